package queen

import (
	"context"
	"sync/atomic"

	"github.com/e03140bc/queen/internal/stmt"
)

// consumeBatch is one partition batch in a Consume's hands.
type consumeBatch struct {
	msgs []*Message
	// exp is the lease's end in Unix ns (0 once lost), shared by the
	// batches of one lease: a renewal while one runs covers the one
	// claimed ahead. nil: the batch's own, from its messages.
	exp *atomic.Int64
	// ahead is the partition's next batch, claimed under this batch's
	// lease (pop_ahead) while this one runs; nil: none asked for.
	ahead *aheadClaim
	// next is set by the settle: ahead's batch, to run next on the same
	// worker (dispatch.Config.Next). nil: the partition is let go.
	next *consumeBatch
	// keeps is set once the handlers are done: handled whole with a
	// batch claimed ahead, so next is likely set (dispatch.Config.Keeps).
	keeps bool
}

// aheadClaim is a claim ahead in flight; b is set (nil: nothing claimed)
// before done is closed.
type aheadClaim struct {
	done chan struct{}
	b    *consumeBatch
}

// claimed is an aheadClaim already done, holding b.
func claimed(b *consumeBatch) *aheadClaim {
	a := &aheadClaim{done: make(chan struct{}), b: b}
	close(a.done)
	return a
}

// wait returns the claim's batch once it is done (nil: none).
func (a *aheadClaim) wait() *consumeBatch {
	if a == nil {
		return nil
	}
	<-a.done
	return a.b
}

// mayClaimAhead reports whether Consume claims the batch after b of its
// partition under b's lease: only for in-order consumes with a lease
// (neither AutoAck, which holds no lease, nor KeyConcurrency above 1,
// which settles out of order), when b was a full batch of more than one
// (the partition had more; with Batch 1 every batch is full, and an idle
// consumer would pay a claim that finds nothing before each ack), while
// not stopping, and while no more partitions are in hand than
// workers (alone): keeping a partition must not keep another that is ready
// from a worker, so with more ready partitions than workers they rotate
// batch by batch as before (pop_ahead itself also declines while another
// partition of the queue is ready). Not against a previous release's statements
// (stmt.Use), which lack pop_ahead.
func (c *consumer) mayClaimAhead(b *consumeBatch, alone func() bool) bool {
	return c.q.c.e.csql.PopAhead != "" && !c.po.AutoAck && c.keyConc <= 1 && c.po.Batch > 1 && len(b.msgs) == c.po.Batch && b.msgs[0].leaseDur > 0 &&
		c.stop.Err() == nil && alone()
}

// startAhead claims the batch after b in the background (see claimAhead).
func (c *consumer) startAhead(b *consumeBatch) *aheadClaim {
	a := &aheadClaim{done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.b, _ = c.claimAhead(b, -1)
	}()
	return a
}

// claimAhead claims, under b's lease, up to Batch messages after the
// lease's last offset (pop_ahead); with through >= 0 it first acks through
// that offset in the same statement, and acked reports whether it did. It
// returns nil when nothing was claimed: the lease is not live any more,
// nothing is retained past it, the queue or cursor is of a kind pop_ahead
// leaves alone, or what it claimed cannot be decoded (then the lease is
// cut back before it). A claim that fails is logged and claims nothing (an
// ack it carried may have committed or not: acked is false).
func (c *consumer) claimAhead(b *consumeBatch, through int64) (nb *consumeBatch, acked bool) {
	q := c.q
	e := q.c.e
	m := b.msgs[0]
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
	defer cancel()
	d := &popDecoder{q: q, o: &c.po, dm: m.dm}
	err := stmt.PopAhead(ctx, e.csql, e.pool, stmt.PopAheadParams{
		Lease: m.leaseOf(), Through: through, Max: c.po.Batch, LeaseTime: m.leaseDur,
	}, d.row)
	if err != nil {
		e.log.Warn("queen: consume: claim ahead failed", "queue", q.name, "partition", m.Partition, "err", err)
		return nil, false
	}
	if len(d.parts) == 0 {
		return nil, false
	}
	p := d.parts[0]
	msgs := p.msgs
	if len(p.dead) > 0 {
		// Undecodable, or sealed with a key this client lacks: the lease
		// is cut before the first such message, which the next claim then
		// finds at its head (and dead-letters, or gives back), and only
		// what comes before it is delivered.
		cut := p.dead[0].m.Offset - 1
		k := 0
		for k < len(msgs) && msgs[k].Offset <= cut {
			k++
		}
		msgs = msgs[:k]
		dctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
		ok, err := stmt.PopDeadLetter(dctx, e.csql, e.pool, stmt.PopDeadLetterParams{
			Partition: p.pid, Group: c.po.Group, Lease: &p.lease, Cut: &cut})
		cancel()
		if err != nil || !ok {
			// The cut did not apply: the lease now ends at its expiry.
			e.log.Warn("queen: consume: could not shorten a lease before an undecodable message", "queue", q.name,
				"partition", p.name, "group", c.po.Group, "err", err)
			msgs = nil
		}
	}
	if len(msgs) == 0 {
		return nil, true
	}
	c.logClaim([][]*Message{msgs})
	raiseExp(b.leaseEnd(), msgs[0].LeaseExpiresAt.UnixNano())
	return &consumeBatch{msgs: msgs, exp: b.leaseEnd()}, true
}

// raiseExp moves the lease end exp to at, if later, unless the lease was
// found lost (0).
func raiseExp(exp *atomic.Int64, at int64) {
	for {
		cur := exp.Load()
		if cur == 0 || cur >= at || exp.CompareAndSwap(cur, at) {
			return
		}
	}
}

// leaseEnd is b's shared lease end, created from its messages on first use.
func (b *consumeBatch) leaseEnd() *atomic.Int64 {
	if b.exp == nil {
		b.exp = new(atomic.Int64)
		b.exp.Store(b.msgs[0].LeaseExpiresAt.UnixNano())
	}
	return b.exp
}
