package dispatch

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type batch struct {
	pid int64
	seq int // per partition, in claim order
}

type wakes struct{ ch chan struct{} }

func (w wakes) C() <-chan struct{}  { return w.ch }
func (w wakes) TakeHints() []string { return nil }

// source hands out batches of a few partitions, the same partition again
// while an earlier batch of it may still be in hand (as after a lost lease),
// and records what the loop does with them.
type source struct {
	mu        sync.Mutex
	next      map[int64]int
	claimed   int
	left      int
	asked     []int
	running   map[int64]bool
	handed    map[int64][]int // in the order Run took the batches from their claims
	handled   map[int64][]int
	overlap   atomic.Bool
	active    atomic.Int32
	maxActive atomic.Int32
}

func newSource(total int) *source {
	return &source{next: map[int64]int{}, left: total, running: map[int64]bool{}, handed: map[int64][]int{},
		handled: map[int64][]int{}}
}

func (s *source) claim(_ context.Context, _ []string, n int) ([]batch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, n)
	var out []batch
	seen := map[int64]bool{}
	for range n {
		if s.left == 0 {
			break
		}
		pid := rand.Int64N(4)
		if seen[pid] {
			continue
		}
		seen[pid] = true
		out = append(out, batch{pid, s.next[pid]})
		s.next[pid]++
		s.left--
		s.claimed++
	}
	return out, nil
}

func (s *source) handle(b batch, _ func() bool) func() {
	s.mu.Lock()
	if s.running[b.pid] {
		s.overlap.Store(true)
	}
	s.running[b.pid] = true
	s.mu.Unlock()
	a := s.active.Add(1)
	for {
		m := s.maxActive.Load()
		if a <= m || s.maxActive.CompareAndSwap(m, a) {
			break
		}
	}
	time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
	s.active.Add(-1)
	return func() {
		s.mu.Lock()
		s.running[b.pid] = false
		s.handled[b.pid] = append(s.handled[b.pid], b.seq)
		s.mu.Unlock()
	}
}

func (s *source) done() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.handled {
		n += len(h)
	}
	return n
}

// runUntilDone runs cfg until s has settled total batches, stops it and
// checks that it returned nil with exactly total settled.
func runUntilDone(t *testing.T, s *source, cfg Config[batch], total int) {
	t.Helper()
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() { done <- Run(stop, cfg) }()
	deadline := time.Now().Add(20 * time.Second)
	for s.done() < total && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if got := s.done(); got != total {
		t.Fatalf("handled %d batches, want %d", got, total)
	}
}

func config(s *source, workers, hold int) Config[batch] {
	return Config[batch]{
		Workers: workers, Hold: hold,
		Claim:  s.claim,
		Handle: s.handle,
		// Run asks a batch's partition once, as it takes the batch from its
		// claim: two claims in flight may return in either order, and
		// what Run promises is the order it took them in.
		Partition: func(b batch) int64 {
			s.mu.Lock()
			s.handed[b.pid] = append(s.handed[b.pid], b.seq)
			s.mu.Unlock()
			return b.pid
		},
		Wake:   wakes{make(chan struct{})},
		Rescan: time.Millisecond,
		Failed: func(err error, _ time.Duration) error { return err },
	}
}

// Every claimed batch is handled and settled once, a partition's batches in
// the order Run took them from their claims and never two at once, at most Workers handlers run at once
// and no claim asks for more than Hold.
func TestRunHandlesEachBatchInPartitionOrder(t *testing.T) {
	const total = 2000
	s := newSource(total)
	runUntilDone(t, s, config(s, 3, 6), total)
	if s.overlap.Load() {
		t.Fatal("two batches of one partition were handled at once")
	}
	if m := s.maxActive.Load(); m > 3 {
		t.Fatalf("%d handlers ran at once, want at most 3", m)
	}
	for pid, seqs := range s.handled {
		if !slices.Equal(seqs, s.handed[pid]) {
			t.Fatalf("partition %d handled in the order %v, taken from its claims in the order %v", pid, seqs, s.handed[pid])
		}
	}
	for _, n := range s.asked {
		if n < 1 || n > 6 {
			t.Fatalf("a claim asked for %d, want 1..6", n)
		}
	}
}

// A claim error that Failed turns fatal ends Run with it, after the batches
// that claim returned are handled; one it retries is claimed again after
// the backoff Failed was told of.
func TestRunClaimFailure(t *testing.T) {
	fatal := errors.New("fatal")
	var calls atomic.Int32
	var handled atomic.Int32
	var waits []time.Duration
	cfg := Config[batch]{
		Workers: 2, Hold: 2,
		Claim: func(context.Context, []string, int) ([]batch, error) {
			switch calls.Add(1) {
			case 1:
				return nil, errors.New("transient")
			case 2:
				return []batch{{pid: 1}}, fatal
			}
			t.Error("claimed after a fatal error")
			return nil, nil
		},
		Handle: func(batch, func() bool) func() {
			handled.Add(1)
			return nil
		},
		Partition: func(b batch) int64 { return b.pid },
		Wake:      wakes{make(chan struct{})},
		Rescan:    time.Hour,
		Failed: func(err error, wait time.Duration) error {
			waits = append(waits, wait)
			if errors.Is(err, fatal) {
				return err
			}
			return nil
		},
	}
	start := time.Now()
	if err := Run(context.Background(), cfg); !errors.Is(err, fatal) {
		t.Fatalf("Run = %v, want %v", err, fatal)
	}
	if handled.Load() != 1 {
		t.Fatalf("handled %d batches, want the failed claim's 1", handled.Load())
	}
	if len(waits) != 2 || waits[0] < BackoffMin/2 || waits[0] > BackoffMin || waits[1] < BackoffMin || waits[1] > 2*BackoffMin {
		t.Fatalf("backoffs %v, want one in [%v, %v] then one in [%v, %v]", waits, BackoffMin/2, BackoffMin, BackoffMin, 2*BackoffMin)
	}
	if el := time.Since(start); el < waits[0] {
		t.Fatalf("claimed again after %v, before the backoff %v", el, waits[0])
	}
}

// With Serial, no two claims are in flight at once.
func TestRunSerialClaims(t *testing.T) {
	const total = 500
	s := newSource(total)
	var inClaim, most atomic.Int32
	cfg := config(s, 4, 8)
	cfg.Serial = true
	claim := cfg.Claim
	cfg.Claim = func(ctx context.Context, hints []string, n int) ([]batch, error) {
		if c := inClaim.Add(1); c > most.Load() {
			most.Store(c)
		}
		time.Sleep(100 * time.Microsecond)
		defer inClaim.Add(-1)
		return claim(ctx, hints, n)
	}
	runUntilDone(t, s, cfg, total)
	if m := most.Load(); m != 1 {
		t.Fatalf("%d claims in flight at once, want 1", m)
	}
}

// The batch Next returns runs after its predecessor's settle, before a
// batch of its partition queued behind (one claimed again after a lost
// lease, say); alone tells whether no more partitions are in hand than
// workers.
func TestRunNextRunsBeforeQueued(t *testing.T) {
	var (
		mu     sync.Mutex
		pid1   []int
		total  int
		alone  []bool
		calls  atomic.Int32
		parts  atomic.Int32
		handed = make(chan struct{})
		looked = make(chan struct{})
	)
	cfg := Config[batch]{
		Workers: 2, Hold: 4,
		Claim: func(context.Context, []string, int) ([]batch, error) {
			switch calls.Add(1) {
			case 1:
				return []batch{{pid: 1, seq: 0}}, nil
			case 2:
				return []batch{{pid: 1, seq: 2}, {pid: 2, seq: 0}, {pid: 3, seq: 0}}, nil
			}
			return nil, nil
		},
		Handle: func(b batch, al func() bool) func() {
			if b.pid == 1 && b.seq == 0 {
				alone = append(alone, al())
				<-handed
				alone = append(alone, al())
				close(looked)
			} else {
				<-looked // the others stay in hand until then
			}
			mu.Lock()
			defer mu.Unlock()
			total++
			if b.pid == 1 {
				pid1 = append(pid1, b.seq)
			}
			return func() {}
		},
		Next: func(b batch) (batch, bool) {
			if b.pid == 1 && b.seq == 0 {
				return batch{pid: 1, seq: 1}, true
			}
			return batch{}, false
		},
		Partition: func(b batch) int64 {
			if parts.Add(1) == 4 {
				close(handed) // under Run's lock: both are in hand once alone can look
			}
			return b.pid
		},
		Wake:   wakes{make(chan struct{})},
		Rescan: time.Millisecond,
		Failed: func(err error, _ time.Duration) error { return err },
	}
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() { done <- Run(stop, cfg) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := total
		mu.Unlock()
		if n >= 5 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	if !slices.Equal(pid1, []int{0, 1, 2}) || total != 5 {
		t.Fatalf("partition 1 handled %v (%d batches in all), want [0 1 2] (5)", pid1, total)
	}
	if !slices.Equal(alone, []bool{true, false}) {
		t.Fatalf("alone reported %v, want true with one partition in hand, false with three for two workers", alone)
	}
}

// A worker going on with its partition (Keeps, then Next) does not start
// a claim per batch for the slot it frees meanwhile, only once it lets the
// partition go; a claim pending when a batch ends (a wake) is started
// then.
func TestRunKeepsClaimsOnlyWhenPending(t *testing.T) {
	const chain = 20
	var (
		mu      sync.Mutex
		handled int
		claims  atomic.Int32
		woke    atomic.Int32
		wake    = make(chan struct{}, 1)
	)
	cfg := Config[batch]{
		Workers: 1, Hold: 1,
		Claim: func(context.Context, []string, int) ([]batch, error) {
			if claims.Add(1) == 1 {
				return []batch{{pid: 1}}, nil
			}
			return nil, nil
		},
		Handle: func(b batch, _ func() bool) func() {
			if b.seq == chain/2 {
				wake <- struct{}{} // a push elsewhere while this batch runs
				for woke.Load() == 0 {
					time.Sleep(time.Millisecond)
				}
				time.Sleep(10 * time.Millisecond) // the loop has seen it
			}
			mu.Lock()
			handled++
			mu.Unlock()
			return func() { time.Sleep(2 * time.Millisecond) } // a settle's round trip
		},
		Next: func(b batch) (batch, bool) {
			if b.seq < chain-1 {
				return batch{pid: 1, seq: b.seq + 1}, true
			}
			return batch{}, false
		},
		Keeps:     func(b batch) bool { return b.seq < chain-1 },
		Partition: func(b batch) int64 { return b.pid },
		Wake:      wakeCounter{wake, &woke},
		Rescan:    time.Hour,
		Failed:    func(err error, _ time.Duration) error { return err },
	}
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() { done <- Run(stop, cfg) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		n := handled
		mu.Unlock()
		if n >= chain && claims.Load() >= 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // room for claims that should not come
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	// The first claim; one after the first batch, since the first claim
	// took all it asked for (more may be ready); the one the wake left
	// pending; and two for the last batch, which is not kept: its slot
	// during its settle, and its partition let go.
	if n := claims.Load(); n < 3 || n > 5 || handled != chain {
		t.Fatalf("%d claims for a chain of %d batches (%d handled), want at most 5", n, chain, handled)
	}
}

// wakeCounter is a wake subscription counting the wakes taken.
type wakeCounter struct {
	ch   chan struct{}
	took *atomic.Int32
}

func (w wakeCounter) C() <-chan struct{} { return w.ch }
func (w wakeCounter) TakeHints() []string {
	w.took.Add(1)
	return nil
}

// goid is the current goroutine's id, from its stack header.
func goid() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	id, _ := strconv.ParseUint(strings.Fields(string(buf[:n]))[1], 10, 64)
	return id
}

// With nothing in hand, a claim runs on Run's goroutine: no worker can free
// a slot while it runs, so the loop has nothing else to do. With a batch in
// hand, the claim runs beside the loop, which keeps taking wakes and freed
// slots.
func TestRunClaimsInlineOnlyWithNothingInHand(t *testing.T) {
	release := make(chan struct{})
	claims := make(chan uint64, 2)
	var calls atomic.Int32
	cfg := Config[batch]{
		Workers: 2, Hold: 2,
		Claim: func(context.Context, []string, int) ([]batch, error) {
			claims <- goid()
			if calls.Add(1) == 1 {
				return []batch{{pid: 1}}, nil
			}
			return nil, nil
		},
		Handle: func(batch, func() bool) func() {
			<-release
			return nil
		},
		Partition: func(b batch) int64 { return b.pid },
		Wake:      wakes{make(chan struct{})},
		Rescan:    time.Hour,
		Failed:    func(err error, _ time.Duration) error { return err },
	}
	stop, cancel := context.WithCancel(context.Background())
	loop := make(chan uint64, 1)
	done := make(chan error, 1)
	go func() {
		loop <- goid()
		done <- Run(stop, cfg)
	}()
	me := <-loop
	if id := <-claims; id != me {
		t.Errorf("the first claim, with nothing in hand, ran on goroutine %d, Run's is %d", id, me)
	}
	// The first claim took fewer than it asked for: the second waits for a
	// wake, a rescan or a freed slot.
	cfg.Wake.(wakes).ch <- struct{}{}
	if id := <-claims; id == me {
		t.Errorf("the second claim, with a batch in hand, ran on Run's goroutine %d", me)
	}
	close(release)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Across random idle and busy spells, claims alternate between Run's
// goroutine and their own, and still every batch is handled and settled
// once, a partition's in the order Run took them, never two at once.
func TestRunInlineAndConcurrentClaimsMix(t *testing.T) {
	const total = 600
	s := newSource(total)
	cfg := config(s, 2, 4)
	var inline, beside atomic.Int32
	var loop atomic.Uint64 // Run's goroutine
	claim := cfg.Claim
	cfg.Claim = func(ctx context.Context, hints []string, n int) ([]batch, error) {
		if goid() == loop.Load() {
			inline.Add(1)
		} else {
			beside.Add(1)
		}
		switch rand.IntN(4) {
		case 0: // an idle spell: the claim round trip finds the rest settled
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		case 1: // an empty claim
			return nil, nil
		}
		return claim(ctx, hints, n)
	}
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() {
		loop.Store(goid())
		done <- Run(stop, cfg)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for s.done() < total && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if got := s.done(); got != total {
		t.Fatalf("handled %d batches, want %d", got, total)
	}
	if s.overlap.Load() {
		t.Fatal("two batches of one partition were handled at once")
	}
	for pid, seqs := range s.handled {
		if !slices.Equal(seqs, s.handed[pid]) {
			t.Fatalf("partition %d handled in the order %v, taken from its claims in the order %v", pid, seqs, s.handed[pid])
		}
	}
	if inline.Load() == 0 || beside.Load() == 0 {
		t.Fatalf("%d claims on Run's goroutine and %d beside it, want some of each", inline.Load(), beside.Load())
	}
}

// Claims on Run's goroutine and beside it mix with workers that keep their
// partition for the batch claimed under its lease (Keeps, Next): a claim
// may run inline while such a worker settles, counting nothing in hand.
// Still every batch is handled and settled once, a partition's in the
// order Run took them (a Next batch right after its predecessor), never two
// at once, and no more than Workers handlers run at once.
func TestRunInlineClaimsWithNext(t *testing.T) {
	const total = 600
	s := newSource(total)
	cfg := config(s, 2, 4)
	var inline, beside, nexts atomic.Int32
	var loop atomic.Uint64 // Run's goroutine
	claim := cfg.Claim
	cfg.Claim = func(ctx context.Context, hints []string, n int) ([]batch, error) {
		if goid() == loop.Load() {
			inline.Add(1)
		} else {
			beside.Add(1)
		}
		switch rand.IntN(4) {
		case 0: // an idle spell: the claim round trip finds the rest settled
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		case 1: // an empty claim
			return nil, nil
		}
		return claim(ctx, hints, n)
	}
	cfg.Keeps = func(b batch) bool { return b.seq%2 == 0 }
	cfg.Next = func(b batch) (batch, bool) {
		if b.seq%2 != 0 || rand.IntN(4) == 0 { // at times a kept partition is let go after all
			return batch{}, false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.left == 0 {
			return batch{}, false
		}
		nb := batch{b.pid, s.next[b.pid]}
		s.next[b.pid]++
		s.left--
		s.claimed++
		// It runs next: after what was handled (b last), before what is
		// queued behind.
		at := len(s.handled[b.pid])
		s.handed[b.pid] = slices.Insert(s.handed[b.pid], at, nb.seq)
		nexts.Add(1)
		return nb, true
	}
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() {
		loop.Store(goid())
		done <- Run(stop, cfg)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for s.done() < total && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if got := s.done(); got != total {
		t.Fatalf("handled %d batches, want %d", got, total)
	}
	if s.overlap.Load() {
		t.Fatal("two batches of one partition were handled at once")
	}
	if m := s.maxActive.Load(); m > 2 {
		t.Fatalf("%d handlers ran at once, want at most 2", m)
	}
	for pid, seqs := range s.handled {
		if !slices.Equal(seqs, s.handed[pid]) {
			t.Fatalf("partition %d handled in the order %v, taken in the order %v", pid, seqs, s.handed[pid])
		}
	}
	if inline.Load() == 0 || beside.Load() == 0 || nexts.Load() == 0 {
		t.Fatalf("%d claims on Run's goroutine, %d beside it, %d batches by Next: want some of each",
			inline.Load(), beside.Load(), nexts.Load())
	}
}
