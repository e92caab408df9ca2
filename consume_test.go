package queen_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// consumeUntil runs Consume until stop reports true (checked after each
// handled message) and returns Consume's error.
func consumeUntil(t testing.TB, q *queen.Queue, o queen.ConsumeOptions, fn func(ctx context.Context, m *queen.Message) error, stop func() bool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxT(t), 30*time.Second)
	defer cancel()
	return q.Consume(ctx, o, func(ctx context.Context, m *queen.Message) error {
		err := fn(ctx, m)
		if stop() {
			cancel()
		}
		return err
	})
}

func TestConsumeDrainsInOrder(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	for p := 0; p < 4; p++ {
		pushN(t, q, fmt.Sprintf("p%d", p), "m", 50)
	}
	var mu sync.Mutex
	seen := map[string][]int64{}
	count := 0
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Wait: 200 * time.Millisecond}, Concurrency: 4},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			seen[m.Partition] = append(seen[m.Partition], m.Offset)
			count++
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return count >= 200 })
	if err != nil {
		t.Fatal(err)
	}
	for p, offs := range seen {
		for i, o := range offs {
			if o != int64(i) {
				t.Fatalf("partition %s handled %v: not each once in order", p, offs)
			}
		}
		if len(offs) != 50 {
			t.Fatalf("partition %s: %d handled", p, len(offs))
		}
	}
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		if g := p.Groups[0]; g.Committed != 49 || g.Lag != 0 || g.Leased {
			t.Fatalf("partition %s after Consume: %+v", p.Name, g)
		}
	}
}

// A handler error fails the message: retried up to the budget, then
// dead-lettered; the rest of the batch is not handled twice.
func TestConsumeErrorFails(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 2, DeadLetter: true})
	pushN(t, q, "", "m", 4)
	var mu sync.Mutex
	handled := map[string]int{}
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Wait: 200 * time.Millisecond}},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			handled[string(m.Data)]++
			if string(m.Data) == "m1" {
				return errors.New("poison")
			}
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return handled["m3"] > 0 })
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(handled) != "map[m0:1 m1:2 m2:1 m3:1]" {
		t.Fatalf("handled %v", handled)
	}
	dl := deadLetters(t, q)
	if len(dl) != 1 || string(dl[0].Data) != "m1" || dl[0].Reason != "poison" {
		t.Fatalf("dead letters %+v", dl)
	}
}

// A handler running past half the lease keeps it: nobody else gets the
// partition, and the message is acked once.
func TestConsumeRenewsLease(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: 600 * time.Millisecond})
	pushN(t, q, "", "m", 1)
	var handled atomic.Int32
	var stolen atomic.Int32
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Wait: 100 * time.Millisecond}},
		func(ctx context.Context, m *queen.Message) error {
			handled.Add(1)
			for i := 0; i < 4; i++ {
				time.Sleep(400 * time.Millisecond)
				if got, err := q.Pop(ctx, queen.PopOptions{}); err != nil || len(got) != 0 {
					stolen.Add(1)
				}
			}
			return nil
		}, func() bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if handled.Load() != 1 || stolen.Load() != 0 {
		t.Fatalf("handled %d times, lease taken %d times", handled.Load(), stolen.Load())
	}
	if got := pop(t, q, queen.PopOptions{}); len(got) != 0 {
		t.Fatalf("acked message came back: %q", datas(got))
	}
}

// Stopping mid-batch: handled messages are acked once, the rest is released
// without a charge and handled by the next Consume.
func TestConsumeStopsCleanly(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: -1}) // any charge would drop
	pushN(t, q, "", "m", 10)
	var mu sync.Mutex
	handled := map[int64]int{}
	ctx, cancel := context.WithCancel(ctxT(t))
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}}, func(hctx context.Context, m *queen.Message) error {
		mu.Lock()
		handled[m.Offset]++
		mu.Unlock()
		if m.Offset == 3 {
			cancel()
			<-hctx.Done()
			return hctx.Err() // an error after ctx is done must not charge
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := q.Status(ctxT(t))
	if g := st.Partitions[0].Groups[0]; g.Committed != 2 || g.Leased {
		t.Fatalf("after stop: %+v", g)
	}
	err = consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 4, Wait: 100 * time.Millisecond}},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			handled[m.Offset]++
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return handled[9] > 0 })
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < 10; off++ {
		want := 1
		if off == 3 {
			want = 2 // its handler saw the stop and returned an error
		}
		if handled[off] != want {
			t.Fatalf("handled %v", handled)
		}
	}
}

// Concurrency partitions really run in parallel.
func TestConsumeConcurrency(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	for p := 0; p < 3; p++ {
		pushN(t, q, fmt.Sprintf("p%d", p), "m", 1)
	}
	var active, peak atomic.Int32
	var done atomic.Int32
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Wait: 100 * time.Millisecond}, Concurrency: 3},
		func(_ context.Context, m *queen.Message) error {
			n := active.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			for i := 0; i < 100 && peak.Load() < 3; i++ {
				time.Sleep(20 * time.Millisecond)
			}
			active.Add(-1)
			done.Add(1)
			return nil
		}, func() bool { return done.Load() >= 3 })
	if err != nil {
		t.Fatal(err)
	}
	if peak.Load() != 3 {
		t.Fatalf("peak concurrency %d, want 3", peak.Load())
	}
}

func TestConsumeAutoAck(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 5)
	var n atomic.Int32
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{AutoAck: true, Batch: 2, Wait: 100 * time.Millisecond}},
		func(context.Context, *queen.Message) error {
			n.Add(1)
			return errors.New("ignored")
		}, func() bool { return n.Load() >= 5 })
	if err != nil || n.Load() != 5 {
		t.Fatalf("Consume = %v after %d", err, n.Load())
	}
	if got := pop(t, q, queen.PopOptions{Batch: 10}); len(got) != 0 {
		t.Fatalf("auto-acked messages came back: %q", datas(got))
	}
}

func TestConsumeClosedClient(t *testing.T) {
	c := open(t)
	done := make(chan error, 1)
	go func() {
		done <- c.Queue("q").Consume(ctxT(t), queen.ConsumeOptions{}, func(context.Context, *queen.Message) error { return nil })
	}()
	time.Sleep(100 * time.Millisecond)
	if err := c.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, queen.ErrClosed) {
		t.Fatalf("Consume on close = %v, want ErrClosed", err)
	}
}

// BenchmarkConsumeDrain drains b.N messages (pushed beforehand, 10
// partitions) with Consume at batch 1000; reports msgs/s.
func BenchmarkConsumeDrain(b *testing.B) {
	for _, autoAck := range []bool{false, true} {
		b.Run(fmt.Sprintf("autoack=%v", autoAck), func(b *testing.B) {
			c := open(b)
			q := c.Queue("q")
			const parts = 10
			for p := 0; p < parts; p++ {
				left := b.N / parts
				for left > 0 {
					n := min(left, 1000)
					pushN(b, q, fmt.Sprintf("p%d", p), "m", n)
					left -= n
				}
			}
			total := (b.N / parts) * parts
			var n atomic.Int64
			b.ResetTimer()
			start := time.Now()
			err := consumeUntil(b, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 1000, AutoAck: autoAck, Wait: 50 * time.Millisecond}, Concurrency: 4},
				func(context.Context, *queen.Message) error { n.Add(1); return nil },
				func() bool { return n.Load() >= int64(total) })
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(total)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// A Consume worker whose lease was taken over while a handler ran (here by
// a direct update standing in for another consumer claiming after expiry)
// must not start handlers for the rest of that batch: the new holder is
// handling the same partition.
func TestConsumeStopsBatchWhenLeaseLost(t *testing.T) {
	var schema string
	c := open(t, func(cfg *queen.Config) { schema = cfg.Schema })
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: 300 * time.Millisecond})
	pushN(t, q, "p", "m", 3)
	var mu sync.Mutex
	var handled []int64
	ctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 3, Wait: 100 * time.Millisecond}},
			func(hctx context.Context, m *queen.Message) error {
				mu.Lock()
				handled = append(handled, m.Offset)
				first := len(handled) == 1
				mu.Unlock()
				if first {
					// Someone else now holds the partition.
					_, err := c.Pool().Exec(hctx, fmt.Sprintf(`UPDATE %q.consumers SET lease_id = gen_random_uuid(),
						lease_expires_at = now() + interval '1 hour'`, schema))
					if err != nil {
						t.Error(err)
					}
					time.Sleep(400 * time.Millisecond) // past the lease and a renewal attempt
				}
				return nil
			})
	}()
	time.Sleep(1500 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(handled) != 1 {
		t.Fatalf("handled offsets %v under a lease that was taken over; want only the first", handled)
	}
}
