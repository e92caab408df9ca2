package queen_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
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
	skipOnLayout(t, "its SQL steals the lease with gen_random_uuid() in an UPDATE, which Citus rejects")
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

// A panicking handler is recovered: the process and the other partitions
// keep going, the message is failed (charged), comes back with Attempt 2,
// and at the retry limit its dead letter names ErrPanic.
func TestConsumeRecoversHandlerPanic(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 2, DeadLetter: true})
	pushN(t, q, "bad", "b", 1)
	pushN(t, q, "good", "g", 3)
	var mu sync.Mutex
	var badAttempts []int
	good := 0
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Wait: 100 * time.Millisecond}, Concurrency: 2},
			func(_ context.Context, m *queen.Message) error {
				mu.Lock()
				defer mu.Unlock()
				if m.Partition == "bad" {
					badAttempts = append(badAttempts, m.Attempt)
					panic("boom")
				}
				good++
				return nil
			})
	}()
	waitFor(t, 20*time.Second, "the dead letter", func() bool { return len(deadLetters(t, q)) == 1 })
	waitFor(t, 20*time.Second, "the good partition", func() bool { mu.Lock(); defer mu.Unlock(); return good == 3 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(badAttempts) != "[1 2]" {
		t.Fatalf("panicking message delivered with attempts %v, want [1 2]", badAttempts)
	}
	dl := deadLetters(t, q)
	if !strings.Contains(dl[0].Reason, queen.ErrPanic.Error()) || !strings.Contains(dl[0].Reason, "boom") {
		t.Fatalf("dead-letter reason %q does not name ErrPanic and the panic value", dl[0].Reason)
	}
}

// HandlerTimeout is each message's deadline: a handler that runs past it
// fails the message (charged), here straight to the dead-letter store.
func TestConsumeHandlerTimeoutFails(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 1, DeadLetter: true})
	pushN(t, q, "", "m", 2)
	var mu sync.Mutex
	var handled []string
	var sawDeadline bool
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 2}, HandlerTimeout: 100 * time.Millisecond},
			func(hctx context.Context, m *queen.Message) error {
				mu.Lock()
				handled = append(handled, string(m.Data))
				mu.Unlock()
				if string(m.Data) == "m0" {
					_, ok := hctx.Deadline()
					<-hctx.Done()
					mu.Lock()
					sawDeadline = ok && errors.Is(hctx.Err(), context.DeadlineExceeded)
					mu.Unlock()
					return hctx.Err()
				}
				return nil
			})
	}()
	waitFor(t, 20*time.Second, "m1 handled", func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !sawDeadline || fmt.Sprint(handled) != "[m0 m1]" {
		t.Fatalf("handled %v, deadline seen %v", handled, sawDeadline)
	}
	dl := deadLetters(t, q)
	if len(dl) != 1 || string(dl[0].Data) != "m0" || !strings.Contains(dl[0].Reason, "deadline exceeded") {
		t.Fatalf("dead letters %+v", dl)
	}
}

// Negative durations and concurrency are refused at once, before anything
// is claimed.
func TestConsumeRejectsBadOptions(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 1)
	for _, o := range []queen.ConsumeOptions{
		{SoftStop: -time.Second},
		{HandlerTimeout: -time.Second},
		{Concurrency: -1},
		{KeyConcurrency: -1},
	} {
		err := q.Consume(ctxT(t), o, func(context.Context, *queen.Message) error {
			t.Error("handler called")
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "negative") {
			t.Fatalf("Consume(%+v) = %v, want an error about a negative option", o, err)
		}
	}
	got := pop(t, q, queen.PopOptions{})
	if len(got) != 1 || got[0].Attempt != 1 {
		t.Fatalf("after refused Consume calls: %d messages, want the untouched one", len(got))
	}
}

// With SoftStop, a handler running when Consume's ctx ends keeps an
// uncancelled context; what it finishes is acked, and the unstarted rest of
// its batch is released at once, uncharged: another client (lease 1h)
// takes it immediately, on its first attempt.
func TestConsumeSoftStopLetsRunningHandlerFinish(t *testing.T) {
	a, b, _ := openPair(t)
	qa := configure(t, a, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, qa, "p", "m", 2)
	started := make(chan context.Context, 1)
	release := make(chan struct{})
	var handled atomic.Int32
	var errAtEnd atomic.Value
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- qa.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 2}, SoftStop: time.Minute},
			func(hctx context.Context, m *queen.Message) error {
				handled.Add(1)
				started <- hctx
				<-release
				errAtEnd.Store(fmt.Sprint(hctx.Err()))
				return nil
			})
	}()
	hctx := <-started
	cancel()
	select {
	case <-hctx.Done():
		t.Fatal("the running handler's context was cancelled before SoftStop passed")
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if handled.Load() != 1 || errAtEnd.Load() != "<nil>" {
		t.Fatalf("handled %d, handler context at its end: %v", handled.Load(), errAtEnd.Load())
	}
	got := pop(t, b.Queue("q"), queen.PopOptions{Batch: 2})
	if len(got) != 1 || string(got[0].Data) != "m1" || got[0].Attempt != 1 {
		t.Fatalf("second client popped %q (attempt %v), want m1 on attempt 1", datas(got), attempts(got))
	}
}

// A handler interrupted by the end of SoftStop (its context is cancelled
// and it returns that error) is not charged: another client (lease 1h)
// takes the message at once, on attempt 1.
func TestConsumeShutdownReleasesInterruptedMessage(t *testing.T) {
	for _, soft := range []time.Duration{0, 100 * time.Millisecond} {
		t.Run(fmt.Sprint("softstop=", soft), func(t *testing.T) {
			a, b, _ := openPair(t)
			qa := configure(t, a, "q", queen.QueueOptions{LeaseTime: time.Hour, RetryLimit: 1})
			pushN(t, qa, "p", "m", 2)
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			err := qa.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 2}, SoftStop: soft},
				func(hctx context.Context, m *queen.Message) error {
					cancel()
					<-hctx.Done()
					return hctx.Err()
				})
			if err != nil {
				t.Fatal(err)
			}
			got := pop(t, b.Queue("q"), queen.PopOptions{Batch: 2})
			if fmt.Sprint(datas(got), attempts(got)) != "[m0 m1] [1 1]" {
				t.Fatalf("second client popped %q on attempts %v, want [m0 m1] on [1 1]", datas(got), attempts(got))
			}
		})
	}
}

func attempts(msgs []*queen.Message) []int {
	out := make([]int, len(msgs))
	for i, m := range msgs {
		out[i] = m.Attempt
	}
	return out
}

// Close stops a running Consume: the handler's context is cancelled, the
// message it was interrupted on is handed back uncharged (another client,
// lease 1h, takes it at once on attempt 1), Consume returns ErrClosed,
// Close returns within its ctx, and no goroutine is left behind.
func TestCloseStopsRunningConsume(t *testing.T) {
	before := goleak.IgnoreCurrent()
	a, b, _ := openPair(t)
	qa := configure(t, a, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, qa, "p", "m", 2)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- qa.Consume(ctxT(t), queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 2}},
			func(hctx context.Context, m *queen.Message) error {
				close(started)
				<-hctx.Done()
				return hctx.Err()
			})
	}()
	<-started
	cctx, cancel := context.WithTimeout(ctxT(t), 10*time.Second)
	defer cancel()
	if err := a.Close(cctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Close returns once the Consume call is done with everything; its
	// return to this goroutine's caller is a step of its own.
	select {
	case err := <-done:
		if !errors.Is(err, queen.ErrClosed) {
			t.Fatalf("Consume = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Consume still running after Close returned")
	}
	got := pop(t, b.Queue("q"), queen.PopOptions{Batch: 2})
	if fmt.Sprint(datas(got), attempts(got)) != "[m0 m1] [1 1]" {
		t.Fatalf("second client popped %q on attempts %v, want [m0 m1] on [1 1]", datas(got), attempts(got))
	}
	if err := b.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before)
}

// A handler that ignores its context cannot hold Close past Close's ctx.
func TestCloseReturnsWithinCtxDespiteStuckHandler(t *testing.T) {
	// Not open(): this Close is expected to report its ctx.
	c, err := queen.Open(ctxT(t), queen.Config{
		DatabaseURL: pgtest.URL(t), Schema: pgtest.Schema(t), Logger: pgtest.Logger(t), SpoolDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	q := c.Queue("q")
	pushN(t, q, "p", "m", 1)
	started := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctxT(t), queen.ConsumeOptions{SoftStop: time.Hour},
			func(context.Context, *queen.Message) error {
				close(started)
				<-release
				return nil
			})
	}()
	<-started
	cctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := c.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close = %v, want its ctx's error: a handler did not finish", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("Close took %s with a 300ms ctx", d)
	}
	close(release)
	if err := <-done; !errors.Is(err, queen.ErrClosed) {
		t.Fatalf("Consume = %v, want ErrClosed", err)
	}
}

// Four Consume calls (two per client) over 100 partitions: no partition is
// ever handled by two handlers at once, each message is handled once and
// in order, and partitions do run in parallel.
func TestConsumeDispatcherOnePartitionOneHandler(t *testing.T) {
	const parts, per = 100, 20
	c1, c2, _ := openPair(t)
	items := make([]queen.Item, 0, parts*per)
	for i := range per {
		for p := range parts {
			items = append(items, queen.Item{Partition: fmt.Sprintf("p%03d", p), Data: []byte(strconv.Itoa(i))})
		}
	}
	push(t, c1.Queue("q"), items...)
	ctx, cancel := context.WithTimeout(ctxT(t), time.Minute)
	defer cancel()
	po := newPartitionOrder(parts*per, cancel)
	var wg sync.WaitGroup
	for i := range 4 {
		q := []*queen.Queue{c1.Queue("q"), c2.Queue("q")}[i%2]
		wg.Go(func() {
			err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 3}, Concurrency: 4}, po.handle)
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	po.check(t)
	g := po.g
	if g.maxAct.Load() < 2 {
		t.Fatalf("at most %d handlers at once: partitions did not run in parallel", g.maxAct.Load())
	}
}

// A partition pushed to while every other one has a backlog is not starved
// behind that backlog.
func TestConsumeDispatcherDoesNotStarveNewPartition(t *testing.T) {
	const parts, per = 50, 40
	c := open(t)
	q := c.Queue("q")
	items := make([]queen.Item, 0, parts*per)
	for i := range per {
		for p := range parts {
			items = append(items, queen.Item{Partition: fmt.Sprintf("p%03d", p), Data: []byte(strconv.Itoa(i))})
		}
	}
	push(t, q, items...)
	var handled atomic.Int64
	var lateAt atomic.Int64
	ctx, cancel := context.WithTimeout(ctxT(t), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 2}, Concurrency: 4},
			func(_ context.Context, m *queen.Message) error {
				n := handled.Add(1)
				if n == 100 {
					// The backlog is being worked on: now a new partition.
					go func() {
						if _, err := q.Push(ctx, []queen.Item{{Partition: "late", Data: []byte("x")}}); err != nil {
							t.Error(err)
						}
					}()
				}
				if m.Partition == "late" {
					lateAt.Store(n)
				}
				if handled.Load() >= parts*per+1 {
					cancel()
				}
				return nil
			})
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if at := lateAt.Load(); at == 0 || at > parts*per/2 {
		t.Fatalf("the new partition's message was handled %dth of %d: starved behind the backlog", at, parts*per+1)
	}
}

// With PopOptions.Partitions k, Consume holds up to Concurrency×k batches,
// claimed ahead in steps of k, and still runs at most Concurrency handlers,
// one per partition at a time, in order.
func TestConsumePartitionsClaimAhead(t *testing.T) {
	const parts, per, conc, k = 64, 2, 2, 8
	c := open(t)
	q := c.Queue("ahead")
	items := make([]queen.Item, 0, parts*per)
	for i := range per {
		for p := range parts {
			items = append(items, queen.Item{Partition: fmt.Sprintf("p%02d", p), Data: []byte(strconv.Itoa(i))})
		}
	}
	push(t, q, items...)
	before := c.Stats()
	ctx, cancel := context.WithTimeout(ctxT(t), time.Minute)
	defer cancel()
	po := newPartitionOrder(parts*per, cancel)
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Partitions: k}, Concurrency: conc}, po.handle)
	if err != nil {
		t.Fatal(err)
	}
	po.check(t)
	if m := po.g.maxAct.Load(); m > conc {
		t.Fatalf("%d handlers at once, Concurrency is %d", m, conc)
	}
	// One claim per worker's share, not per freed worker: 64 partitions in
	// steps of 8 (a claim of 1 or 2 each time a worker frees would take 32+).
	if claims := c.Stats().Claims - before.Claims; claims > parts/k+6 {
		t.Fatalf("%d claims for %d partitions with Partitions %d", claims, parts, k)
	}
}

// partitionOrder is a Consume handler for messages whose Data is their
// index within their partition: it records order violations, overlapping
// handlers of one partition, and calls done after the last of total.
type partitionOrder struct {
	g       *keyGuard
	total   int64
	done    func()
	mu      sync.Mutex
	next    map[string]int
	handled atomic.Int64
	bad     atomic.Value
}

func newPartitionOrder(total int64, done func()) *partitionOrder {
	return &partitionOrder{g: newKeyGuard(), total: total, done: done, next: map[string]int{}}
}

func (p *partitionOrder) handle(_ context.Context, m *queen.Message) error {
	p.g.enter(m.Partition)
	defer p.g.leave(m.Partition)
	p.mu.Lock()
	if want := strconv.Itoa(p.next[m.Partition]); string(m.Data) != want {
		p.bad.Store(fmt.Sprintf("partition %s: handled %s, want %s", m.Partition, m.Data, want))
	}
	p.next[m.Partition]++
	p.mu.Unlock()
	runtime.Gosched()
	if p.handled.Add(1) == p.total {
		p.done()
	}
	return nil
}

// check fails t unless every message was handled once, in order, one
// handler per partition at a time.
func (p *partitionOrder) check(t *testing.T) {
	t.Helper()
	if v := p.bad.Load(); v != nil {
		t.Fatal(v)
	}
	if n := p.handled.Load(); n != p.total {
		t.Fatalf("handled %d of %d", n, p.total)
	}
	if n := p.g.overlaps.Load(); n != 0 {
		t.Fatalf("%d times two handlers held one partition at once", n)
	}
}
