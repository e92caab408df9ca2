package queen_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

func TestPushTxCommitted(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("outbox")
	var res []queen.PushResult
	err := pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
		var err error
		res, err = q.PushTx(ctx, tx, []queen.Item{{Data: []byte("a")}, {Data: []byte("b"), Partition: "p2"}, {TransactionID: "x"}, {TransactionID: "x"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != queen.Queued || res[1].Status != queen.Queued || res[2].Status != queen.Queued || res[3].Status != queen.Duplicate {
		t.Fatalf("%+v", res)
	}
	got := pop(t, q, queen.PopOptions{Batch: 10, Partition: "Default", AutoAck: true})
	if len(got) != 2 || string(got[0].Data) != "a" || got[0].ID != res[0].MessageID {
		t.Fatalf("popped %+v", got)
	}
}

func TestPushTxRolledBackLeavesNothing(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("outbox")
	push(t, q, queen.Item{Data: []byte("before")}) // the queue exists; offsets start at 1 next
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := q.PushTx(ctx, tx, []queen.Item{{Data: []byte("never")}})
	if err != nil || res[0].Status != queen.Queued || res[0].Offset != 1 {
		t.Fatalf("%v %+v", err, res)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(storedFrames(t, c, "Default")); n != 1 {
		t.Fatalf("%d frames stored after rollback, want 1", n)
	}
	// The rolled-back bump is gone too: the next push takes offset 1.
	if r := push(t, q, queen.Item{})[0]; r.Offset != 1 {
		t.Fatalf("offset after a rolled-back push: %d", r.Offset)
	}
}

// Tx(ack A + push B) with an unknown ack: B never visible, A redelivered.
func TestTxUnknownAckRollsBackEverything(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	in, out := c.Queue("in"), c.Queue("out")
	push(t, in, queen.Item{Data: []byte("A")})
	msgs := pop(t, in, queen.PopOptions{LeaseTime: time.Second})
	if len(msgs) != 1 {
		t.Fatalf("popped %d", len(msgs))
	}
	err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Ack(msgs[0])
		tx.Push("out", []queen.Item{{Data: []byte("B")}})
		tx.Ack(&queen.Message{ID: msgs[0].ID}) // not a delivered message
		return nil
	})
	if !errors.Is(err, queen.ErrTxAborted) {
		t.Fatalf("Tx: %v, want ErrTxAborted", err)
	}
	if got := pop(t, out, queen.PopOptions{AutoAck: true}); len(got) != 0 {
		t.Fatalf("B is visible: %q", got[0].Data)
	}
	time.Sleep(1100 * time.Millisecond) // A's lease runs out
	again := pop(t, in, queen.PopOptions{})
	if len(again) != 1 || string(again[0].Data) != "A" {
		t.Fatalf("A not redelivered: %d messages", len(again))
	}
}

// A stale ack (lease lost) inside Tx also rolls back its pushes.
func TestTxLeaseLostAckRollsBack(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	in := c.Queue("in")
	push(t, in, queen.Item{Data: []byte("A")})
	msgs := pop(t, in, queen.PopOptions{LeaseTime: 200 * time.Millisecond})
	time.Sleep(300 * time.Millisecond)
	err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Push("out", []queen.Item{{Data: []byte("B")}})
		tx.Ack(msgs[0])
		return nil
	})
	if !errors.Is(err, queen.ErrTxAborted) || !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("Tx: %v, want ErrTxAborted wrapping ErrLeaseLost", err)
	}
	if n := countRows(t, c, "segments"); n != 1 {
		t.Fatalf("%d segments: the push was not rolled back", n)
	}
}

func TestTxAckAndPushCommitTogether(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	in, out := c.Queue("in"), c.Queue("out")
	push(t, in, queen.Item{Data: []byte("A")}, queen.Item{Data: []byte("A2")})
	msgs := pop(t, in, queen.PopOptions{Batch: 2})
	err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Ack(msgs[1])
		tx.Push("out", []queen.Item{{Data: []byte("B")}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := pop(t, out, queen.PopOptions{AutoAck: true}); len(got) != 1 || string(got[0].Data) != "B" {
		t.Fatalf("B not visible")
	}
	if err := msgs[0].Ack(ctx); !errors.Is(err, queen.ErrAlreadyAcked) {
		t.Fatalf("A after Tx acked through A2: %v", err)
	}
}

// A duplicate push inside Tx rolls everything back.
func TestTxDuplicatePushRollsBack(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	out := withWindow(t, c, "out")
	push(t, out, queen.Item{TransactionID: "once"})
	in := c.Queue("in")
	push(t, in, queen.Item{})
	msgs := pop(t, in, queen.PopOptions{})
	err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Ack(msgs[0])
		tx.Push("out", []queen.Item{{TransactionID: "once"}})
		return nil
	})
	if !errors.Is(err, queen.ErrTxAborted) {
		t.Fatalf("Tx: %v", err)
	}
	if err := msgs[0].Ack(context.Background()); err != nil {
		t.Fatalf("the ack inside the aborted Tx was applied: %v", err)
	}
}

// Two pushes to one partition in one Tx reach the bundle as two segments of
// the same partition: both are stored, in order, with consecutive offsets.
func TestTxTwoPushesToOnePartition(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Push("q", []queen.Item{{Data: []byte("a")}, {Data: []byte("b")}})
		tx.Push("q", []queen.Item{{Data: []byte("c")}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	f := storedFrames(t, c, "Default")
	if len(f) != 3 || string(f[0].Payload) != "a" || string(f[2].Payload) != "c" {
		t.Fatalf("stored %d frames", len(f))
	}
}

// One bundle mixing the set-based allocator (no dedup window), with two
// partitions each listed twice, and push_one (a queue with a window): every
// partition's segments are stored in input order with consecutive offsets,
// and each segment carries one hash per message in its row.
func TestTxInterleavedPartitionsAndWindows(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	if err := c.Queue("dq").Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}
	err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Push("q", []queen.Item{{Data: []byte("a1"), Partition: "A"}, {Data: []byte("a2"), Partition: "A"}})
		tx.Push("q", []queen.Item{{Data: []byte("b1"), Partition: "B"}})
		tx.Push("dq", []queen.Item{{Data: []byte("d1"), Partition: "D"}})
		tx.Push("q", []queen.Item{{Data: []byte("a3"), Partition: "A"}})
		tx.Push("q", []queen.Item{{Data: []byte("b2"), Partition: "B"}, {Data: []byte("b3"), Partition: "B"}})
		tx.Push("dq", []queen.Item{{Data: []byte("d2"), Partition: "D"}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for part, want := range map[string][]string{"A": {"a1", "a2", "a3"}, "B": {"b1", "b2", "b3"}, "D": {"d1", "d2"}} {
		f := storedFrames(t, c, part)
		var got []string
		for _, fr := range f {
			got = append(got, string(fr.Payload))
		}
		if len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] || got[1] != want[1] {
			t.Fatalf("partition %s stored %v, want %v", part, got, want)
		}
	}
	var mismatched int
	err = c.Pool().QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{c.Schema(), "segments"}.Sanitize()+
		" s WHERE octet_length(s.hashes) IS DISTINCT FROM 16 * (s.end_offset - s.base_offset + 1)").Scan(&mismatched)
	if err != nil {
		t.Fatal(err)
	}
	if mismatched != 0 {
		t.Fatalf("%d segments without one hash per message", mismatched)
	}
	if n := countRows(t, c, "txns"); n != 0 {
		t.Fatalf("%d hash rows beside segments that hold their hashes", n)
	}
}

// A bundle's first push to new partitions allocates their offsets as it
// creates them. One transaction pushes to new partitions, one of them
// listed twice and one of a queue with a dedup window (not allocated
// there); one plain push then spreads over new and known partitions; a
// last round pushes to all of them again; one transaction pushes twice to
// the same two new partitions. Every partition is gapless from
// offset 0, in push order, with its last offset on its last message.
func TestFirstTouchBundleOffsets(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q, dq := c.Queue("q"), configure(t, c, "dq", queen.QueueOptions{DedupWindow: time.Hour})
	err := c.Tx(ctx, func(tx *queen.Tx) error {
		tx.Push("q", []queen.Item{{Data: []byte("a1"), Partition: "A"}, {Data: []byte("a2"), Partition: "A"}})
		tx.Push("q", []queen.Item{{Data: []byte("b1"), Partition: "B"}})
		tx.Push("dq", []queen.Item{{Data: []byte("d1"), Partition: "D"}})
		tx.Push("q", []queen.Item{{Data: []byte("a3"), Partition: "A"}})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Data: []byte("a4"), Partition: "A"}, queen.Item{Data: []byte("c1"), Partition: "C"},
		queen.Item{Data: []byte("c2"), Partition: "C"}, queen.Item{Data: []byte("e1"), Partition: "E"})
	push(t, q, queen.Item{Data: []byte("a5"), Partition: "A"}, queen.Item{Data: []byte("b2"), Partition: "B"},
		queen.Item{Data: []byte("c3"), Partition: "C"}, queen.Item{Data: []byte("e2"), Partition: "E"})
	push(t, dq, queen.Item{Data: []byte("d2"), Partition: "D"})
	// Two bundles in one transaction: the second finds the partitions the
	// first created (and allocated) before commit.
	err = pgx.BeginFunc(ctx, c.Pool(), func(tx pgx.Tx) error {
		for _, n := range []string{"1", "2"} {
			if _, err := q.PushTx(ctx, tx, []queen.Item{{Data: []byte("f" + n), Partition: "F"},
				{Data: []byte("g" + n), Partition: "G"}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"A": {"a1", "a2", "a3", "a4", "a5"}, "B": {"b1", "b2"}, "C": {"c1", "c2", "c3"},
		"D": {"d1", "d2"}, "E": {"e1", "e2"}, "F": {"f1", "f2"}, "G": {"g1", "g2"}}
	for part, w := range want {
		var got []string
		for _, fr := range storedFrames(t, c, part) { // fails on a gap
			got = append(got, string(fr.Payload))
		}
		if strings.Join(got, ",") != strings.Join(w, ",") {
			t.Errorf("partition %s stored %v, want %v", part, got, w)
		}
		var last int64
		err := c.Pool().QueryRow(ctx, "SELECT last_offset FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
			" WHERE name = $1", part).Scan(&last)
		if err != nil {
			t.Fatal(err)
		}
		if last != int64(len(w)-1) {
			t.Errorf("partition %s: last offset %d, want %d", part, last, len(w)-1)
		}
	}
}

// longSchema is a fresh schema name of the longest valid length, 63 bytes,
// dropped when the test ends.
func longSchema(t *testing.T) string {
	t.Helper()
	name := pgtest.Schema(t) // a unique prefix
	name += strings.Repeat("x", 63-len(name))
	pool := pgtest.Pool(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// poll waits until cond holds, failing the test after 10s.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Every valid schema name works, the longest (63 bytes) included: its
// NOTIFY channel fits PostgreSQL's 63-byte identifiers, so PushTx and Tx
// pushes commit and another client's waiting pop is woken through LISTEN.
func TestLongSchemaNameNotifies(t *testing.T) {
	schema := longSchema(t)
	a := open(t, queen.PopRescan(time.Hour), func(cfg *queen.Config) { cfg.Schema = schema })
	b := open(t, queen.PopRescan(time.Hour), func(cfg *queen.Config) { cfg.Schema = schema })
	ctx := ctxT(t)
	ch := queen.NotifyChannel(a)
	if len(ch) > 63 {
		t.Errorf("channel %q is %d bytes, over PostgreSQL's 63", ch, len(ch))
	}
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	listen := "LISTEN " + pgx.Identifier{ch}.Sanitize()
	if _, err := conn.Exec(ctx, listen); err != nil {
		t.Fatal(err)
	}
	notified := func(what string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		if err != nil || !strings.Contains(n.Payload, "/outbox") {
			t.Fatalf("%s: no notification on %q: %+v, %v", what, ch, n, err)
		}
	}

	q := a.Queue("outbox")
	err = pgx.BeginFunc(ctx, a.Pool(), func(tx pgx.Tx) error {
		res, err := q.PushTx(ctx, tx, []queen.Item{{Data: []byte("tx")}})
		if err == nil && res[0].Status != queen.Queued {
			err = fmt.Errorf("PushTx: %+v", res[0])
		}
		return err
	})
	if err != nil {
		t.Fatalf("PushTx with a 63-byte schema: %v", err)
	}
	notified("PushTx")
	if err := a.Tx(ctx, func(tx *queen.Tx) error { tx.Push("outbox", []queen.Item{{Data: []byte("Tx")}}); return nil }); err != nil {
		t.Fatalf("Tx with a push, 63-byte schema: %v", err)
	}
	notified("Tx")
	wantData(t, pop(t, b.Queue("outbox"), queen.PopOptions{Batch: 10, AutoAck: true}), "tx", "Tx")

	// b's waiting pop is woken by a's push through b's LISTEN connection
	// (the rescan is an hour away). Both clients' listeners and this
	// test's connection are subscribed first.
	poll(t, "both clients to LISTEN", func() bool {
		var n int
		if err := a.Pool().QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = $1", listen).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n >= 3
	})
	r := popAsync(b.Queue("outbox"), ctx, queen.PopOptions{Wait: 5 * time.Second, AutoAck: true})
	poll(t, "b's pop to park", func() bool { return queen.ParkedPops(b) == 1 })
	pushN(t, a.Queue("outbox"), "", "wake", 1)
	notified("Push")
	if got := <-r; got.err != nil || len(got.msgs) != 1 {
		t.Fatalf("b's waiting pop = %q, %v; want the message a pushed", datas(got.msgs), got.err)
	}
}
