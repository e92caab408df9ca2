package fusion

import (
	"context"
	"errors"
	"iter"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed is returned by Submit once Close has begun.
var ErrClosed = errors.New("fusion: engine closed")

// Batch is one segment of a bundle: what accumulated for one key.
type Batch[K comparable, T any] struct {
	Key K
	// Hash is Key.Hash(), as the engine computed it once for the key's
	// submissions, so a FlushFunc that needs it need not hash the key again.
	Hash uint64
	// Items are the key's items in submission order.
	Items []T
	// Retry is set by the FlushFunc to the items, a subsequence of Items in
	// the same order, that must go back to the head of the key's pending
	// queue and be flushed again: for example the rest of a segment part of
	// which turned out to duplicate stored messages. Their submissions stay
	// open until they are resolved. It is nil when the flush is called.
	Retry []T
}

// FlushFunc commits one bundle, normally in one database transaction. It runs
// on its own goroutine, writes each item's verdict into the item itself, and
// returns only after the commit, or the failure, is final: the engine treats
// every item not listed in Retry as resolved when it returns, and only then
// lets the keys flush again.
//
// A non-nil error reports that the round trip failed or timed out; it only
// feeds the limiter, so the verdicts must already say what happened. The
// FlushFunc must not retain the bundle or its batches after returning; the
// engine reuses them.
type FlushFunc[K comparable, T any] func(ctx context.Context, bundle []*Batch[K, T]) error

// Config configures an Engine. Zero fields take their defaults.
type Config struct {
	// BundleMax is the largest number of keys (segments) in one bundle.
	// Defaults to DefaultBundleMax.
	BundleMax int
	// BundleBase is the bundle size below which a bundle takes every ready
	// key. With more ready, a bundle takes half of them, at least
	// BundleBase, at most BundleMax: a deep backlog goes in fewer, larger
	// commits, the rest flying beside them. Defaults to BundleMax (a
	// bundle takes up to BundleMax ready keys).
	BundleBase int
	// FlushContext returns the context of each flush and its cancel func,
	// which is called when the flush returns. The context belongs to the
	// engine, never to a submitter: pgx kills a connection whose query is
	// cancelled, so a caller who gives up on a flush it shares must only
	// stop waiting (an inline flush, which it does not share, also ends
	// with its caller's ctx). Give it a timeout. Defaults to
	// context.Background with no deadline.
	FlushContext func() (context.Context, context.CancelFunc)
	// Hold is the backstop tick at which a shard that was refused a push
	// permit retries, covering permits freed outside the engine. It is not a
	// batching window: arrivals and completions dispatch at once.
	// Defaults to DefaultHold.
	Hold time.Duration
	// Inline lets SubmitWait of one key flush on the caller's goroutine when
	// that key's shard holds nothing and no other flush of the shard runs:
	// an isolated submission then costs no goroutine hand-off (see the
	// package documentation, "Inline flushes"). Submit never flushes
	// inline. Defaults to false.
	Inline bool
	// Limiter hands out push permits, one per bundle in flight, across every
	// shard. Share one between engines that write to the same database.
	// Defaults to NewVegas(VegasConfig{}).
	Limiter *Vegas
	// MaxBufferedBytes bounds the bytes of the unresolved items (pending or
	// in flight) of the whole engine, as items implementing [Sizer] report
	// them; other items count nothing. Submit blocks while a submission
	// would take the engine over it, until ctx ends or a flush frees room.
	// A submission is admitted whole when nothing is buffered, so one larger
	// than the bound still goes through, alone. Defaults to
	// DefaultMaxBufferedBytes.
	MaxBufferedBytes int64
	// MaxBuffered bounds the unresolved items (pending or in flight) of one
	// shard: Submit blocks while its shard holds MaxBuffered or more, so
	// memory stays bounded when the database falls behind. Up to 64
	// hand-offs already queued to the shard are accepted beyond it: a
	// Submit is one, and SubmitWait hands a shard up to 64 of its pairs in
	// one.
	// Defaults to DefaultMaxBuffered.
	MaxBuffered int
	// MaxInFlight bounds the bundles one shard has in flight at once, whatever
	// the limiter grants, so one hot shard cannot take every permit.
	// Defaults to DefaultMaxInFlight.
	MaxInFlight int
	// Shards is the number of shards, each one goroutine owning a disjoint
	// set of keys. Defaults to DefaultShards.
	Shards int
}

// The defaults of Config's zero fields. They suit a generic caller; queen
// sets its own (BundleMax 256 among them) from its Config.
const (
	DefaultBundleMax        = 16
	DefaultHold             = 15 * time.Millisecond
	DefaultMaxBuffered      = 1 << 20
	DefaultMaxBufferedBytes = 256 << 20
	DefaultMaxInFlight      = 4
	DefaultShards           = 8
)

// Sizer is implemented by items that count toward Config.MaxBufferedBytes.
type Sizer interface {
	// Bytes is the memory the item holds while the engine owns it. It is
	// read once, at Submit.
	Bytes() int
}

func (c Config) withDefaults() Config {
	if c.BundleMax <= 0 {
		c.BundleMax = DefaultBundleMax
	}
	if c.BundleBase <= 0 || c.BundleBase > c.BundleMax {
		c.BundleBase = c.BundleMax
	}
	if c.FlushContext == nil {
		c.FlushContext = func() (context.Context, context.CancelFunc) {
			return context.Background(), func() {}
		}
	}
	if c.Hold <= 0 {
		c.Hold = DefaultHold
	}
	if c.Limiter == nil {
		c.Limiter = NewVegas(VegasConfig{})
	}
	if c.MaxBuffered <= 0 {
		c.MaxBuffered = DefaultMaxBuffered
	}
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.Shards <= 0 {
		c.Shards = DefaultShards
	}
	return c
}

// intakeDepth is the capacity of a shard's intake channel. It lets submitters
// hand over without waiting for the shard to be scheduled, and lets the shard
// absorb a burst before dispatching so the burst shares a bundle.
const intakeDepth = 64

// Engine accumulates submissions per key and flushes them in bundles. It is
// safe for concurrent use.
type Engine[K Keyer, T comparable] struct {
	cfg    Config
	flush  FlushFunc[K, T]
	shards []*shard[K, T]
	sized  bool // T implements Sizer
	bytes  budget

	// closing is closed when Close begins, releasing blocked submitters.
	// Shards learn of it, and of abandon, from the flags and a wake, which
	// keeps two channels out of their hot select.
	closing    chan struct{}
	stopping   atomic.Bool
	abandoning atomic.Bool

	// mores are spare hand-offs of several pairs (see submitMany).
	mores sync.Pool

	closeOnce   sync.Once
	abandonOnce sync.Once
	finishOnce  sync.Once
	flights     sync.WaitGroup
}

// New starts an engine that commits bundles with flush. T is normally a
// pointer to the caller's item, which is how verdicts travel back and how
// Batch.Retry entries are matched to Items (with ==).
func New[K Keyer, T comparable](cfg Config, flush FlushFunc[K, T]) *Engine[K, T] {
	e := &Engine[K, T]{
		cfg:     cfg.withDefaults(),
		flush:   flush,
		closing: make(chan struct{}),
	}
	var zero T
	_, e.sized = any(zero).(Sizer)
	e.bytes.max = e.cfg.MaxBufferedBytes
	e.bytes.freed = make(chan struct{})
	e.shards = make([]*shard[K, T], e.cfg.Shards)
	for i := range e.shards {
		e.shards[i] = newShard(e)
	}
	for _, s := range e.shards {
		go s.run()
	}
	return e
}

// Submit hands items, all for key, to the shard owning key and returns
// without waiting for the database. done, if not nil, is called exactly once
// after every item has been resolved: after the commit that carried it, or
// after Close handed it to abandon. done runs on an engine goroutine,
// possibly concurrently with other submissions' done, and must not block; in
// particular it must not call Submit. The engine owns items until done.
//
// An empty submission is done at once. Submit returns ErrClosed once Close
// has begun. While the shard is over Config.MaxBuffered, or the engine would
// be over Config.MaxBufferedBytes, it blocks until there is room or ctx ends;
// then it returns ctx.Err() and done is never called.
func (e *Engine[K, T]) Submit(ctx context.Context, key K, items []T, done func()) error {
	select {
	case <-e.closing:
		return ErrClosed
	default:
	}
	if len(items) == 0 {
		if done != nil {
			done()
		}
		return nil
	}
	n := e.sizeOf(items)
	if err := e.bytes.acquire(ctx, n, e.closing); err != nil {
		return err
	}
	h := key.Hash()
	s := e.shards[h%uint64(len(e.shards))]
	sub := newSubmission(done, len(items))
	sub.bytes, sub.budget = n, &e.bytes
	return e.send(ctx, s, arrival[K, T]{key: key, hash: h, items: items, sub: sub})
}

// sizeOf is the bytes items count toward MaxBufferedBytes: 0 unless the
// items implement Sizer.
func (e *Engine[K, T]) sizeOf(items []T) int64 {
	var n int64
	if e.sized {
		for _, it := range items {
			n += int64(any(it).(Sizer).Bytes())
		}
	}
	return n
}

// send hands a to its shard. Counting it in transit first is what keeps an
// inline flush from starting, and overtaking it, before the shard sees it.
func (e *Engine[K, T]) send(ctx context.Context, s *shard[K, T], a arrival[K, T]) error {
	s.transit.Add(1)
	// The read lock orders this send before Close closes the channel.
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		s.untransit()
		e.refuse(a)
		return ErrClosed
	}
	select {
	case s.in <- a:
		return nil
	default:
	}
	select {
	case s.in <- a:
		return nil
	case <-ctx.Done():
		s.untransit()
		e.refuse(a)
		return ctx.Err()
	case <-e.closing:
		s.untransit()
		e.refuse(a)
		return ErrClosed
	}
}

// refuse gives back the submissions of a hand-off that did not happen.
func (e *Engine[K, T]) refuse(a arrival[K, T]) {
	if a.more == nil {
		a.sub.refuse()
		return
	}
	for _, p := range *a.more {
		p.sub.refuse()
	}
	e.putMore(a.more)
}

// maxHandoff is the most pairs of one SubmitWait one hand-off carries to a
// shard.
const maxHandoff = intakeDepth

func (e *Engine[K, T]) getMore() *[]arrival[K, T] {
	if p, _ := e.mores.Get().(*[]arrival[K, T]); p != nil {
		return p
	}
	p := make([]arrival[K, T], 0, maxHandoff)
	return &p
}

func (e *Engine[K, T]) putMore(p *[]arrival[K, T]) {
	clear(*p)
	*p = (*p)[:0]
	e.mores.Put(p)
}

// submitMany is SubmitWait's Submit of several pairs: each shard's pairs go
// to it in hand-offs of up to maxHandoff, in their order, rather than one
// channel send (and one lock of the shard's intake on each side) per pair,
// which in a call spread over many keys was the engine's largest cost. What
// Submit checks and bounds per pair it checks and bounds per pair; a pair
// waiting for room under MaxBufferedBytes first hands over everything the
// call holds back, which may be what the room waits for. On an error, pairs
// not handed over are refused (never flushed, their done never called).
func (e *Engine[K, T]) submitMany(ctx context.Context, groups iter.Seq2[K, []T], done func()) error {
	select {
	case <-e.closing:
		return ErrClosed
	default:
	}
	held := make([]*[]arrival[K, T], len(e.shards))
	handAll := func() error {
		for i, p := range held {
			if p == nil {
				continue
			}
			held[i] = nil
			if err := e.send(ctx, e.shards[i], arrival[K, T]{more: p}); err != nil {
				return err
			}
		}
		return nil
	}
	fail := func(err error) error {
		for i, p := range held {
			if p != nil {
				held[i] = nil
				e.refuse(arrival[K, T]{more: p})
			}
		}
		return err
	}
	for key, items := range groups {
		if len(items) == 0 {
			if done != nil {
				done()
			}
			continue
		}
		n := e.sizeOf(items)
		if n > 0 && !e.bytes.tryAcquire(n) {
			if err := handAll(); err != nil {
				return fail(err)
			}
			if err := e.bytes.acquire(ctx, n, e.closing); err != nil {
				return fail(err)
			}
		}
		h := key.Hash()
		i := h % uint64(len(e.shards))
		sub := newSubmission(done, len(items))
		sub.bytes, sub.budget = n, &e.bytes
		p := held[i]
		if p == nil {
			p = e.getMore()
			held[i] = p
		}
		*p = append(*p, arrival[K, T]{key: key, hash: h, items: items, sub: sub})
		if len(*p) == maxHandoff {
			held[i] = nil
			if err := e.send(ctx, e.shards[i], arrival[K, T]{more: p}); err != nil {
				return fail(err)
			}
		}
	}
	if err := handAll(); err != nil {
		return fail(err)
	}
	return nil
}

// SubmitWait submits each of groups' n (key, items) pairs and returns once
// every one has been resolved, or when ctx ends, or with ErrClosed. Each
// item carries its own verdict. On an error, pairs already submitted may
// still commit: the caller learns only that the call as a whole did not
// complete.
//
// With n > 1 the pairs reach each shard in hand-offs of up to 64 (in their
// order), not one by one; each pair is still its own submission, bounded as
// Submit bounds it.
//
// With Config.Inline and n == 1, SubmitWait flushes on the caller's
// goroutine when the key's shard is idle, and a ctx that ends during that
// flush cancels it (see the package documentation, "Inline flushes").
func (e *Engine[K, T]) SubmitWait(ctx context.Context, n int, groups iter.Seq2[K, []T]) error {
	var pending atomic.Int32
	pending.Store(int32(n))
	done := make(chan struct{})
	groupDone := func() {
		if pending.Add(-1) == 0 {
			close(done)
		}
	}
	if n > 1 {
		if err := e.submitMany(ctx, groups, groupDone); err != nil {
			return err
		}
	} else {
		for k, items := range groups {
			if n == 1 && e.cfg.Inline {
				ran, err := e.inline(ctx, k, items, groupDone)
				if err != nil {
					return err
				}
				if ran {
					continue
				}
			}
			if err := e.Submit(ctx, k, items, groupDone); err != nil {
				return err
			}
		}
	}
	select {
	case <-done: // preferred to a ctx that ended meanwhile
		return nil
	default:
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// bufferedBytes is what the unresolved submissions hold.
func (e *Engine[K, T]) bufferedBytes() int64 { return e.bytes.used.Load() }

// budget is a byte semaphore that admits an acquisition whole when it is
// empty, so no single acquisition can wait forever.
type budget struct {
	max  int64
	used atomic.Int64
	// waiters is read without mu by release, which closes and replaces
	// freed under mu only when someone waits.
	waiters atomic.Int32
	mu      sync.Mutex
	freed   chan struct{}
}

func (b *budget) tryAcquire(n int64) bool {
	for {
		u := b.used.Load()
		if u != 0 && u+n > b.max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// acquire takes n bytes, waiting for room until ctx ends or closing is
// closed.
func (b *budget) acquire(ctx context.Context, n int64, closing <-chan struct{}) error {
	if n == 0 || b.tryAcquire(n) {
		return nil
	}
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	for {
		b.mu.Lock()
		freed := b.freed
		b.mu.Unlock()
		// After registering: a release from now on closes freed, and one
		// before shows in used.
		if b.tryAcquire(n) {
			return nil
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		case <-closing:
			return ErrClosed
		}
	}
}

func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.used.Add(-n)
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		close(b.freed)
		b.freed = make(chan struct{})
		b.mu.Unlock()
	}
}

// Close stops intake, dispatches everything still pending (keeping one flush
// in flight per key), waits for every flush and stops the goroutines.
//
// If ctx ends first, shards stop dispatching; once the flushes in flight have
// returned (they run on the engine's own contexts), every item never
// dispatched, including items a flush put back in Retry, is handed to abandon
// in one call, and the submissions are done after abandon returns. abandon
// may be nil, which discards them; it must not retain the bundle. Close then
// returns ctx.Err().
//
// Close is idempotent: later calls wait for the first to finish and return
// nil unless their own ctx ends first.
func (e *Engine[K, T]) Close(ctx context.Context, abandon func(bundle []*Batch[K, T])) error {
	e.closeOnce.Do(e.stopIntake)
	var err error
	for _, s := range e.shards {
		select {
		case <-s.exited:
			continue
		default:
		}
		select {
		case <-s.exited:
		case <-ctx.Done():
			err = ctx.Err()
			e.abandonOnce.Do(func() {
				e.abandoning.Store(true)
				e.wakeAll()
			})
			<-s.exited
		}
	}
	e.finishOnce.Do(func() { e.finish(abandon) })
	return err
}

func (e *Engine[K, T]) stopIntake() {
	e.stopping.Store(true)
	close(e.closing)
	for _, s := range e.shards {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.in)
	}
	e.wakeAll()
}

// wakeAll makes every shard look at the engine's flags. A wake already
// pending is as good as a new one, since the flags were set before.
func (e *Engine[K, T]) wakeAll() {
	for _, s := range e.shards {
		s.poke()
	}
}

// finish runs once every shard goroutine has exited, so their state is now
// owned by the caller.
func (e *Engine[K, T]) finish(abandon func([]*Batch[K, T])) {
	e.flights.Wait()
	var left []*Batch[K, T]
	for _, s := range e.shards {
		for _, ks := range s.ready[s.readyHead:] {
			left = append(left, &Batch[K, T]{Key: ks.key, Hash: ks.hash, Items: ks.pending})
		}
	}
	if len(left) == 0 {
		return
	}
	if abandon != nil {
		abandon(left)
	}
	for _, s := range e.shards {
		for _, ks := range s.ready[s.readyHead:] {
			for _, r := range ks.runs {
				r.sub.resolve(r.n)
			}
		}
	}
}

// Stats are cumulative counters of an engine.
type Stats struct {
	// Bundles is the number of FlushFunc calls that returned (commits).
	Bundles uint64
	// Segments is the number of batches those calls carried; Segments well
	// above Bundles is the evidence that partitions are being fused.
	Segments uint64
	// Items is the number of items flushed, counting a retried item once per
	// flush.
	Items uint64
	// Retried is the number of items flushes put back in Retry.
	Retried uint64
	// Failed is the number of FlushFunc calls that returned an error.
	Failed uint64
	// Inline is the number of FlushFunc calls, among Bundles, that ran on
	// the submitter's goroutine (Config.Inline).
	Inline uint64
	// Limit is the limiter's current number of push permits.
	Limit int
	// BufferedBytes is what the unresolved items hold now, as [Sizer]
	// reports it.
	BufferedBytes int64
}

// Stats returns the engine's counters.
func (e *Engine[K, T]) Stats() Stats {
	st := Stats{Limit: e.cfg.Limiter.Limit(), BufferedBytes: e.bufferedBytes()}
	for _, s := range e.shards {
		st.Bundles += s.bundles.Load()
		st.Segments += s.segments.Load()
		st.Items += s.items.Load()
		st.Retried += s.retried.Load()
		st.Failed += s.failed.Load()
		st.Inline += s.inlined.Load()
	}
	return st
}

// fly runs one bundle on its own goroutine and hands it back to its shard.
func (e *Engine[K, T]) fly(s *shard[K, T], f *flight[K, T]) {
	defer e.flights.Done()
	ctx, cancel := e.cfg.FlushContext()
	start := time.Now()
	err := e.flush(ctx, f.bundle)
	rtt := time.Since(start)
	cancel()
	e.cfg.Limiter.Release(rtt, err != nil)

	// Count before settling, so Stats include a commit by the time its
	// submissions are done.
	var items, retried int
	for _, ks := range f.keys {
		items += len(ks.batch.Items)
		retried += len(ks.batch.Retry)
	}
	s.tally(len(f.keys), items, retried, err != nil)
	for _, ks := range f.keys {
		ks.settle()
	}

	s.completions <- f
}

// tally counts one returned FlushFunc call.
func (s *shard[K, T]) tally(segments, items, retried int, failed bool) {
	s.bundles.Add(1)
	s.segments.Add(uint64(segments))
	s.items.Add(uint64(items))
	if retried > 0 {
		s.retried.Add(uint64(retried))
	}
	if failed {
		s.failed.Add(1)
	}
}

// submission tracks one Submit call until all its items are resolved. Its
// counter needs no lock: a submission belongs to one key, and a key's items
// pass from shard to flight to shard over channels, never held by two
// goroutines at once.
type submission struct {
	done      func()
	remaining int
	bytes     int64 // held in budget until the last item is resolved
	budget    *budget
}

// Submissions are pooled because the common submission is one item, and the
// hot path must not allocate per item.
var submissions = sync.Pool{New: func() any { return new(submission) }}

func newSubmission(done func(), n int) *submission {
	sub := submissions.Get().(*submission)
	sub.done, sub.remaining = done, n
	return sub
}

func (sub *submission) recycle() {
	sub.done, sub.budget, sub.bytes = nil, nil, 0
	submissions.Put(sub)
}

// refuse gives back a submission Submit did not hand over.
func (sub *submission) refuse() {
	if sub.budget != nil {
		sub.budget.release(sub.bytes)
	}
	sub.recycle()
}

func (sub *submission) resolve(n int) {
	sub.remaining -= n
	if sub.remaining > 0 {
		return
	}
	if sub.budget != nil {
		sub.budget.release(sub.bytes) // before done, whose caller may submit again
	}
	done := sub.done
	sub.recycle()
	if done != nil {
		done()
	}
}

// run is a stretch of consecutive items of one key from one submission.
type run struct {
	sub *submission
	n   int
}

type arrival[K comparable, T any] struct {
	key   K
	hash  uint64 // key.Hash()
	items []T
	sub   *submission
	// more, when set, is a hand-off of several pairs (see submitMany),
	// taken in order; the fields above are then unused.
	more *[]arrival[K, T]
}

// flight is one bundle in flight; keys[i].batch is bundle[i].
type flight[K Keyer, T comparable] struct {
	keys   []*keyState[K, T]
	bundle []*Batch[K, T]
}

// counters lives in its own cache lines so flush goroutines bumping one
// shard's counters do not slow the shards next to it.
type counters struct {
	_                                                  [64]byte
	bundles, segments, items, retried, failed, inlined atomic.Uint64
	_                                                  [64]byte
}
