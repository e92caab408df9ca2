package fusion

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// seqOf is a SubmitWait sequence over pairs.
func seqOf(keys []Key, groups [][]*item) func(func(Key, []*item) bool) {
	return func(yield func(Key, []*item) bool) {
		for i, k := range keys {
			if !yield(k, groups[i]) {
				return
			}
		}
	}
}

// TestSubmitWaitManyPairs: a SubmitWait of many pairs (more per shard than
// one hand-off carries, a key more than once, an empty pair) resolves every
// item once, flushes each key's items in the call's order and after the
// previous call's, keeps each pair's items together, and hands each shard
// several pairs at once rather than one by one.
func TestSubmitWaitManyPairs(t *testing.T) {
	var mu sync.Mutex
	got := map[Key][]int{}
	e := New(Config{Shards: 3, BundleMax: 8}, func(_ context.Context, bundle []*Batch[Key, *item]) error {
		mu.Lock()
		defer mu.Unlock()
		for _, b := range bundle {
			for _, it := range b.Items {
				got[b.Key] = append(got[b.Key], it.seq)
				it.resolved.Add(1)
			}
		}
		return nil
	})
	ctx := context.Background()
	var all []*item
	want := map[Key][]int{}
	seq := 0
	for call := range 5 {
		var keys []Key
		var groups [][]*item
		for i := range 300 {
			k := keyN(i % 250) // keys 0..49 twice in a call
			n := 1 + (i+call)%3
			if i == 7 {
				n = 0
			}
			its := items(0, seq, n)
			seq += n
			keys, groups = append(keys, k), append(groups, its)
			all = append(all, its...)
			for _, it := range its {
				want[k] = append(want[k], it.seq)
			}
		}
		if err := e.SubmitWait(ctx, len(keys), seqOf(keys, groups)); err != nil {
			t.Fatal(err)
		}
	}
	closeNow(t, e)
	for _, it := range all {
		if n := it.resolved.Load(); n != 1 {
			t.Fatalf("item %d resolved %d times", it.seq, n)
		}
	}
	for k, w := range want {
		if !slices.Equal(got[k], w) {
			t.Fatalf("key %v flushed %v, want %v", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d keys flushed, want %d", len(got), len(want))
	}
}

// TestSubmitWaitManyBoundedBytes: a call's pairs need more than
// MaxBufferedBytes together. A pair waiting for room first hands over what
// the call held back, so the call completes on its own (it would otherwise
// wait for room its own unsent pairs hold), and the engine never holds more
// than the bound.
func TestSubmitWaitManyBoundedBytes(t *testing.T) {
	var e *Engine[Key, *item]
	var over atomic.Int64
	e = New(Config{Shards: 2, MaxBufferedBytes: 100}, func(_ context.Context, bundle []*Batch[Key, *item]) error {
		if n := e.bufferedBytes(); n > 100 {
			over.Store(n)
		}
		for _, b := range bundle {
			for _, it := range b.Items {
				it.resolved.Add(1)
			}
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var keys []Key
	var groups [][]*item
	for i := range 50 {
		keys, groups = append(keys, keyN(i)), append(groups, sized(i, 10))
	}
	if err := e.SubmitWait(ctx, len(keys), seqOf(keys, groups)); err != nil {
		t.Fatalf("SubmitWait of 500 bytes under a bound of 100: %v", err)
	}
	closeNow(t, e)
	if n := over.Load(); n != 0 {
		t.Fatalf("the engine held %d bytes, over its bound of 100", n)
	}
	for _, g := range groups {
		if g[0].resolved.Load() != 1 {
			t.Fatalf("item %d not resolved once", g[0].seq)
		}
	}
	if n := e.bufferedBytes(); n != 0 {
		t.Fatalf("%d bytes still counted after Close", n)
	}
}

// TestSubmitWaitManyCancelled: a call blocked handing over (its shard full,
// MaxBuffered) returns ctx.Err() when ctx ends; pairs handed over before
// still flush and resolve, pairs not handed over never reach a flush, and
// their bytes are given back. What was handed over is at most the shard's
// bound, one hand-off past it and the hand-offs its intake queues.
func TestSubmitWaitManyCancelled(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1, MaxBuffered: 4, MaxInFlight: 1}, flush)
	ctx := context.Background()
	if err := e.Submit(ctx, keyN(999), sized(-1, 1), nil); err != nil {
		t.Fatal(err)
	}
	c1 := next(t, calls) // held: the shard fills up behind it
	var keys []Key
	var groups [][]*item
	// More hand-offs than the intake queues.
	for i := range 2 * intakeDepth * maxHandoff {
		keys, groups = append(keys, keyN(i)), append(groups, sized(i, 1))
	}
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := e.SubmitWait(tctx, len(keys), seqOf(keys, groups))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("SubmitWait into a full shard: %v, want DeadlineExceeded", err)
	}
	flushed := map[int]bool{}
	served := make(chan struct{})
	go func() {
		defer close(served)
		c1.release(nil)
		for c := range calls {
			for _, b := range c.bundle {
				for _, it := range b.Items {
					flushed[it.seq] = true
				}
			}
			c.release(nil)
		}
	}()
	closeNow(t, e)
	close(calls)
	<-served
	handed := 0
	for _, g := range groups {
		it := g[0]
		switch n := it.resolved.Load(); {
		case n > 1:
			t.Fatalf("item %d resolved %d times", it.seq, n)
		case n == 1:
			handed++
		case flushed[it.seq]:
			t.Fatalf("item %d flushed but not resolved", it.seq)
		}
	}
	if handed == 0 || handed == len(groups) {
		t.Fatalf("%d of %d pairs handed over: want some, not all", handed, len(groups))
	}
	if max := 4 + (intakeDepth+1)*maxHandoff; handed > max {
		t.Fatalf("%d pairs handed over, more than the bound and the intake's hand-offs (%d)", handed, max)
	}
	if n := e.bufferedBytes(); n != 0 {
		t.Fatalf("%d bytes still counted after Close", n)
	}
	t.Logf("%d of %d pairs handed over before ctx ended", handed, len(groups))
}

// TestSubmitWaitManyClosed: a call after Close began fails with ErrClosed,
// and so does one that Close interrupts while it waits to hand over; its
// pairs are resolved (flushed or abandoned) at most once, and nothing is
// left counted.
func TestSubmitWaitManyClosed(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 2, MaxBuffered: 2, MaxInFlight: 1}, flush)
	ctx := context.Background()
	if err := e.Submit(ctx, keyN(999), sized(-1, 1), nil); err != nil {
		t.Fatal(err)
	}
	c1 := next(t, calls)
	var keys []Key
	var groups [][]*item
	// More hand-offs than the intakes queue.
	for i := range 3 * 2 * intakeDepth * maxHandoff {
		keys, groups = append(keys, keyN(i)), append(groups, sized(i, 1))
	}
	res := make(chan error, 1)
	go func() { res <- e.SubmitWait(ctx, len(keys), seqOf(keys, groups)) }()
	time.Sleep(50 * time.Millisecond) // blocked on a full shard
	closed := make(chan error, 1)
	abandoned := 0
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		closed <- e.Close(cctx, func(bundle []*Batch[Key, *item]) {
			for _, b := range bundle {
				for _, it := range b.Items {
					it.resolved.Add(1)
					abandoned++
				}
			}
		})
	}()
	if err := <-res; !errors.Is(err, ErrClosed) {
		t.Fatalf("SubmitWait interrupted by Close: %v, want ErrClosed", err)
	}
	c1.release(nil)
	go func() {
		for c := range calls {
			c.release(nil)
		}
	}()
	<-closed
	close(calls)
	for _, g := range groups {
		if n := g[0].resolved.Load(); n > 1 {
			t.Fatalf("item %d resolved %d times", g[0].seq, n)
		}
	}
	if err := e.SubmitWait(ctx, 2, seqOf([]Key{keyN(0), keyN(1)}, [][]*item{sized(0, 1), sized(1, 1)})); !errors.Is(err, ErrClosed) {
		t.Fatalf("SubmitWait after Close: %v, want ErrClosed", err)
	}
	if n := e.bufferedBytes(); n != 0 {
		t.Fatalf("%d bytes still counted after Close", n)
	}
	t.Logf("%d abandoned", abandoned)
}
