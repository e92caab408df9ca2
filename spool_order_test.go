package queen_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// TestSpoolBufferedPushNotOvertaken: a push that timed out into the spool is
// not overtaken by a later push to the same partition: the later one queues
// behind it, and the partition ends in push order.
func TestSpoolBufferedPushNotOvertaken(t *testing.T) {
	c := open(t, manual, func(c *queen.Config) { c.StatementTimeout = lockTimeout })
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", TransactionID: "first"})
	release := lockPartition(t, c, "p")
	if r := push(t, q, queen.Item{Partition: "p", TransactionID: "A"})[0]; r.Status != queen.Buffered {
		t.Fatalf("%+v, want Buffered", r)
	}
	// Let the drain fail on the lock, so that it is backing off when the
	// next push comes.
	waitFor(t, time.Minute, "a failed drain pass", func() bool { return c.SpoolStats().DrainFailures >= 2 })
	release()
	push(t, q, queen.Item{Partition: "p", TransactionID: "B"})
	waitFor(t, 20*time.Second, "the drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	if got := txnIDs(storedFrames(t, c, "p")); fmt.Sprint(got) != "[first A B]" {
		t.Fatalf("partition p holds %v, want [first A B]", got)
	}
}

// TestSpoolOrderUnderMaintenanceToggles: one client's sequential pushes to
// one partition, while maintenance mode flips on and off and the drain
// replays between flips, are stored in push order, Buffered ones included.
func TestSpoolOrderUnderMaintenanceToggles(t *testing.T) {
	if testing.Short() {
		t.Skip("stress")
	}
	c := open(t, func(c *queen.Config) { c.StatementTimeout = time.Second })
	admin := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	q := c.Queue("q")
	ctx := ctxT(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for on := true; ; on = !on {
			select {
			case <-stop:
				_ = admin.SetMaintenance(ctx, false)
				return
			case <-time.After(time.Duration(20+rand.IntN(80)) * time.Millisecond):
			}
			_ = admin.SetMaintenance(ctx, on)
		}
	}()
	var want []string
	deadline := time.Now().Add(4 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		tx := fmt.Sprintf("t%04d", i)
		res, err := q.Push(ctx, []queen.Item{{Partition: "p", TransactionID: tx}})
		if err != nil {
			t.Fatal(err)
		}
		if s := res[0].Status; s == queen.Queued || s == queen.Buffered {
			want = append(want, tx)
		}
	}
	close(stop)
	<-done
	waitFor(t, 30*time.Second, "the drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	got := txnIDs(storedFrames(t, c, "p"))
	if fmt.Sprint(got) != fmt.Sprint(want) {
		for i := range min(len(got), len(want)) {
			if got[i] != want[i] {
				t.Fatalf("partition p differs from push order at %d: stored %v, pushed %v (%d stored, %d pushed)",
					i, got[i:min(i+5, len(got))], want[i:min(i+5, len(want))], len(got), len(want))
			}
		}
		t.Fatalf("stored %d, pushed %d", len(got), len(want))
	}
	t.Logf("%d pushes in order", len(want))
}
