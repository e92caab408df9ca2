package queen

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
)

// ConsumeOptions are the options of Consume.
type ConsumeOptions struct {
	PopOptions
	// Concurrency is how many partitions are handled in parallel: each claim
	// takes up to as many ready partitions as there are free workers,
	// PopOptions.Batch messages from each. A worker is free again once its
	// handlers have returned; the batch's settle round trip that follows
	// holds only its partition, so up to Concurrency more partitions may be
	// leased while settles are in flight. Defaults to 1.
	Concurrency int
	// SoftStop is how long running handlers keep an uncancelled context
	// after Consume's ctx ends (or the client closes). Defaults to 0: their
	// context is cancelled at once.
	SoftStop time.Duration
	// HandlerTimeout is each message's deadline: the handler's context is
	// cancelled when it passes, and an error it then returns fails the
	// message (charging its retry budget). Defaults to 0: no deadline.
	HandlerTimeout time.Duration
	// MaxHold is how long a leased batch keeps its lease renewed while no
	// handler of it starts: a handler that runs past it (one hung on a call
	// without a deadline, say) has its context cancelled, as at
	// HandlerTimeout, and the lease is renewed no more, so it ends within
	// LeaseTime and the next claim redelivers the message and the rest of
	// its batch, uncharged, as after a crash. An error the handler returns
	// while the lease still lasts fails the message (charging its retry
	// budget). With KeyConcurrency above 1 it is measured from the latest
	// handler start of the batch, whatever the key. AutoAck batches hold no
	// lease and are not watched. Defaults to DefaultMaxHold; negative: no
	// limit (a hung handler holds its partition until Consume stops).
	MaxHold time.Duration
	// KeyConcurrency is how many handlers run at once within one leased
	// partition batch, each on a different ordering key (Message.Key; the
	// keyless messages, key "", count as one key). Messages of one key are
	// handled one at a time in offset order; keys overtake each other.
	// Defaults to 1: one handler per partition, in offset order, settled
	// cumulatively. Negative values are an error.
	//
	// Above 1, settlement is out of order: the partition's cursor commits
	// the contiguous prefix of settled messages, and the offsets settled
	// above it are stored with the cursor, so whoever holds the partition
	// next (after a crash, a lost lease or a handed-back batch) skips them
	// and delivers only the rest. They are written through the fused
	// settlement path when the batch ends, when a handler fails, each time
	// the lease is renewed and at least once a second while the batch runs;
	// a crash loses at most the settlements since the last write, whose
	// messages run again. A failing message under the pause
	// policy pauses only its key: that key's later messages are not
	// started, the other keys go on, and the failed message is delivered
	// again (Attempt + 1), before its key's later messages, once its retry
	// backoff (QueueOptions.RetryBackoff, RetryAfter) is over. The wait is
	// stored per message with the cursor: it holds no handler and no
	// lease, and a batch left with waiting keys only hands its lease back.
	// Other keys run ahead of a waiting one by at most 10,000 offsets (or
	// a Batch) past the cursor; then the partition stalls until the wait
	// is over. Failures
	// are counted per message, so RetryLimit holds for each one wherever it
	// sits in the partition; the failure that spends it dead-letters (or
	// drops) the message and its key goes on. Under the skip policy a
	// failed message counts as settled and is re-enqueued at the tail
	// after its retry backoff (QueueOptions.RetryBackoff, RetryAfter).
	// Concurrency still counts partitions: up to Concurrency ×
	// KeyConcurrency handlers run at once.
	KeyConcurrency int
}

// Consume claims messages and hands them to fn until ctx is done. One fetch
// loop claims, in one round trip, as many ready partitions as it has free
// workers, and claims again as soon as a worker frees up or a push arrives.
// Messages of a partition are handled one at a time in offset order (with
// KeyConcurrency above 1: one at a time per ordering key, see there); up to
// Concurrency partitions are handled in parallel. PopOptions.Wait does not
// apply: Consume waits for pushes by itself and sizes each claim by its free
// workers. PopOptions.Partitions (default 1) is how many partitions' batches
// Consume may hold per worker: the extra ones are claimed ahead and wait in
// hand, their leases running, until a worker is free. With small batches (a
// partition per key holding a few messages each) a value like 4 to 16 lets
// each claim and settle round trip carry that many times more messages.
//
// While a full batch of a partition runs, Consume claims the partition's
// next batch under the same lease (one batch ahead), and settles each
// batch handled whole in the same round trip as the claim of the batch
// after the one in hand. The batch claimed ahead starts only after the one
// before it was handled whole and its ack applied; a failure or a stop
// releases it with the lease, unstarted (its messages count as delivered,
// like the unstarted rest of a failed batch), and a lost lease is lost for
// it too. Not with AutoAck or KeyConcurrency above 1, nor while another
// partition of the queue is ready or more partitions are in hand than
// Concurrency: ready partitions take turns batch by batch.
//
// A worker that handled a batch whole keeps its lease over the drained
// partition (under the same conditions as claims ahead): the ack leaves
// the lease in place, and what is pushed to the partition next is taken
// under it by one statement that does not wait for a WAL flush, without a
// claim. The lease lingers until Consume stops (it is let go before
// Consume returns), the group is paused, another partition of the queue
// is ready, or 5 seconds pass with nothing pushed; meanwhile no other
// consumer of the group gets the partition. A process that dies then
// holds it for at most 10 seconds (the ack brings the lease's end in to
// that), not LeaseTime. A server crash may lose what that statement took,
// which is then delivered again. A Push of the same client to such a
// partition (one partition, not in a transaction) takes the message under
// the lease in its own transaction and hands it to the worker directly:
// one commit, the push's, durable like any push.
//
// A nil from fn acks the message; an error fails it (see Message.Fail) and
// the rest of its batch is left for redelivery, unhandled: the message comes
// back after the queue's RetryBackoff, or after the wait a RetryAfter error
// asks for (under FailureSkip as a copy at the partition's tail; neither
// applies with KeyConcurrency above 1 under FailurePause yet).
// Each batch is settled in one round trip after its last handler. While a handler runs past half the lease, the lease is
// renewed. A panic in fn is recovered, logged at Error with its stack, and
// fails the message with an error wrapping ErrPanic. With AutoAck, fn's
// errors (and panics) are only logged.
//
// When ctx is done, Consume stops claiming and starts no more handlers.
// Running handlers keep an uncancelled context for up to SoftStop (with 0,
// the default, it is cancelled at once); what they finish is acked. Every
// message not finished is handed back at once without charging the retry
// budget and without counting as a delivery (its next Attempt is unchanged),
// so another consumer takes it immediately rather than after LeaseTime: the
// unstarted rest of each batch, and a message whose handler returned an
// error after its context was cancelled by the stop. Nothing is acked twice.
// With AutoAck the claim already consumed its batch, so there is nothing to
// hand back: every message claimed still reaches fn, with a cancelled
// context once the stop began (with or without KeyConcurrency).
// See the graceful shutdown example for the signal.NotifyContext wiring.
//
// Client.Close stops every running Consume the same way and waits, within
// its own ctx, for them to settle; when that ctx ends first it cancels the
// handlers' contexts and goes on closing (a message settled after that comes
// back after its lease).
//
// While it runs, the call is a member of its group (see Member, and
// GroupStatus.Members): its claims and lease renewals are its heartbeats,
// it writes one of its own every DefaultMemberHeartbeat when they are
// rare, its leases carry its member id, and it deletes its member row when
// it returns. A process that dies leaves the row to expire after
// MemberTTL.
//
// Consume returns nil when ctx ends it, ErrClosed when the client closes,
// and an option error at once. Failing claims are logged and retried with a
// jittered backoff, except one that fails with ErrEncryption: the queue is
// encrypted and the client has no key, or a claimed payload was sealed with
// a key that is neither Config.EncryptionKey nor in Config.DecryptionKeys.
// That claim took nothing (see Pop), and Consume returns the error once the
// batches already in hand are done.
func (q *Queue) Consume(ctx context.Context, o ConsumeOptions, fn func(ctx context.Context, m *Message) error) error {
	e := q.c.e
	if e.isClosed() {
		return ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return err
	}
	if fn == nil {
		return errors.New("queen: Consume: nil handler")
	}
	po, err := o.PopOptions.withDefaults()
	if err != nil {
		return err
	}
	if o.Concurrency < 0 || o.SoftStop < 0 || o.HandlerTimeout < 0 {
		return fmt.Errorf("queen: ConsumeOptions: Concurrency, SoftStop and HandlerTimeout must not be negative (have %d, %s, %s)",
			o.Concurrency, o.SoftStop, o.HandlerTimeout)
	}
	if o.KeyConcurrency < 0 {
		return fmt.Errorf("queen: ConsumeOptions: KeyConcurrency must not be negative (have %d)", o.KeyConcurrency)
	}
	n := max(o.Concurrency, 1)

	c := newConsumer(ctx, q, po, o, fn)
	if !e.consumes.add(e, c) {
		c.done()
		return ErrClosed
	}
	// Deferred in this order so Close, which waits for the removal, finds
	// the call's own cleanup done too.
	defer e.consumes.remove(c)
	defer c.done()
	return c.dispatch(n)
}

// consumer is one Consume call's state.
type consumer struct {
	q       *Queue
	po      PopOptions
	timeout time.Duration
	maxHold time.Duration // 0: off
	keyConc int           // KeyConcurrency; above 1 batches run per key (handleBatchKeyed)
	fn      func(context.Context, *Message) error
	dm      *destMeter // the consume-side instruments' attributes of (queue, group)
	mem     *member    // the call as a member of its group; po.mem too

	// stop ends when Consume's ctx does: claim nothing more, start no
	// handler. work is the handlers' context: it ends with stop, or
	// SoftStop after it.
	stop       context.Context
	cancelStop context.CancelCauseFunc
	// caller is Consume's ctx: its Done closes before stop's (a parent
	// closes its own channel, then cancels its children), so a handler
	// that waited on it may return while stop is still live.
	caller     context.Context
	work       context.Context
	cancelWork context.CancelFunc
	cleanup    func()
	finished   chan struct{} // closed when Consume has settled and returns
	// lingering is the partitions whose drained lease a worker keeps
	// (linger): wakes naming only these start no claim.
	lingering lingerSet
	// lingerAfter is when (Unix ns) batches may linger again (see
	// lingerBackoff).
	lingerAfter atomic.Int64
}

// consumeSet is the client's running Consume calls, which Close stops.
type consumeSet struct {
	m map[*consumer]struct{} // under engine.mu
}

// add registers c unless the client is closing.
func (s *consumeSet) add(e *engine, c *consumer) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return false
	}
	if s.m == nil {
		s.m = make(map[*consumer]struct{})
	}
	s.m[c] = struct{}{}
	return true
}

func (s *consumeSet) remove(c *consumer) {
	e := c.q.c.e
	e.mu.Lock()
	delete(s.m, c)
	e.mu.Unlock()
	close(c.finished)
}

// stopConsumes is Close's first step: every running Consume stops
// claiming and returns ErrClosed once its handlers are done and their
// batches settled (unfinished messages handed back uncharged), which
// needs the ack engine and the pool, so it runs before they close. Handlers
// keep their SoftStop until ctx ends; then they are cancelled and Close
// goes on without waiting further.
func (e *engine) stopConsumes(ctx context.Context) {
	e.mu.Lock()
	cs := make([]*consumer, 0, len(e.consumes.m))
	for c := range e.consumes.m {
		cs = append(cs, c)
	}
	e.mu.Unlock()
	for _, c := range cs {
		c.cancelStop(ErrClosed)
	}
	for _, c := range cs {
		select {
		case <-c.finished:
		case <-ctx.Done():
			for _, c := range cs {
				c.cancelWork()
			}
			return
		}
	}
}

func newConsumer(ctx context.Context, q *Queue, po PopOptions, o ConsumeOptions, fn func(context.Context, *Message) error) *consumer {
	c := &consumer{q: q, po: po, timeout: o.HandlerTimeout, keyConc: o.KeyConcurrency, fn: fn, finished: make(chan struct{}),
		dm: q.c.e.meter.consume.dest(q.name, po.Group)}
	id := newMemberID()
	c.mem = &member{id: id, owner: q.c.e.owner + "#" + id}
	c.po.Member, c.po.mem = "", c.mem
	c.po.keyed = o.KeyConcurrency > 1 && !po.AutoAck
	switch {
	case o.MaxHold == 0:
		c.maxHold = DefaultMaxHold
	case o.MaxHold > 0:
		c.maxHold = o.MaxHold
	}
	c.stop, c.cancelStop = context.WithCancelCause(ctx)
	c.caller = ctx
	if o.SoftStop <= 0 {
		c.work, c.cancelWork = context.WithCancel(c.stop)
		c.cleanup = func() {}
		return c
	}
	// Detached from ctx (keeping its values): the soft phase outlives it.
	c.work, c.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var timer *time.Timer
	stopAF := context.AfterFunc(c.stop, func() {
		mu.Lock()
		timer = time.AfterFunc(o.SoftStop, c.cancelWork)
		mu.Unlock()
	})
	c.cleanup = func() {
		stopAF()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}
	return c
}

// done releases the consumer's contexts and timers.
func (c *consumer) done() {
	c.cleanup()
	c.cancelWork()
	c.cancelStop(nil)
}

// stopErr is what Consume returns once stopped: ErrClosed when the client
// closed, else nil.
func (c *consumer) stopErr() error {
	if errors.Is(context.Cause(c.stop), ErrClosed) {
		return ErrClosed
	}
	return nil
}

// handleBatch runs fn over one partition's leased messages and returns the
// settlement of what it did (nil when there is nothing to settle), for the
// caller to run once it has released the worker: the settle round trip holds
// the partition's lease, not a handler slot.
//
// Where mayClaimAhead allows, the partition's next batch is claimed under
// the same lease while the handlers run, and the settle of a batch handled
// whole acks it and claims the one after that in one statement (pop_ahead);
// the batch in hand then runs next (b.next). A batch not handled whole, or
// whose settle did not apply, lets the one claimed ahead go unstarted: a
// failure or an interrupt released the lease over both, and a lost lease
// is lost for both.
func (c *consumer) handleBatch(b *consumeBatch, alone func() bool) (settle func()) {
	if !b.covered {
		return c.handleBatchOf(b, alone)
	}
	p := b.msgs[0].Partition
	s := c.handleBatchOf(b, alone)
	if s == nil {
		c.lingering.remove(p)
		return nil
	}
	return func() {
		defer c.lingering.remove(p)
		s()
	}
}

// handleBatchOf is handleBatch but for a covered batch's partition.
func (c *consumer) handleBatchOf(b *consumeBatch, alone func() bool) (settle func()) {
	msgs := b.msgs
	if c.keyConc > 1 {
		return c.handleBatchKeyed(msgs)
	}
	q := c.q
	e := q.c.e
	if c.po.AutoAck {
		// Already committed by the claim: stopping cannot give them back.
		for _, m := range msgs {
			if err := c.call(c.work, m, nil, nil); err != nil {
				e.log.Warn("queen: consume: handler failed on an auto-acked message", "queue", q.name,
					"partition", m.Partition, "offset", m.Offset, "err", err)
			}
		}
		return nil
	}
	exp := b.leaseEnd() // the lease's end in Unix ns, 0 once lost
	if b.ahead == nil && c.mayClaimAhead(b, alone) {
		b.ahead = c.startAhead(b)
	}
	hold, hctx := c.newHold()
	defer hold.end()
	stopRenew := q.renewFrom(msgs[0], exp, nil, hold, b.renewSpan)
	lastOK := -1
	op := settleOp{m: msgs[0], ok: -1, act: actNone}
	for i, m := range msgs {
		if c.stop.Err() != nil || c.caller.Err() != nil {
			// Stopping: hand back what was not started, uncharged.
			op.act, op.actMsg = actInterrupt, m
			break
		}
		err := c.call(hctx, m, exp, hold)
		if err == nil {
			lastOK = i
			continue
		}
		if errors.Is(err, errLeaseEnded) {
			// The lease ended (the pop was slow, or a renewal found it taken
			// over): another consumer may hold the partition now, so the rest
			// of the batch is theirs. Ack what was handled; if the lease was
			// taken over that ack is refused and the batch redelivered.
			break
		}
		if c.work.Err() != nil && !errors.Is(err, ErrPanic) {
			// Most likely the shutdown itself cancelled the handler: do not
			// charge the budget.
			op.act, op.actMsg = actInterrupt, m
		} else {
			op.act, op.actMsg, op.reason, op.delay = actFail, m, reasonText(err), retryDelay(err)
		}
		break
	}
	stopRenew()
	lostByRenewal := exp.Load() == 0
	if lastOK >= 0 {
		op.ok = msgs[lastOK].Offset
	}
	// Whole: every message handled and the lease not known lost, so the
	// batch claimed ahead may follow once this one's ack applies.
	whole := op.act == actNone && lastOK == len(msgs)-1 && !lostByRenewal
	if op.ok < 0 && op.act == actNone {
		if lostByRenewal {
			c.dm.leaseLost(context.Background())
		}
		if b.ahead == nil {
			return nil // nothing handled: the lease runs out by itself
		}
		// Nothing handled: the lease runs out by itself, over the batch
		// claimed ahead too once that claim is done.
		return func() { b.ahead.wait() }
	}
	b.keeps = whole && (b.ahead != nil || c.mayLinger(b, alone))
	released := 0 // what an interrupt hands back: the message and the unstarted rest
	if op.act == actInterrupt {
		released = len(msgs) - (lastOK + 1)
	}
	return func() {
		// Not e.settle: a Consume stopped by Close settles while it closes.
		ctx := context.Background()
		rows := b.ahead.claimedRows()
		acks := func() int {
			// A message the handler settled itself was counted then.
			n := 0
			for _, m := range msgs[:lastOK+1] {
				if atomic.LoadInt32(&m.appSettled) == 0 {
					n++
				}
			}
			return n
		}
		if whole && c.full(rows) && c.mayClaimAheadOf(b, alone) {
			// The ack and the next claim in one round trip, while the
			// batch claimed ahead is still being decoded.
			rows2, acked := c.claimAhead(b, op.ok)
			nb, dead := b.ahead.wait()
			if acked {
				c.dm.settledOp(ctx, &op, acks(), 0, stApplied)
				if dead >= 0 {
					// What was just claimed lies past a message that
					// cannot be delivered: let go with the cut.
					b.next = c.cutAhead(b, nb, dead)
					return
				}
				if nb != nil {
					nb.ahead = c.decodeAheadAsync(nb, rows2)
					b.next = nb
				}
				return
			}
		}
		if whole && c.mayLinger(b, alone) {
			// The ack keeps the lease; the worker then takes the
			// partition's next messages under it as they are pushed.
			if nb, settled := c.lingerAck(b, op.ok, acks); settled {
				b.next = nb
				return
			}
		}
		nb, dead := b.ahead.wait()
		if whole && dead >= 0 {
			// Else the settle lets the lease go, past dead too.
			nb = c.cutAhead(b, nb, dead)
		}
		st, err := e.settleFused(ctx, []settleOp{op})
		if err == nil {
			c.dm.settledOp(ctx, &op, acks(), released, st[0])
			if lostByRenewal || st[0] == stLeaseLost {
				c.dm.leaseLost(ctx)
			}
			err = statusErr(st[0])
			last := op.actMsg
			if last == nil {
				last = msgs[lastOK]
			}
			if st[0] == stBelowCursor && atomic.LoadInt32(&last.appSettled) == 1 {
				// The handler settled through it itself (Ack, Client.Tx):
				// nothing was left to do.
				err = nil
			}
		}
		if err != nil {
			e.log.Warn("queen: consume: settle failed; the batch will be redelivered after its lease",
				"queue", q.name, "partition", msgs[0].Partition, "err", err)
			return
		}
		if whole && nb != nil {
			b.next = nb
		}
	}
}

// call runs fn on m with ctx, the batch's handlers' context, under the
// HandlerTimeout deadline if any, and turns a panic into an error wrapping
// ErrPanic, logged at Error with the stack: one poison message must not take
// down the process and every lease it holds. With exp it first checks the
// lease, and stamps the start on hold.
func (c *consumer) call(ctx context.Context, m *Message, exp *atomic.Int64, hold *holdWatch) (err error) {
	if c.dm.timed(ctx) {
		start := time.Now()
		defer func() { // last: after the recover below
			if err != errLeaseEnded { // not started: nothing was processed
				c.dm.processed(ctx, time.Since(start), err)
			}
		}()
	}
	if e := c.q.c.e; e.tracing() {
		var end func(error)
		ctx, end = e.startProcess(ctx, m)
		defer func() { end(err) }() // runs after the recover below: a panic is an error
	}
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	defer func() {
		if r := recover(); r != nil {
			c.q.c.e.log.Error("queen: consume: handler panicked", "queue", c.q.name, "partition", m.Partition,
				"offset", m.Offset, "panic", r, "stack", string(debug.Stack()))
			err = fmt.Errorf("%w: %v", ErrPanic, r)
		}
	}()
	// The lease is checked last, right before the handler: the caller
	// checked it too, but a process paused after that check (a stop
	// signal, a long GC, a frozen VM) must not start a handler once
	// another consumer may hold the partition.
	if exp != nil {
		now := time.Now().UnixNano()
		if now >= exp.Load() {
			return errLeaseEnded
		}
		hold.started(now)
	}
	c.dm.consumed(ctx, 1, false)
	return c.fn(ctx, m)
}

// renew keeps the lease of m's batch alive: it extends it whenever half of
// it is left, at once if the pop already took that long, and publishes the
// current end in exp (0 once the lease is lost) until the returned func is
// called (which waits for the renewer to stop). onRenew, if not nil, runs
// after each renewal. With hold, it gives up once no handler has started
// for MaxHold: it cancels the handlers' context and lets the lease end.
func (q *Queue) renew(m *Message, exp *atomic.Int64, onRenew func(), hold *holdWatch) (stop func()) {
	return q.renewFrom(m, exp, onRenew, hold, 0)
}

// renewFrom is renew for a lease whose length until its first renewal is
// span (0: the lease time), as a lingering lease's (see lingerKeep): it is
// first renewed when half of span is left.
func (q *Queue) renewFrom(m *Message, exp *atomic.Int64, onRenew func(), hold *holdWatch, span time.Duration) (stop func()) {
	d := m.leaseDur
	if d <= 0 {
		return func() {}
	}
	if span <= 0 || span > d {
		span = d
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			at := time.Unix(0, exp.Load()).Add(-span / 2)
			next := at
			if hold != nil && hold.deadline().Before(next) {
				next = hold.deadline()
			}
			t := time.NewTimer(max(time.Until(next), 0))
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
			}
			if hold != nil && !time.Now().Before(hold.deadline()) {
				q.c.e.log.Warn("queen: consume: no handler started for MaxHold; the lease is renewed no more and the handlers' context is cancelled",
					"queue", q.name, "partition", m.Partition, "offset", m.Offset, "max_hold", hold.limit)
				hold.cancel()
				return
			}
			if time.Now().Before(at) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), q.c.e.cfg.StatementTimeout)
			end, err := q.c.e.extend(ctx, m, d)
			cancel()
			if err == nil {
				exp.Store(end.UnixNano())
				span = d
				if onRenew != nil {
					onRenew()
				}
				continue
			}
			q.c.e.log.Warn("queen: consume: lease renewal failed", "queue", q.name, "partition", m.Partition, "err", err)
			if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrClosed) {
				exp.Store(0)
				return
			}
			// A transient error: try again shortly, while the lease lasts.
			select {
			case <-done:
				return
			case <-time.After(min(d/10, time.Second)):
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
