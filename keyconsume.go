package queen

import (
	"context"
	"errors"
	"iter"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/internal/perkey"
)

// keyCheckpoint is how often a per-key batch that runs long writes the
// outcomes it has not written yet (besides at each lease renewal, each
// failure and the batch's end): what a crash can lose.
const keyCheckpoint = time.Second

// keyBatch is one leased partition batch handled per key (KeyConcurrency
// > 1): package perkey schedules the handlers, keyBatch settles their
// outcomes.
type keyBatch struct {
	c    *consumer
	head *Message // names the partition, group and lease
	exp  atomic.Int64
	stat *keyStat
	hold *holdWatch      // nil when MaxHold is off or AutoAck
	ctx  context.Context // the batch's handlers' context

	mu      sync.Mutex
	paused  int        // keys paused in this batch
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
	b := &keyBatch{c: c, head: msgs[0], ctx: c.work}
	for _, m := range msgs {
		m.keyed = !c.po.AutoAck
	}
	// A message whose retry wait holds blocks its key: neither it nor the
	// key's later messages start (they are left unsettled and uncharged,
	// for a claim after the wait); the other keys run.
	all := msgs
	waits := slices.ContainsFunc(all, func(m *Message) bool { return m.waiting })
	var held []keyedRow // noted at the release, so claims do not count them
	if waits {
		msgs = make([]*Message, 0, len(all))
		blocked := map[string]bool{}
		for _, m := range all {
			switch {
			case m.waiting:
				blocked[m.Key] = true
			case blocked[m.Key]:
				held = append(held, keyedRow{m: m, act: actHeld})
			default:
				msgs = append(msgs, m)
			}
		}
	}
	keys := perkey.New(perkey.Config[*Message]{
		Limit:  c.keyConc,
		Key:    func(m *Message) string { return m.Key },
		Offset: func(m *Message) int64 { return m.Offset },
		// An auto-acked batch never stops: the claim consumed it, so a
		// message not started would be lost unseen; as without keys, every
		// one reaches the handler (with a cancelled context once Consume
		// stops).
		Stop: func() bool {
			return !c.po.AutoAck && (c.stop.Err() != nil || time.Now().UnixNano() >= b.exp.Load())
		},
		Handle: b.handle,
	}, msgs)
	sk := keyStatKey{q.c.tenant, q.name, b.head.Group, b.head.Partition}
	b.stat = e.keyStats.acquire(sk)
	defer func() {
		b.mu.Lock()
		paused := b.paused
		b.mu.Unlock()
		b.stat.paused.Add(-int64(paused))
		e.keyStats.release(sk)
	}()

	if c.po.AutoAck {
		// Already committed by the claim: nothing to settle or pause.
		b.exp.Store(math.MaxInt64)
		keys.Run()
		return nil
	}
	b.exp.Store(b.head.LeaseExpiresAt.UnixNano())
	b.hold, b.ctx = c.newHold()
	defer b.hold.end()
	kick := make(chan struct{}, 1)
	stopRenew := q.renew(b.head, &b.exp, func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}, b.hold)
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
	keys.Run()
	close(done)
	wg.Wait()
	stopRenew()

	rows := b.pending
	stopping := c.stop.Err() != nil
	if stopping {
		// Stopping: hand back what was not started, uncharged, except a
		// paused key's (its failure already counted this delivery).
		for m := range keys.Unstarted() {
			rows = append(rows, keyedRow{m: m, act: actInterrupt})
		}
	}
	if !keys.Started() && len(rows) == 0 && !waits {
		if b.exp.Load() == 0 {
			c.dm.leaseLost(context.Background())
		}
		return nil // nothing handled: the lease runs out by itself
	}
	// Left with waiting keys only (every other key ran to its end), and the
	// next claim would carry the same messages (a full claim that started
	// nothing; else the claim reached the partition's end or how far a
	// claim may reach, which the database tells apart): the release parks
	// the partition until the earliest wait ends or, if the claim reached
	// the end, new messages arrive, so it is not claimed again for nothing
	// meanwhile. settle_keyed_v2 decides, and does not park while a failure
	// without a wait is to be redelivered.
	act := actCarry
	b.mu.Lock()
	paused := b.paused
	b.mu.Unlock()
	if (waits || paused > 0) && !stopping && b.exp.Load() != 0 && !hasAny(keys.Unstarted()) &&
		(!keys.Started() || len(all) < c.po.Batch) {
		act = actPark
	}
	rows = append(rows, held...)
	rows = append(rows, keyedRow{m: all[len(all)-1], act: act})
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

// hasAny reports whether seq yields anything.
func hasAny[T any](seq iter.Seq[T]) bool {
	for range seq {
		return true
	}
	return false
}

// handle runs one message's handler and records its outcome; a failure is
// written at once, because its verdict decides whether the key goes on.
func (b *keyBatch) handle(m *Message) perkey.Outcome {
	c := b.c
	var exp *atomic.Int64
	if !c.po.AutoAck {
		exp = &b.exp
	}
	b.stat.inFlight.Add(1)
	defer b.stat.inFlight.Add(-1)
	err := c.call(b.ctx, m, exp, b.hold)
	switch {
	case errors.Is(err, errLeaseEnded):
		// Not started: nothing to settle, and the key stops here (the
		// lease is over, so the batch starts nothing more anyway).
		return perkey.Hold
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
		return perkey.Hold
	default:
		if b.fail(keyedRow{m: m, act: actFail, reason: reasonText(err), delay: retryDelay(err)}) {
			b.mu.Lock()
			b.paused++
			b.mu.Unlock()
			b.stat.paused.Add(1)
			return perkey.Pause
		}
	}
	return perkey.Next
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
