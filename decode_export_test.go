package queen

import (
	"context"

	"github.com/e03140bc/queen/internal/stmt"
)

// ClaimRows claims up to batch messages of q for group, leased, and returns
// the claim's rows undecoded: what DecodeClaim then decodes, as often as a
// benchmark likes.
func ClaimRows(ctx context.Context, q *Queue, group string, batch int) ([]stmt.PopRow, error) {
	e := q.c.e
	var rows []stmt.PopRow
	err := stmt.Pop(ctx, e.csql, e.pool, stmt.PopParams{
		Tenant: q.c.tenant, Queue: q.name, Group: group, Hints: []string{}, Batch: batch, PerPartition: batch,
		Partitions: 1, Owner: e.owner, Mode: "all",
	}, func(r *stmt.PopRow) error {
		rows = append(rows, *r)
		return nil
	})
	return rows, err
}

// DecodeClaim decodes rows as a claim of q for group does and returns the
// messages delivered.
func DecodeClaim(q *Queue, group string, rows []stmt.PopRow) ([]*Message, error) {
	o := &PopOptions{Group: group}
	d := &popDecoder{q: q, o: o, dm: q.c.e.meter.consume.dest(q.name, group)}
	for i := range rows {
		if err := d.row(&rows[i]); err != nil {
			return nil, err
		}
	}
	var out []*Message
	for _, p := range d.parts {
		if len(p.dead) > 0 {
			return nil, p.dead[0].err
		}
		out = append(out, p.msgs...)
	}
	return out, nil
}
