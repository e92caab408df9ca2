package queen_test

import (
	"context"
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

	tx, done := parkMaintain(t, c, "subscriptions", "ACCESS EXCLUSIVE")
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

// A group's first contact that commits while completed retention is
// deciding on a partition (after the step's snapshot, before its commit)
// must not lose that partition's head: what was still stored when the
// subscription committed is the group's to read. Either the subscription
// is in the step's snapshot (and pins the head), or the first contact
// commits after the step (and starts past what it deleted).
//
// The test parks retention at its delete (a second connection holds the
// segments table in SHARE mode: reads go on, the delete waits) while "late"
// makes first contact with a pop of another partition. p stays in the
// ready set, as right after a push, so the first contact locks no row of
// it.
func TestCompletedRetentionCountsAFirstContactCommittedWhileDeleting(t *testing.T) {
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{CompletedRetention: time.Millisecond})
	s := func(table string) string { return pgx.Identifier{c.Schema(), table}.Sanitize() }

	pushN(t, q, "p", "m", 1)
	msgs := pop(t, q, queen.PopOptions{Group: "a", Partition: "p"})
	wantData(t, msgs, "m0")
	ack(t, msgs[0])
	ageSegments(t, c)
	var pending bool
	if err := c.Pool().QueryRow(ctxT(t), "SELECT pending FROM "+s("partitions")+" WHERE name = 'p'").Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if !pending {
		t.Fatal("p left the ready set: the first contact would lock it and wait for retention")
	}

	tx, done := parkMaintain(t, c, "segments", "SHARE")

	contact := make(chan error, 1)
	go func() {
		_, err := q.Pop(ctxT(t), queen.PopOptions{Group: "late", Partition: "none"})
		contact <- err
	}()
	// The first contact either returns (committed while retention is
	// parked) or waits for a lock.
	committed := false
	waitFor(t, 30*time.Second, "late's first contact to return or wait", func() bool {
		select {
		case err := <-contact:
			if err != nil {
				t.Fatalf("late's first pop: %v", err)
			}
			committed = true
			return true
		default:
		}
		var n int
		if err := c.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := tx.Rollback(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Maintain: %v", r.err)
	}
	if !committed {
		if err := <-contact; err != nil {
			t.Fatalf("late's first pop: %v", err)
		}
	}
	msgs = pop(t, q, queen.PopOptions{Group: "late", Partition: "p"})
	t.Logf("first contact committed while retention was parked: %v; retention deleted %d segment(s); late got %q",
		committed, r.rep.SegmentsDeleted, datas(msgs))
	if committed && (len(msgs) != 1 || string(msgs[0].Data) != "m0") {
		t.Fatalf("late's first contact committed while retention was deciding, then retention deleted %d segment(s): late got %q from p, want [m0]",
			r.rep.SegmentsDeleted, datas(msgs))
	}
}

type maintainResult struct {
	rep queen.MaintenanceReport
	err error
}

// parkMaintain locks table in mode from a transaction of its own and
// starts c.Maintain, returning once Maintain waits for that lock: the
// caller commits what it must between retention's statements, then ends tx
// and reads Maintain's outcome from done.
func parkMaintain(t *testing.T, c *queen.Client, table, mode string) (pgx.Tx, <-chan maintainResult) {
	t.Helper()
	rel := pgx.Identifier{c.Schema(), table}.Sanitize()
	holder, err := c.Pool().Acquire(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(holder.Release)
	tx, err := holder.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctxT(t), "LOCK TABLE "+rel+" IN "+mode+" MODE"); err != nil {
		t.Fatal(err)
	}
	done := make(chan maintainResult, 1)
	go func() {
		rep, err := c.Maintain(ctxT(t))
		done <- maintainResult{rep, err}
	}()
	waitFor(t, 30*time.Second, "retention to wait for the "+table+" table", func() bool {
		var n int
		if err := c.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks
WHERE locktype = 'relation' AND NOT granted AND relation = $1::regclass`, rel).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	return tx, done
}
