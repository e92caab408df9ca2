package queen_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// The hazards of the generations (migration 015, DESIGN.md "Scheduled
// delivery"): a schedule or a cancel that commits beside a move, a
// generation freed too soon, a move rolled back, held rows.

func ident(c *queen.Client, name string) string { return pgx.Identifier{c.Schema(), name}.Sanitize() }

// holdState begins a transaction holding the state row FOR UPDATE, as a
// move does, and returns it.
func holdState(t *testing.T, c *queen.Client) pgx.Tx {
	t.Helper()
	tx, err := c.Pool().Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	if _, err := tx.Exec(ctxT(t), "SELECT 1 FROM "+ident(c, "scheduled_state")+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// unmoved sets the watermark back to its start: for tests that make
// generation rows due by an UPDATE, after the moves of a client that
// moved none of them (its moves set the watermark to their clock, and
// rows made due before it would count as moved).
func unmoved(t *testing.T, pool interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, schema string) {
	t.Helper()
	if _, err := pool.Exec(ctxT(t), "UPDATE "+pgx.Identifier{schema, "scheduled_state"}.Sanitize()+
		" SET wm_due = '-infinity', wm_id = 0"); err != nil {
		t.Fatal(err)
	}
}

// A schedule that waits for a move which raises the watermark past its
// item (a move that took everything due by a time after the item's due)
// must not write the item where that move's successors no longer look: it
// is retried and lands in the per-row table, and is delivered.
func TestScheduleWaitingForAMovePastItsItem(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	q.Push(ctxT(t), []queen.Item{{Partition: "p", Data: []byte("x")}}) // the queue exists
	tx := holdState(t, c)
	due := time.Now().Add(2 * time.Second) // more than a second ahead: the shared lock
	type res struct {
		r   []queen.PushResult
		err error
	}
	done := make(chan res, 1)
	go func() {
		r, err := q.Push(context.Background(), []queen.Item{{Partition: "p", TransactionID: "late", Data: []byte("late"), DeliverAt: due}})
		done <- res{r, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("scheduled while a move held the state row: %+v, %v", r.r, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	// The "move" takes everything due up to a second past the item.
	if _, err := tx.Exec(ctxT(t), "UPDATE "+ident(c, "scheduled_state")+
		" SET wm_due = $1, wm_id = 9223372036854775807", due.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(due.Add(100 * time.Millisecond)))
	if err := tx.Commit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.r[0].Status != queen.Scheduled {
		t.Fatalf("schedule: %+v, %v", r.r, r.err)
	}
	msgs, _ := drainUntil(t, q, 2, time.Now().Add(20*time.Second))
	wantData(t, msgs, "x", "late")
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 0 {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// A cancel waits for a move in flight: the message that move took is
// delivered, not cancelled.
func TestCancelWaitsForTheMove(t *testing.T) {
	// No move of the client's own mover behind the test's: that "move"
	// leaves the watermark at c0, ten minutes ahead, and a move queued
	// behind it on the state row reads that as its clock and moves c1
	// before the cancel. So no backstop poll, and the state is held once
	// the move every client makes at Open is not waiting for it.
	c := open(t, queen.SchedulePoll(time.Hour))
	q := c.Queue("q")
	scheduleItems(t, q, time.Now().Add(10*time.Minute), "c", "p", "p")
	var tx pgx.Tx
	for {
		tx = holdState(t, c)
		time.Sleep(50 * time.Millisecond)
		var waiting int
		if err := c.Pool().QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"+
			" AND position('move_scheduled' in query) > 0").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 0 {
			break
		}
		_ = tx.Rollback(ctxT(t))
	}
	done := make(chan int, 1)
	go func() {
		n, err := q.CancelScheduled(context.Background(), []string{"c0", "c1"})
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	select {
	case n := <-done:
		t.Fatalf("cancelled %d while a move held the state row", n)
	case <-time.After(500 * time.Millisecond):
	}
	// The "move" took c0 (the watermark at its row), not c1.
	if _, err := tx.Exec(ctxT(t), "UPDATE "+ident(c, "scheduled_state")+" s SET wm_due = g.due_at, wm_id = g.id FROM "+
		ident(c, "scheduled_gen")+" g WHERE g.hash = (SELECT hash FROM "+ident(c, "scheduled_gen")+
		" ORDER BY id LIMIT 1)"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := <-done; n != 1 {
		t.Fatalf("cancelled %d, want 1 (c1; c0 was moved)", n)
	}
}

// A generation closed with a row not yet due is not truncated until that
// row has moved; the next generation takes new schedules, and dedup spans
// both.
func TestGenerationFreedOnlyOnceMoved(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	t0 := time.Now()
	scheduleItems(t, q, t0.Add(1500*time.Millisecond), "a", "p")
	b := scheduleItems(t, q, t0.Add(5*time.Second), "b", "p")
	// Generation 0 is due to close: the next move closes it, its last row b0.
	if _, err := c.Pool().Exec(ctxT(t), "UPDATE "+ident(c, "scheduled_gens")+" SET opened = opened - interval '1 hour' WHERE gen = 0"); err != nil {
		t.Fatal(err)
	}
	msgs, _ := drainUntil(t, q, 1, t0.Add(4*time.Second))
	wantData(t, msgs, "a0")
	var cur int
	var closed bool
	if err := c.Pool().QueryRow(ctxT(t), "SELECT s.cur_gen, g.closed FROM "+ident(c, "scheduled_state")+" s, "+
		ident(c, "scheduled_gens")+" g WHERE g.gen = 0").Scan(&cur, &closed); err != nil {
		t.Fatal(err)
	}
	if cur == 0 || !closed {
		t.Fatalf("current generation %d, generation 0 closed %v; want it closed and another current", cur, closed)
	}
	if n := countRows(t, c, "scheduled_g0"); n != 2 {
		t.Fatalf("generation 0 holds %d rows before b0 is due, want 2", n)
	}
	// b0 is in the closed generation: scheduling it again is a duplicate.
	res, err := q.Push(ctxT(t), []queen.Item{{Partition: "p", TransactionID: "b0", Data: []byte("again"), DeliverAt: t0.Add(10 * time.Minute)}})
	if err != nil || res[0].Status != queen.Duplicate || res[0].MessageID != b[0].MessageID {
		t.Fatalf("b0 again: %+v, %v; want a duplicate of %v", res, err, b[0].MessageID)
	}
	// a0 has moved: scheduling it again is not (in the new generation).
	scheduleItems(t, q, t0.Add(5500*time.Millisecond), "a", "p")
	msgs, _ = drainUntil(t, q, 3, t0.Add(20*time.Second))
	wantData(t, msgs, "b0", "a0")
	deadline := time.Now().Add(10 * time.Second)
	for countRows(t, c, "scheduled_g0") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("generation 0 not truncated after its last row moved")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 0 {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// A move rolled back (its client killed mid-move) leaves the watermark and
// the generations as they were: the next move moves the same messages.
func TestMoveRolledBackMovesNothing(t *testing.T) {
	ctx := ctxT(t)
	c := open(t)
	schema := c.Schema()
	scheduleItems(t, c.Queue("q"), time.Now().Add(30*time.Minute), "r", "p", "p", "p")
	if err := c.Close(ctx); err != nil { // no mover of its own from here
		t.Fatal(err)
	}
	pool := pgtest.Pool(t)
	unmoved(t, pool, schema)
	id := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	if _, err := pool.Exec(ctx, "UPDATE "+id("scheduled_gen")+" SET due_at = now() - interval '1 second'"); err != nil {
		t.Fatal(err)
	}
	move := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) int32 {
		t.Helper()
		var moved int32
		if err := q.QueryRow(ctx, "SELECT moved FROM "+id("move_scheduled")+"(10, 16 << 20)").Scan(&moved); err != nil {
			t.Fatal(err)
		}
		return moved
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := move(tx); n != 3 {
		t.Fatalf("moved %d, want 3", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var unmoved bool
	var segs int
	if err := pool.QueryRow(ctx, "SELECT (SELECT wm_due FROM "+id("scheduled_state")+") = '-infinity', "+
		"(SELECT count(*) FROM "+id("segments")+")").Scan(&unmoved, &segs); err != nil {
		t.Fatal(err)
	}
	if !unmoved || segs != 0 {
		t.Fatalf("after the rollback: watermark at -infinity %v, %d segments", unmoved, segs)
	}
	if n := move(pool); n != 3 {
		t.Fatalf("after the rollback moved %d, want 3", n)
	}
	if n := move(pool); n != 0 {
		t.Fatalf("moved %d more", n)
	}
}

// A generation's plaintext row of a queue made encrypted is held (copied
// to the per-row table): it keeps its transaction id (a repeat is a
// duplicate), Status counts it, a cancel removes it.
func TestScheduledHeldKeepsItsTransactionID(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = make([]byte, 32) })
	q := c.Queue("q")
	due := time.Now().Add(1500 * time.Millisecond)
	first := scheduleItems(t, q, due, "h", "p")
	if err := q.Configure(ctxT(t), queen.QueueOptions{Encryption: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for countRows(t, c, "scheduled") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("not held")
		}
		time.Sleep(50 * time.Millisecond)
	}
	res, err := q.Push(ctxT(t), []queen.Item{{Partition: "p", TransactionID: "h0", Data: []byte("again"), DeliverAt: time.Now().Add(time.Minute)}})
	if err != nil || res[0].Status != queen.Duplicate || res[0].MessageID != first[0].MessageID {
		t.Fatalf("h0 again: %+v, %v", res, err)
	}
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 1 {
		t.Fatalf("status %+v, %v", st, err)
	}
	if n, err := q.CancelScheduled(ctxT(t), []string{"h0"}); err != nil || n != 1 {
		t.Fatalf("cancel: %d, %v", n, err)
	}
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 0 {
		t.Fatalf("status after cancel %+v, %v", st, err)
	}
	if msgs, _ := drainUntil(t, q, 1, time.Now().Add(time.Second)); len(msgs) != 0 {
		t.Fatalf("delivered %q", datas(msgs))
	}
}
