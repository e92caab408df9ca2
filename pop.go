package queen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/claimfuse"
	"github.com/e03140bc/queen/internal/seal"
	"github.com/e03140bc/queen/internal/stmt"
)

// defaultPopRescan is how often a waiting Pop looks again without a wake:
// the correctness floor that turns a missed wake into a delay, never a
// stranded message. It also paces DelayedProcessing and WindowBuffer, which
// no push wakes.
const defaultPopRescan = 250 * time.Millisecond

// MaxBatch caps PopOptions.Batch.
const MaxBatch = 100_000

func (o PopOptions) withDefaults() (PopOptions, error) {
	if err := checkName(nameGroup, o.Group); err != nil {
		return o, err
	}
	if err := checkName(namePartition, o.Partition); err != nil {
		return o, err
	}
	if err := checkMember(o.Member); err != nil {
		return o, err
	}
	if o.Batch < 0 || o.Partitions < 0 || o.Wait < 0 || o.LeaseTime < 0 {
		return o, fmt.Errorf("queen: PopOptions: Batch, Partitions, Wait and LeaseTime must not be negative")
	}
	if o.Batch == 0 {
		o.Batch = 1
	}
	if o.Batch > MaxBatch {
		return o, fmt.Errorf("queen: PopOptions.Batch %d exceeds MaxBatch (%d)", o.Batch, MaxBatch)
	}
	if o.Partitions == 0 {
		o.Partitions = 1
	}
	if o.LeaseTime > 0 && o.LeaseTime < time.Millisecond {
		o.LeaseTime = time.Millisecond
	}
	return o, nil
}

// Pop claims up to o.Batch messages from up to o.Partitions partitions and
// leases them (unless o.AutoAck). It never waits on a lock: partitions leased
// by other consumers are skipped. With o.Wait it parks until a push arrives
// or o.Wait passes, then returns what it found (possibly nothing, with a nil
// error). Messages of one partition come in offset order.
//
// Pop fails with ErrEncryption, taking nothing, when the queue is encrypted
// and the client has no key, or when a claimed payload was sealed with a key
// that is neither Config.EncryptionKey nor in Config.DecryptionKeys (the
// producers rotated first, or a wrong key): the claim is given back
// uncharged, leases released, nothing auto-acked or dead-lettered, for a
// client with the key. A payload that does not open under a key the client
// holds (altered, or not this message's) is undecodable: it goes to the
// dead-letter store and the rest is delivered (see deadLetterUndecodable); a
// claim that delivered nothing for that is followed by another, so an empty
// Pop means nothing was claimable.
func (q *Queue) Pop(ctx context.Context, o PopOptions) (msgs []*Message, err error) {
	e := q.c.e
	if e.isClosed() {
		return nil, ErrClosed
	}
	if err := checkName(nameQueue, q.name); err != nil {
		return nil, err
	}
	o, err = o.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Member != "" {
		o.mem = &member{id: o.Member, owner: e.owner + "#" + o.Member}
	}
	if e.tracing() {
		var end func([]*Message, error)
		ctx, end = e.startReceive(ctx, q.name, &o)
		defer func() { end(msgs, err) }()
	}
	defer func() {
		if len(msgs) > 0 {
			msgs[0].meter().consumed(ctx, len(msgs), true)
		}
	}()
	if o.Wait <= 0 {
		return q.popOnce(ctx, &o, nil)
	}
	// Subscribe before the first look so a push committing in between
	// still wakes this pop.
	w := e.wake.Subscribe(q.c.tenant, q.name)
	defer e.wake.Unsubscribe(w)
	deadline := time.NewTimer(o.Wait)
	defer deadline.Stop()
	rescan := time.NewTicker(e.cfg.test.popRescan)
	defer rescan.Stop()
	var hints []string
	for {
		msgs, err := q.popOnce(ctx, &o, hints)
		if err != nil || len(msgs) > 0 {
			return msgs, err
		}
		select {
		case <-w.C():
			hints = w.TakeHints()
		case <-rescan.C:
			hints = nil
		case <-deadline.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.ctx.Done():
			return nil, ErrClosed
		}
	}
}

// popOnce is one claim: on its own, or folded into a claim shared with
// concurrent pops of the same queue and options (see package claimfuse).
func (q *Queue) popOnce(ctx context.Context, o *PopOptions, hints []string) ([]*Message, error) {
	e := q.c.e
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if e.isClosed() {
		return nil, ErrClosed
	}
	e.claims.Pops.Add(1)
	if o.Partition == "" && o.Partitions == 1 {
		return e.claims.Pop(ctx, claimKeyOf(q, o), hints, func(ctx context.Context, hints []string, n int) ([][]*Message, error) {
			return q.claim(ctx, o, hints, n)
		})
	}
	groups, err := q.claim(ctx, o, hints, 1)
	return slices.Concat(groups...), err
}

// claimKeyOf is the claim-fusion lane of a pop of q with o.
func claimKeyOf(q *Queue, o *PopOptions) claimfuse.Key {
	mode, from := o.Subscription.SQLMode()
	k := claimfuse.Key{
		Tenant: q.c.tenant, Queue: q.name, Group: o.Group, Batch: o.Batch,
		Lease: o.LeaseTime, AutoAck: o.AutoAck, Mode: mode, Keyed: o.keyed,
	}
	if from != nil {
		k.From = from.UnixNano()
	}
	if o.mem != nil {
		k.Owner = o.mem.owner
	}
	return k
}

// claim takes up to n*o.Partitions partitions, at most o.Batch messages
// from each and n*o.Batch in all. It returns each claimed partition's
// messages, in claim order.
//
// Mostly one claim round trip. While some of the n pops it serves would
// get nothing, it claims again for what is still asked, as long as its
// last claim took something (so each round makes progress: leases taken,
// messages consumed or dead-lettered) and
//   - a partition it took delivered nothing (every message it claimed was
//     undecodable, now dead-lettered): another may still hold messages, or
//   - on the Citus layout, it took fewer partitions than asked: a claim
//     there takes one worker's partitions (no two-phase commit), and
//     another worker's may be claimable.
//
// A claim that takes nothing has looked at everything the group can claim
// (pop_v2's last passes), so an empty result means nothing was claimable,
// on the layout as on PostgreSQL. A pop that got something is not made to
// wait for more: on the layout a pop of several partitions gets one
// worker's.
func (q *Queue) claim(ctx context.Context, o *PopOptions, hints []string, n int) ([][]*Message, error) {
	e := q.c.e
	wantParts, wantMsgs := n*o.Partitions, n*o.Batch
	var groups [][]*Message
	delivered := 0
	for {
		asked := wantParts - len(groups)
		got, took, dropped, err := q.claimOnce(ctx, o, hints, asked, wantMsgs-delivered)
		if err != nil {
			if len(groups) > 0 {
				// Leases and auto-acks of the earlier rounds are the
				// caller's: hand them over; the next pop meets the error.
				return groups, nil
			}
			return nil, err
		}
		groups = append(groups, got...)
		for _, g := range got {
			delivered += len(g)
		}
		hints = nil
		short := e.cfg.Citus && o.Partition == "" && took < asked
		if took == 0 || len(groups) >= n || delivered >= wantMsgs || !(dropped || short) ||
			ctx.Err() != nil || e.isClosed() {
			return groups, nil
		}
	}
}

// claimOnce is one claim round trip taking up to parts partitions, at most
// o.Batch messages from each and batch in all. It returns each claimed
// partition's messages that are delivered, in claim order; took, the
// partitions claimed; dropped, whether one of them delivered nothing.
func (q *Queue) claimOnce(ctx context.Context, o *PopOptions, hints []string, parts, batch int) (groups [][]*Message, took int, dropped bool, err error) {
	e := q.c.e
	var part *string
	if o.Partition != "" {
		part = &o.Partition
	}
	mode, from := o.Subscription.SQLMode()
	// A client that lacks a key the queue's payloads need is misconfigured:
	// it must fail without taking anything, where it would otherwise
	// dead-letter every message it claims. A client without any key learns
	// that from the queue's settings, before the claim. A payload sealed
	// with a key it does not hold is found only in the claim, which it then
	// gives back: a lease is released uncharged, and an auto-ack of an
	// encrypted queue, which consumes in the claim itself, runs in a
	// transaction committed only once every payload opened.
	inTx := false
	if o.AutoAck || !e.keys.CanSeal() {
		meta, err := e.queueMeta(ctx, q.c.tenant, q.name)
		if err != nil {
			if e.isClosed() {
				return nil, 0, false, ErrClosed
			}
			return nil, 0, false, err
		}
		if meta.Encryption && !e.keys.CanSeal() {
			return nil, 0, false, errNoKey(q.name)
		}
		inTx = o.AutoAck && meta.Encryption
	}
	dm := e.meter.consume.dest(q.name, o.Group) // once per claim: settlements use it
	e.claims.Claims.Add(1)
	// The claim commits on the server even if the caller gives up, so it
	// runs to completion on a detached context: a lease nobody received
	// would stall the partition until expiry, an auto-ack would lose data.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StatementTimeout)
	defer cancel()
	var (
		tx pgx.Tx
		d  *popDecoder
	)
	rollback := func() {
		if tx != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StatementTimeout)
			_ = tx.Rollback(rctx) // after the commit, a no-op
			cancel()
		}
	}
	defer func() { rollback() }()
	// On the Citus layout a claim that writes reference tables (a first
	// contact's cursors, dead letters) can be aborted as a deadlock; it
	// rolled back whole, having delivered nothing, so it runs again.
	err = e.onLayout(qctx, func() error {
		var db interface {
			Query(context.Context, string, ...any) (pgx.Rows, error)
		} = e.pool
		rollback()
		tx = nil
		if inTx {
			var err error
			if tx, err = e.pool.Begin(qctx); err != nil {
				return err
			}
			db = tx
		}
		d = &popDecoder{q: q, o: o, dm: dm}
		return stmt.Pop(qctx, e.csql, db, stmt.PopParams{
			Tenant: q.c.tenant, Queue: q.name, Group: o.Group, Partition: part, Hints: hints,
			Batch: batch, PerPartition: o.Batch, Partitions: parts, Lease: o.LeaseTime,
			AutoAck: o.AutoAck, Owner: o.mem.leaseOwner(e.owner), Mode: mode, From: from, Keyed: o.keyed,
		}, d.row)
	})
	if err != nil {
		return nil, 0, false, fmt.Errorf("queen: pop %q: %w", q.name, err)
	}
	o.mem.carry() // the claim was the member's heartbeat
	claimed := d.parts
	if d.unknownKey != nil {
		err := fmt.Errorf("queen: pop %q: %w", q.name, d.unknownKey)
		switch {
		case tx != nil:
			return nil, 0, false, err // rolled back: nothing was claimed
		case !o.AutoAck:
			q.giveBack(ctx, o, claimed)
			return nil, 0, false, err
		}
		// Auto-acked outside a transaction (the queue was not known to be
		// encrypted: settings older than metaTTL, or switched off since the
		// payload was sealed): consumed already, so dead-lettered below
		// like any undecodable message. The next claim reads the settings
		// again.
		e.forgetMeta(q.c.tenant, q.name)
	}
	if tx != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StatementTimeout)
		err := tx.Commit(cctx)
		cancel()
		if err != nil {
			return nil, 0, false, fmt.Errorf("queen: pop %q: %w", q.name, err)
		}
	}
	groups = make([][]*Message, 0, len(claimed))
	for _, p := range claimed {
		msgs := p.msgs
		if len(p.dead) > 0 {
			msgs = q.deadLetterUndecodable(ctx, o, p)
		}
		if len(msgs) > 0 {
			groups = append(groups, msgs)
		} else {
			dropped = true
		}
	}
	return groups, len(claimed), dropped, nil
}

// popDecoder turns the rows of a claim (pop, pop_ahead) into its
// partitions' messages, in row order.
type popDecoder struct {
	q     *Queue
	o     *PopOptions
	dm    *destMeter
	parts []*popPart
	p     *popPart
	// What the claim's messages keep, in a few allocations.
	slab  msgSlab
	arena decodeArena
	// unknownKey is the first payload sealed with a key this client lacks.
	unknownKey error
}

// row decodes one row of a claim.
func (d *popDecoder) row(r *stmt.PopRow) error {
	q, o, e := d.q, d.o, d.q.c.e
	dm := d.dm
	pname := r.PartitionName
	if d.p == nil || d.p.pid != r.PartitionID {
		p := &popPart{pid: r.PartitionID, name: r.PartitionName, settled: r.Settled, head: -1, short: -1}
		if r.Lease != nil {
			p.lease = *r.Lease
			p.leaseID = p.lease.String()
		}
		if len(r.FailOffsets) > 0 && len(r.FailOffsets) == len(r.FailCounts) {
			p.fails = make(map[int64]int, len(r.FailOffsets))
			for i, o := range r.FailOffsets {
				p.fails[o] = int(r.FailCounts[i])
			}
		}
		p.waits = slices.Clone(r.WaitOffsets)
		d.parts = append(d.parts, p)
		d.p = p
	}
	p := d.p
	var exp time.Time
	var dur time.Duration
	if r.LeaseExpires != nil {
		exp = *r.LeaseExpires
		dur = r.LeaseTime
	}
	base, end := r.Base, r.End
	lo, hi := max(r.First, base), min(r.Last, end)
	if p.head < 0 {
		p.head = lo
	}
	if hi >= lo && hi-lo < MaxBatch {
		p.msgs = slices.Grow(p.msgs, int(hi-lo+1))
	}
	d.arena.last = r.Last
	msg := func(off int64) *Message {
		// Field by field into the zeroed slab: a composite literal would
		// be copied in whole, under a write barrier per pointer while the
		// GC runs.
		m := d.slab.take(r.Last - off + 1)
		m.Queue, m.Partition, m.Offset, m.CreatedAt, m.Group = q.name, pname, off, r.CreatedAt, o.Group
		m.LeaseID, m.Attempt, m.LeaseExpiresAt = p.leaseID, 1, exp
		m.q, m.pid, m.lease, m.leaseDur, m.dm, m.mem = q, r.PartitionID, p.lease, dur, dm, o.mem
		if off <= r.DeliveredMax && r.Deliveries > 1 {
			m.Attempt = int(r.Deliveries)
		}
		if f := p.fails[off]; f > 0 {
			// Failed out of order (not at the cursor): at least its
			// failures plus this delivery.
			m.Attempt = max(m.Attempt, f+1)
		}
		// A message the skip policy re-enqueued carries its failures.
		m.Attempt += int(r.Failures)
		if len(p.waits) > 0 {
			_, m.waiting = slices.BinarySearch(p.waits, off)
		}
		return m
	}
	var frames []byte
	cached := false
	if r.Blob == nil {
		// Left out by pop_ahead: sent to this holder before, cached
		// then, or else read again.
		if frames, cached = e.segs.cached(r.PartitionID, base, end, r.Last); !cached {
			ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
			blob, err := stmt.SegmentBlob(ctx, e.csql, e.pool, r.PartitionID, base)
			cancel()
			if err != nil {
				// Not the message's fault: it is not delivered now,
				// and not dead-lettered (see popPart.short).
				e.log.Warn("queen: consume: could not read a segment again", "queue", q.name,
					"partition", pname, "base", base, "err", err)
				if p.short < 0 || lo < p.short {
					p.short = lo
				}
				return nil
			}
			r.Blob = blob
		}
	}
	bp, _ := frameBufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	defer frameBufs.Put(bp)
	owned := false
	var err error
	if !cached {
		frames, owned, err = e.segs.frames(r.PartitionID, base, end, r.Last, r.Blob, *bp)
	}
	if err != nil {
		p.undecodable(msg, lo, hi, err)
		return nil
	}
	var snap *segSnap
	if owned {
		// The messages keep nothing of frames (decodeRun): reused by the
		// next pop once this one is decoded.
		snap = &segSnap{blob: r.Blob}
		if cap(frames) <= maxPooledFrames {
			*bp = frames[:0]
		}
	} else {
		snap = &segSnap{frames: frames} // cached, read-only
	}
	next, err := q.decodeRun(&d.arena, pname, frames, base, end, lo, hi, snap, func(off int64) *Message {
		if p.isSettled(off) {
			return nil // settled out of order by an earlier holder
		}
		return msg(off)
	}, func(m *Message, openErr error) error {
		if openErr != nil {
			if _, ok := openErr.(seal.UnknownKeyError); ok && d.unknownKey == nil {
				d.unknownKey = openErr
			}
			p.dead = append(p.dead, deadMsg{m, openErr})
			return nil
		}
		p.msgs = append(p.msgs, m)
		return nil
	})
	if err != nil {
		p.undecodable(msg, next, hi, err)
	}
	return nil
}

// popPart is one claimed partition's share of a claim: the messages
// decoded, in offset order, and those that could not be.
type popPart struct {
	pid   int64
	name  string
	lease uuid.UUID
	// leaseID is lease as Message.LeaseID shows it; "" for an auto-ack.
	leaseID string
	head    int64 // the claim's first offset (giveBack)
	msgs    []*Message
	dead    []deadMsg // in offset order
	// short is the first offset not decoded for want of its segment's
	// blob (a claim ahead's segment read again failed): those messages
	// are fine, only not delivered now. -1: none.
	short int64
	// The cursor's out-of-order state at the claim: settled offsets above
	// it (sorted; skipped) and failures stored per offset (Attempt).
	settled []int64
	fails   map[int64]int
	// waits: the messages whose retry wait still holds (sorted; keyed
	// claims only).
	waits []int64
}

// deadMsg is a claimed message that cannot be delivered: its segment or
// frame is corrupt, or it does not decrypt. m carries what could be read
// (at least its offset).
type deadMsg struct {
	m   *Message
	err error
}

// undecodable records offsets lo..hi as unreadable for err.
func (p *popPart) undecodable(msg func(off int64) *Message, lo, hi int64, err error) {
	for off := lo; off <= hi; off++ {
		if !p.isSettled(off) {
			p.dead = append(p.dead, deadMsg{msg(off), err})
		}
	}
}

// isSettled reports whether off was settled out of order (per-key parallel
// Consume) above the cursor the claim started at: the claim skips it.
func (p *popPart) isSettled(off int64) bool {
	if len(p.settled) == 0 {
		return false
	}
	_, ok := slices.BinarySearch(p.settled, off)
	return ok
}

// giveBack releases the leases of a claim that must not be delivered,
// without charging a delivery (as a stopping Consume hands back what it did
// not start). Should that fail, the leases run out by themselves.
func (q *Queue) giveBack(ctx context.Context, o *PopOptions, parts []*popPart) {
	e := q.c.e
	ops := make([]settleOp, 0, len(parts))
	for _, p := range parts {
		m := &Message{Queue: q.name, Partition: p.name, Offset: p.head, Group: o.Group, q: q, pid: p.pid, lease: p.lease}
		ops = append(ops, settleOp{m: m, ok: -1, act: actInterrupt, actMsg: m})
	}
	if len(ops) == 0 {
		return
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StatementTimeout)
	defer cancel()
	if _, err := e.settleFused(sctx, ops); err != nil {
		e.log.Warn("queen: pop: could not release the leases of a claim it cannot decrypt; they end at their expiry",
			"queue", q.name, "group", o.Group, "err", err)
	}
}

// deadLetterUndecodable moves what p's claim could not decode to the
// dead-letter store and returns the messages of p that may be delivered. A
// message that cannot be decoded once never will be (a corrupt blob, a
// ciphertext that does not open under its key): redelivering it would fail
// every claim that takes it, and with AutoAck it is already consumed. (A key
// this client lacks is its own misconfiguration, not the message's: such a
// claim is given back, see claim.)
//
// With AutoAck every decoded message is delivered. Under a lease a dead
// letter commits the cursor through it, which would complete the lease's
// earlier messages unseen, so only the lease's head can go at once: the
// undecodable messages there are dead-lettered, the decoded run after them
// is delivered, and the lease is cut before the next undecodable message,
// which a later claim then finds at its head. A keyed claim above a
// waiting message has no such head until the wait ends: there every
// undecodable message goes at once, settled out of order (pop_dead_letter),
// and nothing is cut.
func (q *Queue) deadLetterUndecodable(ctx context.Context, o *PopOptions, p *popPart) []*Message {
	e := q.c.e
	dead, deliver := p.dead, p.msgs
	var leaseID *uuid.UUID
	var cut *int64
	if !o.AutoAck {
		leaseID = &p.lease
	}
	if !o.AutoAck && len(p.waits) == 0 {
		firstOK := int64(math.MaxInt64)
		if len(p.msgs) > 0 {
			firstOK = p.msgs[0].Offset
		}
		h := 0
		for h < len(dead) && dead[h].m.Offset < firstOK {
			h++
		}
		if h < len(dead) {
			c := dead[h].m.Offset - 1
			cut = &c
			k := 0
			for k < len(deliver) && deliver[k].Offset <= c {
				k++
			}
			deliver = deliver[:k]
		}
		dead = dead[:h]
	}
	n := len(dead)
	in := stmt.PopDeadLetterParams{Partition: p.pid, Group: o.Group, Lease: leaseID, Cut: cut, Dead: make([]stmt.PopDead, n)}
	for i, d := range dead {
		in.Dead[i] = stmt.PopDead{Offset: d.m.Offset, Kept: *d.m.kept(actDeadLetter),
			Reason: string(reasonText(fmt.Errorf("queen: undecodable message: %w", d.err)))}
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StatementTimeout)
	defer cancel()
	var ok bool
	err := e.onLayout(dctx, func() (err error) {
		ok, err = stmt.PopDeadLetter(dctx, e.csql, e.pool, in)
		return err
	})
	if err == nil && !ok {
		err = ErrLeaseLost
		if o.AutoAck {
			err = ErrUnknownMessage // the partition is gone
		}
	}
	if err == nil {
		e.meter.consume.dest(q.name, o.Group).deadLettered(ctx, causeUndecodable, n)
	}
	for i, d := range dead {
		attrs := []any{"queue", q.name, "partition", p.name, "group", o.Group, "offset", d.m.Offset,
			"id", d.m.ID, "reason", in.Dead[i].Reason}
		if err == nil {
			e.log.Warn("queen: pop: undecodable message moved to the dead-letter store", attrs...)
		} else {
			e.log.Error("queen: pop: undecodable message could not be dead-lettered", append(attrs, "err", err)...)
		}
	}
	switch {
	case err == nil, o.AutoAck:
		return deliver
	case n == 0:
		// Only the cut failed: the lease now ends at its expiry, not
		// after the delivered messages.
		e.log.Warn("queen: pop: could not shorten a lease before an undecodable message", "queue", q.name,
			"partition", p.name, "group", o.Group, "err", err)
		return deliver
	default:
		// The head is still there: a later message's ack would commit past
		// it unseen. The partition comes back when the lease ends.
		return nil
	}
}

// newOwner names this client in lease_owner: host, process and a random
// suffix telling clients of one process apart.
func newOwner() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
