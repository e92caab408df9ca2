package queen_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// A claim ahead does not send again the blob of a segment its lease's
// holder was sent before (the one holding the lease's last offset): only a
// segment that starts past it comes with its blob.
func TestPopAheadLeavesOutSegmentSentBefore(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, q, "p", "a", 6) // one segment, offsets 0-5
	pushN(t, q, "p", "b", 2) // one segment, offsets 6-7
	msgs := pop(t, q, queen.PopOptions{Partition: "p", Batch: 2})
	if len(msgs) != 2 {
		t.Fatalf("popped %d, want 2", len(msgs))
	}
	m := msgs[0]
	schema := pgx.Identifier{c.Schema()}.Sanitize()
	var pid int64
	if err := c.Pool().QueryRow(ctxT(t), "SELECT id FROM "+schema+".partitions WHERE name = 'p'").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	type seg struct {
		first, base int64
		sent        bool
	}
	ahead := func(max int) []seg {
		t.Helper()
		rows, err := c.Pool().Query(ctxT(t), "SELECT first_offset, base_offset, blob IS NOT NULL FROM "+schema+
			".pop_ahead($1, $2, $3::uuid, -1, $4, 0)", pid, m.Group, m.LeaseID, max)
		if err != nil {
			t.Fatal(err)
		}
		var out []seg
		for rows.Next() {
			var s seg
			if err := rows.Scan(&s.first, &s.base, &s.sent); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got, want := ahead(2), []seg{{2, 0, false}}; !slices.Equal(got, want) {
		t.Fatalf("claim of 2-3: %+v, want %+v", got, want)
	}
	// 4-7: the first segment's rest, again without its blob, and the
	// second segment, which this holder was not sent yet.
	if got, want := ahead(4), []seg{{4, 0, false}, {4, 6, true}}; !slices.Equal(got, want) {
		t.Fatalf("claim of 4-7: %+v, want %+v", got, want)
	}
}

// A Consume whose segment cache no longer holds a segment a claim ahead
// left out reads it again: every message is handled once, in order, none
// dead-lettered, the batches claimed ahead under one lease.
func TestConsumeClaimAheadReadsForgottenSegment(t *testing.T) {
	c, claims := openClaimLog(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, q, "p", "m", 25) // one segment
	var h handledLog
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 5}},
		func(_ context.Context, m *queen.Message) error {
			h.add(m)
			c.ForgetSegments()
			return nil
		},
		func() bool { return len(h.all()) >= 25 })
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 25 {
		want = append(want, fmt.Sprintf("m%d", i))
	}
	if got := h.datas(); !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
	cl := claims.all()
	if len(cl) != 5 {
		t.Fatalf("claims %+v, want 5", cl)
	}
	for _, r := range cl {
		if r.lease != cl[0].lease {
			t.Fatalf("claims %+v: want one lease", cl)
		}
	}
	if dl := deadLetters(t, q); len(dl) != 0 {
		t.Fatalf("dead letters %+v, want none", dl)
	}
}
