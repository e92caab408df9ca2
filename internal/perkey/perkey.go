// Package perkey runs one batch's messages per ordering key: up to a limit
// at once, on distinct keys, each key in offset order, and among the keys
// ready to start the one whose next message has the lowest offset first,
// so the partition's cursor advances as fast as the keys allow. It knows
// nothing of settlement or of queen's messages: handling is a function the
// caller passes in, and a message is any type.
package perkey

import (
	"container/heap"
	"iter"
	"sync"
)

// Outcome is what became of one message, and decides its key's rest in the
// batch.
type Outcome int

const (
	// Next goes on with the key's next message.
	Next Outcome = iota
	// Pause stops the key: it failed and waits for its redelivery. Its
	// rest is not handed back (the failure already counted the delivery).
	Pause
	// Hold stops the key: its rest is handed back (see Unstarted).
	Hold
)

// Config is one batch's run. Every field is required.
type Config[M any] struct {
	// Limit is how many messages are handled at once.
	Limit  int
	Key    func(M) string
	Offset func(M) int64
	// Stop reports whether to start nothing more; it is asked before
	// every start and after every message.
	Stop func() bool
	// Handle handles one message, on a goroutine of its own.
	Handle func(M) Outcome
}

// Batch is one batch's messages, grouped by key.
type Batch[M any] struct {
	cfg Config[M]

	mu      sync.Mutex
	done    *sync.Cond // a handler finished
	ready   laneHeap[M]
	lanes   []*lane[M]
	running int
	started bool
}

// lane is one key's messages, in offset order.
type lane[M any] struct {
	msgs   []M
	next   int // the next message to start
	paused bool
}

// New groups msgs (in offset order) by key.
func New[M any](cfg Config[M], msgs []M) *Batch[M] {
	b := &Batch[M]{cfg: cfg}
	b.done = sync.NewCond(&b.mu)
	byKey := map[string]*lane[M]{}
	for _, m := range msgs {
		k := cfg.Key(m)
		l := byKey[k]
		if l == nil {
			l = &lane[M]{}
			byKey[k] = l
			b.lanes = append(b.lanes, l)
		}
		l.msgs = append(l.msgs, m)
	}
	b.ready = laneHeap[M]{offset: cfg.Offset, lanes: append([]*lane[M](nil), b.lanes...)}
	heap.Init(&b.ready)
	return b
}

// Run starts handlers until every key is done or stopped, or Stop says so,
// and returns once the started ones have returned.
func (b *Batch[M]) Run() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		stop := b.cfg.Stop()
		for !stop && b.running < b.cfg.Limit && b.ready.Len() > 0 {
			l := heap.Pop(&b.ready).(*lane[M])
			m := l.msgs[l.next]
			l.next++
			b.running++
			b.started = true
			go b.handle(l, m)
		}
		if b.running == 0 && (stop || b.ready.Len() == 0) {
			return
		}
		b.done.Wait()
	}
}

func (b *Batch[M]) handle(l *lane[M], m M) {
	out := b.cfg.Handle(m)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running--
	switch {
	case out == Pause:
		l.paused = true
	case out == Hold:
	case l.next < len(l.msgs):
		heap.Push(&b.ready, l)
	}
	b.done.Signal()
}

// Started reports whether any handler started. Call it after Run.
func (b *Batch[M]) Started() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started
}

// Unstarted yields, after Run, the messages no handler started, except a
// paused key's.
func (b *Batch[M]) Unstarted() iter.Seq[M] {
	return func(yield func(M) bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, l := range b.lanes {
			if l.paused {
				continue
			}
			for _, m := range l.msgs[l.next:] {
				if !yield(m) {
					return
				}
			}
		}
	}
}

// laneHeap orders the keys ready to start by their next offset.
type laneHeap[M any] struct {
	offset func(M) int64
	lanes  []*lane[M]
}

func (h laneHeap[M]) Len() int { return len(h.lanes) }
func (h laneHeap[M]) Less(i, j int) bool {
	a, b := h.lanes[i], h.lanes[j]
	return h.offset(a.msgs[a.next]) < h.offset(b.msgs[b.next])
}
func (h laneHeap[M]) Swap(i, j int) { h.lanes[i], h.lanes[j] = h.lanes[j], h.lanes[i] }
func (h *laneHeap[M]) Push(x any)   { h.lanes = append(h.lanes, x.(*lane[M])) }
func (h *laneHeap[M]) Pop() any {
	old := h.lanes
	l := old[len(old)-1]
	h.lanes = old[:len(old)-1]
	return l
}
