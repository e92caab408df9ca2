package queen_test

import (
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// Once the dedup window has passed, the same transaction id is accepted
// again as a new message.
func TestDedupWindowExpires(t *testing.T) {
	c := open(t, manual)
	inWindow(t, 300*time.Millisecond, func(name string, window time.Duration) bool {
		q := c.Queue(name)
		if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: window}); err != nil {
			t.Fatal(err)
		}
		start := time.Now() // no later than the first push's created_at
		first := push(t, q, queen.Item{TransactionID: "job-7"})[0]
		r := push(t, q, queen.Item{TransactionID: "job-7"})[0]
		if time.Since(start) >= window {
			return false
		}
		if r.Status != queen.Duplicate || r.MessageID != first.MessageID {
			t.Fatalf("inside the window: %+v", r)
		}
		time.Sleep(window + 100*time.Millisecond)
		r = push(t, q, queen.Item{TransactionID: "job-7"})[0]
		if r.Status != queen.Queued || r.MessageID == first.MessageID || r.Offset != 1 {
			t.Fatalf("after the window: %+v, want Queued with a new id at offset 1", r)
		}
		return true
	})
}

// The key-scope footgun: the idempotency key must name the effect, not the
// entity. Keyed "migrate:tenant:version", v2 is not suppressed by v1; keyed
// "migrate:tenant", it would be.
func TestDedupKeyScopeFootgun(t *testing.T) {
	c := open(t, manual)
	q := c.Queue("migrations")
	if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}
	v1 := push(t, q, queen.Item{Partition: "tenant-9", TransactionID: "migrate:tenant-9:v1", Data: []byte(`{"version":1}`)})[0]
	v2 := push(t, q, queen.Item{Partition: "tenant-9", TransactionID: "migrate:tenant-9:v2", Data: []byte(`{"version":2}`)})[0]
	if v1.Status != queen.Queued || v2.Status != queen.Queued {
		t.Fatalf("effect-scoped keys: v1 %s, v2 %s; want both Queued", v1.Status, v2.Status)
	}
	// The wrong key: v2 keyed on the entity is swallowed as a duplicate of v1.
	push(t, q, queen.Item{Partition: "tenant-10", TransactionID: "migrate:tenant-10", Data: []byte(`{"version":1}`)})
	bad := push(t, q, queen.Item{Partition: "tenant-10", TransactionID: "migrate:tenant-10", Data: []byte(`{"version":2}`)})[0]
	if bad.Status != queen.Duplicate {
		t.Fatalf("entity-scoped key: %s; the footgun this test documents is gone?", bad.Status)
	}
}
