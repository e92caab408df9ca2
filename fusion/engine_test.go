package fusion

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// item is what the tests push; the fake flush writes its verdict into it.
type item struct {
	src, seq int
	size     int // bytes, for Config.MaxBufferedBytes
	resolved atomic.Int32
}

func (it *item) Bytes() int { return it.size }

var tenant = uuid.Must(uuid.FromString("0190a6a4-8c1a-7000-8000-000000000001"))

func keyN(i int) Key {
	return Key{Tenant: tenant, Queue: "orders", Partition: fmt.Sprintf("p%03d", i)}
}

// keysOnShards returns, for each of n shards, one key that lands on it.
func keysOnShards(n int) []Key {
	out := make([]Key, n)
	found := 0
	for i := 0; found < n; i++ {
		k := keyN(i)
		if s := k.Hash() % uint64(n); out[s] == (Key{}) {
			out[s] = k
			found++
		}
	}
	return out
}

func items(src, from, n int) []*item {
	out := make([]*item, n)
	for i := range out {
		out[i] = &item{src: src, seq: from + i}
	}
	return out
}

// call is one flush held by a manual flusher until the test answers it.
type call struct {
	bundle []*Batch[Key, *item]
	ret    chan error
}

// keys lists the bundle's keys; items lists a batch's seqs. Both read the
// bundle while the flush is held, when the test owns it.
func (c call) keys() []Key {
	var ks []Key
	for _, b := range c.bundle {
		ks = append(ks, b.Key)
	}
	return ks
}

func seqs(b *Batch[Key, *item]) []int {
	var out []int
	for _, it := range b.Items {
		out = append(out, it.seq)
	}
	return out
}

// release resolves the call's items not in Retry and lets the flush return.
func (c call) release(err error) {
	for _, b := range c.bundle {
		for _, it := range b.Items {
			if !slices.Contains(b.Retry, it) {
				it.resolved.Add(1)
			}
		}
	}
	c.ret <- err
}

// manual returns a flush func that hands every flush to the test. Once the
// test ends, flushes return unanswered, so a failed test cannot hang Close.
func manual(t *testing.T) (FlushFunc[Key, *item], chan call) {
	calls := make(chan call, 64)
	end := t.Context().Done()
	return func(_ context.Context, bundle []*Batch[Key, *item]) error {
		c := call{bundle: bundle, ret: make(chan error)}
		select {
		case calls <- c:
		case <-end:
			return nil
		}
		select {
		case err := <-c.ret:
			return err
		case <-end:
			return nil
		}
	}, calls
}

func next(t *testing.T, calls chan call) call {
	t.Helper()
	select {
	case c := <-calls:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no flush")
		return call{}
	}
}

func noCall(t *testing.T, calls chan call, wait time.Duration) {
	t.Helper()
	select {
	case c := <-calls:
		t.Fatalf("unexpected flush of %v", c.keys())
	case <-time.After(wait):
	}
}

func fixedLimiter(n int) *Vegas {
	return NewVegas(VegasConfig{Initial: n, Min: n, Max: n})
}

func closeNow[K Keyer](t *testing.T, e *Engine[K, *item]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Close(ctx, nil); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// signal returns a done func and a channel closed by it, failing the test if
// done runs twice.
func signal(t *testing.T) (func(), chan struct{}) {
	ch := make(chan struct{})
	var n atomic.Int32
	return func() {
		if n.Add(1) > 1 {
			t.Error("done called twice")
			return
		}
		close(ch)
	}, ch
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func wait(t *testing.T, ch chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("done not called")
	}
}

func TestFireOnIdle(t *testing.T) {
	// A one-second Hold: anything waiting for the tick would take a second.
	e := New(Config{Hold: time.Second}, func(_ context.Context, bundle []*Batch[Key, *item]) error {
		return nil
	})
	t.Cleanup(func() { closeNow(t, e) })

	var lat []time.Duration
	for i := range 50 {
		done, ch := signal(t)
		start := time.Now()
		if err := e.Submit(context.Background(), keyN(i%5), items(0, i, 1), done); err != nil {
			t.Fatal(err)
		}
		wait(t, ch)
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	median, worst := lat[len(lat)/2], lat[len(lat)-1]
	t.Logf("Submit→done latency: median %v, max %v", median, worst)
	if median > 5*time.Millisecond || worst > 100*time.Millisecond {
		t.Fatalf("idle submissions waited: median %v, max %v (Hold is 1s)", median, worst)
	}
	if st := e.Stats(); st.Bundles != 50 || st.Segments != 50 {
		t.Fatalf("idle submissions should commit alone: %+v", st)
	}
}

func TestOneFlightPerKeyAndOrder(t *testing.T) {
	const (
		submitters = 64
		perSub     = 100
		nkeys      = 16
	)
	var (
		mu       sync.Mutex
		flying   = map[Key]bool{}
		lastSeq  = map[[2]any]int{}
		overlaps atomic.Int32
		disorder atomic.Int32
	)
	flush := func(_ context.Context, bundle []*Batch[Key, *item]) error {
		mu.Lock()
		for _, b := range bundle {
			if flying[b.Key] {
				overlaps.Add(1)
			}
			flying[b.Key] = true
		}
		mu.Unlock()

		time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)

		mu.Lock()
		for _, b := range bundle {
			for _, it := range b.Items {
				k := [2]any{b.Key, it.src}
				if last, ok := lastSeq[k]; ok && it.seq <= last {
					disorder.Add(1)
				}
				lastSeq[k] = it.seq
				it.resolved.Add(1)
			}
			flying[b.Key] = false
		}
		mu.Unlock()
		return nil
	}
	e := New(Config{Shards: 4, BundleMax: 4}, flush)

	var (
		all   = make([][]*item, submitters)
		dones = make([]atomic.Int32, submitters*perSub)
		wg    sync.WaitGroup
	)
	wg.Add(submitters * perSub)
	for g := range submitters {
		go func() {
			seq := 0
			for i := range perSub {
				n := 1 + rand.IntN(3)
				its := items(g, seq, n)
				seq += n
				all[g] = append(all[g], its...)
				idx := g*perSub + i
				done := func() { dones[idx].Add(1); wg.Done() }
				if err := e.Submit(context.Background(), keyN(rand.IntN(nkeys)), its, done); err != nil {
					t.Error(err)
					wg.Done()
				}
			}
		}()
	}
	wg.Wait()
	closeNow(t, e)

	if n := overlaps.Load(); n > 0 {
		t.Errorf("%d flushes overlapped another flush of the same key", n)
	}
	if n := disorder.Load(); n > 0 {
		t.Errorf("%d items flushed out of submission order", n)
	}
	for g := range all {
		for _, it := range all[g] {
			if n := it.resolved.Load(); n != 1 {
				t.Fatalf("item %d/%d resolved %d times", it.src, it.seq, n)
			}
		}
	}
	for i := range dones {
		if n := dones[i].Load(); n != 1 {
			t.Fatalf("submission %d done %d times", i, n)
		}
	}
	st := e.Stats()
	t.Logf("stats: %+v, segments per bundle %.2f", st, float64(st.Segments)/float64(st.Bundles))
}

func TestBundlingAcrossPartitions(t *testing.T) {
	const bundleMax = 8
	var bad atomic.Int32
	flush := func(_ context.Context, bundle []*Batch[Key, *item]) error {
		seen := map[Key]bool{}
		for _, b := range bundle {
			if seen[b.Key] || len(b.Items) == 0 {
				bad.Add(1)
			}
			seen[b.Key] = true
			for _, it := range b.Items {
				it.resolved.Add(1)
			}
		}
		if len(bundle) > bundleMax {
			bad.Add(1)
		}
		time.Sleep(time.Millisecond) // a database round trip
		return nil
	}
	e := New(Config{Shards: 2, BundleMax: bundleMax}, flush)

	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				done, ch := signal(t)
				if err := e.Submit(context.Background(), keyN((g*7+i)%64), items(g, i, 1), done); err != nil {
					t.Error(err)
					return
				}
				wait(t, ch)
			}
		}()
	}
	wg.Wait()
	closeNow(t, e)

	st := e.Stats()
	ratio := float64(st.Segments) / float64(st.Bundles)
	t.Logf("stats: %+v, segments per bundle %.2f", st, ratio)
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d malformed bundles (duplicate key, empty segment or over BundleMax)", n)
	}
	if st.Items != 32*100 {
		t.Fatalf("flushed %d items, want %d", st.Items, 32*100)
	}
	if ratio <= 1 {
		t.Fatalf("no cross-partition bundling under load: %+v", st)
	}
}

func TestReadyKeysAreServedFIFO(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1, BundleMax: 2, MaxInFlight: 1, Limiter: fixedLimiter(1)}, flush)
	t.Cleanup(func() { closeNow(t, e) })
	ctx := context.Background()

	if err := e.Submit(ctx, keyN(0), items(0, 0, 1), nil); err != nil {
		t.Fatal(err)
	}
	first := next(t, calls)
	for i := 1; i <= 5; i++ {
		if err := e.Submit(ctx, keyN(i), items(0, i, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	// The shard must have taken all five before the slot frees up.
	time.Sleep(20 * time.Millisecond)
	first.release(nil)

	want := [][]Key{{keyN(1), keyN(2)}, {keyN(3), keyN(4)}, {keyN(5)}}
	for _, w := range want {
		c := next(t, calls)
		if got := c.keys(); !slices.Equal(got, w) {
			t.Fatalf("bundle %v, want %v", got, w)
		}
		c.release(nil)
	}
}

func TestSegmentTakesAllAccumulated(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1}, flush)
	t.Cleanup(func() { closeNow(t, e) })
	ctx := context.Background()
	k := keyN(0)

	if err := e.Submit(ctx, k, items(0, 0, 1), nil); err != nil {
		t.Fatal(err)
	}
	first := next(t, calls)
	// While k is in flight nothing of k may flush, however much piles up.
	for i := 1; i <= 500; i++ {
		if err := e.Submit(ctx, k, items(0, i, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	noCall(t, calls, 20*time.Millisecond)
	first.release(nil)

	c := next(t, calls)
	if len(c.bundle) != 1 || len(c.bundle[0].Items) != 500 {
		t.Fatalf("second flush: %d batches, %d items; want everything accumulated", len(c.bundle), len(c.bundle[0].Items))
	}
	if got := seqs(c.bundle[0]); !slices.IsSorted(got) || got[0] != 1 {
		t.Fatalf("second segment out of order: %v", got[:10])
	}
	c.release(nil)
}

func TestRetryGoesBackToTheHead(t *testing.T) {
	for _, aliased := range []bool{false, true} {
		t.Run(fmt.Sprintf("aliased=%v", aliased), func(t *testing.T) {
			flush, calls := manual(t)
			e := New(Config{Shards: 1}, flush)
			t.Cleanup(func() { closeNow(t, e) })
			ctx := context.Background()
			k := keyN(0)

			doneA, chA := signal(t)
			doneB, chB := signal(t)
			a := items(0, 0, 3)
			if err := e.Submit(ctx, k, a, doneA); err != nil {
				t.Fatal(err)
			}
			c1 := next(t, calls)
			if err := e.Submit(ctx, k, items(0, 10, 1), doneB); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // let B reach the shard first
			b := c1.bundle[0]
			if aliased {
				b.Retry = b.Items[1:]
			} else {
				b.Retry = []*item{b.Items[1], b.Items[2]}
			}
			c1.release(nil)

			c2 := next(t, calls)
			if got := seqs(c2.bundle[0]); !slices.Equal(got, []int{1, 2, 10}) {
				t.Fatalf("after retry the segment is %v, want [1 2 10]", got)
			}
			if c2.bundle[0].Retry != nil {
				t.Fatal("Retry not reset for the next flush")
			}
			if isClosed(chA) {
				t.Fatal("A done while two of its items were still to be flushed")
			}
			c2.release(nil)
			wait(t, chA)
			wait(t, chB)
			for _, it := range a {
				if n := it.resolved.Load(); n != 1 {
					t.Fatalf("item %d resolved %d times", it.seq, n)
				}
			}
			if st := e.Stats(); st.Retried != 2 || st.Items != 6 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestSettleRejectsForeignRetry(t *testing.T) {
	a, b := &item{}, &item{}
	ks := &keyState[Key, *item]{}
	ks.batch.Items = []*item{a, b}
	ks.batch.Retry = []*item{b, a} // out of order
	ks.flightRuns = []run{{sub: newSubmission(nil, 2), n: 2}}
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a Retry that is not a subsequence of Items")
		}
	}()
	ks.settle()
}

func TestTenantsAccumulateSeparately(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1, Limiter: fixedLimiter(1)}, flush)
	t.Cleanup(func() { closeNow(t, e) })
	ctx := context.Background()

	if err := e.Submit(ctx, keyN(99), items(0, 0, 1), nil); err != nil {
		t.Fatal(err)
	}
	hold := next(t, calls)
	k1 := Key{Tenant: tenant, Queue: "orders", Partition: "Default"}
	k2 := Key{Tenant: uuid.Must(uuid.NewV7()), Queue: "orders", Partition: "Default"}
	for _, k := range []Key{k1, k2} {
		if err := e.Submit(ctx, k, items(0, 1, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(10 * time.Millisecond)
	hold.release(nil)
	c := next(t, calls)
	if got := c.keys(); !slices.Equal(got, []Key{k1, k2}) {
		t.Fatalf("bundle keys %v, want one segment per tenant", got)
	}
	c.release(nil)
}

func TestBackpressure(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1, MaxBuffered: 2}, flush)
	ctx := context.Background()
	k := keyN(0)

	if err := e.Submit(ctx, k, items(0, 0, 1), nil); err != nil {
		t.Fatal(err)
	}
	c1 := next(t, calls)

	accepted := 1
	var blockedDone *atomic.Bool // of the refused submission
	for {
		flag := new(atomic.Bool)
		tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err := e.Submit(tctx, k, items(0, accepted, 1), func() { flag.Store(true) })
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			blockedDone = flag
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		accepted++
		if accepted > 2+intakeDepth+2 {
			t.Fatalf("Submit never blocked after %d submissions with MaxBuffered 2", accepted)
		}
	}
	t.Logf("accepted %d submissions before blocking", accepted)

	// A submitter blocked without a deadline proceeds once room appears.
	unblocked := make(chan error, 1)
	go func() { unblocked <- e.Submit(ctx, k, items(0, 1000, 1), nil) }()
	select {
	case err := <-unblocked:
		t.Fatalf("Submit returned %v while the shard was full", err)
	case <-time.After(20 * time.Millisecond):
	}

	served := make(chan struct{})
	go func() {
		defer close(served)
		c1.release(nil)
		for c := range calls {
			c.release(nil)
		}
	}()
	if err := <-unblocked; err != nil {
		t.Fatalf("blocked Submit: %v", err)
	}
	closeNow(t, e)
	close(calls)
	<-served
	if blockedDone.Load() {
		t.Fatal("done called for a submission refused with ctx.Err()")
	}
	if st := e.Stats(); st.Items != uint64(accepted+1) {
		t.Fatalf("flushed %d items, want %d", st.Items, accepted+1)
	}
}

func TestHoldTickRetriesForeignPermit(t *testing.T) {
	lim := fixedLimiter(1)
	if !lim.TryAcquire() { // a permit held outside the engine
		t.Fatal("no permit")
	}
	flush, calls := manual(t)
	e := New(Config{Shards: 1, Hold: 20 * time.Millisecond, Limiter: lim}, flush)
	t.Cleanup(func() { closeNow(t, e) })

	done, ch := signal(t)
	if err := e.Submit(context.Background(), keyN(0), items(0, 0, 1), done); err != nil {
		t.Fatal(err)
	}
	noCall(t, calls, 60*time.Millisecond)
	// Nothing in the engine learns of this release; only the tick does.
	released := time.Now()
	lim.Release(time.Millisecond, false)
	c := next(t, calls)
	t.Logf("dispatched %v after the foreign release", time.Since(released))
	c.release(nil)
	wait(t, ch)
}

func TestCompletionWakesStarvedShard(t *testing.T) {
	keys := keysOnShards(2)
	flush, calls := manual(t)
	// Hold is far longer than the test may take: only the wake can help.
	e := New(Config{Shards: 2, Hold: time.Hour, Limiter: fixedLimiter(1)}, flush)
	t.Cleanup(func() { closeNow(t, e) })
	ctx := context.Background()

	if err := e.Submit(ctx, keys[0], items(0, 0, 1), nil); err != nil {
		t.Fatal(err)
	}
	c1 := next(t, calls)
	if err := e.Submit(ctx, keys[1], items(0, 1, 1), nil); err != nil {
		t.Fatal(err)
	}
	noCall(t, calls, 20*time.Millisecond)
	c1.release(nil)
	c2 := next(t, calls)
	if got := c2.keys(); !slices.Equal(got, []Key{keys[1]}) {
		t.Fatalf("flushed %v, want %v", got, keys[1])
	}
	c2.release(nil)
}

func TestMaxInFlightPerShard(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1, BundleMax: 1, MaxInFlight: 2}, flush)
	t.Cleanup(func() { closeNow(t, e) })
	for i := range 3 {
		if err := e.Submit(context.Background(), keyN(i), items(0, i, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	c1, c2 := next(t, calls), next(t, calls)
	noCall(t, calls, 20*time.Millisecond)
	c1.release(nil)
	c3 := next(t, calls)
	c2.release(nil)
	c3.release(nil)
}

func TestFlushContextAndFailure(t *testing.T) {
	type ctxKey struct{}
	var cancels atomic.Int32
	var sawOwnCtx atomic.Bool
	lim := NewVegas(VegasConfig{Initial: 8})
	e := New(Config{
		Limiter: lim,
		FlushContext: func() (context.Context, context.CancelFunc) {
			return context.WithValue(context.Background(), ctxKey{}, "engine"), func() { cancels.Add(1) }
		},
	}, func(ctx context.Context, bundle []*Batch[Key, *item]) error {
		sawOwnCtx.Store(ctx.Value(ctxKey{}) == "engine")
		return errors.New("connection reset")
	})
	callerCtx, cancel := context.WithCancel(context.Background())
	done, ch := signal(t)
	if err := e.Submit(callerCtx, keyN(0), items(0, 0, 1), done); err != nil {
		t.Fatal(err)
	}
	cancel() // the caller giving up must not reach the flush
	wait(t, ch)
	closeNow(t, e)
	if !sawOwnCtx.Load() || cancels.Load() != 1 {
		t.Fatalf("flush context not used or not cancelled once (cancels %d)", cancels.Load())
	}
	if st := e.Stats(); st.Failed != 1 || st.Limit != 4 {
		t.Fatalf("failed flush should count and halve the limit: %+v", st)
	}
}

func TestEmptySubmission(t *testing.T) {
	e := New(Config{}, func(context.Context, []*Batch[Key, *item]) error {
		t.Error("flushed an empty submission")
		return nil
	})
	done, ch := signal(t)
	if err := e.Submit(context.Background(), keyN(0), nil, done); err != nil {
		t.Fatal(err)
	}
	wait(t, ch)
	closeNow(t, e)
}

func TestCloseFlushesEverything(t *testing.T) {
	var flushed atomic.Int64
	e := New(Config{Shards: 4, Limiter: fixedLimiter(2)}, func(_ context.Context, bundle []*Batch[Key, *item]) error {
		time.Sleep(2 * time.Millisecond)
		for _, b := range bundle {
			flushed.Add(int64(len(b.Items)))
		}
		return nil
	})
	var dones atomic.Int64
	for i := range 1000 {
		if err := e.Submit(context.Background(), keyN(i%50), items(0, i, 1), func() { dones.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	var abandoned bool
	if err := e.Close(context.Background(), func([]*Batch[Key, *item]) { abandoned = true }); err != nil {
		t.Fatal(err)
	}
	if abandoned || flushed.Load() != 1000 || dones.Load() != 1000 {
		t.Fatalf("abandoned %v, flushed %d, done %d; want everything flushed", abandoned, flushed.Load(), dones.Load())
	}
	if err := e.Submit(context.Background(), keyN(0), items(0, 0, 1), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v, want ErrClosed", err)
	}
	// Idempotent, also concurrently.
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := e.Close(context.Background(), nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

func TestCloseExpiredAbandonsPending(t *testing.T) {
	lim := fixedLimiter(1)
	if !lim.TryAcquire() { // nothing can dispatch
		t.Fatal("no permit")
	}
	defer lim.Release(time.Millisecond, false)
	e := New(Config{Shards: 2, Limiter: lim}, func(context.Context, []*Batch[Key, *item]) error {
		t.Error("flushed with no permit")
		return nil
	})
	var dones atomic.Int32
	var abandonReturned atomic.Bool
	for i := range 10 {
		done := func() {
			if !abandonReturned.Load() {
				t.Error("done before abandon returned")
			}
			dones.Add(1)
		}
		if err := e.Submit(context.Background(), keyN(i%3), items(0, i, 1), done); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var got []int
	err := e.Close(ctx, func(bundle []*Batch[Key, *item]) {
		for _, b := range bundle {
			got = append(got, seqs(b)...)
		}
		abandonReturned.Store(true)
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Close: %v, want context.Canceled", err)
	}
	sort.Ints(got)
	if !slices.Equal(got, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}) || dones.Load() != 10 {
		t.Fatalf("abandoned %v, done %d; want all ten", got, dones.Load())
	}
}

func TestCloseExpiredWaitsForInFlight(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1, Limiter: fixedLimiter(1)}, flush)
	ctx := context.Background()
	k1, k2 := keyN(1), keyN(2)

	doneA, chA := signal(t)
	doneB, chB := signal(t)
	doneC, chC := signal(t)
	if err := e.Submit(ctx, k1, items(0, 0, 2), doneA); err != nil {
		t.Fatal(err)
	}
	c1 := next(t, calls)
	if err := e.Submit(ctx, k1, items(0, 10, 1), doneB); err != nil { // behind the flight
		t.Fatal(err)
	}
	if err := e.Submit(ctx, k2, items(0, 20, 1), doneC); err != nil { // no permit
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)

	expired, cancel := context.WithCancel(ctx)
	cancel()
	abandoned := map[Key][]int{}
	closed := make(chan error, 1)
	go func() {
		closed <- e.Close(expired, func(bundle []*Batch[Key, *item]) {
			for _, b := range bundle {
				abandoned[b.Key] = seqs(b)
			}
			if isClosed(chA) || isClosed(chB) || isClosed(chC) {
				t.Error("done before abandon returned")
			}
		})
	}()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a flush in flight", err)
	case <-time.After(30 * time.Millisecond):
	}
	// The in-flight flush finishes on its own context and retries item 1,
	// which can no longer be dispatched and must be abandoned too.
	c1.bundle[0].Retry = c1.bundle[0].Items[1:]
	c1.release(nil)
	if err := <-closed; !errors.Is(err, context.Canceled) {
		t.Fatalf("Close: %v", err)
	}
	noCall(t, calls, 10*time.Millisecond)
	want := map[Key][]int{k1: {1, 10}, k2: {20}}
	if fmt.Sprint(abandoned) != fmt.Sprint(want) {
		t.Fatalf("abandoned %v, want %v", abandoned, want)
	}
	wait(t, chA)
	wait(t, chB)
	wait(t, chC)
}

func TestSubmitBlockedByBackpressureSeesClose(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 1, MaxBuffered: 1}, flush)
	ctx := context.Background()
	if err := e.Submit(ctx, keyN(0), items(0, 0, 1), nil); err != nil {
		t.Fatal(err)
	}
	c1 := next(t, calls)
	for i := range intakeDepth {
		if err := e.Submit(ctx, keyN(0), items(0, i+1, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	blocked := make(chan error, 1)
	go func() { blocked <- e.Submit(ctx, keyN(0), items(0, 999, 1), nil) }()
	time.Sleep(20 * time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- e.Close(ctx, nil) }()
	if err := <-blocked; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked Submit during Close: %v, want ErrClosed", err)
	}
	c1.release(nil)
	next(t, calls).release(nil)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

func TestNoGoroutinesAfterClose(t *testing.T) {
	before := goleak.IgnoreCurrent()
	e := New(Config{Shards: 16}, func(_ context.Context, bundle []*Batch[Key, *item]) error {
		time.Sleep(time.Millisecond)
		return nil
	})
	for i := range 200 {
		if err := e.Submit(context.Background(), keyN(i), items(0, i, 1), nil); err != nil {
			t.Fatal(err)
		}
	}
	closeNow(t, e)
	goleak.VerifyNone(t, before)
}

func sized(seq, size int) []*item { return []*item{{seq: seq, size: size}} }

// Submit blocks while the engine's unresolved items hold MaxBufferedBytes,
// across shards and however few items that is, until ctx ends or a flush
// frees room. A submission larger than the bound is admitted alone.
func TestMaxBufferedBytesBlocksSubmit(t *testing.T) {
	flush, calls := manual(t)
	e := New(Config{Shards: 2, MaxBufferedBytes: 100}, flush)
	ctx := context.Background()
	ks := keysOnShards(2)

	if err := e.Submit(ctx, ks[0], sized(0, 60), nil); err != nil {
		t.Fatal(err)
	}
	c1 := next(t, calls)
	// 60 + 60 > 100, even on the other shard.
	refused := new(atomic.Bool)
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := e.Submit(tctx, ks[1], sized(1, 60), func() { refused.Store(true) })
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Submit of 60 bytes with 60 of 100 buffered: %v, want it blocked until ctx ended", err)
	}
	// 60 + 40 fits.
	if err := e.Submit(ctx, ks[1], sized(2, 40), nil); err != nil {
		t.Fatal(err)
	}
	c2 := next(t, calls)

	unblocked := make(chan error, 1)
	go func() { unblocked <- e.Submit(ctx, ks[0], sized(3, 60), nil) }()
	select {
	case err := <-unblocked:
		t.Fatalf("Submit returned %v with the engine full", err)
	case <-time.After(20 * time.Millisecond):
	}
	c2.release(nil) // frees 40: 60 + 60 still does not fit
	select {
	case err := <-unblocked:
		t.Fatalf("Submit returned %v with 60 of 100 bytes buffered", err)
	case <-time.After(20 * time.Millisecond):
	}
	c1.release(nil)
	if err := <-unblocked; err != nil {
		t.Fatalf("blocked Submit: %v", err)
	}
	next(t, calls).release(nil)

	// Alone, a submission over the bound goes through.
	waitEmpty := time.Now().Add(5 * time.Second)
	for e.bufferedBytes() != 0 {
		if time.Now().After(waitEmpty) {
			t.Fatalf("%d bytes still buffered", e.bufferedBytes())
		}
		time.Sleep(time.Millisecond)
	}
	if err := e.Submit(ctx, ks[1], sized(4, 500), nil); err != nil {
		t.Fatal(err)
	}
	next(t, calls).release(nil)
	closeNow(t, e)
	if refused.Load() {
		t.Fatal("done called for a submission refused with ctx.Err()")
	}
	if n := e.bufferedBytes(); n != 0 {
		t.Fatalf("%d bytes still counted after Close", n)
	}
}

func TestBundleSize(t *testing.T) {
	for _, c := range []struct{ ready, base, limit, want int }{
		{0, 16, 256, 0}, {1, 16, 256, 1}, {16, 16, 256, 16}, // shallow: all of it
		{20, 16, 256, 16},    // a little over: the base, the rest flies beside it
		{125, 16, 256, 63},   // deep: half
		{1000, 16, 256, 256}, // deeper: capped at the limit
		{3, 16, 2, 2},        // a limit under the base is the cap
		{40, 8, 8, 8},        // base = limit: up to the limit, as without growth
		{5, 8, 8, 5},
	} {
		if got := bundleSize(c.ready, c.base, c.limit); got != c.want {
			t.Errorf("bundleSize(%d, %d, %d) = %d, want %d", c.ready, c.base, c.limit, got, c.want)
		}
	}
}
