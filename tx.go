package queen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/fusion"
	"github.com/e03140bc/queen/internal/settle"
	"github.com/e03140bc/queen/internal/stmt"
	"github.com/e03140bc/queen/internal/wake"
)

// PushTx pushes items inside the caller's own transaction: the messages
// exist if and only if the caller commits (the outbox pattern). It bypasses
// fusion, since the caller's transaction is the commit boundary, and runs the
// same bundle function. Results are as for Push, but Queued means "queued if
// you commit". The partition rows stay locked until the transaction ends, so
// keep it short; consumers in other processes are notified on commit.
//
// Each call locks its partitions in a consistent order, but two
// transactions that push to the same partitions (or create the same new
// queues) over several calls in different orders can deadlock: PostgreSQL
// aborts one of them (SQLSTATE 40P01), to be retried. Client.Tx pushes all
// its queues in one call. The first keyed push to an existing queue marks
// it keyed (fixing its Lanes) in a statement of its own, so first keyed
// pushes do not lock the queue row; a rollback does not undo that mark.
func (q *Queue) PushTx(ctx context.Context, tx pgx.Tx, items []Item) (res []PushResult, err error) {
	if tx == nil {
		return nil, errors.New("queen: PushTx: nil transaction")
	}
	if err := refuseScheduled(items); err != nil {
		return nil, err
	}
	ctx, items, end := q.c.e.startSend(ctx, q.name, items)
	defer func() { end(err) }()
	b, err := q.prepare(ctx, items)
	if err != nil {
		return nil, err
	}
	defer b.release()
	if err := q.c.e.pushInTx(ctx, tx, []*Queue{q}, []*pushBatch{b}); err != nil {
		return nil, err
	}
	return b.finish(), nil
}

// pushInTx sends the batches of one or more queues as bundles on tx, one
// partition set per call so partition rows are locked in ascending id, until
// every item is resolved.
func (e *engine) pushInTx(ctx context.Context, tx pgx.Tx, qs []*Queue, bs []*pushBatch) error {
	e.markKeyed(ctx, qs, bs)
	var bundle []*fusion.Batch[partitionKey, *pushItem]
	for i, b := range bs {
		for part, g := range b.groups {
			bundle = append(bundle, &fusion.Batch[partitionKey, *pushItem]{
				Key:   partitionKey{Tenant: qs[i].c.tenant, Queue: qs[i].name, Partition: part},
				Items: g,
			})
		}
	}
	for n := 0; ; n++ {
		for len(bundle) > 0 {
			if err := e.push.commit(ctx, tx, bundle, false); err != nil {
				return err
			}
			// Frames left over from a partly duplicate segment, or re-encrypted
			// ones, go again.
			next := bundle[:0]
			for _, b := range bundle {
				if len(b.Retry) > 0 {
					b.Items, b.Retry = b.Retry, nil
					next = append(next, b)
				}
			}
			bundle = next
		}
		// Keys routed to lanes with a stale lane count: to their lanes under
		// the queue's count, read again.
		for i, b := range bs {
			moved := b.sentBack()
			if len(moved) == 0 {
				continue
			}
			q := qs[i]
			if n == maxReroutes {
				return fmt.Errorf("queen: push to %q: %w: gave up after %d attempts", q.name, errLanesChanged, n)
			}
			meta, err := e.queueMeta(ctx, q.c.tenant, q.name)
			if err != nil {
				return fmt.Errorf("queen: push to %q: %w", q.name, err)
			}
			for part, g := range e.rerouteCall(q.c.tenant, q.name, b, moved, max(meta.Lanes, 1)) {
				bundle = append(bundle, &fusion.Batch[partitionKey, *pushItem]{
					Key:   partitionKey{Tenant: q.c.tenant, Queue: q.name, Partition: part},
					Items: g,
				})
			}
		}
		if len(bundle) == 0 {
			break
		}
	}
	seen := map[wake.QueueKey]bool{}
	for _, q := range qs {
		k := wake.QueueKey{Tenant: q.c.tenant, Queue: q.name}
		if seen[k] {
			continue
		}
		seen[k] = true
		// Delivered on commit only: exactly the wake-up this push deserves.
		if err := stmt.Notify(ctx, e.sql, tx, k.Line()); err != nil {
			return fmt.Errorf("queen: notify: %w", err)
		}
	}
	return nil
}

// markKeyed marks the queues bs push keyed messages to keyed, if not seen
// so already, in a statement of its own before the caller's transaction
// writes them. Marked inside it, a queue row would stay locked until that
// commits, and two transactions making first keyed pushes to two queues in
// opposite orders (PushTx one queue at a time) would deadlock on them. Best
// effort: a queue it could not mark (the statement failed or timed out, the
// row was locked, the queue does not exist yet) is marked by the push as
// before.
func (e *engine) markKeyed(ctx context.Context, qs []*Queue, bs []*pushBatch) {
	byTenant := map[uuid.UUID][]string{}
	for i, b := range bs {
		k := metaKey{qs[i].c.tenant, qs[i].name}
		if _, ok := e.keyed.Load(k); ok || slices.Contains(byTenant[k.tenant], k.name) || !b.keyed() {
			continue
		}
		byTenant[k.tenant] = append(byTenant[k.tenant], k.name)
	}
	for tenant, names := range byTenant {
		// Short: the caller holds a connection of the pool this waits for.
		mctx, cancel := context.WithTimeout(ctx, min(e.cfg.StatementTimeout, time.Second))
		keyed, err := stmt.MarkKeyed(mctx, e.sql, e.pool, tenant, names)
		cancel()
		for _, name := range keyed {
			e.keyed.Store(metaKey{tenant, name}, struct{}{})
		}
		if err != nil {
			e.log.Debug("queen: marking queues keyed ahead of a push failed; the push marks them", "err", err)
		}
	}
}

// keyed reports whether b has a keyed message.
func (b *pushBatch) keyed() bool {
	for _, g := range b.groups {
		for _, it := range g {
			if it.Key != "" {
				return true
			}
		}
	}
	return false
}

// Tx collects acks and pushes to commit atomically.
type Tx struct {
	c      *Client
	ops    []settleOp
	queues []*Queue
	items  [][]Item
	err    error
	ctx    context.Context // Client.Tx's: the parent of Push's spans
	ends   []func(error)   // Push's spans, ended with the outcome of Client.Tx
}

// Ack records an ack of m, applied when Client.Tx commits. As Message.Ack,
// it commits the cursor through m, except for a message of a Consume
// handler with KeyConcurrency > 1, which it settles alone: other keys'
// earlier messages may still be running.
func (tx *Tx) Ack(m *Message) {
	if m == nil || m.q == nil {
		tx.fail(ErrUnknownMessage)
		return
	}
	if m.keyed {
		tx.ops = append(tx.ops, settleOp{m: m, keyed: []keyedRow{{m: m, act: actNone}}})
		return
	}
	tx.ops = append(tx.ops, settleOp{m: m, ok: m.Offset, act: actNone})
}

// Fail records a failed attempt of m (see Message.Fail), applied on commit.
// For a message of a Consume handler with KeyConcurrency > 1 it aborts the
// Tx with ErrKeyedSettle, as Message.Fail does: return the handler's error
// instead.
func (tx *Tx) Fail(m *Message, reason error) {
	if m == nil || m.q == nil {
		tx.fail(ErrUnknownMessage)
		return
	}
	if m.keyed {
		tx.fail(ErrKeyedSettle)
		return
	}
	tx.ops = append(tx.ops, failOp(m, reason))
}

// Push records items to push to queue on commit.
func (tx *Tx) Push(queue string, items []Item) {
	_, items, end := tx.c.e.startSend(tx.ctx, queue, items)
	tx.ends = append(tx.ends, end)
	tx.queues = append(tx.queues, tx.c.Queue(queue))
	tx.items = append(tx.items, items)
}

func (tx *Tx) fail(err error) {
	if tx.err == nil {
		tx.err = err
	}
}

// Tx runs fn, then commits its acks and pushes atomically in one PostgreSQL
// transaction: all of them or none. If fn returns an error, nothing is
// applied and that error is returned. A push that turns out to duplicate a
// stored message, or an ack that cannot apply (already acked, lease lost,
// unknown), rolls everything back and returns an error wrapping
// ErrTxAborted and the cause. Pushes are applied first and acks second,
// following the global lock order (partitions, then consumers).
func (c *Client) Tx(ctx context.Context, fn func(tx *Tx) error) (err error) {
	e := c.e
	if e.isClosed() {
		return ErrClosed
	}
	tx := &Tx{c: c, ctx: ctx}
	defer func() {
		for _, end := range tx.ends {
			end(err)
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	if tx.err != nil {
		return fmt.Errorf("%w: %w", ErrTxAborted, tx.err)
	}
	bs := make([]*pushBatch, len(tx.queues))
	defer func() {
		for _, b := range bs {
			if b != nil {
				b.release()
			}
		}
	}()
	for i, q := range tx.queues {
		if err := refuseScheduled(tx.items[i]); err != nil {
			return err
		}
		b, err := q.prepare(ctx, tx.items[i])
		if err != nil {
			return err
		}
		bs[i] = b
	}
	var settled []int16
	defer func() {
		if err == nil {
			// Committed: count the settlements it carried.
			for i, st := range settled {
				op := &tx.ops[i]
				if op.keyed != nil {
					op.m.meter().settledRows(ctx, op.keyed, []int16{st})
				} else {
					e.countSettled(ctx, op, st)
				}
				// Consume does not count it again.
				atomic.StoreInt32(&op.m.appSettled, 1)
				if op.act == actFail && st == stApplied {
					e.noteRetries()
				}
			}
		}
	}()
	return pgx.BeginFunc(ctx, e.pool, func(ptx pgx.Tx) error {
		if len(bs) > 0 {
			if err := e.pushInTx(ctx, ptx, tx.queues, bs); err != nil {
				return err
			}
			for i, b := range bs {
				for k, r := range b.finish() {
					if r.Status != Queued {
						return fmt.Errorf("%w: push %d to %q (transaction id %q) is %s", ErrTxAborted, k, tx.queues[i].name, r.TransactionID, r.Status)
					}
				}
			}
		}
		if len(tx.ops) == 0 {
			return nil
		}
		sts, err := settle.InTx(ctx, e.csql, ptx, settleParams(tx.ops))
		if err != nil {
			return err
		}
		settled = sts
		for i, st := range sts {
			if st != stApplied && st != stDeadLetter && st != stDropped {
				return fmt.Errorf("%w: ack %d: %w", ErrTxAborted, i, statusErr(st))
			}
		}
		return nil
	})
}
