package queen_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// A spool write that outlasts the push's deadline is still written and
// replayed: the item must not be reported Failed, which promises it is
// not stored.
func TestSlowSpoolWriteIsNotFailed(t *testing.T) {
	var slow atomic.Bool
	c := open(t, queen.SlowSpoolWrites(&slow), func(c *queen.Config) { c.SpoolDir = t.TempDir() })
	ctx := ctxT(t)
	q := withWindow(t, c, "q")
	if err := c.SetMaintenance(ctx, true); err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	res, err := q.Push(ctx, []queen.Item{{TransactionID: "a", Key: "k", Data: []byte("A")}})
	slow.Store(false)
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if err := c.SetMaintenance(ctx, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the spool to drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	got := drainAll(t, q)
	if r.Status == queen.Failed && len(got) > 0 {
		t.Fatalf("push reported %s (%v), yet %v is stored", r.Status, r.Err, got)
	}
	if r.Status != queen.Buffered || got[r.MessageID] != "A" {
		t.Fatalf("result %+v, stored %v; want Buffered and stored", r, got)
	}
}
