package queen_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// Deletes racing with pushes to the same queue: once both are done, every
// stored row is reachable from a queue (the push recreated the queue
// consistently) or is gone with it. Rows of no partition are never visited
// by maintenance and would stay forever.
func TestQueueDeleteRacingPushesLeavesNoOrphans(t *testing.T) {
	c := open(t, manual)
	ctx := ctxT(t)
	q := c.Queue("q")
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				// Existing partitions and new ones (created by the push).
				items := []queen.Item{
					{Partition: fmt.Sprintf("k%d", i%4), Data: []byte("x")},
					{Partition: fmt.Sprintf("w%d-%d", w, i), Data: []byte("y")},
				}
				res, err := q.Push(ctx, items)
				if err != nil {
					errs <- err
					return
				}
				for _, r := range res {
					if r.Status == queen.Failed {
						errs <- r.Err
						return
					}
				}
			}
		}()
	}
	for range 200 {
		if err := q.Delete(ctx); err != nil {
			t.Errorf("Delete: %v", err)
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("push: %v", err)
	}

	s := pgx.Identifier{c.Schema()}.Sanitize()
	for _, check := range []struct{ what, sql string }{
		{"segments of no partition", "SELECT count(*) FROM " + s + ".segments x WHERE NOT EXISTS (SELECT 1 FROM " + s + ".partitions p WHERE p.id = x.partition_id)"},
		{"hash rows of no partition", "SELECT count(*) FROM " + s + ".txns x WHERE NOT EXISTS (SELECT 1 FROM " + s + ".partitions p WHERE p.id = x.partition_id)"},
		{"partitions of no queue", "SELECT count(*) FROM " + s + ".partitions x WHERE NOT EXISTS (SELECT 1 FROM " + s + ".queues q WHERE q.id = x.queue_id)"},
		{"consumers of no partition", "SELECT count(*) FROM " + s + ".consumers x WHERE NOT EXISTS (SELECT 1 FROM " + s + ".partitions p WHERE p.id = x.partition_id)"},
		{"segments past their partition's tail", "SELECT count(*) FROM " + s + ".segments x JOIN " + s + ".partitions p ON p.id = x.partition_id WHERE x.end_offset > p.last_offset"},
	} {
		var n int
		if err := c.Pool().QueryRow(ctx, check.sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d %s", n, check.what)
		}
	}
}
