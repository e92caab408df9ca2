package queen_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// The consume path's routed forms (routed.sql, chosen on the Citus layout
// by settings.routed) against the set-based ones, both on PostgreSQL: a
// group that subscribes after messages exist (first contact, backlog),
// pops with hints and by partition, acks one at a time and in batches, a
// failure, a retry, ExtendLease, a lingering Consume and a per-key one.
// Every message is delivered to each group once, in order per partition
// (a failed or retried one again, at once), and the cursors, the ready set
// and the backlog end as the set-based forms leave them.
func TestConsumeRoutedMatchesSetBased(t *testing.T) {
	run := func(routed bool) (got map[string][]string, rows []string) {
		c := open(t, manual)
		tbl := func(n string) string { return pgx.Identifier{c.Schema(), n}.Sanitize() }
		if routed {
			if _, err := c.Pool().Exec(ctxT(t), `UPDATE `+tbl("settings")+` SET routed = true`); err != nil {
				t.Fatal(err)
			}
		}
		got = map[string][]string{}
		var mu sync.Mutex
		note := func(g string, m *queen.Message) {
			mu.Lock()
			defer mu.Unlock()
			k := g + "/" + m.Partition
			got[k] = append(got[k], string(m.Data))
		}
		q := configure(t, c, "q", queen.QueueOptions{RetryBackoff: queen.RetryBackoff{Disabled: true}})
		var items []queen.Item
		for i := range 60 {
			items = append(items, queen.Item{Partition: fmt.Sprint("p", i%6), Key: fmt.Sprint("k", i%3), Data: []byte(fmt.Sprint(i / 6))})
		}
		push(t, q, items[:30]...)
		// Group "": pops with a hint, by partition, acks, a failure, a retry.
		ms := pop(t, q, queen.PopOptions{Batch: 3, Partitions: 2})
		for _, m := range ms {
			note("", m)
			ack(t, m)
		}
		ms = pop(t, q, queen.PopOptions{Partition: "p4", Batch: 2})
		if len(ms) != 2 {
			t.Fatalf("pop of p4: %d messages", len(ms))
		}
		if err := ms[0].ExtendLease(ctxT(t), time.Minute); err != nil {
			t.Fatalf("ExtendLease: %v", err)
		}
		if err := ms[0].Fail(ctxT(t), errors.New("again")); err != nil {
			t.Fatal(err)
		}
		ms = pop(t, q, queen.PopOptions{Partition: "p4", Batch: 1})
		if len(ms) != 1 {
			t.Fatalf("pop of p4 after a failure: %d messages", len(ms))
		}
		if err := ms[0].Retry(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		push(t, q, items[30:]...)
		// Group "g" subscribes now: everything retained.
		for range 4 {
			ms := pop(t, q, queen.PopOptions{Group: "g", Batch: 5, Partitions: 3})
			var reqs []queen.AckRequest
			for _, m := range ms {
				note("g", m)
				reqs = append(reqs, queen.AckRequest{Message: m})
			}
			if errs, err := q.AckBatch(ctxT(t), reqs); err != nil || errors.Join(errs...) != nil {
				t.Fatal(err, errs)
			}
		}
		count := func(g string) int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for k, v := range got {
				if strings.HasPrefix(k, g+"/") {
					n += len(v)
				}
			}
			return n
		}
		cons := func(g string, kc int) {
			err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: g, Batch: 4, Wait: 50 * time.Millisecond},
				KeyConcurrency: kc},
				func(_ context.Context, m *queen.Message) error { note(g, m); return nil },
				func() bool { return count(g) >= len(items) })
			if err != nil || count(g) != len(items) {
				t.Fatalf("Consume of group %q: %v after %d of %d", g, err, count(g), len(items))
			}
		}
		cons("", 1)
		cons("g", 3)
		// Where a Consume stopped decides which ready-set flags its last
		// pops cleared: one more pop of each group, finding nothing, clears
		// the rest on either path, so the rows compare what both paths
		// must agree on.
		for _, g := range []string{"", "g"} {
			if ms := pop(t, q, queen.PopOptions{Group: g, Batch: 10, Partitions: 6}); len(ms) != 0 {
				t.Fatalf("group %q: %d messages left after its Consume", g, len(ms))
			}
		}
		r, err := c.Pool().Query(ctxT(t), `SELECT format('%s %s %s %s %s %s', p.name, c.group_name, c.committed, c.batch_end, p.pending,
				EXISTS (SELECT 1 FROM `+tbl("backlog")+` b WHERE b.partition_id = p.id AND b.group_name = c.group_name))
			FROM `+tbl("consumers")+` c JOIN `+tbl("partitions")+` p ON p.id = c.partition_id ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		rows, err = pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got, rows
	}
	setGot, setRows := run(false)
	rGot, rRows := run(true)
	for k, v := range setGot {
		if want := fmt.Sprint(v); fmt.Sprint(rGot[k]) != want {
			t.Errorf("%s: routed delivered %v, set-based %v", k, rGot[k], v)
		}
	}
	if len(rGot) != len(setGot) {
		t.Errorf("routed delivered to %d group partitions, set-based to %d", len(rGot), len(setGot))
	}
	if !slices.Equal(setRows, rRows) {
		t.Errorf("cursor rows:\nrouted     %q\nset-based  %q", rRows, setRows)
	}
}
