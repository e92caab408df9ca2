package queen_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// goid is the current goroutine's id, from its stack header.
func goid() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	id, _ := strconv.ParseUint(strings.Fields(string(buf[:n]))[1], 10, 64)
	return id
}

// goroutineTracer records the goroutine each statement started on, and
// the pipeline (batch) it was sent in: batch numbers from 1, 0 for a
// statement sent alone.
type goroutineTracer struct {
	mu      sync.Mutex
	ids     []uint64
	sql     []string
	batch   []int
	batches int
}

type batchKey struct{}

func (g *goroutineTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	g.mu.Lock()
	g.ids = append(g.ids, goid())
	g.sql = append(g.sql, d.SQL)
	g.batch = append(g.batch, 0)
	g.mu.Unlock()
	return ctx
}
func (g *goroutineTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The batch's statements (a push with its take, push_take) are recorded
// as they are read.
func (g *goroutineTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	g.mu.Lock()
	g.batches++
	n := g.batches
	g.mu.Unlock()
	return context.WithValue(ctx, batchKey{}, n)
}
func (g *goroutineTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	n, _ := ctx.Value(batchKey{}).(int)
	g.mu.Lock()
	g.ids = append(g.ids, goid())
	g.sql = append(g.sql, d.SQL)
	g.batch = append(g.batch, n)
	g.mu.Unlock()
}
func (g *goroutineTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// An idle push commits on the pushing goroutine: its statement starts
// there, with no hand-off to the fusion engine's goroutines.
func TestPushIdleRunsOnCallersGoroutine(t *testing.T) {
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := &goroutineTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := open(t, manual, func(c *queen.Config) { c.Pool = pool })
	q := c.Queue("q")
	push(t, q, queen.Item{}) // creates the queue and caches its options
	inline := queen.FusionInline(c)
	me := goid()
	for i := range 5 {
		tr.mu.Lock()
		from := len(tr.ids)
		tr.mu.Unlock()
		res, err := q.Push(ctx, []queen.Item{{Data: []byte("idle")}})
		if err != nil || res[0].Status != queen.Queued {
			t.Fatalf("%v %+v", err, res)
		}
		tr.mu.Lock()
		pushes := 0
		for k := from; k < len(tr.ids); k++ {
			if strings.Contains(tr.sql[k], "segments") || strings.Contains(tr.sql[k], "push_") {
				pushes++
				if tr.ids[k] != me {
					t.Errorf("push %d: %.40q ran on goroutine %d, the caller is %d", i, tr.sql[k], tr.ids[k], me)
				}
			}
		}
		tr.mu.Unlock()
		if pushes != 1 {
			t.Fatalf("push %d ran %d push statements, want 1", i, pushes)
		}
	}
	if n := queen.FusionInline(c) - inline; n != 5 {
		t.Fatalf("%d of 5 idle pushes flushed inline", n)
	}
}

// A caller whose context ends during its inline flush is treated as an
// INSERT's would be: Push returns the context's error at once, with an
// unknown outcome, and nothing is spooled or taken for an outage; pushing
// again with the same transaction id on a queue with a DedupWindow tells
// whether it was stored.
func TestPushCancelledDuringInlineFlushIsLikeAnInsert(t *testing.T) {
	skipOnLayout(t, "its SQL locks every partitions row, a row lock over every shard, which Citus rejects")
	ctx := ctxT(t)
	c := open(t, manual)
	q := c.Queue("q")
	if err := q.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Data: []byte("first")})

	blocker, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(context.Background())
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT * FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	inline := queen.FusionInline(c)
	short, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	item := queen.Item{TransactionID: "order-2", Data: []byte("second")}
	go func() {
		res, err := q.Push(short, []queen.Item{item})
		if err == nil {
			err = fmt.Errorf("results %+v", res)
		}
		done <- err
	}()
	waitForBlockedPush(t, c)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Push: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Push still waits for its statement after its context ended")
	}
	if queen.FusionInline(c) != inline+1 {
		t.Fatal("the push did not flush inline")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Not an outage: the next push is stored, not spooled.
	if r := push(t, q, queen.Item{Data: []byte("third")}); r[0].Status != queen.Queued {
		t.Fatalf("push after a caller gave up: %+v, want Queued", r[0])
	}
	// The retry tells: stored once, whether the cancelled push got in or not.
	r := push(t, q, item)
	if r[0].Status != queen.Queued && r[0].Status != queen.Duplicate {
		t.Fatalf("retry: %+v", r[0])
	}
	if n := countRows(t, c, "segments"); n != 3 {
		t.Fatalf("%d segments stored, want 3 (first, third, and order-2 once)", n)
	}
}

// Pushers that go idle and busy in turn over two partitions, on one client:
// each pusher's messages are stored in push order per partition, and each
// exactly once.
func TestPushOrderAcrossIdleTransitions(t *testing.T) {
	ctx := ctxT(t)
	c := open(t, manual)
	q := c.Queue("q")
	const pushers, each = 6, 40
	var wg sync.WaitGroup
	for g := range pushers {
		wg.Go(func() {
			for i := range each {
				part := fmt.Sprintf("p%d", (g+i)%2)
				if _, err := q.Push(ctx, []queen.Item{{Partition: part, Data: fmt.Appendf(nil, "%d/%d", g, i)}}); err != nil {
					t.Error(err)
					return
				}
				if rand.IntN(4) == 0 {
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				}
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, part := range []string{"p0", "p1"} {
		msgs, err := q.Peek(ctx, queen.PeekOptions{Partition: part, Limit: pushers * each})
		if err != nil {
			t.Fatal(err)
		}
		last := map[int]int{}
		for _, m := range msgs {
			var g, i int
			if _, err := fmt.Sscanf(string(m.Data), "%d/%d", &g, &i); err != nil {
				t.Fatal(err)
			}
			if l, ok := last[g]; ok && i <= l {
				t.Fatalf("%s: pusher %d's push %d stored after its push %d", part, g, i, l)
			}
			last[g] = i
			if seen[string(m.Data)] {
				t.Fatalf("%s stored twice", m.Data)
			}
			seen[string(m.Data)] = true
		}
	}
	if len(seen) != pushers*each {
		t.Fatalf("%d messages stored, want %d", len(seen), pushers*each)
	}
	t.Logf("%d of %d pushes flushed inline", queen.FusionInline(c), pushers*each)
}
