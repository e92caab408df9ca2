package queen

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ConsumeOptions are the options of Consume.
type ConsumeOptions struct {
	PopOptions
	// Concurrency is how many partitions are processed in parallel, each by
	// its own pop loop. Defaults to 1.
	Concurrency int
}

// consumeWait is the long-poll of each pop of a Consume loop whose
// PopOptions.Wait is zero: the loop parks rather than spins.
const consumeWait = 5 * time.Second

// Consume pops and hands messages to fn until ctx is done. Messages of a
// partition are handled one at a time in offset order; up to Concurrency
// partitions are handled in parallel. A nil from fn acks the message; an
// error fails it (see Message.Fail) and the rest of its batch is left for
// redelivery, unhandled. Each batch is settled in one round trip after its
// last handler. While a handler runs past half the lease, the lease is
// renewed. When ctx is done, running handlers finish (they see ctx done),
// what they completed is acked, the unhandled rest of their batches is
// released without charging the retry budget (an error returned after ctx
// is done is treated the same way), and nothing is acked twice. With
// AutoAck, fn's errors are only logged.
//
// Consume returns nil when ctx ends it, ErrClosed when the client closes,
// and an option error at once. Failing pops are logged and retried.
// PopOptions.Wait defaults to 5s here.
func (q *Queue) Consume(ctx context.Context, o ConsumeOptions, fn func(ctx context.Context, m *Message) error) error {
	e := q.c.e
	if e.isClosed() {
		return ErrClosed
	}
	if !validName(q.name) {
		return fmt.Errorf("%w: queue %q", ErrInvalidName, q.name)
	}
	if fn == nil {
		return errors.New("queen: Consume: nil handler")
	}
	po, err := o.PopOptions.withDefaults()
	if err != nil {
		return err
	}
	if po.Wait == 0 {
		po.Wait = consumeWait
	}
	n := o.Concurrency
	if n < 0 {
		return fmt.Errorf("queen: ConsumeOptions.Concurrency must not be negative")
	}
	n = max(n, 1)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		fatalErr error
	)
	for range n {
		wg.Go(func() {
			if err := q.consumeLoop(ctx, &po, fn); err != nil {
				mu.Lock()
				fatalErr = cmpOr(fatalErr, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return fatalErr
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// consumeLoop is one worker: pop, handle, settle, until ctx ends.
func (q *Queue) consumeLoop(ctx context.Context, o *PopOptions, fn func(context.Context, *Message) error) error {
	e := q.c.e
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		msgs, err := q.Pop(ctx, *o)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrClosed) {
				return ErrClosed
			}
			e.log.Warn("queen: consume: pop failed; retrying", "queue", q.name, "err", err, "backoff", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		// A pop over several partitions returns each partition's messages
		// contiguously, in offset order.
		for len(msgs) > 0 {
			k := 1
			for k < len(msgs) && msgs[k].pid == msgs[0].pid {
				k++
			}
			q.handleBatch(ctx, o.AutoAck, msgs[:k], fn)
			msgs = msgs[k:]
		}
	}
	return nil
}

// handleBatch runs fn over one partition's leased messages and settles them.
func (q *Queue) handleBatch(ctx context.Context, autoAck bool, msgs []*Message, fn func(context.Context, *Message) error) {
	e := q.c.e
	if autoAck {
		for _, m := range msgs {
			if err := fn(ctx, m); err != nil {
				e.log.Warn("queen: consume: handler failed on an auto-acked message", "queue", q.name,
					"partition", m.Partition, "offset", m.Offset, "err", err)
			}
		}
		return
	}
	var exp atomic.Int64 // the lease's end in Unix ns, 0 once lost
	exp.Store(msgs[0].LeaseExpiresAt.UnixNano())
	stopRenew := q.renew(msgs[0], &exp)
	lastOK := -1
	op := settleOp{m: msgs[0], ok: -1, act: actNone}
	for i, m := range msgs {
		if ctx.Err() != nil {
			op.act, op.actMsg = actRetry, m
			break
		}
		if time.Now().UnixNano() >= exp.Load() {
			// The lease ended (the pop was slow, or a renewal found it taken
			// over): another consumer may hold the partition now, so the rest
			// of the batch is theirs. Ack what was handled; if the lease was
			// taken over that ack is refused and the batch redelivered.
			break
		}
		err := fn(ctx, m)
		if err == nil {
			lastOK = i
			continue
		}
		if ctx.Err() != nil {
			// Most likely the shutdown itself: do not charge the budget.
			op.act, op.actMsg = actRetry, m
		} else {
			op.act, op.actMsg, op.reason = actFail, m, err.Error()
		}
		break
	}
	stopRenew()
	if lastOK >= 0 {
		op.ok = msgs[lastOK].Offset
	}
	if op.ok < 0 && op.act == actNone {
		return // nothing handled: the lease runs out by itself
	}
	st, err := e.settle(ctx, []settleOp{op})
	if err == nil {
		err = statusErr(st[0])
	}
	if err != nil {
		e.log.Warn("queen: consume: settle failed; the batch will be redelivered after its lease",
			"queue", q.name, "partition", msgs[0].Partition, "err", err)
	}
}

// renew keeps the lease of m's batch alive: it extends it whenever half of
// it is left, at once if the pop already took that long, and publishes the
// current end in exp (0 once the lease is lost) until the returned func is
// called (which waits for the renewer to stop).
func (q *Queue) renew(m *Message, exp *atomic.Int64) (stop func()) {
	d := m.leaseDur
	if d <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			wait := time.Until(time.Unix(0, exp.Load())) - d/2
			t := time.NewTimer(max(wait, 0))
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), q.c.e.cfg.StatementTimeout)
			end, err := q.c.e.extend(ctx, m, d)
			cancel()
			if err == nil {
				exp.Store(end.UnixNano())
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
