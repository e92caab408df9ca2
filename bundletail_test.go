package queen_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// Layer-2 dedup holds for a flush's whole batch: two calls repeating a
// transaction id that meet in one flush are one message even when the
// second does not fit the bundle (MaxBundleBytes) and waits for the next
// one, on a queue without a DedupWindow.
func TestPushLayer2FollowerInDeferredTail(t *testing.T) {
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = slowTracer{d: 200 * time.Millisecond}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := open(t, queen.MaxBundleBytes(3<<19), // one of the two payloads
		func(c *queen.Config) { c.Pool = pool; c.Fusion.Shards = 1 })
	q := c.Queue("q")
	push(t, q, queen.Item{}) // creates the queue; caches its options
	first := make(chan struct{})
	go func() {
		defer close(first)
		if _, err := q.Push(ctx, []queen.Item{{TransactionID: "holder"}}); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(50 * time.Millisecond) // "holder" is in flight now
	payload := randomPayload(t, 1<<20)
	res := make([]queen.PushResult, 2)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() {
			r, err := q.Push(ctx, []queen.Item{{TransactionID: "same", Data: payload}})
			if err != nil {
				t.Error(err)
				return
			}
			res[i] = r[0]
		})
	}
	wg.Wait()
	<-first
	stored := 0
	for _, f := range storedFrames(t, c, "Default") {
		if f.TransactionID == "same" {
			stored++
		}
	}
	if stored != 1 {
		t.Fatalf("transaction id \"same\" stored %d times, want once (results %s and %s)", stored, res[0].Status, res[1].Status)
	}
	if res[0].MessageID != res[1].MessageID || (res[0].Status == queen.Queued) == (res[1].Status == queen.Queued) {
		t.Fatalf("want one Queued and one Duplicate of it: %+v", res)
	}
}
