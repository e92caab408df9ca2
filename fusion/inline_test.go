package fusion

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// goid is the current goroutine's id, from its stack header.
func goid() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	id, _ := strconv.ParseUint(strings.Fields(string(buf[:n]))[1], 10, 64)
	return id
}

// one is SubmitWait of a single key, the call that may flush inline.
func one(ctx context.Context, e *Engine[Key, *item], k Key, its []*item) error {
	return e.SubmitWait(ctx, 1, func(yield func(Key, []*item) bool) { yield(k, its) })
}

// waitAsync runs one on its own goroutine and returns its result channel.
func waitAsync(e *Engine[Key, *item], k Key, its []*item) chan error {
	res := make(chan error, 1)
	go func() { res <- one(context.Background(), e, k, its) }()
	return res
}

// waitIdle waits until every shard has gone idle: done runs before a
// flight's completion reaches its shard.
func waitIdle(t *testing.T, e *Engine[Key, *item]) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, s := range e.shards {
		for s.ibusy.Load() {
			if time.Now().After(deadline) {
				t.Fatal("shard never went idle")
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// An idle SubmitWait of one key runs the flush on the caller's goroutine;
// without Config.Inline, or through Submit, it never does.
func TestInlineRunsOnCallersGoroutine(t *testing.T) {
	for _, inline := range []bool{true, false} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			var onCaller atomic.Int32
			var caller atomic.Uint64
			e := New(Config{Inline: inline}, func(_ context.Context, bundle []*Batch[Key, *item]) error {
				if goid() == caller.Load() {
					onCaller.Add(1)
				}
				for _, b := range bundle {
					for _, it := range b.Items {
						it.resolved.Add(1)
					}
				}
				return nil
			})
			caller.Store(goid())
			for i := range 50 {
				its := items(0, i, 1+i%3)
				if err := one(context.Background(), e, keyN(i%5), its); err != nil {
					t.Fatal(err)
				}
				for _, it := range its {
					if it.resolved.Load() != 1 {
						t.Fatalf("SubmitWait returned before item %d was resolved", it.seq)
					}
				}
			}
			done, ch := signal(t)
			if err := e.Submit(context.Background(), keyN(0), items(0, 99, 1), done); err != nil {
				t.Fatal(err)
			}
			wait(t, ch)
			closeNow(t, e)
			st := e.Stats()
			want := 0
			if inline {
				want = 50
			}
			if int(onCaller.Load()) != want || int(st.Inline) != want || st.Bundles != 51 {
				t.Fatalf("%d flushes on the caller's goroutine, Stats.Inline %d, Bundles %d; want %d, %d, 51",
					onCaller.Load(), st.Inline, st.Bundles, want, want)
			}
		})
	}
}

// While an inline flush runs, its shard is not idle: arrivals for its key
// wait for it and follow it, other keys of the shard flush beside it, and
// a second SubmitWait takes the shard's path.
func TestInlineDefersArrivalsOfItsKey(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1, Inline: true}, flush)
	t.Cleanup(func() { closeNow(t, e) })
	ctx := context.Background()
	k, other := keyN(0), keyN(1)

	resA := waitAsync(e, k, items(0, 0, 2))
	a := next(t, calls)
	if got := seqs(a.bundle[0]); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("inline flush carries %v", got)
	}
	doneB, chB := signal(t)
	if err := e.Submit(ctx, k, items(0, 2, 1), doneB); err != nil {
		t.Fatal(err)
	}
	resC := waitAsync(e, other, items(1, 0, 1))
	c := next(t, calls)
	if got := c.keys(); !slices.Equal(got, []Key{other}) {
		t.Fatalf("flushed %v beside the inline flush, want %v only", got, other)
	}
	c.release(nil)
	if err := <-resC; err != nil {
		t.Fatal(err)
	}
	noCall(t, calls, 20*time.Millisecond) // B waits for A
	a.release(nil)
	if err := <-resA; err != nil {
		t.Fatal(err)
	}
	b := next(t, calls)
	if got := seqs(b.bundle[0]); !slices.Equal(got, []int{2}) {
		t.Fatalf("after the inline flush %v, want [2]", got)
	}
	b.release(nil)
	wait(t, chB)
	if st := e.Stats(); st.Inline != 1 || st.Bundles != 3 {
		t.Fatalf("stats %+v, want the first flush inline, the others not", st)
	}
}

// Items an inline flush puts in Retry go back to the head of their key,
// before what arrived during it, and the caller waits for them.
func TestInlineRetryGoesBackFirst(t *testing.T) {
	for _, arrivals := range []bool{false, true} {
		t.Run(fmt.Sprintf("arrivals=%v", arrivals), func(t *testing.T) {
			flush, calls := manual(t)
			e := New(Config{Shards: 1, Inline: true}, flush)
			t.Cleanup(func() { closeNow(t, e) })
			k := keyN(0)
			a := items(0, 0, 3)
			resA := waitAsync(e, k, a)
			c1 := next(t, calls)
			want := []int{1, 2}
			doneB, chB := signal(t)
			if arrivals {
				if err := e.Submit(context.Background(), k, items(0, 10, 1), doneB); err != nil {
					t.Fatal(err)
				}
				time.Sleep(10 * time.Millisecond) // let B reach the shard first
				want = append(want, 10)
			} else {
				doneB()
			}
			c1.bundle[0].Retry = c1.bundle[0].Items[1:]
			c1.release(nil)
			c2 := next(t, calls)
			if got := seqs(c2.bundle[0]); !slices.Equal(got, want) {
				t.Fatalf("after the retry the segment is %v, want %v", got, want)
			}
			select {
			case err := <-resA:
				t.Fatalf("SubmitWait returned (%v) with two items still to flush", err)
			default:
			}
			c2.release(nil)
			if err := <-resA; err != nil {
				t.Fatal(err)
			}
			wait(t, chB)
			for _, it := range a {
				if n := it.resolved.Load(); n != 1 {
					t.Fatalf("item %d resolved %d times", it.seq, n)
				}
			}
			// The shard goes idle again: the next call is inline.
			waitIdle(t, e)
			resD := waitAsync(e, k, items(0, 20, 1))
			next(t, calls).release(nil)
			if err := <-resD; err != nil {
				t.Fatal(err)
			}
			if st := e.Stats(); st.Inline != 2 || st.Retried != 2 {
				t.Fatalf("stats %+v, want 2 inline flushes and 2 items retried", st)
			}
		})
	}
}

// Close waits for an inline flush; if Close's ctx ends first, what the
// flush put in Retry is abandoned, not lost.
func TestInlineClose(t *testing.T) {
	for _, expired := range []bool{false, true} {
		t.Run(fmt.Sprintf("expired=%v", expired), func(t *testing.T) {
			flush, calls := manual(t)
			e := New(Config{Shards: 2, Inline: true}, flush)
			a := items(0, 0, 2)
			resA := waitAsync(e, keyN(0), a)
			c := next(t, calls)

			ctx := context.Background()
			if expired {
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				ctx = cctx
			}
			var abandoned []int
			closed := make(chan error, 1)
			go func() {
				closed <- e.Close(ctx, func(bundle []*Batch[Key, *item]) {
					for _, b := range bundle {
						for _, it := range b.Items {
							abandoned = append(abandoned, it.seq)
							it.resolved.Add(1)
						}
					}
				})
			}()
			select {
			case err := <-closed:
				t.Fatalf("Close returned (%v) during an inline flush", err)
			case <-time.After(30 * time.Millisecond):
			}
			if err := one(context.Background(), e, keyN(1), items(1, 0, 1)); !errors.Is(err, ErrClosed) {
				t.Fatalf("SubmitWait during Close: %v, want ErrClosed", err)
			}
			c.bundle[0].Retry = c.bundle[0].Items[1:]
			c.release(nil)
			if !expired {
				next(t, calls).release(nil)
			}
			err := <-closed
			if expired != errors.Is(err, context.Canceled) || (!expired && err != nil) {
				t.Fatalf("Close: %v", err)
			}
			if err := <-resA; err != nil {
				t.Fatalf("SubmitWait: %v", err)
			}
			if expired && !slices.Equal(abandoned, []int{1}) {
				t.Fatalf("abandoned %v, want [1]", abandoned)
			}
			for _, it := range a {
				if n := it.resolved.Load(); n != 1 {
					t.Fatalf("item %d resolved %d times", it.seq, n)
				}
			}
		})
	}
}

// A caller that gives up during its inline flush does what an INSERT
// does: the flush, on the engine's context, is cancelled with
// ErrCallerGone as the cause, SubmitWait returns ctx.Err() at once, and the
// limiter is neither halved nor fed the cut round trip.
func TestInlineCallerCancelled(t *testing.T) {
	type ctxKey struct{}
	started := make(chan struct{})
	var seen atomic.Value
	lim := fixedLimiter(1)
	e := New(Config{
		Inline:  true,
		Limiter: lim,
		FlushContext: func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "engine"))
		},
	}, func(ctx context.Context, bundle []*Batch[Key, *item]) error {
		close(started)
		<-ctx.Done()
		seen.Store(fmt.Sprintf("%v %v", ctx.Value(ctxKey{}), context.Cause(ctx)))
		bundle[0].Items[0].resolved.Add(1) // failed, as the FlushFunc decides
		return ctx.Err()
	})
	defer closeNow(t, e)
	ctx, cancel := context.WithCancel(context.Background())
	it := items(0, 0, 1)
	res := make(chan error, 1)
	go func() { res <- one(ctx, e, keyN(0), it) }()
	<-started
	cancel()
	select {
	case err := <-res:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("SubmitWait: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("SubmitWait did not return when its caller gave up")
	}
	if got, want := seen.Load(), "engine "+ErrCallerGone.Error(); got != want {
		t.Fatalf("flush context %q, want %q", got, want)
	}
	if it[0].resolved.Load() != 1 {
		t.Fatal("item not resolved")
	}
	if st := e.Stats(); st.Failed != 0 || st.Inline != 1 {
		t.Fatalf("stats %+v: a caller giving up is not a failed flush", st)
	}
	if !lim.TryAcquire() {
		t.Fatal("the inline flush kept its permit")
	}
	lim.Release(time.Millisecond, false)
	// The shard went idle again.
	waitIdle(t, e)
}

// No inline flush without a permit, or while a shard queues for one; the
// shard's path takes the submission.
func TestInlineTakesAFreePermitOnly(t *testing.T) {
	lim := fixedLimiter(1)
	if !lim.TryAcquire() {
		t.Fatal("no permit")
	}
	flush, calls := manual(t)
	e := New(Config{Shards: 2, Inline: true, Limiter: lim, Hold: time.Hour}, flush)
	t.Cleanup(func() { closeNow(t, e) })
	res := waitAsync(e, keyN(0), items(0, 0, 1))
	noCall(t, calls, 20*time.Millisecond)
	lim.Release(time.Millisecond, false) // wakes the queued shard
	next(t, calls).release(nil)
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Inline != 0 {
		t.Fatalf("flushed inline without a permit: %+v", st)
	}
}

// The contract under idle/busy transitions: submitters mixing SubmitWait
// (inline when idle) and Submit over few keys, pauses that let shards go
// idle, flushes that retry part of a segment and callers that give up.
// Flushes of a key never overlap, a key's items reach the flush in
// submission order with retried ones first, and every item is resolved
// once.
func TestInlineContractUnderTransitions(t *testing.T) {
	iters := 20
	if testing.Short() {
		iters = 3
	}
	for iter := range iters {
		inlineContract(t, iter)
		if t.Failed() {
			return
		}
	}
}

func inlineContract(t *testing.T, iter int) {
	const (
		submitters = 16
		perSub     = 60
		nkeys      = 6
	)
	var (
		mu       sync.Mutex
		flying   = map[Key]bool{}
		head     = map[Key][]*item{} // what the key's next flush must start with
		lastSeq  = map[[2]any]int{}
		problems []string
	)
	fail := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	flush := func(_ context.Context, bundle []*Batch[Key, *item]) error {
		mu.Lock()
		for _, b := range bundle {
			if flying[b.Key] {
				fail("overlapping flushes of %v", b.Key)
			}
			flying[b.Key] = true
			if h := head[b.Key]; len(h) > 0 && (len(b.Items) < len(h) || !slices.Equal(b.Items[:len(h)], h)) {
				fail("%v: retried items not first", b.Key)
			}
			for _, it := range b.Items[len(head[b.Key]):] {
				k := [2]any{b.Key, it.src}
				if last, ok := lastSeq[k]; ok && it.seq <= last {
					fail("%v: item %d/%d after %d", b.Key, it.src, it.seq, last)
				}
				lastSeq[k] = it.seq
			}
		}
		mu.Unlock()
		if rand.IntN(3) == 0 {
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		}
		mu.Lock()
		for _, b := range bundle {
			if len(b.Items) > 1 && rand.IntN(5) == 0 {
				b.Retry = b.Items[len(b.Items)/2:]
			}
			head[b.Key] = slices.Clone(b.Retry)
			for _, it := range b.Items[:len(b.Items)-len(b.Retry)] {
				it.resolved.Add(1)
			}
			flying[b.Key] = false
		}
		mu.Unlock()
		return nil
	}
	e := New(Config{Shards: 2, BundleMax: 3, Inline: true, Limiter: fixedLimiter(2)}, flush)

	var (
		all   = make([][]*item, submitters)
		sure  = make([][]*item, submitters) // handed over for certain
		wg    sync.WaitGroup
		dones atomic.Int64
		subs  atomic.Int64
	)
	for g := range submitters {
		wg.Go(func() {
			seq := 0
			for i := range perSub {
				its := items(g, seq, 1+rand.IntN(3))
				seq += len(its)
				all[g] = append(all[g], its...)
				k := keyN(rand.IntN(nkeys))
				switch r := rand.IntN(10); {
				case r < 6:
					if err := one(context.Background(), e, k, its); err != nil {
						t.Error(err)
						return
					}
					sure[g] = append(sure[g], its...)
				case r < 8:
					subs.Add(1)
					if err := e.Submit(context.Background(), k, its, func() { dones.Add(1) }); err != nil {
						t.Error(err)
						return
					}
					sure[g] = append(sure[g], its...)
				default:
					// gives up soon: handed over or not, resolved at most once
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(100))*time.Microsecond)
					_ = one(ctx, e, k, its)
					cancel()
				}
				if i%10 == 0 {
					time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond) // let shards go idle
				}
			}
		})
	}
	wg.Wait()
	closeNow(t, e)
	for _, p := range problems {
		t.Errorf("iteration %d: %s", iter, p)
	}
	for g := range all {
		for _, it := range all[g] {
			if n := it.resolved.Load(); n > 1 {
				t.Fatalf("iteration %d: item %d/%d resolved %d times", iter, it.src, it.seq, n)
			}
		}
		for _, it := range sure[g] {
			if n := it.resolved.Load(); n != 1 {
				t.Fatalf("iteration %d: item %d/%d resolved %d times", iter, it.src, it.seq, n)
			}
		}
	}
	if dones.Load() != subs.Load() {
		t.Fatalf("iteration %d: %d of %d submissions done", iter, dones.Load(), subs.Load())
	}
	if iter == 0 {
		t.Logf("stats %+v", e.Stats())
	}
	if e.Stats().Inline == 0 {
		t.Fatalf("iteration %d: no flush ran inline", iter)
	}
}
