package queen_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// claimTracer counts the claims (pop_v2) a pool runs and, while armed,
// holds one claim's return until release is closed: the claim is then in
// flight, its snapshot taken, for as long as the test needs.
type claimTracer struct {
	claims  atomic.Int64 // started
	ended   atomic.Int64
	mu      sync.Mutex
	armed   bool
	held    chan struct{} // closed once a claim is held
	release chan struct{}
}

func (c *claimTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, sqlPop) {
		c.claims.Add(1)
		return context.WithValue(ctx, claimTracer{}, true)
	}
	return ctx
}

func (c *claimTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(claimTracer{}) == nil {
		return
	}
	defer c.ended.Add(1)
	c.mu.Lock()
	armed := c.armed
	c.armed = false
	c.mu.Unlock()
	if armed {
		close(c.held)
		<-c.release
	}
}

// quiet waits until no claim is in flight and none started for d.
func (c *claimTracer) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for n := c.claims.Load(); time.Now().Before(deadline); {
		time.Sleep(d)
		m := c.claims.Load()
		if m == n && c.ended.Load() == m {
			return
		}
		n = m
	}
	t.Fatal("claims never stopped")
}

// arm makes the next claim to end wait for release.
func (c *claimTracer) arm() {
	c.mu.Lock()
	c.armed, c.held, c.release = true, make(chan struct{}), make(chan struct{})
	c.mu.Unlock()
}

func claimTracedClient(t *testing.T) (*queen.Client, *claimTracer) {
	t.Helper()
	tr := &claimTracer{}
	pool := tracedPool(t, tr)
	// No rescan within the test: only wakes make Consume claim.
	return open(t, manual, queen.PopRescan(time.Hour), func(c *queen.Config) { c.Pool = pool }), tr
}

// A push wakes a Consume of the same client once: the database's
// notification of it, coming back to the process that pushed, does not
// wake the fetch loop again for a claim that finds nothing. With a worker
// free and the one message in hand, each wake would claim.
func TestConsumeOwnPushClaimsOnce(t *testing.T) {
	ctx := ctxT(t)
	c, tr := claimTracedClient(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p"})
	ack(t, pop(t, q, queen.PopOptions{})[0]) // the queue and the group exist
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(cctx, queen.ConsumeOptions{Concurrency: 2}, func(context.Context, *queen.Message) error {
			started <- struct{}{}
			<-release
			return nil
		})
	}()
	tr.quiet(t, 300*time.Millisecond) // the first claims, on nothing, are done
	before := tr.claims.Load()
	push(t, q, queen.Item{Partition: "p"})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the push was not handled")
	}
	time.Sleep(300 * time.Millisecond) // the notification has come back
	n := tr.claims.Load() - before
	close(release)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d claims for one push, want 1", n)
	}
}

// A message pushed while a claim is in flight, after that claim's snapshot,
// is delivered at once: the push's wake waits for the claim to return and
// makes the fetch loop claim again (the rescan is an hour).
func TestConsumePushDuringClaimDelivered(t *testing.T) {
	ctx := ctxT(t)
	c, tr := claimTracedClient(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p"})
	ack(t, pop(t, q, queen.PopOptions{})[0])
	for _, conc := range []int{1, 2} {
		got := make(chan string, 8)
		cctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		// The first claim, on nothing, is held until the push committed.
		tr.arm()
		held := tr.held
		go func() {
			done <- q.Consume(cctx, queen.ConsumeOptions{Concurrency: conc}, func(_ context.Context, m *queen.Message) error {
				got <- string(m.Data)
				return nil
			})
		}()
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("no claim")
		}
		push(t, q, queen.Item{Partition: "p", Data: []byte("during")})
		pushed := time.Now()
		close(tr.release)
		select {
		case d := <-got:
			if d != "during" {
				t.Fatalf("Concurrency %d: handled %q", conc, d)
			}
			t.Logf("Concurrency %d: handled %s after the push", conc, time.Since(pushed))
		case <-time.After(10 * time.Second):
			t.Fatalf("Concurrency %d: the message pushed during the claim was not delivered", conc)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
