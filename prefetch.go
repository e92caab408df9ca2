package queen

import (
	"context"
	"sync/atomic"
	"time"

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
	// renewSpan is the lease's length as its renewer reckons it until
	// the first renewal, when shorter than the lease time: a batch taken
	// under a lingering lease, whose end linger_ack brought in. 0: the
	// lease time.
	renewSpan time.Duration
	// covered: taken under a lingering lease (linger), the batch keeps its
	// partition in consumer.lingering until it is settled, so the wake of
	// the push it holds, if the fetch loop sees it only now, starts no
	// claim (the lease is this worker's).
	covered bool
}

// aheadClaim is a claim ahead in flight: its statement, then the decode
// of its rows. rows is set before claimed is closed, b and dead before done
// is closed.
type aheadClaim struct {
	claimed chan struct{}
	rows    []stmt.PopRow // nil: nothing claimed
	done    chan struct{}
	b       *consumeBatch // the messages before dead; nil: none
	// dead is the first offset of the claim that cannot be decoded or
	// opened, or whose segment could not be read again (popPart.short):
	// the lease is still to be cut before it (cutAhead). -1: none.
	dead int64
}

// newAhead is an aheadClaim not yet claimed.
func newAhead() *aheadClaim {
	return &aheadClaim{claimed: make(chan struct{}), done: make(chan struct{}), dead: -1}
}

// claimedRows returns the claim's rows once its statement is done (nil:
// none).
func (a *aheadClaim) claimedRows() []stmt.PopRow {
	if a == nil {
		return nil
	}
	<-a.claimed
	return a.rows
}

// wait returns the claim's batch and its first undecodable offset (-1:
// none) once it is decoded.
func (a *aheadClaim) wait() (*consumeBatch, int64) {
	if a == nil {
		return nil, -1
	}
	<-a.done
	return a.b, a.dead
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
	return len(b.msgs) == c.po.Batch && c.mayClaimAheadOf(b, alone)
}

// mayClaimAheadOf is mayClaimAhead for a batch whose size is known to be
// Batch: one claimed ahead, of which only the rows may be in yet (full).
func (c *consumer) mayClaimAheadOf(b *consumeBatch, alone func() bool) bool {
	return c.q.c.e.csql.PopAhead != "" && !c.po.AutoAck && c.keyConc <= 1 && c.po.Batch > 1 && b.msgs[0].leaseDur > 0 &&
		c.stop.Err() == nil && alone()
}

// full reports whether rows, a claim ahead, took Batch messages.
func (c *consumer) full(rows []stmt.PopRow) bool {
	return len(rows) > 0 && rows[0].Last-rows[0].First+1 == int64(c.po.Batch)
}

// startAhead claims the batch after b in the background (see claimAhead)
// and decodes it.
func (c *consumer) startAhead(b *consumeBatch) *aheadClaim {
	a := newAhead()
	go func() {
		a.rows, _ = c.claimAhead(b, -1)
		close(a.claimed)
		a.b, a.dead = c.decodeAhead(b, a.rows)
		close(a.done)
	}()
	return a
}

// decodeAheadAsync decodes rows, claimed after b under its lease, in the
// background: the decode then overlaps the handlers of the batch in hand
// and the round trip of the next claim, instead of running between an ack
// and the next handler.
func (c *consumer) decodeAheadAsync(b *consumeBatch, rows []stmt.PopRow) *aheadClaim {
	a := newAhead()
	a.rows = rows
	close(a.claimed)
	go func() {
		a.b, a.dead = c.decodeAhead(b, rows)
		close(a.done)
	}()
	return a
}

// claimAhead claims, under b's lease, up to Batch messages after the
// lease's last offset (pop_ahead); with through >= 0 it first acks through
// that offset in the same statement, and acked reports whether it did. It
// returns the claim's rows, undecoded (see decodeAhead), and raises the
// lease's end to the one the claim set. No rows: nothing was claimed (the
// lease is not live any more, nothing is retained past it, or the queue or
// cursor is of a kind pop_ahead leaves alone). A claim that fails is logged
// and claims nothing (an ack it carried may have committed or not: acked
// is false).
func (c *consumer) claimAhead(b *consumeBatch, through int64) (rows []stmt.PopRow, acked bool) {
	q := c.q
	e := q.c.e
	m := b.msgs[0]
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
	defer cancel()
	err := e.onLayout(ctx, func() error {
		rows = rows[:0]
		return stmt.PopAhead(ctx, e.csql, e.pool, stmt.PopAheadParams{
			Lease: m.leaseOf(), Through: through, Max: c.po.Batch, LeaseTime: m.leaseDur,
		}, func(r *stmt.PopRow) error {
			// The row is reused, the slices in it are not: a copy keeps them.
			rows = append(rows, *r)
			return nil
		})
	})
	if err != nil {
		e.log.Warn("queen: consume: claim ahead failed", "queue", q.name, "partition", m.Partition, "err", err)
		return nil, false
	}
	if len(rows) == 0 {
		return nil, false
	}
	if r := rows[0]; r.LeaseExpires != nil {
		// Committed: the lease lasts this long whatever the decode finds.
		raiseExp(b.leaseEnd(), r.LeaseExpires.UnixNano())
	}
	return rows, true
}

// decodeAhead turns the rows of a claim ahead of b (claimAhead) into the
// batch that follows b: its messages before the first it cannot decode or
// open (or whose segment it could not read again, popPart.short), whose
// offset it returns as dead (-1: none). The lease still covers
// dead and what follows: cutAhead cuts it back. nil: no message before
// dead, or no rows.
func (c *consumer) decodeAhead(b *consumeBatch, rows []stmt.PopRow) (nb *consumeBatch, dead int64) {
	if len(rows) == 0 {
		return nil, -1
	}
	d := &popDecoder{q: c.q, o: &c.po, dm: b.msgs[0].dm}
	for i := range rows {
		_ = d.row(&rows[i]) // never fails: what does not decode is in p.dead
	}
	if len(d.parts) == 0 {
		return nil, -1
	}
	p := d.parts[0]
	msgs := p.msgs
	dead = p.short // not dead, but it can wait for the next claim as well
	if len(p.dead) > 0 && (dead < 0 || p.dead[0].m.Offset < dead) {
		// Undecodable, or sealed with a key this client lacks.
		dead = p.dead[0].m.Offset
	}
	if dead >= 0 {
		// Only what comes before it is delivered.
		k := 0
		for k < len(msgs) && msgs[k].Offset < dead {
			k++
		}
		msgs = msgs[:k]
	}
	if len(msgs) == 0 {
		return nil, dead
	}
	c.logClaim([][]*Message{msgs})
	return &consumeBatch{msgs: msgs, exp: b.leaseEnd()}, dead
}

// cutAhead cuts the lease b holds back to end before dead, a message of
// the batch claimed ahead (nb, what comes before it) that cannot be decoded
// or opened (or was not read, see decodeAhead): the next claim finds it at
// its head and dead-letters it (or gives it back, or delivers it), and
// whatever was claimed past it under the lease is let go. It returns nb, or nil when the cut did not apply (the lease then ends
// at its expiry, and nothing of it is delivered).
func (c *consumer) cutAhead(b, nb *consumeBatch, dead int64) *consumeBatch {
	q := c.q
	e := q.c.e
	m := b.msgs[0]
	cut := dead - 1
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
	var ok bool
	err := e.onLayout(ctx, func() (err error) {
		ok, err = stmt.PopDeadLetter(ctx, e.csql, e.pool, stmt.PopDeadLetterParams{
			Partition: m.pid, Group: c.po.Group, Lease: &m.lease, Cut: &cut})
		return err
	})
	cancel()
	if err != nil || !ok {
		e.log.Warn("queen: consume: could not shorten a lease before an undecodable message", "queue", q.name,
			"partition", m.Partition, "group", c.po.Group, "err", err)
		return nil
	}
	return nb
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

// lowerExp lowers exp to at, unless the lease is lost (0) or ends sooner.
func lowerExp(exp *atomic.Int64, at int64) {
	for {
		cur := exp.Load()
		if cur == 0 || cur <= at || exp.CompareAndSwap(cur, at) {
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
