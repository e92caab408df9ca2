package fusion

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Reused buffers above these sizes are dropped rather than kept, so one burst
// does not pin its memory for the life of the engine.
const (
	maxKeptItems = 1 << 16
	maxFreeKeys  = 256
	// Past maxFreeKeys a shard keeps up to Config.BundleMax free key
	// states per flight it may have in flight (Config.MaxInFlight), but
	// only with buffers of at most maxSmallItems: a load spread over many
	// partitions forgets a bundle's worth of keys with each returned
	// flush and adds as many new ones, which otherwise each allocated a
	// state and its first buffers.
	maxSmallItems = 16
	maxFreeCap    = 1 << 14 // whatever BundleMax and MaxInFlight say
)

// shard owns a disjoint set of keys. Everything below the run-owned marker is
// touched only by the shard's goroutine, or by finish after it exited.
type shard[K Keyer, T comparable] struct {
	e *Engine[K, T]

	mu     sync.RWMutex // guards closed: Submit holds it to send on in
	closed bool

	in          chan arrival[K, T]
	completions chan *flight[K, T]
	wake        chan struct{}
	exited      chan struct{}
	waiter      *Waiter // queued at the limiter while refused a permit

	counters

	// Inline flushes (Config.Inline). ibusy says the shard holds or expects
	// work, so no inline flush may start; transit counts arrivals sent and
	// not yet received. imu guards inline, iwant and spare and orders the
	// writes of ibusy; the shard's goroutine takes it only on idle/active
	// edges, so a busy shard pays nothing for it.
	imu        sync.Mutex
	ibusy      atomic.Bool
	transit    atomic.Int64
	inline     *inlineFlight[K, T] // the inline flush running, if any
	iwant      bool                // the shard waits for inlineDone
	spare      *inlineFlight[K, T]
	inlineDone chan *inlineFlight[K, T] // one inline flush per shard at a time

	// run-owned
	active   bool // the shard holds work, or waits for an inline flush
	inlineOn bool // an inline flush it saw is running; its key is held flying
	// keys holds the state of every key the shard knows, by the key's
	// hash: finding one hashes no strings, and forgetting one compares no
	// keys (see keyTable).
	keys         keyTable[K, T]
	ready        []*keyState[K, T] // FIFO of ready keys from readyHead on
	readyHead    int
	freeKeys     []*keyState[K, T]
	maxFree      int // bound of freeKeys
	freeFlights  []*flight[K, T]
	inflight     int
	buffered     int
	closing      bool
	intakeClosed bool
	abandoning   bool
	timer        *time.Timer
	armed        bool
}

// keyState is one key. pending and runs are the shard's; while flying, batch,
// flightRuns and retryRuns belong to the flight goroutine.
type keyState[K Keyer, T comparable] struct {
	key     K
	hash    uint64 // key.Hash(), as Submit computed it
	pending []T
	runs    []run // submissions of pending, in order
	queued  bool  // in the ready FIFO
	flying  bool

	batch      Batch[K, T]
	flightRuns []run // submissions of batch.Items
	retryRuns  []run // submissions of batch.Retry, built by settle
}

func newShard[K Keyer, T comparable](e *Engine[K, T]) *shard[K, T] {
	s := &shard[K, T]{
		e:    e,
		in:   make(chan arrival[K, T], intakeDepth),
		wake: make(chan struct{}, 1),
		// Room for every flight the shard can have, so a flush goroutine
		// never waits on its shard.
		completions: make(chan *flight[K, T], e.cfg.MaxInFlight),
		exited:      make(chan struct{}),
		inlineDone:  make(chan *inlineFlight[K, T], 1),
		timer:       time.NewTimer(time.Hour),
	}
	s.waiter = NewWaiter(s.poke)
	s.timer.Stop()
	s.maxFree = min(e.cfg.BundleMax, maxFreeCap/max(e.cfg.MaxInFlight, 1)) * e.cfg.MaxInFlight
	return s
}

func (s *shard[K, T]) run() {
	defer close(s.exited)
	defer s.timer.Stop()
	defer s.e.cfg.Limiter.Cancel(s.waiter)
	for {
		if s.intakeClosed && s.inflight == 0 && !s.inlineOn && len(s.inlineDone) == 0 &&
			(s.readyLen() == 0 || s.abandoning) {
			return
		}
		var tick <-chan time.Time
		if s.armed {
			tick = s.timer.C
		}
		select {
		case a, ok := <-s.intake():
			s.arrive(a, ok)
		case f := <-s.completions:
			s.complete(f)
		case in := <-s.inlineDone:
			s.inlineEnded(in)
		case <-s.wake:
		case <-tick:
			s.armed = false
		}
		if !s.closing && s.e.stopping.Load() {
			s.closing = true
		}
		if !s.abandoning && s.e.abandoning.Load() {
			s.abandoning = true
		}
		s.absorb()
		s.dispatch()
		if s.active && !s.intakeClosed && s.buffered == 0 && s.inflight == 0 && !s.inlineOn {
			s.goIdle()
		}
	}
}

// goActive records the idle→active edge: no inline flush may start from
// now on, and one already running is waited for, its key held flying so
// that arrivals for it queue behind it.
func (s *shard[K, T]) goActive() {
	s.active = true
	s.imu.Lock()
	s.ibusy.Store(true)
	if in := s.inline; in != nil && !s.inlineOn {
		s.iwant, s.inlineOn = true, true
		ks := s.lookup(in.ks.key, in.ks.hash)
		if ks == nil {
			ks = s.newKey(in.ks.key, in.ks.hash)
		}
		ks.flying = true
	}
	s.imu.Unlock()
	// An inline flush that ended before the edge, handing back Retry, was
	// sent under imu: take its items now, ahead of the arrival at hand.
	select {
	case in := <-s.inlineDone:
		s.inlineEnded(in)
	default:
	}
}

// goIdle records the active→idle edge unless an arrival is on its way.
func (s *shard[K, T]) goIdle() {
	s.imu.Lock()
	defer s.imu.Unlock()
	if s.transit.Load() == 0 && len(s.inlineDone) == 0 {
		s.ibusy.Store(false)
		s.active = false
	}
}

// untransit undoes a send that did not happen; the shard may be waiting for
// it to go idle.
func (s *shard[K, T]) untransit() {
	s.transit.Add(-1)
	s.poke()
}

// inlineEnded takes back the key of an inline flush that the shard waited
// for or that put items in Retry: they go to the head of the key's pending
// queue, before what arrived meanwhile, as after a flight.
func (s *shard[K, T]) inlineEnded(in *inlineFlight[K, T]) {
	s.active = true // ibusy is set: by goActive, or by the flush for Retry
	b := &in.ks.batch
	ks := s.lookup(b.Key, in.ks.hash)
	if s.inlineOn {
		s.inlineOn = false
		ks.flying = false
	}
	if len(b.Retry) > 0 {
		if ks == nil {
			ks = s.newKey(b.Key, in.ks.hash)
		}
		pending := make([]T, 0, len(b.Retry)+len(ks.pending))
		pending = append(append(pending, b.Retry...), ks.pending...)
		clear(ks.pending)
		ks.pending = pending
		ks.runs = append(append([]run(nil), in.ks.retryRuns...), ks.runs...)
		s.buffered += len(b.Retry)
	}
	if ks == nil {
		return
	}
	if len(ks.pending) > 0 {
		s.enqueue(ks)
	} else {
		s.forget(ks)
	}
}

// intake is nil, disabling the receive, while the shard is over MaxBuffered;
// that is what blocks Submit. Once closing, everything queued is taken so
// the shard can see the channel close.
func (s *shard[K, T]) intake() chan arrival[K, T] {
	if s.intakeClosed || (!s.closing && s.buffered >= s.e.cfg.MaxBuffered) {
		return nil
	}
	return s.in
}

// absorb takes what is already queued before dispatching, so a burst shares
// one bundle instead of the first arrival firing alone. It never waits.
func (s *shard[K, T]) absorb() {
	for more := true; more; {
		select {
		case f := <-s.completions:
			s.complete(f)
		default:
			more = false
		}
	}
	for range intakeDepth {
		in := s.intake()
		if in == nil {
			return
		}
		select {
		case a, ok := <-in:
			s.arrive(a, ok)
		default:
			return
		}
	}
}

func (s *shard[K, T]) arrive(a arrival[K, T], ok bool) {
	if !ok {
		s.intakeClosed = true
		s.goActive() // waits for an inline flush, and lets none start
		return
	}
	s.transit.Add(-1)
	if !s.active {
		s.goActive()
	}
	if a.more != nil {
		for _, p := range *a.more {
			s.take(p)
		}
		s.e.putMore(a.more)
		return
	}
	s.take(a)
}

// take adds an arrival's items to its key's pending queue.
func (s *shard[K, T]) take(a arrival[K, T]) {
	ks := s.lookup(a.key, a.hash)
	if ks == nil {
		ks = s.newKey(a.key, a.hash)
	}
	ks.pending = append(ks.pending, a.items...)
	ks.runs = append(ks.runs, run{sub: a.sub, n: len(a.items)})
	s.buffered += len(a.items)
	if !ks.flying && !ks.queued {
		s.enqueue(ks)
	}
}

// dispatch fires bundles while there are ready keys, a free in-flight slot
// and an immediately available permit. It never waits.
func (s *shard[K, T]) dispatch() {
	if s.abandoning {
		s.e.cfg.Limiter.Cancel(s.waiter)
		return
	}
	inline := 0 // an inline flush counts as one in flight
	if s.inlineOn {
		inline = 1
	}
	for s.readyLen() > 0 && s.inflight+inline < s.e.cfg.MaxInFlight {
		if !s.e.cfg.Limiter.Acquire(s.waiter) {
			// Queued: the limiter pokes the shard when its turn comes.
			if !s.armed {
				s.timer.Reset(s.e.cfg.Hold)
				s.armed = true
			}
			return
		}
		f := s.newFlight()
		n := bundleSize(s.readyLen(), s.e.cfg.BundleBase, s.e.cfg.BundleMax)
		picked := s.ready[s.readyHead : s.readyHead+n]
		for _, ks := range picked {
			ks.queued, ks.flying = false, true
			ks.batch.Items, ks.pending = ks.pending, ks.batch.Items[:0]
			ks.flightRuns, ks.runs = ks.runs, ks.flightRuns[:0]
			f.keys = append(f.keys, ks)
			f.bundle = append(f.bundle, &ks.batch)
		}
		clear(picked)
		s.readyHead += n
		if s.readyHead == len(s.ready) {
			s.ready, s.readyHead = s.ready[:0], 0
		}
		s.inflight++
		s.e.flights.Add(1)
		go s.e.fly(s, f)
	}
}

// bundleSize is how many of ready keys the next bundle takes: all of them up
// to base (Config.BundleBase); past it, half the backlog but at least base
// (the rest can fly beside it), never more than limit (Config.BundleMax).
// Under a deep backlog fewer, larger commits carry the same keys: each
// commit has a fixed cost (a WAL flush, a function call, a round trip) that
// a partition per key otherwise pays every few segments.
func bundleSize(ready, base, limit int) int {
	base = min(base, limit)
	if ready <= base {
		return ready
	}
	return min(ready, limit, max(base, (ready+1)/2))
}

// settle runs on the flight goroutine after the flush returned: it resolves
// every item not in Retry and records which submissions the retried items
// belong to.
func (ks *keyState[K, T]) settle() {
	items, retry := ks.batch.Items, ks.batch.Retry
	if len(retry) == 0 {
		for _, r := range ks.flightRuns {
			r.sub.resolve(r.n)
		}
		return
	}
	i, j := 0, 0
	for _, r := range ks.flightRuns {
		kept := 0
		for range r.n {
			if j < len(retry) && items[i] == retry[j] {
				j++
				kept++
			}
			i++
		}
		if kept > 0 {
			ks.retryRuns = append(ks.retryRuns, run{sub: r.sub, n: kept})
		}
		if kept < r.n {
			r.sub.resolve(r.n - kept)
		}
	}
	if j < len(retry) {
		panic(fmt.Sprintf("fusion: Batch.Retry of %v is not a subsequence of its Items", ks.key))
	}
}

// complete takes a flight back: its keys may flush again, retried items
// first, and keys left with nothing are forgotten.
func (s *shard[K, T]) complete(f *flight[K, T]) {
	s.inflight--
	for _, ks := range f.keys {
		ks.flying = false
		b := &ks.batch
		s.buffered -= len(b.Items) - len(b.Retry)
		if len(b.Retry) == 0 {
			clear(b.Items)
			b.Items = b.Items[:0]
			clear(ks.flightRuns)
			ks.flightRuns = ks.flightRuns[:0]
		} else {
			// copy-safe even if the flush made Retry a subslice of Items.
			old := b.Items
			merged := append(old[:0], b.Retry...)
			merged = append(merged, ks.pending...)
			if len(old) > len(merged) {
				clear(old[len(merged):])
			}
			clear(ks.pending)
			ks.pending, b.Items = merged, ks.pending[:0]

			runs := append(ks.flightRuns[:0], ks.retryRuns...)
			runs = append(runs, ks.runs...)
			clear(ks.runs)
			ks.runs, ks.flightRuns = runs, ks.runs[:0]
			clear(ks.retryRuns)
			ks.retryRuns = ks.retryRuns[:0]
		}
		// Never reuse Retry: the flush may have pointed it into Items.
		b.Retry = nil
		if len(ks.pending) > 0 {
			s.enqueue(ks)
		} else {
			s.forget(ks)
		}
	}
	clear(f.keys)
	clear(f.bundle)
	f.keys, f.bundle = f.keys[:0], f.bundle[:0]
	s.freeFlights = append(s.freeFlights, f)
}

// poke wakes the shard without waiting.
func (s *shard[K, T]) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *shard[K, T]) readyLen() int { return len(s.ready) - s.readyHead }

func (s *shard[K, T]) enqueue(ks *keyState[K, T]) {
	ks.queued = true
	if len(s.ready) == cap(s.ready) && s.readyHead > 0 {
		n := copy(s.ready, s.ready[s.readyHead:])
		clear(s.ready[n:])
		s.ready, s.readyHead = s.ready[:n], 0
	}
	s.ready = append(s.ready, ks)
}

// lookup is the state of key k, whose hash is h, or nil.
func (s *shard[K, T]) lookup(k K, h uint64) *keyState[K, T] {
	return s.keys.get(k, h)
}

// newKey adds the state of key k, whose hash is h and which the shard does
// not hold.
func (s *shard[K, T]) newKey(k K, h uint64) *keyState[K, T] {
	var ks *keyState[K, T]
	if n := len(s.freeKeys); n > 0 {
		ks = s.freeKeys[n-1]
		s.freeKeys[n-1] = nil
		s.freeKeys = s.freeKeys[:n-1]
	} else {
		ks = new(keyState[K, T])
	}
	ks.key, ks.batch.Key, ks.hash, ks.batch.Hash = k, k, h, h
	s.keys.add(h, ks)
	return ks
}

func (s *shard[K, T]) forget(ks *keyState[K, T]) {
	s.keys.remove(ks.hash, ks)
	n := len(s.freeKeys)
	if n >= max(s.maxFree, maxFreeKeys) {
		return
	}
	keep := maxKeptItems
	if n >= maxFreeKeys {
		keep = maxSmallItems
		if cap(ks.runs) > keep || cap(ks.flightRuns) > keep || cap(ks.retryRuns) > keep {
			return
		}
	}
	if cap(ks.pending) > keep {
		ks.pending = nil
	}
	if cap(ks.batch.Items) > keep {
		ks.batch.Items = nil
	}
	s.freeKeys = append(s.freeKeys, ks)
}

func (s *shard[K, T]) newFlight() *flight[K, T] {
	if n := len(s.freeFlights); n > 0 {
		f := s.freeFlights[n-1]
		s.freeFlights[n-1] = nil
		s.freeFlights = s.freeFlights[:n-1]
		return f
	}
	return &flight[K, T]{
		keys:   make([]*keyState[K, T], 0, s.e.cfg.BundleMax),
		bundle: make([]*Batch[K, T], 0, s.e.cfg.BundleMax),
	}
}
