package queen_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// tracedClient is a client whose pool records the goroutine each statement
// starts on.
func tracedClient(t *testing.T, mod ...func(*queen.Config)) (*queen.Client, *goroutineTracer) {
	t.Helper()
	tr := &goroutineTracer{}
	pool := tracedPool(t, tr)
	mod = append([]func(*queen.Config){manual, func(c *queen.Config) { c.Pool = pool }}, mod...)
	return open(t, mod...), tr
}

// mark is where the statements recorded from now on start.
func (g *goroutineTracer) mark() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.ids)
}

// since returns the goroutine of each statement recorded from mark on
// whose SQL contains fn.
func (g *goroutineTracer) since(mark int, fn string) []uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var ids []uint64
	for k := mark; k < len(g.ids); k++ {
		if strings.Contains(g.sql[k], fn) {
			ids = append(ids, g.ids[k])
		}
	}
	return ids
}

const (
	sqlAck    = ".ack_many("
	sqlSettle = ".settle_v2("
	sqlPop    = ".pop_v2("
)

// An isolated Ack or Fail commits on the calling goroutine: its statement
// starts there, with no hand-off to the ack fusion engine's goroutines.
func TestIsolatedAckRunsOnCallersGoroutine(t *testing.T) {
	ctx := ctxT(t)
	c, tr := tracedClient(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p"}, queen.Item{Partition: "p"}, queen.Item{Partition: "p"}, queen.Item{Partition: "p"})
	msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 4})
	if err != nil || len(msgs) != 4 {
		t.Fatalf("Pop: %d messages, %v", len(msgs), err)
	}
	inline := queen.AckInline(c)
	me := goid()
	for i, m := range msgs {
		mark := tr.mark()
		fn := sqlAck
		if i == len(msgs)-1 {
			fn = sqlSettle
			err = m.Fail(ctx, errors.New("boom"))
		} else {
			err = m.Ack(ctx)
		}
		if err != nil {
			t.Fatalf("settle %d: %v", i, err)
		}
		ids := tr.since(mark, fn)
		if len(ids) != 1 {
			t.Fatalf("settle %d ran %d %s statements, want 1", i, len(ids), fn)
		}
		if ids[0] != me {
			t.Errorf("settle %d: %s ran on goroutine %d, the caller is %d", i, fn, ids[0], me)
		}
	}
	if n := queen.AckInline(c) - inline; n != 4 {
		t.Fatalf("%d of 4 isolated settlements flushed inline", n)
	}
}

// An isolated Pop claims on the calling goroutine.
func TestIsolatedPopRunsOnCallersGoroutine(t *testing.T) {
	ctx := ctxT(t)
	c, tr := tracedClient(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "a"}, queen.Item{Partition: "b"})
	me := goid()
	for i := range 3 { // the last finds nothing
		mark := tr.mark()
		msgs, err := q.Pop(ctx, queen.PopOptions{})
		if err != nil || len(msgs) != min(1, 2-i) {
			t.Fatalf("Pop %d: %d messages, %v", i, len(msgs), err)
		}
		ids := tr.since(mark, sqlPop)
		if len(ids) != 1 || ids[0] != me {
			t.Fatalf("Pop %d: claims ran on goroutines %v, want one on the caller's, %d", i, ids, me)
		}
	}
}

// With nothing in hand, Consume claims on the goroutine that called it, and
// a batch's settlement, isolated, commits on the goroutine that ran its
// handler.
func TestConsumeIsolatedClaimAndSettleRunInline(t *testing.T) {
	ctx := ctxT(t)
	c, tr := tracedClient(t, queen.NoLinger) // a lingering lease is acked by linger_ack, not the ack engine
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p"}) // creates the queue
	const n = 5
	var (
		mu       sync.Mutex
		handlers = map[uint64]bool{} // goroutines that ran a handler
	)
	handled := make(chan struct{}, n+1)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	consumer := make(chan uint64, 1)
	done := make(chan error, 1)
	mark := tr.mark()
	inline := queen.AckInline(c)
	go func() {
		consumer <- goid()
		done <- q.Consume(cctx, queen.ConsumeOptions{}, func(context.Context, *queen.Message) error {
			mu.Lock()
			handlers[goid()] = true
			mu.Unlock()
			handled <- struct{}{}
			return nil
		})
	}()
	me := <-consumer
	for i := range n + 1 {
		select {
		case <-handled:
		case <-time.After(30 * time.Second):
			t.Fatalf("message %d not handled", i)
		}
		// The batch's settlement commits before the next push, which then
		// finds the ack engine idle.
		waitSettled(t, c, int64(i+1))
		if i < n {
			push(t, q, queen.Item{Partition: "p"})
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pops := tr.since(mark, sqlPop)
	if len(pops) == 0 {
		t.Fatal("no claim recorded")
	}
	for k, id := range pops {
		if id != me {
			t.Errorf("claim %d of %d ran on goroutine %d, Consume's is %d", k, len(pops), id, me)
		}
	}
	acks := tr.since(mark, sqlAck)
	if len(acks) != n+1 {
		t.Fatalf("%d ack statements, want %d", len(acks), n+1)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, id := range acks {
		if !handlers[id] {
			t.Errorf("ack %d ran on goroutine %d, which ran no handler", k, id)
		}
	}
	if got := queen.AckInline(c) - inline; got != n+1 {
		t.Fatalf("%d of %d isolated settlements flushed inline", got, n+1)
	}
}

// waitSettled waits until c's ack engine has carried n settlements.
func waitSettled(t *testing.T, c *queen.Client, n int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for c.Stats().Acks < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d settlements after 30s, want %d", c.Stats().Acks, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Consumers acking one message at a time, with random idle spells, settle
// partly inline and partly fused: every Ack gets its own verdict, applied
// (a lost, swapped or doubled result, or an ack applied after a later one of
// its lease, would fail one), and a Pop after an Ack of the same partition
// starts right after it (the Ack returned only once committed).
func TestAckInlineAndFusedMix(t *testing.T) {
	ctx := ctxT(t)
	c := open(t, manual)
	q := c.Queue("q")
	const parts, per = 6, 20
	var items []queen.Item
	for p := range parts {
		for range per {
			items = append(items, queen.Item{Partition: fmt.Sprint("p", p)})
		}
	}
	push(t, q, items...)
	before, inline := c.Stats(), queen.AckInline(c)
	var wg sync.WaitGroup
	for p := range parts {
		wg.Go(func() {
			name := fmt.Sprint("p", p)
			next := int64(0)
			for next < per {
				msgs, err := q.Pop(ctx, queen.PopOptions{Partition: name, Batch: 1 + rand.IntN(4)})
				if err != nil || len(msgs) == 0 {
					t.Errorf("%s: Pop at %d: %d messages, %v", name, next, len(msgs), err)
					return
				}
				for _, m := range msgs {
					if m.Offset != next {
						t.Errorf("%s: popped offset %d, want %d", name, m.Offset, next)
						return
					}
					if rand.IntN(3) == 0 { // an idle spell
						time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
					}
					if err := m.Ack(ctx); err != nil {
						t.Errorf("%s: Ack %d: %v", name, m.Offset, err)
						return
					}
					next++
				}
			}
			if msgs, err := q.Pop(ctx, queen.PopOptions{Partition: name}); err != nil || len(msgs) != 0 {
				t.Errorf("%s: Pop after the last Ack: %d messages, %v", name, len(msgs), err)
			}
		})
	}
	wg.Wait()
	after := c.Stats()
	if n := after.Acks - before.Acks; n != parts*per {
		t.Fatalf("the ack engine carried %d settlements, want %d", n, parts*per)
	}
	t.Logf("%d acks in %d commits, %d inline", parts*per, after.AckCommits-before.AckCommits, queen.AckInline(c)-inline)
}

// An isolated Ack runs on its caller's goroutine but its context does not
// cancel it: cancelled while its statement waits on a lock, it still
// commits once the lock is released and returns the verdict, as a fused
// settlement does (a stopping consumer must commit what it handled).
func TestIsolatedAckNotCancelledByItsContext(t *testing.T) {
	skipOnLayout(t, "its SQL locks every cursor row (FOR UPDATE over every shard), which Citus rejects")
	ctx := ctxT(t)
	c := open(t, manual)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p"}, queen.Item{Partition: "p"})
	msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 2})
	if err != nil || len(msgs) != 2 {
		t.Fatalf("Pop: %d messages, %v", len(msgs), err)
	}
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT * FROM "+pgx.Identifier{c.Schema(), "consumers"}.Sanitize()+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var holder int // the lock holder's backend: what the ack waits on, not another test's
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holder); err != nil {
		t.Fatal(err)
	}
	inline := queen.AckInline(c)
	short, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- msgs[0].Ack(short) }()
	waitFor(t, 20*time.Second, "an ack blocked on the cursor's lock", func() bool {
		var n int
		err := c.Pool().QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE '%ack_many%'",
			holder).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	cancel()
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Ack after its context ended: %v, want it committed", err)
	}
	if queen.AckInline(c) != inline+1 {
		t.Fatal("the ack did not commit inline")
	}
	// Committed: the lease's next message is all that is left.
	if err := msgs[0].Ack(ctx); !errors.Is(err, queen.ErrAlreadyAcked) {
		t.Fatalf("Ack again: %v, want ErrAlreadyAcked", err)
	}
	if err := msgs[1].Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
