package queen

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/e03140bc/queen/internal/stmt"
	"github.com/e03140bc/queen/internal/wake"
)

// lingerSet is the partitions whose lease a Consume call keeps while they
// are drained (see consumer.linger): a wake naming only these needs no
// claim, the lingering worker takes what was pushed.
type lingerSet struct {
	mu sync.Mutex
	m  map[string]int // partition name: lingering workers (at most one)
}

func (s *lingerSet) add(p string) {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]int{}
	}
	s.m[p]++
	s.mu.Unlock()
}

func (s *lingerSet) remove(p string) {
	s.mu.Lock()
	if s.m[p]--; s.m[p] <= 0 {
		delete(s.m, p)
	}
	s.mu.Unlock()
}

// covers reports whether every partition of hints lingers here (false for
// none: a wake without hints may be for any partition).
func (s *lingerSet) covers(hints []string) bool {
	if len(hints) == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range hints {
		if s.m[h] == 0 {
			return false
		}
	}
	return true
}

// lingerLetGo is linger_ack's status for an ack applied that let the
// lease go, as settle's would: the partition may not be kept (another is
// ready, the group is paused, ...).
const lingerLetGo = 3

// lingerKeep bounds how long a lingering lease lasts past its ack:
// linger_ack brings the lease's end in to at most this far ahead (a
// process that dies while it lingers holds the partition that long, not a
// whole LeaseTime), and an idle linger ends when half of it is left. A
// batch taken under it is renewed from then on as any other.
const lingerKeep = 10 * time.Second

// keepFor is how long a lease of duration d lingers past its ack.
func keepFor(d time.Duration) time.Duration { return min(d, lingerKeep) }

// lingerBackoff is how long a Consume tries no linger after linger_ack
// let a lease go because other partitions were ready.
const lingerBackoff = 100 * time.Millisecond

// mayLinger reports whether the lease of b, handled whole, may be kept
// over its drained partition (linger_ack, then pop_linger): in-order
// Consume with a lease (not AutoAck nor KeyConcurrency above 1), no batch
// claimed ahead, not stopping, and no more partitions in hand than workers
// (alone), and not for lingerBackoff after a linger_ack found other
// partitions ready. Not against a previous release's statements
// (stmt.Use).
func (c *consumer) mayLinger(b *consumeBatch, alone func() bool) bool {
	e := c.q.c.e
	return e.csql.PopLinger != "" && !e.cfg.test.noLinger && !c.po.AutoAck && c.keyConc <= 1 && b.ahead == nil &&
		b.msgs[0].leaseDur > 0 && c.stop.Err() == nil && c.caller.Err() == nil &&
		time.Now().UnixNano() >= c.lingerAfter.Load() && alone()
}

// lingerAck acks b, handled whole through its last offset, keeping its
// lease (linger_ack), and then lingers (see linger); acks counts the
// messages the ack settles (for the metrics). It returns the batch
// to run next under the lease (nil: none, the lease let go or lost), and
// whether b is settled: false when the ack was declined or its outcome is
// unknown, and the caller settles as usual.
func (c *consumer) lingerAck(b *consumeBatch, through int64, acks func() int) (next *consumeBatch, settled bool) {
	q := c.q
	e := q.c.e
	m := b.msgs[0]
	// Subscribed and marked before the ack: a push that commits after the
	// ack's snapshot wakes the linger, and the fetch loop claims nothing
	// for it meanwhile.
	w := e.wake.Subscribe(q.c.tenant, q.name)
	defer e.wake.Unsubscribe(w)
	c.lingering.add(m.Partition)
	defer c.lingering.remove(m.Partition)
	var (
		st     int
		logEnd int64
		end    time.Time
		err    error
		failed bool // an attempt failed: it may have committed
	)
	// The ack brings the lease's end in (lingerKeep): believed first, so
	// that the belief never exceeds the server's, whatever attempt commits.
	keep := keepFor(m.leaseDur)
	lowerExp(b.leaseEnd(), time.Now().Add(keep).UnixNano())
	for try := 0; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
		st, logEnd, end, err = stmt.LingerAck(ctx, e.csql, e.pool, m.leaseOf(), through, keep)
		cancel()
		if err == nil {
			break
		}
		e.log.Warn("queen: consume: ack keeping the lease failed", "queue", q.name, "partition", m.Partition, "err", err)
		// A connection lost to a server restart fails once: a settle
		// then would find the lease, whose claim the restart may have
		// lost, unreleased until it expires. Retried while it lasts.
		failed = true
		wait := min(m.leaseDur/10, time.Second)
		if try == 5 || e.isClosed() || time.Now().Add(wait).UnixNano() >= b.leaseEnd().Load() {
			return nil, false
		}
		time.Sleep(wait)
	}
	if failed && st == int(stBelowCursor) {
		// A failed attempt committed: the lease is kept.
		st, logEnd = int(stApplied), through+1 // unknown: look at once
	}
	switch {
	case st == int(stLeaseLost):
		// Lost, or let go by linger_ack (a crash lost the claim of b):
		// b comes back, as after any lost lease.
		c.dm.leaseLost(context.Background())
		e.log.Warn("queen: consume: the ack found the lease lost; the batch will be redelivered",
			"queue", q.name, "partition", m.Partition, "err", ErrLeaseLost)
		return nil, true
	case st == lingerLetGo:
		// Others are ready: for a while, batches settle through ack
		// fusion, which shares commits between workers.
		c.lingerAfter.Store(time.Now().Add(lingerBackoff).UnixNano())
		c.dm.settled(context.Background(), outcomeAck, acks())
		return nil, true
	case st != int(stApplied):
		return nil, false
	}
	if !end.IsZero() {
		lowerExp(b.leaseEnd(), end.UnixNano()) // a server clock behind this one
	}
	c.dm.settled(context.Background(), outcomeAck, acks())
	return c.linger(b, w, logEnd > through), true
}

// linger keeps b's lease over its drained partition and takes what is
// pushed to it under that lease at each wake that may concern it: by
// pop_linger (committed without waiting for the WAL flush), or, for a push
// of this client, in the push's own transaction (push_take, handed over
// through lingerSlots); more says the partition had more already. It
// returns the batch taken, or nil once the linger is over: Consume stops,
// the take let the lease go (the group is paused, another partition is
// ready, ...), or half of lingerKeep is left with nothing taken. The
// lease's end moves only by durable statements (the ack that brought it
// in, the renewals of the batches handled under it), so an idle linger
// needs no renewal.
func (c *consumer) linger(b *consumeBatch, w *wake.Waiter, more bool) *consumeBatch {
	q := c.q
	e := q.c.e
	m := b.msgs[0]
	exp := b.leaseEnd()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	// Not on the Citus layout, where push_take's subtransaction is not
	// tried, nor against a previous release's statements.
	var slot *lingerSlot
	if e.csql.PushTake != "" && !e.cfg.Citus && !e.cfg.test.noHandOff {
		slot = &lingerSlot{key: partitionKey{Tenant: q.c.tenant, Queue: q.name, Partition: m.Partition},
			lease: m.leaseOf(), max: c.po.Batch, leaseDur: m.leaseDur, out: make(chan handoff, 1)}
	}
	for {
		var rows []stmt.PopRow
		if !more {
			end := exp.Load()
			if end == 0 {
				return nil
			}
			left := time.Until(time.Unix(0, end).Add(-keepFor(m.leaseDur) / 2))
			if left <= 0 {
				c.letGo(b)
				return nil
			}
			if timer == nil {
				timer = time.NewTimer(left)
			} else {
				timer.Reset(left)
			}
			h, got, stop := c.lingerWait(slot, w, timer, m.Partition)
			switch {
			case got && h.known && h.over:
				return nil
			case got && h.known && len(h.rows) > 0:
				// Even when stopping: handleBatch hands them back.
				rows = h.rows
			case stop:
				c.letGo(b)
				return nil
			}
			// Else a wake, or a push that took nothing or whose outcome
			// is unknown: pop_linger takes whatever committed.
		}
		more = false
		if rows == nil {
			ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
			over, err := stmt.PopLinger(ctx, e.csql, e.pool, m.leaseOf(), c.po.Batch, m.leaseDur, func(r *stmt.PopRow) error {
				rows = append(rows, *r) // the row is reused, its slices are not
				return nil
			})
			cancel()
			if err != nil {
				// The server may be restarting: the lease outlives that, and
				// the fetch loop could not claim the partition before it ends.
				e.log.Warn("queen: consume: claim under a lingering lease failed", "queue", q.name, "partition", m.Partition, "err", err)
				if e.isClosed() {
					return nil
				}
				select {
				case <-c.stop.Done():
					c.letGo(b)
					return nil
				case <-time.After(min(m.leaseDur/10, time.Second)):
				}
				more = true
				continue
			}
			if over {
				return nil
			}
			if len(rows) == 0 {
				continue
			}
		}
		nb, dead := c.decodeAhead(b, rows)
		if dead >= 0 {
			nb = c.cutAhead(b, nb, dead)
		} else if nb == nil {
			c.letGo(b)
		}
		if nb != nil {
			// The lease ends within lingerKeep: renewed from half of that.
			nb.renewSpan = keepFor(m.leaseDur)
			nb.covered = true
			c.lingering.add(m.Partition)
		}
		return nb
	}
}

// lingerWait waits, slot offered to this client's pushes (if not nil),
// for a wake that may concern partition part, the timer, a stop (stop:
// either of these), or a push's hand-off (got). A push that reserved the
// slot is waited for, whatever ended the wait.
func (c *consumer) lingerWait(slot *lingerSlot, w *wake.Waiter, timer *time.Timer, part string) (h handoff, got, stop bool) {
	lingers := &c.q.c.e.lingers
	var out chan handoff // nil: no slot offered
	if slot != nil && lingers.add(slot) {
		out = slot.out
	}
wait:
	for {
		select {
		case <-c.stop.Done():
			stop = true
		case <-timer.C:
			stop = true
		case <-w.C():
			if h := w.TakeHints(); len(h) > 0 && !slices.Contains(h, part) {
				// Another partition's push: the fetch loop claims it.
				continue
			}
		case h = <-out:
			return h, true, false
		}
		break wait
	}
	if out != nil {
		h, got = lingers.withdraw(slot)
	}
	return h, got, stop
}

// letGo releases b's lingering lease (pop_linger with nothing to take). A
// failure is logged: the lease then ends at its expiry.
func (c *consumer) letGo(b *consumeBatch) {
	e := c.q.c.e
	m := b.msgs[0]
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.StatementTimeout)
	defer cancel()
	if _, err := stmt.PopLinger(ctx, e.csql, e.pool, m.leaseOf(), 0, 0, func(*stmt.PopRow) error { return nil }); err != nil {
		e.log.Warn("queen: consume: could not let a lingering lease go; it ends at its expiry", "queue", c.q.name,
			"partition", m.Partition, "err", err)
	}
}

// lingerSlots is the client's workers lingering on a partition with
// nothing in hand (linger), by partition: a push of this client to one of
// them takes the messages under the worker's lease in its own transaction
// (push_take) and hands them over, saving pop_linger's round trip and
// commit. At most one worker a partition (a second Consume, of another
// group, lingers without a slot).
type lingerSlots struct {
	n  atomic.Int32 // slots in m: a push reads only this while none lingers
	mu sync.Mutex
	m  map[partitionKey]*lingerSlot
}

// lingerSlot is one lingering worker's offer. A push may take under its
// lease only once it reserved the slot (removed it from the map, under
// the mutex), and then always hands the worker an outcome on out; the
// worker, leaving its wait for any reason (a wake, its timer, a stop),
// withdraws the slot, or if it finds it reserved, waits for that outcome.
// So neither gives up on the other while a take may be committing.
type lingerSlot struct {
	key      partitionKey
	lease    stmt.Lease
	max      int
	leaseDur time.Duration
	out      chan handoff // one outcome per reservation
}

// handoff is a push's outcome for the worker whose slot it reserved.
type handoff struct {
	// known: the push committed, and rows are what its take took: none
	// when the consumer row was busy, the push stored nothing, or the
	// take declined where pop_linger would end the linger (push_take
	// leaves that to the worker's pop_linger, and says over only if a
	// function layer that does says it). Not known: the push failed or
	// its outcome is unknown; a take may have committed, or not.
	known bool
	over  bool
	rows  []stmt.PopRow
}

// add offers s; false if another worker lingers on its partition.
func (ls *lingerSlots) add(s *lingerSlot) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if _, ok := ls.m[s.key]; ok {
		return false
	}
	if ls.m == nil {
		ls.m = make(map[partitionKey]*lingerSlot)
	}
	ls.m[s.key] = s
	ls.n.Add(1)
	return true
}

// withdraw takes s back from the map. If a push reserved it meanwhile, it
// waits for that push's outcome and returns it (got).
func (ls *lingerSlots) withdraw(s *lingerSlot) (h handoff, got bool) {
	ls.mu.Lock()
	if ls.m[s.key] == s {
		delete(ls.m, s.key)
		ls.n.Add(-1)
		ls.mu.Unlock()
		return handoff{}, false
	}
	ls.mu.Unlock()
	return <-s.out, true
}

// reserve takes the slot of the worker lingering on k, if any: the caller
// must then deliver exactly one outcome on it. Nothing but an atomic load
// while no worker lingers.
func (ls *lingerSlots) reserve(k partitionKey) *lingerSlot {
	if ls.n.Load() == 0 {
		return nil
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	s := ls.m[k]
	if s != nil {
		delete(ls.m, k)
		ls.n.Add(-1)
	}
	return s
}
