package settle

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/internal/stmt"
)

// blackhole accepts connections and never answers, as a database behind a
// dead network path does: a connect waits until its context ends.
func blackhole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return "postgres://u@" + ln.Addr().String() + "/db?sslmode=disable&connect_timeout=600"
}

// A settlement's wait is bounded by Timeout however many settlements queue
// ahead of it: while the database does not answer, every flush of a shard
// takes Timeout to fail, and more than BundleMax settlements waiting on one
// shard used to wait out one failing flush after another — a stopping
// Consume then did not return for tens of seconds.
func TestSettleWaitBoundedWhileDatabaseHangs(t *testing.T) {
	pool, err := pgxpool.New(context.Background(), blackhole(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const timeout = 3 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := New(ctx, Config{Pool: pool, SQL: stmt.NewConsume("q"), Hold: time.Millisecond, Timeout: timeout})
	defer func() {
		// Close flushes what is still queued: cut it short.
		cctx, ccancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer ccancel()
		_ = f.Close(cctx)
	}()

	n := 16 * BundleMax
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	errs := 0
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			// A partition each: more keys than a bundle takes on each shard.
			op := Op{Settle: stmt.SettleParams{Lease: stmt.Lease{Partition: int64(i), Group: "g", ID: uuid.Must(uuid.NewV4())}, Through: int64(i)}}
			t0 := time.Now()
			res, err := f.Settle(context.Background(), []Op{op})
			d := time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, d)
			if err != nil || res[0].Err != nil {
				errs++
			}
		})
	}
	wg.Wait()
	if errs != n {
		t.Fatalf("%d of %d settlements failed, want all: the database never answered", errs, n)
	}
	// Bound: the flush in flight when it arrived, then its own; generous
	// for a loaded machine, and well under the 8 flushes in a row per shard that 16 bundles make.
	if limit := 4 * timeout; slowest > limit {
		t.Fatalf("slowest settlement waited %v (all done in %v), want at most %v with Timeout %v", slowest, time.Since(start), limit, timeout)
	}
}
