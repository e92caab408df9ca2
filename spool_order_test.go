package queen_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// TestSpoolBufferedPushNotOvertaken: a push that timed out into the spool is
// not overtaken by a later push to the same partition: the later one queues
// behind it, and the partition ends in push order.
func TestSpoolBufferedPushNotOvertaken(t *testing.T) {
	c := open(t, manual, func(c *queen.Config) { c.StatementTimeout = 300 * time.Millisecond })
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", TransactionID: "first"})
	release := lockPartition(t, c, "p")
	if r := push(t, q, queen.Item{Partition: "p", TransactionID: "A"})[0]; r.Status != queen.Buffered {
		t.Fatalf("%+v, want Buffered", r)
	}
	// Let the drain fail on the lock, so that it is backing off when the
	// next push comes.
	waitFor(t, 10*time.Second, "a failed drain pass", func() bool { return c.SpoolStats().DrainFailures >= 2 })
	release()
	push(t, q, queen.Item{Partition: "p", TransactionID: "B"})
	waitFor(t, 20*time.Second, "the drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	if got := txnIDs(storedFrames(t, c, "p")); fmt.Sprint(got) != "[first A B]" {
		t.Fatalf("partition p holds %v, want [first A B]", got)
	}
}
