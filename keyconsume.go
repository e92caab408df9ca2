package queen

import (
	"container/heap"
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
)

// keyCheckpoint is how often a per-key batch that runs long writes the
// outcomes it has not written yet (besides at each lease renewal, each
// failure and the batch's end): what a crash can lose.
const keyCheckpoint = time.Second

// keyLane is one ordering key's messages in a leased batch, in offset order.
type keyLane struct {
	msgs   []*Message
	next   int  // the next message to start
	paused bool // a failure stopped the key for this batch
	held   bool // stopping: the rest is handed back
}

// laneHeap orders the keys ready to start by their next offset, so the
// partition's cursor advances as fast as the keys allow.
type laneHeap []*keyLane

func (h laneHeap) Len() int { return len(h) }
func (h laneHeap) Less(i, j int) bool {
	return h[i].msgs[h[i].next].Offset < h[j].msgs[h[j].next].Offset
}
func (h laneHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *laneHeap) Push(x any)   { *h = append(*h, x.(*keyLane)) }
func (h *laneHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	*h = old[:len(old)-1]
	return l
}

// keyBatch is one leased partition batch handled per key (KeyConcurrency
// > 1).
type keyBatch struct {
	c    *consumer
	head *Message // names the partition, group and lease
	exp  atomic.Int64
	stat *keyStat

	mu      sync.Mutex
	wake    *sync.Cond // a handler finished
	ready   laneHeap
	lanes   []*keyLane
	running int
	paused  int // keys paused in this batch
	started bool
	pending []keyedRow // outcomes not written yet
}

// handleBatchKeyed is handleBatch for KeyConcurrency > 1: up to that many
// handlers at once, on distinct keys, each key in offset order; outcomes
// are settled out of order (settle_keyed), written at failures, renewals,
// every keyCheckpoint and in the returned settlement, which also releases
// the lease.
func (c *consumer) handleBatchKeyed(msgs []*Message) (settle func()) {
	q := c.q
	e := q.c.e
	b := &keyBatch{c: c, head: msgs[0]}
	b.wake = sync.NewCond(&b.mu)
	byKey := map[string]*keyLane{}
	for _, m := range msgs {
		m.keyed = !c.po.AutoAck
		l := byKey[m.Key]
		if l == nil {
			l = &keyLane{}
			byKey[m.Key] = l
			b.lanes = append(b.lanes, l)
		}
		l.msgs = append(l.msgs, m)
	}
	b.ready = append(laneHeap(nil), b.lanes...)
	heap.Init(&b.ready)
	sk := keyStatKey{q.c.tenant, q.name, b.head.Group, b.head.Partition}
	b.stat = e.keyStats.acquire(sk)
	defer func() {
		b.stat.paused.Add(-int64(b.paused))
		e.keyStats.release(sk)
	}()

	if c.po.AutoAck {
		// Already committed by the claim: nothing to settle or pause.
		b.exp.Store(math.MaxInt64)
		b.run()
		return nil
	}
	b.exp.Store(b.head.LeaseExpiresAt.UnixNano())
	kick := make(chan struct{}, 1)
	stopRenew := q.renew(b.head, &b.exp, func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(keyCheckpoint)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			case <-kick:
			}
			b.checkpoint()
		}
	})
	b.run()
	close(done)
	wg.Wait()
	stopRenew()

	rows := b.pending
	if c.stop.Err() != nil {
		// Stopping: hand back what was not started, uncharged, except a
		// paused key's (its failure already counted this delivery).
		for _, l := range b.lanes {
			if l.paused {
				continue
			}
			for _, m := range l.msgs[l.next:] {
				rows = append(rows, keyedRow{m: m, act: actInterrupt})
			}
		}
	}
	if !b.started && len(rows) == 0 {
		if b.exp.Load() == 0 {
			c.dm.leaseLost(context.Background())
		}
		return nil // nothing handled: the lease runs out by itself
	}
	rows = append(rows, keyedRow{m: msgs[len(msgs)-1], act: actCarry})
	return func() {
		_, err := b.write(rows, true)
		if err == nil && b.exp.Load() == 0 {
			err = ErrLeaseLost
		}
		if b.exp.Load() == 0 {
			c.dm.leaseLost(context.Background()) // by a renewal or a write: once per batch
		}
		if err != nil {
			e.log.Warn("queen: consume: settle failed; the batch's unsettled messages will be redelivered after its lease",
				"queue", q.name, "partition", b.head.Partition, "err", err)
		}
	}
}

// run starts handlers until every key is done, paused or the batch must
// stop (Consume stopping, the lease ended), and returns once the started
// ones have returned. An auto-acked batch never stops: the claim consumed
// it, so a message not started would be lost unseen; as without keys, every
// one reaches the handler (with a cancelled context once Consume stops).
func (b *keyBatch) run() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		stop := !b.c.po.AutoAck && (b.c.stop.Err() != nil || time.Now().UnixNano() >= b.exp.Load())
		for !stop && b.running < b.c.keyConc && b.ready.Len() > 0 {
			l := heap.Pop(&b.ready).(*keyLane)
			m := l.msgs[l.next]
			l.next++
			b.running++
			b.started = true
			b.stat.inFlight.Add(1)
			go b.handle(l, m)
		}
		if b.running == 0 && (stop || b.ready.Len() == 0) {
			return
		}
		b.wake.Wait()
	}
}

// handle runs one message's handler and records its outcome; a failure is
// written at once, because its verdict decides whether the key goes on.
func (b *keyBatch) handle(l *keyLane, m *Message) {
	c := b.c
	var exp *atomic.Int64
	if !c.po.AutoAck {
		exp = &b.exp
	}
	err := c.call(m, exp)
	var pause, hold bool
	switch {
	case errors.Is(err, errLeaseEnded):
		// Not started: nothing to settle, and the key stops here (the
		// lease is over, so the batch starts nothing more anyway).
		hold = true
	case c.po.AutoAck:
		if err != nil {
			c.q.c.e.log.Warn("queen: consume: handler failed on an auto-acked message", "queue", c.q.name,
				"partition", m.Partition, "offset", m.Offset, "err", err)
		}
	case err == nil:
		b.mu.Lock()
		b.pending = append(b.pending, keyedRow{m: m, act: actNone})
		b.mu.Unlock()
	case c.work.Err() != nil && !errors.Is(err, ErrPanic):
		// Most likely the shutdown cancelled the handler: hand the key's
		// rest back uncharged.
		b.mu.Lock()
		b.pending = append(b.pending, keyedRow{m: m, act: actInterrupt})
		b.mu.Unlock()
		hold = true
	default:
		pause = b.fail(keyedRow{m: m, act: actFail, reason: reasonText(err)})
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running--
	b.stat.inFlight.Add(-1)
	switch {
	case pause:
		l.paused = true
		b.paused++
		b.stat.paused.Add(1)
	case hold:
		l.held = true
	case l.next < len(l.msgs):
		heap.Push(&b.ready, l)
	}
	b.wake.Signal()
}

// fail writes a failure together with the outcomes not written yet and
// reports whether its key must wait: true when the message will be
// redelivered (the pause policy with budget left, or a verdict that did
// not arrive), false when it is settled (dead-lettered, dropped, or
// re-enqueued by the skip policy).
func (b *keyBatch) fail(row keyedRow) bool {
	b.mu.Lock()
	rows := append(b.pending, row)
	b.pending = nil
	b.mu.Unlock()
	sts, err := b.write(rows, false)
	if err != nil {
		b.unwritten(rows)
		return true
	}
	switch sts[len(sts)-1] {
	case stDeadLetter, stDropped, stRequeued, stBelowCursor:
		return false
	}
	return true
}

// checkpoint writes the outcomes not written yet, if any.
func (b *keyBatch) checkpoint() {
	b.mu.Lock()
	rows := b.pending
	b.pending = nil
	b.mu.Unlock()
	if len(rows) == 0 {
		return
	}
	if _, err := b.write(rows, false); err != nil {
		b.unwritten(rows)
	}
}

// unwritten puts back rows whose write failed: the next write (at the
// latest the batch's settlement) tries them again. Resending is harmless:
// an offset already settled is ignored.
func (b *keyBatch) unwritten(rows []keyedRow) {
	b.mu.Lock()
	b.pending = append(rows, b.pending...)
	b.mu.Unlock()
}

// write settles rows out of order through the ack fusion engine (release:
// also end the lease) and marks the lease lost if it was refused.
func (b *keyBatch) write(rows []keyedRow, release bool) ([]int16, error) {
	e := b.c.q.c.e
	sts, err := e.settleKeyedFused(settleOp{m: b.head, keyed: rows, release: release})
	if err != nil {
		e.log.Warn("queen: consume: writing out-of-order settlements failed", "queue", b.c.q.name,
			"partition", b.head.Partition, "err", err)
		return nil, err
	}
	b.c.dm.settledRows(context.Background(), rows, sts)
	for _, st := range sts {
		if st == stLeaseLost || st == stUnknown {
			b.exp.Store(0) // start nothing more: the partition may be someone else's
			break
		}
	}
	return sts, nil
}

// keyStats are the in-process numbers of running per-key batches, per
// leased (queue, group, partition) of this client: Queue.Status and the
// metrics read them.
type keyStats struct {
	mu sync.Mutex
	m  map[keyStatKey]*keyStat
}

type keyStatKey struct {
	tenant                  uuid.UUID
	queue, group, partition string
}

type keyStat struct {
	refs             int // batches of the partition running (under keyStats.mu)
	inFlight, paused atomic.Int64
}

func (s *keyStats) acquire(k keyStatKey) *keyStat {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[keyStatKey]*keyStat)
	}
	st := s.m[k]
	if st == nil {
		st = &keyStat{}
		s.m[k] = st
	}
	st.refs++
	return st
}

// release ends a batch's share (its caller has taken back its paused
// keys: the next claim redelivers them).
func (s *keyStats) release(k keyStatKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.m[k]
	if st == nil {
		return
	}
	if st.refs--; st.refs <= 0 {
		delete(s.m, k)
	}
}

// each calls fn for every partition with a running per-key batch.
func (s *keyStats) each(fn func(k keyStatKey, inFlight, paused int64)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, st := range s.m {
		fn(k, st.inFlight.Load(), st.paused.Load())
	}
}

func (s *keyStats) get(k keyStatKey) (inFlight, paused int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.m[k]
	if st == nil {
		return 0, 0, false
	}
	return st.inFlight.Load(), st.paused.Load(), true
}
