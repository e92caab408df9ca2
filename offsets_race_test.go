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

// offKey names one message.
type offKey struct {
	part string
	off  int64
}

// produce pushes n messages round-robin over parts, a few per push, and
// closes done when all are stored.
func produce(t testing.TB, q *queen.Queue, parts []string, n int) {
	t.Helper()
	for i := 0; i < n; i += 4 {
		var items []queen.Item
		for j := i; j < min(i+4, n); j++ {
			items = append(items, queen.Item{Partition: parts[j%len(parts)], Data: fmt.Appendf(nil, "%d", j)})
		}
		push(t, q, items...)
	}
}

// caughtUp reports whether group has committed every partition's last
// offset.
func caughtUp(t testing.TB, q *queen.Queue, group string, parts []string) bool {
	t.Helper()
	st := status(t, q)
	if len(st.Partitions) != len(parts) {
		return false
	}
	for _, p := range st.Partitions {
		g, ok := gstat(t, q, group, p.Name)
		if !ok || g.Committed != p.LastOffset {
			return false
		}
	}
	return true
}

// ReleaseLease in a loop beside a Consume (group c) and two Pop workers
// that ack message by message (group g): nothing is lost, and each
// message of g is acked successfully exactly once (a released holder's
// acks are refused from the release on, as lease lost or, once the next
// holder acked past them, already acked; the next holder starts after the
// last one that committed).
func TestReleaseLeaseRace(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("releaserace")
	parts := []string{"p0", "p1", "p2", "p3"}
	const n = 240

	var mu sync.Mutex
	acked := map[offKey]int{}
	seenC := map[offKey]int{}
	var releases atomic.Int64

	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "c", Batch: 5},
			Concurrency: 2}, func(ctx context.Context, m *queen.Message) error {
			mu.Lock()
			seenC[offKey{m.Partition, m.Offset}]++
			mu.Unlock()
			return nil
		})
		if err != nil {
			t.Errorf("Consume: %v", err)
		}
	}()
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for cctx.Err() == nil {
				msgs, err := q.Pop(cctx, queen.PopOptions{Group: "g", Batch: 5, Wait: 200 * time.Millisecond})
				if err != nil {
					if cctx.Err() == nil {
						t.Errorf("Pop: %v", err)
					}
					return
				}
				for _, m := range msgs {
					err := m.Ack(context.Background())
					if errors.Is(err, queen.ErrLeaseLost) || errors.Is(err, queen.ErrAlreadyAcked) {
						// The lease was released: the rest of the batch is
						// the next holder's, which may already have acked
						// this message (the cursor is past it).
						break
					}
					if err != nil {
						t.Errorf("Ack %s/%d: %v", m.Partition, m.Offset, err)
						return
					}
					mu.Lock()
					acked[offKey{m.Partition, m.Offset}]++
					mu.Unlock()
				}
			}
		}()
	}
	// The releases stop once the messages are all stored and either
	// minReleases leases were released or both groups caught up: a release
	// lands while its batch is in flight, and on a layout whose claim to ack
	// is slower than the releaser's round over the partitions, releasing on
	// until caught up never lets the last partition's batch commit (as a
	// Kafka consumer whose partition is revoked faster than it commits).
	const minReleases = 20
	produced := make(chan struct{})
	rctx, stopReleases := context.WithCancel(cctx)
	defer stopReleases()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; rctx.Err() == nil; i++ {
			select {
			case <-produced:
				if releases.Load() >= minReleases || (caughtUp(t, q, "c", parts) && caughtUp(t, q, "g", parts)) {
					return
				}
			default:
			}
			for _, g := range []string{"c", "g"} {
				ok, err := q.ReleaseLease(rctx, g, parts[i%len(parts)])
				if err != nil && !errors.Is(err, queen.ErrNotFound) && rctx.Err() == nil {
					t.Errorf("ReleaseLease: %v", err)
					return
				}
				if ok {
					releases.Add(1)
				}
			}
			time.Sleep(time.Duration(i%7) * time.Millisecond)
		}
	}()

	produce(t, q, parts, n)
	close(produced)
	waitFor(t, 2*time.Minute, "both groups caught up", func() bool {
		return caughtUp(t, q, "c", parts) && caughtUp(t, q, "g", parts)
	})
	stop()
	wg.Wait()

	if releases.Load() == 0 {
		t.Error("no lease was released: the race did not happen")
	}
	st := status(t, q)
	total := 0
	for _, p := range st.Partitions {
		for off := p.LogStart; off <= p.LastOffset; off++ {
			k := offKey{p.Name, off}
			total++
			if acked[k] != 1 {
				t.Errorf("group g: %s/%d acked %d times", k.part, k.off, acked[k])
			}
			if seenC[k] == 0 {
				t.Errorf("group c: %s/%d never delivered", k.part, k.off)
			}
		}
	}
	if total != n {
		t.Errorf("%d messages stored, want %d", total, n)
	}
	t.Logf("%d leases released", releases.Load())
}

// A ResetGroup to earliest (forced when a batch is leased) beside a
// running Consume and a producer: every message is delivered at least once
// after the reset, and the group ends caught up (which, from -1, takes a
// handled ack of every message after the reset).
func TestResetGroupRace(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("resetrace")
	parts := []string{"p0", "p1", "p2"}
	const n = 180

	var mu sync.Mutex
	var afterReset bool
	seenAfter := map[offKey]bool{}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g", Batch: 4},
			Concurrency: 2}, func(ctx context.Context, m *queen.Message) error {
			mu.Lock()
			if afterReset {
				seenAfter[offKey{m.Partition, m.Offset}] = true
			}
			mu.Unlock()
			return nil
		})
	}()
	produce(t, q, parts, n/2)
	waitFor(t, time.Minute, "some consumed", func() bool {
		g, _ := gstat(t, q, "g", "p0")
		return g.Committed >= 5
	})
	// Paused, so that no claim made after the reset commits is handled
	// before the flag is up (the reset wakes the group): only batches
	// leased before it may still run, and their acks are refused.
	if err := q.Pause(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	var moves []queen.OffsetMove
	var err error
	for moves == nil {
		// Not forced first: refused while a batch is leased, or done.
		moves, err = q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{})
		if errors.Is(err, queen.ErrGroupActive) {
			moves, err = q.ResetGroup(ctx, "g", queen.ResetEarliest(), queen.ResetOptions{Force: true})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	afterReset = true
	mu.Unlock()
	if err := q.Resume(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	for _, m := range moves {
		if m.After != -1 {
			t.Fatalf("reset: %+v", moves)
		}
	}
	produce(t, q, parts, n/2)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		seen := len(seenAfter)
		mu.Unlock()
		if caughtUp(t, q, "g", parts) && seen == n {
			break
		}
		if time.Now().After(deadline) {
			var missing []offKey
			mu.Lock()
			for _, p := range status(t, q).Partitions {
				for off := p.LogStart; off <= p.LastOffset; off++ {
					if !seenAfter[offKey{p.Name, off}] {
						missing = append(missing, offKey{p.Name, off})
					}
				}
			}
			mu.Unlock()
			t.Fatalf("not caught up after the reset (%+v): %d seen, missing %v; status %+v", moves, seen, missing, status(t, q))
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// DeleteGroup beside a producer and another group's Consume: the other
// group loses nothing, and once the deleted group no longer pins it,
// completed retention trims everything the other group consumed.
func TestDeleteGroupRace(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("deleterace")
	if err := q.Configure(ctx, queen.QueueOptions{CompletedRetention: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	parts := []string{"p0", "p1", "p2"}
	const n = 180

	var mu sync.Mutex
	seen := map[offKey]int{}
	kctx, stopKeep := context.WithCancel(ctx)
	keepDone := make(chan error, 1)
	go func() {
		keepDone <- q.Consume(kctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "keep", Batch: 4},
			Concurrency: 2}, func(ctx context.Context, m *queen.Message) error {
			mu.Lock()
			seen[offKey{m.Partition, m.Offset}]++
			mu.Unlock()
			return nil
		})
	}()
	// "gone" reads a little, then its consumer stops (handing back what
	// it held), pinning the rest.
	gctx, stopGone := context.WithCancel(ctx)
	goneDone := make(chan error, 1)
	var goneN atomic.Int64
	go func() {
		goneDone <- q.Consume(gctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "gone", Batch: 2}},
			func(ctx context.Context, m *queen.Message) error {
				goneN.Add(1)
				return nil
			})
	}()
	produce(t, q, parts, n/2)
	waitFor(t, time.Minute, "gone read some", func() bool { return goneN.Load() >= 3 })
	stopGone()
	if err := <-goneDone; err != nil {
		t.Fatal(err)
	}
	pushing := make(chan struct{})
	go func() {
		defer close(pushing)
		produce(t, q, parts, n/2)
	}()
	d, err := q.DeleteGroup(ctx, "gone", queen.DeleteGroupOptions{})
	if err != nil || d.Cursors == 0 || d.LeasesEnded != 0 {
		t.Fatalf("DeleteGroup: %+v, %v", d, err)
	}
	<-pushing
	waitFor(t, 2*time.Minute, "keep caught up", func() bool { return caughtUp(t, q, "keep", parts) })
	stopKeep()
	if err := <-keepDone; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(seen) != n {
		t.Errorf("keep saw %d messages, want %d", len(seen), n)
	}
	mu.Unlock()
	waitFor(t, time.Minute, "completed retention trims every partition", func() bool {
		if _, err := c.Maintain(ctx); err != nil {
			t.Fatal(err)
		}
		for _, p := range status(t, q).Partitions {
			if p.LogStart != p.LastOffset+1 {
				return false
			}
		}
		return true
	})
}

// Forced resets, deletes and releases in a loop beside a Consume whose
// failures are re-enqueued (FailureSkip: the settle locks partitions, then
// cursors) and a producer: the fixed lock order means no deadlock, which
// PostgreSQL would report as SQLSTATE 40P01 to one side and count.
func TestOffsetsNoDeadlock(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	q := c.Queue("offsetsdeadlock")
	if err := q.Configure(ctx, queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 1000}); err != nil {
		t.Fatal(err)
	}
	deadlocks := func() int64 {
		var n int64
		if err := c.Pool().QueryRow(ctx, `SELECT pg_stat_force_next_flush()`).Scan(new(any)); err != nil {
			t.Fatal(err)
		}
		if err := c.Pool().QueryRow(ctx,
			`SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := deadlocks()
	parts := []string{"p0", "p1", "p2"}
	cctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var handled atomic.Int64
	for _, g := range []string{"g", "h"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := q.Consume(cctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: g, Batch: 3},
				Concurrency: 3}, func(ctx context.Context, m *queen.Message) error {
				if handled.Add(1)%3 == 0 {
					return errors.New("again")
				}
				return nil
			})
			if err != nil {
				t.Errorf("Consume: %v", err)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for cctx.Err() == nil {
			produce(t, q, parts, 12)
		}
	}()
	waitFor(t, time.Minute, "messages handled", func() bool { return handled.Load() >= 20 })
	tos := []queen.ResetTo{queen.ResetEarliest(), queen.ResetLatest(), queen.ResetToOffsets(map[string]int64{"p1": 0})}
	for i := range 60 {
		time.Sleep(time.Duration(i%5) * 10 * time.Millisecond)
		var err error
		switch i % 4 {
		case 3:
			_, err = q.DeleteGroup(ctx, "h", queen.DeleteGroupOptions{Force: true})
			if errors.Is(err, queen.ErrNotFound) {
				err = nil
			}
		case 2:
			_, err = q.ReleaseLease(ctx, "g", parts[i%len(parts)])
		default:
			_, err = q.ResetGroup(ctx, "g", tos[i%len(tos)], queen.ResetOptions{Force: true})
		}
		if err != nil && !errors.Is(err, queen.ErrNotFound) {
			t.Fatalf("operation %d: %v", i, err)
		}
	}
	stop()
	wg.Wait()
	if handled.Load() == 0 {
		t.Error("nothing was handled")
	}
	if d := deadlocks() - before; d != 0 {
		t.Errorf("%d deadlocks", d)
	}
}
