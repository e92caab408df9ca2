package queen_test

import (
	"context"
	"sync"
	"testing"

	"github.com/e03140bc/queen"
)

// An AutoAck Consume with several workers handles one partition's messages
// in offset order, as any Consume does. AutoAck holds no lease, so two
// claims in flight can take consecutive batches of the same partition; the
// later one must not start first.
func TestAutoAckConsumeKeepsPartitionOrder(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	const n = 20000
	for i := 0; i < n; i += 1000 {
		pushN(t, q, "p", "m", 1000)
	}
	var mu sync.Mutex
	var offs []int64
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, AutoAck: true}, Concurrency: 8},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			offs = append(offs, m.Offset)
			mu.Unlock()
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(offs) >= n })
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(offs); i++ {
		if offs[i] <= offs[i-1] {
			t.Fatalf("offset %d handled after %d (the %d-th handler call)", offs[i], offs[i-1], i+1)
		}
	}
}
