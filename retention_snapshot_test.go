package queen_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// Completed retention decides which groups still need a partition's head
// from one snapshot. A subscribed group whose first cursor row there
// commits while retention is deciding (a pop's window seeds it at the
// partition's start, then claims another partition) is still counted: by
// the row or by its subscription, never by neither.
//
// The test parks retention where it first reads the subscriptions: a
// second connection holds that table locked (a statement waits for its
// locks, then takes its snapshot), creates the group's cursor row as a
// pop's window does, and commits.
func TestCompletedRetentionCountsACursorRowCommittedWhileDeciding(t *testing.T) {
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{CompletedRetention: time.Millisecond})
	s := func(table string) string { return pgx.Identifier{c.Schema(), table}.Sanitize() }

	pushN(t, q, "p", "m", 1)
	// "a" has read p; "b" is subscribed (its first pop looked at a partition
	// that does not exist) but has no cursor row on p yet. Only p is due.
	msgs := pop(t, q, queen.PopOptions{Group: "a", Partition: "p"})
	wantData(t, msgs, "m0")
	ack(t, msgs[0])
	wantData(t, pop(t, q, queen.PopOptions{Group: "b", Partition: "none"}))
	ageSegments(t, c)
	var qid, pid int64
	if err := c.Pool().QueryRow(ctxT(t), "SELECT queue_id, id FROM "+s("partitions")+" WHERE name = 'p'").
		Scan(&qid, &pid); err != nil {
		t.Fatal(err)
	}

	holder, err := c.Pool().Acquire(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	tx, err := holder.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctxT(t)) }()
	if _, err := tx.Exec(ctxT(t), "LOCK TABLE "+s("subscriptions")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	type result struct {
		rep queen.MaintenanceReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := c.Maintain(ctxT(t))
		done <- result{rep, err}
	}()
	waitFor(t, 30*time.Second, "retention to wait for the subscriptions table", func() bool {
		var n int
		if err := c.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks
WHERE locktype = 'relation' AND NOT granted AND relation = $1::regclass`, s("subscriptions")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	// What b's pop does for a window holding p: a cursor row at p's start.
	if _, err := tx.Exec(ctxT(t), "SELECT "+pgx.Identifier{c.Schema()}.Sanitize()+
		".seed_consumers($1, 'b', 'all', NULL, ARRAY[$2::bigint])", qid, pid); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Maintain: %v", r.err)
	}
	if r.rep.SegmentsDeleted != 0 {
		t.Errorf("retention deleted %d segment(s) group b has not read", r.rep.SegmentsDeleted)
	}
	msgs = pop(t, q, queen.PopOptions{Group: "b", Partition: "p"})
	wantData(t, msgs, "m0")
	if msgs[0].Offset != 0 || msgs[0].Attempt != 1 {
		t.Fatalf("b's first delivery: offset %d attempt %d, want offset 0 attempt 1", msgs[0].Offset, msgs[0].Attempt)
	}
}
