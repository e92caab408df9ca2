package queen_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// Push benchmarks. They run on the shared test cluster, which has fsync off
// unless QUEEN_TEST_FSYNC=on:
//
//	QUEEN_TEST_FSYNC=on go test -run x -bench Push -benchtime 5s .
//
// examples/pushbench prints the same scenarios with latency percentiles and
// a single-row INSERT baseline from the same run.

var benchPayload = func() []byte {
	p := []byte(`{"event":"order.created","id":123456,"customer":"c-000042","items":[{"sku":"tea-01","qty":2}],"note":"leave it at the door"}`)
	for len(p) < 200 {
		p = append(p, ' ')
	}
	return p
}()

func reportRate(b *testing.B, msgs int) {
	b.ReportMetric(float64(msgs)/b.Elapsed().Seconds(), "msgs/s")
}

// One push at a time: the latency of an idle push (one round trip).
func BenchmarkPushIdle(b *testing.B) {
	q := open(b).Queue("idle")
	ctx := context.Background()
	items := []queen.Item{{Data: benchPayload}}
	b.ResetTimer()
	for b.Loop() {
		if _, err := q.Push(ctx, items); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, b.N)
}

// Single-item pushes from 1000 goroutines over 100 partitions.
func BenchmarkPushSingle1000Goroutines(b *testing.B) {
	q := open(b).Queue("single")
	ctx := context.Background()
	b.SetParallelism(1000 / max(1, runtimeProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			items := []queen.Item{{Data: benchPayload, Partition: fmt.Sprintf("p%d", rand.IntN(100))}}
			if _, err := q.Push(ctx, items); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b, b.N)
}

// 1000-item pushes of 200-byte payloads from 8 goroutines.
func BenchmarkPushBatch1000Items8Goroutines(b *testing.B) {
	q := open(b).Queue("batch")
	ctx := context.Background()
	b.SetParallelism(8 / max(1, runtimeProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		items := make([]queen.Item, 1000)
		for pb.Next() {
			part := fmt.Sprintf("p%d", rand.IntN(100))
			for i := range items {
				items[i] = queen.Item{Data: benchPayload, Partition: part}
			}
			if _, err := q.Push(ctx, items); err != nil {
				b.Error(err)
				return
			}
		}
	})
	reportRate(b, b.N*1000)
}

// Per-message acks from 100 consumers over 100 partitions: every message is
// acked on its own (Message.Ack), and ack fusion folds the acks of all
// consumers into shared transactions. Pop1: each pop takes one message
// (claim fusion folds the pops); Pop100: up to 100 of one partition.
func BenchmarkAckPerMessage100Consumers(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("Pop%d", batch), func(b *testing.B) { benchAckPerMessage(b, batch) })
	}
}

func benchAckPerMessage(b *testing.B, batch int) {
	c := open(b)
	q := c.Queue("acks")
	ctx := context.Background()
	const parts = 100
	per := max(b.N/parts, 1)
	items := make([]queen.Item, 0, 1000)
	for p := range parts {
		for left := per; left > 0; {
			n := min(left, 1000)
			items = items[:0]
			for range n {
				items = append(items, queen.Item{Data: benchPayload, Partition: fmt.Sprintf("p%d", p)})
			}
			if _, err := q.Push(ctx, items); err != nil {
				b.Fatal(err)
			}
			left -= n
		}
	}
	total := int64(per * parts)
	var acked atomic.Int64
	before := c.Stats()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			for acked.Load() < total {
				msgs, err := q.Pop(ctx, queen.PopOptions{Batch: batch, Wait: 20 * time.Millisecond})
				if err != nil {
					b.Error(err)
					return
				}
				for _, m := range msgs {
					if err := m.Ack(ctx); err != nil {
						b.Error(err)
						return
					}
					acked.Add(1)
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	reportRate(b, int(total))
	after := c.Stats()
	b.ReportMetric(float64(after.Pops-before.Pops)/float64(max(after.Claims-before.Claims, 1)), "pops/claim")
	b.ReportMetric(float64(after.Acks-before.Acks)/float64(max(after.AckCommits-before.AckCommits, 1)), "acks/commit")
}

// One pop at a time of one message with AutoAck, from a backlog on one
// partition: the claim's fixed cost, where a check on the claim path (the
// pause probe) would show.
func BenchmarkPopOneAutoAck(b *testing.B) {
	q := open(b).Queue("pop")
	ctx := context.Background()
	items := make([]queen.Item, 1000)
	for i := range items {
		items[i] = queen.Item{Partition: "p", Data: benchPayload}
	}
	for range b.N/len(items) + 1 {
		if _, err := q.Push(ctx, items); err != nil {
			b.Fatal(err)
		}
	}
	o := queen.PopOptions{Partition: "p", AutoAck: true}
	b.ResetTimer()
	for range b.N {
		msgs, err := q.Pop(ctx, o)
		if err != nil || len(msgs) != 1 {
			b.Fatalf("pop: %d, %v", len(msgs), err)
		}
	}
	reportRate(b, b.N)
}

// An empty pop (nothing ready) of a queue with 100 drained partitions: a
// consumer's idle claim.
func BenchmarkPopEmpty(b *testing.B) {
	q := open(b).Queue("empty")
	ctx := context.Background()
	items := make([]queen.Item, 100)
	for i := range items {
		items[i] = queen.Item{Partition: fmt.Sprint("p", i), Data: benchPayload}
	}
	if _, err := q.Push(ctx, items); err != nil {
		b.Fatal(err)
	}
	if _, err := q.Pop(ctx, queen.PopOptions{AutoAck: true, Batch: 1000, Partitions: 100}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if msgs, err := q.Pop(ctx, queen.PopOptions{}); err != nil || len(msgs) != 0 {
			b.Fatalf("pop: %d, %v", len(msgs), err)
		}
	}
	reportRate(b, b.N)
}

// 1000-item pushes from 8 goroutines whose items spread over many
// partitions: Spread10 puts 10 items in each of 100 partitions per push
// (mixed keys), Spread1 one item in each of 1000 consecutive partitions of
// 100,000 (a partition per key). Each partition of a flush pays its own
// segment, so these measure the per-segment cost. Spread10Window is
// Spread10 to a queue with a one-minute dedup window: each segment's
// probe reads its partition's window.
func BenchmarkPushSpread(b *testing.B) {
	for _, c := range []struct {
		name       string
		per, parts int
		window     time.Duration
	}{{"Spread10", 10, 100, 0}, {"Spread1", 1, 10_000, 0}, {"Spread10Window", 10, 100, time.Minute}} {
		b.Run(c.name, func(b *testing.B) {
			q := open(b).Queue("spread")
			ctx := context.Background()
			if c.window > 0 {
				if err := q.Configure(ctx, queen.QueueOptions{DedupWindow: c.window}); err != nil {
					b.Fatal(err)
				}
			}
			names := make([]string, c.parts)
			for i := range names {
				names[i] = fmt.Sprintf("k%d", i)
			}
			var next atomic.Int64
			b.SetParallelism(8 / max(1, runtimeProcs()))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				items := make([]queen.Item, 1000)
				for pb.Next() {
					first := int(next.Add(1)-1) * 1000 / c.per
					for i := range items {
						items[i] = queen.Item{Data: benchPayload, Partition: names[(first+i/c.per)%c.parts]}
					}
					if _, err := q.Push(ctx, items); err != nil {
						b.Error(err)
						return
					}
				}
			})
			reportRate(b, b.N*1000)
		})
	}
}
