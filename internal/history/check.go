package history

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Stored is one message of the final log, read from the database.
type Stored struct {
	Queue     string
	Partition string
	Offset    int64
	ID        string
	TxID      string
	// Failures is non-zero for the tail copy of a message a FailureSkip
	// queue re-enqueued; only originals (0) count as stored pushes.
	Failures int
	// Reconstructed rows were deleted by retention; a delivery shows them.
	Reconstructed bool
}

// QueueInfo is what the checker needs to know of an audited queue.
type QueueInfo struct {
	// DedupWindow longer than the run: a transaction id is stored at most
	// once. Zero: every definite push of it is stored.
	Deduped bool
	// Groups must each have been delivered every stored message by the end
	// (the run drains them); "" is queue mode.
	Groups []string
	// LateGroups joined with SubscribeNew during the run: each must have
	// been delivered every message pushed after its first pop completed.
	LateGroups []string
	// FromGroups joined with SubscribeFrom(t) (Unix ns): each must have been
	// delivered every message whose push began after t.
	FromGroups map[string]int64
	// Retained queues lose messages to Retention and CompletedRetention: a
	// pushed message missing from the final log is not lost, a delivered
	// one stands in for its deleted row, and only offsets at or above the
	// partition's final LogStart must reach every group.
	Retained bool
	LogStart map[string]int64 // partition -> oldest retained offset at the end
	// Completed queues have CompletedRetention only: a message may leave
	// the log once every group has read it, so a delivery stands in for a
	// deleted row and everything else is checked as usual.
	Completed bool
	// DeadLetter queues keep exhausted messages: a failed message is
	// redelivered or dead-lettered, never dropped.
	DeadLetter bool
	// Encrypted queues deliver nothing to a client without their keys.
	Encrypted bool
	// Moved groups have their cursors moved by an operator (ResetGroup,
	// DeleteGroup): reset-lost owes them what each move left ahead of the
	// cursor, era by era, instead of never-delivered (check_offsets.go).
	Moved []string
	// LeaseTime is the queue's lease time (0: unknown). A claim recorded
	// from Consume's log is recorded after its statement, and a call that
	// ends a lease may fall between the two: a delivery's lease expiry
	// less LeaseTime is the latest the claim can have been (renewals only
	// move the expiry later), which bounds it better.
	LeaseTime int64
	// RetryMin is the queue's RetryBackoff.Min under a fixed
	// FailurePolicy (0: not judged): a charged failure's next delivery
	// waits at least that, or its RetryAfter, in place under FailurePause
	// and as its copy under FailureSkip (Skip) (retry-early,
	// check_sched.go).
	RetryMin time.Duration
	// HoldWait is the fixed retry wait (RetryBackoff Min = Max, at least
	// holdBound) of a queue whose failures must hold back nothing but
	// their own key (FailurePause, consumed with KeyConcurrency:
	// key-stalled) or nothing at all (Skip: skip-stalled); 0: not judged
	// (check_keyback.go).
	HoldWait time.Duration
	// Skip: the queue's FailurePolicy is FailureSkip all run.
	Skip bool
}

// DeadStored is one dead letter of the final dead-letter store.
type DeadStored struct {
	Queue, Group, Partition string
	Offset                  int64
	ID, TxID, Reason        string
}

// State is the final state the history is checked against.
type State struct {
	Queues map[string]QueueInfo
	Log    []Stored
	// Destroyed messages were stored, then their segment was corrupted on
	// purpose: they count as stored, and nobody owes their delivery (they
	// end in the dead-letter store).
	Destroyed []Stored
	// DeadLetters is the final dead-letter store of the audited queues.
	DeadLetters []DeadStored
	// Orphans are rows of the final state that belong to a partition no
	// longer there (segments, transaction-id hashes).
	Orphans []Orphan
}

// Orphan is a partition id that rows of Table still name, though the
// partition is gone.
type Orphan struct {
	Table     string
	Partition int64
	Rows      int
}

// Violation is one broken promise with the events that prove it.
type Violation struct {
	Kind string
	// Queue, Group and Partition locate it, where it has one.
	Queue, Group, Partition string

	Detail   string
	Evidence []Event
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", v.Kind, v.Detail)
	for _, e := range v.Evidence {
		fmt.Fprintf(&b, "\n    %s#%d %s %s at %s queue=%s group=%q", e.Proc, e.Seq, e.Op, e.Phase,
			time.Unix(0, e.T).Format("15:04:05.000000"), e.Queue, e.Group)
		if e.Partition != "" || e.Kind != "" {
			fmt.Fprintf(&b, " %s %s@%d lease=%s", e.Kind, e.Partition, e.Offset, e.Lease)
		}
		if e.Keyed {
			b.WriteString(" keyed")
		}
		if e.Err != "" {
			fmt.Fprintf(&b, " err=%q", e.Err)
		}
	}
	return b.String()
}

// Op is an invoke paired with its completion.
type Op struct {
	Inv  Event
	Done *Event // nil: never completed (the process died)
}

// Phase is the completion's phase; Info when there is none.
func (o *Op) Phase() string {
	if o.Done == nil {
		return Info
	}
	return o.Done.Phase
}

// Start and End bound when the operation took effect; End is MaxInt64 for
// an operation that never completed.
func (o *Op) Start() int64 { return o.Inv.T }
func (o *Op) End() int64 {
	if o.Done == nil {
		return math.MaxInt64
	}
	return o.Done.T
}

func (o *Op) evidence() []Event {
	if o.Done == nil {
		return []Event{o.Inv}
	}
	return []Event{o.Inv, *o.Done}
}

// Pair groups a history's events into operations, in invoke order.
func Pair(events []Event) []*Op {
	type key struct {
		proc string
		seq  int64
	}
	open := map[key]*Op{}
	var ops []*Op
	for i := range events {
		e := events[i]
		k := key{e.Proc, e.Seq}
		if e.Phase == Invoke {
			o := &Op{Inv: e}
			open[k] = o
			ops = append(ops, o)
			continue
		}
		if o, ok := open[k]; ok && o.Done == nil {
			o.Done = &e
		}
	}
	return ops
}

// Check returns every violation of the history against the final state,
// at most limit per kind (0: no limit).
func Check(events []Event, st State, limit int) []Violation {
	c := &checker{st: st, limit: limit, counts: map[string]int{}, destroyed: map[qp]map[int64]bool{}}
	for _, d := range st.Destroyed {
		k := qp{d.Queue, d.Partition}
		if c.destroyed[k] == nil {
			c.destroyed[k] = map[int64]bool{}
		}
		c.destroyed[k][d.Offset] = true
	}
	c.st.Log = append(slices.Clone(st.Log), st.Destroyed...)
	all := Pair(events)
	c.markCopies(all)
	c.deletedSurvived(all)
	ops := c.lastEpoch(all)
	c.moved = c.movers(ops) // check_offsets.go
	c.reconstruct(ops)
	// Again: retention may have taken a requeued copy or its original,
	// which reconstruct has just put back from their deliveries.
	c.markCopies(all)
	c.requeueUnbounded(all)
	c.observe(all) // check_observe.go
	c.rawErrors(all)
	c.orphans()
	c.payloads(ops)
	c.statusLag(all)
	c.pushes(ops)
	c.partitionsOwed(ops) // a follower whose lane parted from its leader's
	c.pushErrors(ops)
	c.logShape()
	c.order(ops)
	c.deliveries(ops)
	c.pollSkip(ops)
	c.holders(ops)
	c.eventually(ops)
	c.redelivered(ops)
	c.requeued(ops)
	c.paused(ops)
	c.rejected(ops)
	c.wrongKey(ops)
	c.rewrittenReads(all) // check_faults.go
	c.misuse(all)
	c.autoAckHandled(all) // check_autoack.go
	c.autoAckOrder(all)   // check_autoorder.go
	c.maintenanceDirect(all)
	c.scheduled(ops) // check_sched.go
	c.retryEarly(ops)
	c.held(ops) // check_keyback.go
	c.discards(all)
	c.resetLost(ops) // check_offsets.go
	c.resetWrong(ops)
	c.releasedDouble(ops)
	c.releasedSettled(ops)
	return c.out
}

type checker struct {
	st     State
	limit  int
	counts map[string]int
	out    []Violation
	where  Violation // location of the next report
	// destroyed offsets per partition, owed to nobody
	destroyed map[qp]map[int64]bool
	// reborn: per deleted queue, when its last incarnation surely existed
	// (a message of the final log was known to exist); MaxInt64 if never.
	reborn map[string]int64
	// moved: the ResetGroup, DeleteGroup and ReleaseLease calls that may
	// have applied, by queue and group (check_offsets.go).
	moved map[qg][]*Op
}

func (c *checker) report(kind, detail string, ev ...Event) {
	c.counts[kind]++
	if c.limit > 0 && c.counts[kind] > c.limit {
		return
	}
	v := c.where
	c.where = Violation{}
	v.Kind, v.Detail, v.Evidence = kind, detail, ev
	c.out = append(c.out, v)
}

// Counts returns how many violations of each kind Check found (including
// those over the limit). Only valid for the checker that produced them.
func Counts(vs []Violation) map[string]int {
	m := map[string]int{}
	for _, v := range vs {
		m[v.Kind]++
	}
	return m
}

type qp struct{ queue, partition string }
type qt struct{ queue, tx string }

// attempt is one pushed item's fate as the client saw it.
type attempt struct {
	op     *Op
	item   int
	status string // queued, buffered, duplicate, failed, info, rollback
	res    Result
}

func (c *checker) audited(queue string) bool {
	_, ok := c.st.Queues[queue]
	return ok
}

// pushes: every Queued or Buffered item is stored, exactly once on deduped
// queues; without a window, at most once per push (the pushes of one
// transaction id that meet in one flush are stored once), give or take the
// outcome-unknown calls; nothing failed or rolled back is stored; a
// Queued result names the stored offset and id; a Duplicate names the
// stored original.
func (c *checker) pushes(ops []*Op) {
	attempts := map[qt][]attempt{}
	for _, o := range ops {
		if o.Inv.Op != OpPush || !c.audited(o.Inv.Queue) {
			continue
		}
		for i, it := range o.Inv.Items {
			a := attempt{op: o, item: i}
			switch {
			case o.Inv.Rollback:
				a.status = "rollback"
			case o.Phase() == OK && o.Done != nil && i < len(o.Done.Results):
				a.res = o.Done.Results[i]
				a.status = a.res.Status
			case o.Phase() == Fail:
				a.status = "failed"
			default:
				a.status = Info
			}
			k := qt{o.Inv.Queue, it.TxID}
			attempts[k] = append(attempts[k], a)
		}
	}
	// CompletedRetention deletes what every subscribed group consumed: with
	// none subscribed yet (a group subscribes at its first contact) it may
	// delete what nobody read.
	contact := map[string]int64{}
	for _, o := range ops {
		if (o.Inv.Op == OpPop || o.Inv.Op == OpHandler) && o.Phase() == OK {
			if t, ok := contact[o.Inv.Queue]; !ok || o.End() < t {
				contact[o.Inv.Queue] = o.End()
			}
		}
	}
	stored := map[qt][]Stored{}
	for _, s := range c.st.Log {
		if s.Failures == 0 {
			k := qt{s.Queue, s.TxID}
			stored[k] = append(stored[k], s)
		}
	}
	for k, ss := range stored {
		// Of an audited queue: only theirs are collected.
		if _, ok := attempts[k]; !ok && c.audited(k.queue) {
			c.report("phantom", fmt.Sprintf("queue %s: transaction %q stored at %s@%d was never pushed", k.queue, k.tx, ss[0].Partition, ss[0].Offset))
		}
	}
	for k, as := range attempts {
		ss := stored[k]
		var definite, unknown, buffered int
		var ev []Event
		early := true // every definite push began before the queue's first contact
		for _, a := range as {
			switch a.status {
			case "queued", "buffered", "committed":
				definite++
				if t, ok := contact[k.queue]; ok && a.op.Start() >= t {
					early = false
				}
				if a.status == "buffered" {
					buffered++
				}
				ev = append(ev, a.op.evidence()...)
			case Info, "scheduled": // scheduled: check_sched.go judges it
				unknown++
				ev = append(ev, a.op.evidence()...)
			}
		}
		ev = clip(ev, 6)
		qi := c.st.Queues[k.queue]
		deduped := qi.Deduped
		switch {
		case qi.Retained && len(ss) == 0:
			// Retention may have taken it before anyone read it.
		case qi.Completed && early && len(ss) == 0:
			// So may CompletedRetention, before any group subscribed.
		case definite > 0 && len(ss) == 0:
			c.report("lost", fmt.Sprintf("queue %s: transaction %q reported stored (%d times) is not in the log", k.queue, k.tx, definite), ev...)
		case definite == 0 && unknown == 0 && len(ss) > 0:
			c.report("aborted-write", fmt.Sprintf("queue %s: transaction %q was only failed or rolled back, yet is stored at %s@%d", k.queue, k.tx, ss[0].Partition, ss[0].Offset), clip(evidenceOf(as), 6)...)
		case deduped && dedupBroken(ss, as):
			c.report("duplicated", fmt.Sprintf("queue %s: transaction %q stored %d times (%s) within its dedup window", k.queue, k.tx, len(ss), where(ss)), ev...)
		case !deduped && len(ss) > definite+unknown+buffered:
			// Without a window a Buffered item whose flush committed unseen
			// (a lost commit reply) is stored again by its replay: once more.
			c.report("duplicated", fmt.Sprintf("queue %s: transaction %q stored %d times (%s), pushed %d times definitely (%d buffered) and %d with unknown outcome",
				k.queue, k.tx, len(ss), where(ss), definite, buffered, unknown), ev...)
		}
		for _, a := range as {
			switch a.status {
			case "queued":
				if (qi.Retained || qi.Completed && early) && len(ss) == 0 {
					continue
				}
				if !slices.ContainsFunc(ss, func(s Stored) bool {
					return s.Offset == a.res.Offset && s.ID == a.res.ID && s.Partition == a.op.Inv.Items[a.item].Partition
				}) {
					c.report("wrong-result", fmt.Sprintf("queue %s: transaction %q reported queued as %s@%d id %s; the log has %s", k.queue, k.tx,
						a.op.Inv.Items[a.item].Partition, a.res.Offset, a.res.ID, where(ss)), a.op.evidence()...)
				}
			case "duplicate":
				if deduped && !qi.Retained && len(ss) == 0 {
					c.report("wrong-duplicate", fmt.Sprintf("queue %s: transaction %q reported a duplicate of %s; nothing of it is stored", k.queue, k.tx, a.res.ID), a.op.evidence()...)
				}
				// The window is per partition: the original of a duplicate
				// is in the item's own partition (a keyed item's lane).
				in := ss
				if p := a.op.Inv.Items[a.item].Partition; p != "" && !qi.Retained {
					in = slices.DeleteFunc(slices.Clone(ss), func(s Stored) bool { return s.Partition != p })
					if deduped && len(ss) > 0 && len(in) == 0 {
						c.report("wrong-duplicate", fmt.Sprintf("queue %s: transaction %q reported a duplicate of %s in %s; nothing of it is stored there (the log has %s)",
							k.queue, k.tx, a.res.ID, p, where(ss)), a.op.evidence()...)
					}
				}
				if deduped && len(in) == 1 && a.res.ID != in[0].ID && a.res.ID != zeroUUID {
					c.report("wrong-duplicate", fmt.Sprintf("queue %s: transaction %q reported a duplicate of %s; the stored original is %s", k.queue, k.tx, a.res.ID, in[0].ID), a.op.evidence()...)
				}
			}
		}
	}
}

// dedupBroken: a deduped queue stores a transaction id at most once per
// partition (the window is per partition), and only where it was pushed.
// An attempt of unknown partition (the default one) makes it once per queue.
func dedupBroken(ss []Stored, as []attempt) bool {
	if len(ss) < 2 {
		return false
	}
	named := map[string]bool{}
	for _, a := range as {
		p := a.op.Inv.Items[a.item].Partition
		if p == "" {
			return true
		}
		named[p] = true
	}
	seen := map[string]bool{}
	for _, s := range ss {
		if seen[s.Partition] || !named[s.Partition] {
			return true
		}
		seen[s.Partition] = true
	}
	return false
}

const zeroUUID = "00000000-0000-0000-0000-000000000000"

func evidenceOf(as []attempt) []Event {
	var ev []Event
	for _, a := range as {
		ev = append(ev, a.op.evidence()...)
	}
	return ev
}

func where(ss []Stored) string {
	var parts []string
	for _, s := range ss {
		parts = append(parts, fmt.Sprintf("%s@%d id %s", s.Partition, s.Offset, s.ID))
	}
	return strings.Join(parts, ", ")
}

func clip(ev []Event, n int) []Event {
	if len(ev) > n {
		return ev[:n]
	}
	return ev
}

// logShape: per partition, one message per offset and no gaps.
func (c *checker) logShape() {
	by := map[qp][]Stored{}
	for _, s := range c.st.Log {
		by[qp{s.Queue, s.Partition}] = append(by[qp{s.Queue, s.Partition}], s)
	}
	for k, ss := range by {
		slices.SortFunc(ss, func(a, b Stored) int { return cmp.Compare(a.Offset, b.Offset) })
		start := c.st.Queues[k.queue].LogStart[k.partition]
		for i := 1; i < len(ss); i++ {
			if c.st.Queues[k.queue].Retained && ss[i].Offset <= start {
				continue // below the retained range, rows come from deliveries
			}
			switch d := ss[i].Offset - ss[i-1].Offset; {
			case d == 0:
				c.report("inconsistent-offsets", fmt.Sprintf("queue %s partition %s: offset %d holds %s and %s", k.queue, k.partition, ss[i].Offset, ss[i-1].ID, ss[i].ID))
			case d > 1:
				c.report("gap", fmt.Sprintf("queue %s partition %s: offsets %d..%d are missing", k.queue, k.partition, ss[i-1].Offset+1, ss[i].Offset-1))
			}
		}
	}
}

type placed struct {
	op     *Op
	item   int
	offset int64
	queued bool // Queued rather than Buffered
}

// order: one client's pushes to a partition are stored in call order
// (Buffered ones included, though PushTx and Client.Tx, never spooled, may
// overtake a Buffered item); across clients, a push queued before another
// was invoked is stored before it; items of one call keep input order.
func (c *checker) order(ops []*Op) {
	// Only transaction ids stored once say where their push landed.
	offsets := map[qt]Stored{}
	seen := map[qt]int{}
	for _, s := range c.st.Log {
		if s.Failures == 0 {
			k := qt{s.Queue, s.TxID}
			offsets[k] = s
			seen[k]++
		}
	}
	for k, n := range seen {
		if n > 1 {
			delete(offsets, k)
		}
	}
	// A transaction id pushed more than once lands where its first push did.
	pushed := map[qt]int{}
	for _, o := range ops {
		if o.Inv.Op == OpPush {
			for _, it := range o.Inv.Items {
				pushed[qt{o.Inv.Queue, it.TxID}]++
			}
		}
	}
	by := map[qp][]placed{}
	for _, o := range ops {
		if o.Inv.Op != OpPush || o.Inv.Rollback || o.Phase() != OK || !c.audited(o.Inv.Queue) || o.Done == nil {
			continue
		}
		for i, it := range o.Inv.Items {
			if i >= len(o.Done.Results) {
				break
			}
			r := o.Done.Results[i]
			// Committed: a Client.Tx push, stored (in input order) at its commit.
			if r.Status != "queued" && r.Status != "buffered" && r.Status != "committed" {
				continue
			}
			s, ok := offsets[qt{o.Inv.Queue, it.TxID}]
			if !ok || s.Partition != it.Partition || pushed[qt{o.Inv.Queue, it.TxID}] > 1 {
				continue // reported by pushes
			}
			by[qp{o.Inv.Queue, it.Partition}] = append(by[qp{o.Inv.Queue, it.Partition}], placed{o, i, s.Offset, r.Status != "buffered"})
		}
	}
	for k, ps := range by {
		// Within one call: input order.
		for i := 1; i < len(ps); i++ {
			if ps[i].op == ps[i-1].op && ps[i].offset <= ps[i-1].offset {
				c.report("int-nonmonotonic-send", fmt.Sprintf("queue %s partition %s: items %d and %d of one call stored at %d and %d", k.queue, k.partition,
					ps[i-1].item, ps[i].item, ps[i-1].offset, ps[i].offset), ps[i].op.evidence()...)
			}
		}
		// Across calls: sweep in invoke order, with the highest offset of
		// every call that had completed before.
		c.sweepOrder(k, ps, func(a, b placed) bool { return a.queued && b.queued }, "nonmonotonic-send")
		byProc := map[string][]placed{}
		for _, p := range ps {
			byProc[p.op.Inv.Proc] = append(byProc[p.op.Inv.Proc], p)
		}
		for _, pp := range byProc {
			c.sweepOrder(k, pp, func(a, b placed) bool { return a.queued || b.op.Inv.Kind == "" }, "client-order")
		}
	}
}

func (c *checker) sweepOrder(k qp, ps []placed, counts func(a, b placed) bool, kind string) {
	starts := slices.Clone(ps)
	slices.SortStableFunc(starts, func(a, b placed) int { return cmp.Compare(a.op.Start(), b.op.Start()) })
	ends := slices.Clone(ps)
	slices.SortStableFunc(ends, func(a, b placed) int { return cmp.Compare(a.op.End(), b.op.End()) })
	// counts looks at a only through its "queued" flag; track the best of each.
	var best [2]*placed // [0]: any, [1]: queued
	j := 0
	for _, b := range starts {
		for j < len(ends) && ends[j].op.End() < b.op.Start() {
			a := ends[j]
			if best[0] == nil || a.offset > best[0].offset {
				best[0] = &ends[j]
			}
			if a.queued && (best[1] == nil || a.offset > best[1].offset) {
				best[1] = &ends[j]
			}
			j++
		}
		for _, a := range best {
			same := a != nil && a.op.Inv.Items[a.item].TxID == b.op.Inv.Items[b.item].TxID // a producer retry
			if a != nil && !same && counts(*a, b) && a.offset >= b.offset {
				c.where = Violation{Queue: k.queue, Partition: k.partition}
				c.report(kind, fmt.Sprintf("queue %s partition %s: a push completed before another began, yet is stored after it (%d >= %d)",
					k.queue, k.partition, a.offset, b.offset), append(a.op.evidence(), b.op.evidence()...)...)
				break
			}
		}
	}
}

type qgp struct{ queue, group, partition string }

// deliveries: every delivered message is the stored one at its offset;
// one pop's messages of a partition are consecutive (but for offsets a
// handler took before: settled out of order); nothing acked (or
// auto-acked, or dead-lettered) is delivered again to the same group.
func (c *checker) deliveries(ops []*Op) {
	log := c.index()
	type commit struct {
		op     *Op
		offset int64
	}
	commits := map[qgp][]commit{}
	// A per-key handler's ack settles its offset alone: only that offset
	// must not come again; earlier ones may still be running or handed back.
	alone := map[qgp][]commit{}
	type read struct {
		op  *Op
		msg Delivery
	}
	reads := map[qgp][]read{}
	// A Consume with KeyConcurrency > 1 settles out of order, and a later
	// claim skips what it settled: a gap in one pop is explained if a
	// handler had started on each offset in it before the pop ended.
	handled := map[qgp]map[int64]int64{} // earliest handler start per offset
	for _, o := range ops {
		if o.Inv.Op != OpHandler {
			continue
		}
		for _, m := range o.Inv.Msgs {
			k := qgp{o.Inv.Queue, o.Inv.Group, m.Partition}
			if handled[k] == nil {
				handled[k] = map[int64]int64{}
			}
			if t, ok := handled[k][m.Offset]; !ok || o.Start() < t {
				handled[k][m.Offset] = o.Start()
			}
		}
	}
	skipped := func(o *Op, partition string, from, to int64) bool {
		k := qgp{o.Inv.Queue, o.Inv.Group, partition}
		for off := from; off < to; off++ {
			if t, ok := handled[k][off]; (!ok || t >= o.End()) && !c.destroyed[qp{o.Inv.Queue, partition}][off] {
				return false
			}
		}
		return true
	}
	for _, o := range ops {
		if !c.audited(o.Inv.Queue) {
			continue
		}
		msgs := delivered(o)
		switch o.Inv.Op {
		case OpPop, OpHandler:
			last := map[string]int64{}
			for _, m := range msgs {
				s, ok := log[qp{o.Inv.Queue, m.Partition}][m.Offset]
				if !ok || s.ID != m.ID || s.TxID != m.TxID {
					c.report("inconsistent-read", fmt.Sprintf("queue %s: delivered %s@%d id %s tx %q; the log has id %s tx %q there",
						o.Inv.Queue, m.Partition, m.Offset, m.ID, m.TxID, s.ID, s.TxID), o.evidence()...)
				}
				if p, ok := last[m.Partition]; ok && m.Offset != p+1 && !c.allDestroyed(o.Inv.Queue, m.Partition, p+1, m.Offset) &&
					!skipped(o, m.Partition, p+1, m.Offset) {
					c.report("int-poll-skip", fmt.Sprintf("queue %s group %q: one pop delivered %s@%d right after @%d",
						o.Inv.Queue, o.Inv.Group, m.Partition, m.Offset, p), o.evidence()...)
				}
				last[m.Partition] = m.Offset
				k := qgp{o.Inv.Queue, o.Inv.Group, m.Partition}
				if o.Inv.Op == OpPop || !o.Inv.AutoAck {
					// An AutoAck Consume read it at its claim, which may
					// precede this handler by much.
					reads[k] = append(reads[k], read{o, m})
				}
				if o.Inv.AutoAck {
					commits[k] = append(commits[k], commit{o, m.Offset})
				}
			}
		case OpSettle:
			if o.Phase() == OK && (o.Inv.Kind == "ack" || o.Inv.Kind == "dead") {
				k := qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}
				if o.Inv.Keyed {
					alone[k] = append(alone[k], commit{o, o.Inv.Offset})
				} else {
					commits[k] = append(commits[k], commit{o, o.Inv.Offset})
				}
			}
		}
	}
	// A holder whose lease a reset, delete or release ended runs on
	// through the batch it holds (its settles are refused): its reads after
	// that are not redeliveries.
	claimed := map[string]int64{} // lease -> its earliest claim or delivery
	for _, o := range ops {
		note := func(l string, t int64) {
			if c, ok := claimed[l]; l != "" && (!ok || t < c) {
				claimed[l] = t
			}
		}
		if o.Inv.Op == OpClaim {
			note(o.Inv.Lease, o.Start())
		}
		lt := c.st.Queues[o.Inv.Queue].LeaseTime
		for _, m := range delivered(o) {
			note(m.Lease, o.Start())
			if lt > 0 && m.LeaseExpires > 0 {
				note(m.Lease, m.LeaseExpires-lt)
			}
		}
	}
	stale := func(k qgp, r read) bool {
		t, ok := claimed[r.msg.Lease]
		return ok && c.leaseEnded(k, t, r.op.End())
	}
	for k, rs := range reads {
		cs := commits[k]
		slices.SortFunc(cs, func(a, b commit) int { return cmp.Compare(a.op.End(), b.op.End()) })
		slices.SortStableFunc(rs, func(a, b read) int { return cmp.Compare(a.op.Start(), b.op.Start()) })
		var best *commit
		j := 0
		// A commit a reset or delete may have undone before the read.
		undone := func(cm commit, r read) bool { return c.rewound(k, r.msg.Offset, cm.op.Start(), r.op.End()) }
		for _, r := range rs {
			for j < len(cs) && cs[j].op.End() < r.op.Start() {
				if best == nil || cs[j].offset > best.offset {
					best = &cs[j]
				}
				j++
			}
			if stale(k, r) {
				continue
			}
			if best != nil && r.msg.Offset <= best.offset && undone(*best, r) {
				// The highest commit was undone: is a lower one that still
				// covers the offset?
				var still *commit
				for i := range cs[:j] {
					if cs[i].offset >= r.msg.Offset && !undone(cs[i], r) {
						still = &cs[i]
						break
					}
				}
				if still == nil {
					continue
				}
				c.report("acked-redelivered", fmt.Sprintf("queue %s group %q partition %s: offset %d delivered after the cursor was committed through %d",
					k.queue, k.group, k.partition, r.msg.Offset, still.offset), append(still.op.evidence(), r.op.evidence()...)...)
				continue
			}
			if best != nil && r.msg.Offset <= best.offset {
				c.report("acked-redelivered", fmt.Sprintf("queue %s group %q partition %s: offset %d delivered after the cursor was committed through %d",
					k.queue, k.group, k.partition, r.msg.Offset, best.offset), append(best.op.evidence(), r.op.evidence()...)...)
				continue
			}
			for _, a := range alone[k] {
				if a.offset == r.msg.Offset && a.op.End() < r.op.Start() && !undone(a, r) {
					c.report("acked-redelivered", fmt.Sprintf("queue %s group %q partition %s: offset %d delivered after it was settled alone",
						k.queue, k.group, k.partition, r.msg.Offset), append(a.op.evidence(), r.op.evidence()...)...)
					break
				}
			}
		}
	}
}

// holders: no two leases on one (partition, group) at once. A lease that
// settled successfully after another lease was claimed on the same key
// (the claim wholly between the first claim and that settle) means both
// were held together. Consume handlers of two leases must not overlap
// while the first lease was surely live.
func (c *checker) holders(ops []*Op) {
	type lease struct {
		pop      *Op
		id       string
		settled  []*Op // successful settles
		handlers []*Op
		exp      int64
	}
	leases := map[qgp]map[string]*lease{}
	get := func(k qgp, id string) *lease {
		if leases[k] == nil {
			leases[k] = map[string]*lease{}
		}
		l := leases[k][id]
		if l == nil {
			l = &lease{id: id}
			leases[k][id] = l
		}
		return l
	}
	for _, o := range ops {
		if !c.audited(o.Inv.Queue) {
			continue
		}
		switch o.Inv.Op {
		case OpPop:
			if o.Done == nil || o.Done.Phase != OK || o.Inv.AutoAck {
				continue
			}
			for _, m := range o.Done.Msgs {
				if m.Lease == "" {
					continue
				}
				l := get(qgp{o.Inv.Queue, o.Inv.Group, m.Partition}, m.Lease)
				l.pop = o
				l.exp = max(l.exp, m.LeaseExpires)
			}
		case OpSettle:
			if o.Done != nil && o.Done.Phase == OK && o.Inv.Lease != "" {
				l := get(qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}, o.Inv.Lease)
				l.settled = append(l.settled, o)
			}
		case OpHandler:
			if o.Inv.Lease != "" {
				l := get(qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}, o.Inv.Lease)
				l.handlers = append(l.handlers, o)
				for _, m := range o.Inv.Msgs {
					l.exp = max(l.exp, m.LeaseExpires)
				}
			}
		}
	}
	const slop = int64(50 * time.Millisecond)
	type handler struct {
		l *lease
		o *Op
	}
	for k, ls := range leases {
		var claimed []*lease
		var hs []handler
		for _, l := range ls {
			if l.pop != nil {
				claimed = append(claimed, l)
			}
			for _, h := range l.handlers {
				hs = append(hs, handler{l, h})
			}
		}
		slices.SortFunc(claimed, func(a, b *lease) int { return cmp.Compare(a.pop.Start(), b.pop.Start()) })
		for i, a := range claimed {
			var last *Op
			for _, s := range a.settled {
				if last == nil || s.Start() > last.Start() {
					last = s
				}
			}
			if last == nil {
				continue
			}
			for _, b := range claimed[i+1:] {
				if b.pop.Start() >= last.Start() {
					break
				}
				if b.pop.Start() > a.pop.End() && b.pop.End() < last.Start() {
					c.report("two-holders", fmt.Sprintf("queue %s group %q partition %s: lease %s was claimed while lease %s was held, and %s then settled",
						k.queue, k.group, k.partition, b.id, a.id, a.id), append(append(a.pop.evidence(), b.pop.evidence()...), last.evidence()...)...)
					break
				}
			}
		}
		slices.SortFunc(hs, func(a, b handler) int { return cmp.Compare(a.o.Start(), b.o.Start()) })
		for i, ha := range hs {
			for _, hb := range hs[i+1:] {
				if hb.o.Start() >= ha.o.End() {
					break
				}
				// ReleaseLease, or a forced reset or delete, may end a
				// lease while its handler runs: the next holder's handlers
				// may then start at once.
				if hb.l != ha.l && hb.o.Start()+slop < ha.l.exp && !c.leaseEnded(k, ha.o.Start(), hb.o.Start()) {
					c.report("concurrent-handlers", fmt.Sprintf("queue %s group %q partition %s: a handler of lease %s started while one of lease %s ran, before that lease could expire",
						k.queue, k.group, k.partition, hb.l.id, ha.l.id), append(ha.o.evidence(), hb.o.evidence()...)...)
				}
			}
		}
	}
}

// eventually: every stored message was delivered to every group the run
// drained.
func (c *checker) eventually(ops []*Op) {
	got := map[string]map[string]bool{} // queue/group -> ids
	for _, o := range ops {
		k := o.Inv.Queue + "\x00" + o.Inv.Group
		if got[k] == nil {
			got[k] = map[string]bool{}
		}
		for _, m := range delivered(o) {
			got[k][m.ID] = true
		}
	}
	// An AutoAck pop whose outcome is unknown may have consumed up to its
	// Batch messages nobody saw: at-most-once is AutoAck's contract.
	unknown := map[string]int{}
	for _, o := range ops {
		if o.Inv.Op == OpPop && o.Inv.AutoAck && o.Phase() != OK {
			unknown[o.Inv.Queue+"\x00"+o.Inv.Group] += max(o.Inv.Batch, 1)
		}
	}
	// So may an AutoAck Consume's claims, when one may have gone unseen
	// (how many is not known).
	uncertain, _ := c.autoAckConsumes(ops)
	for k := range uncertain {
		unknown[k] = math.MaxInt
	}
	// A late group owes only what was pushed after its first contact.
	joined := map[string]int64{}
	pushedAt := map[qt]int64{}
	for _, o := range ops {
		switch {
		case o.Inv.Op == OpPush:
			for _, it := range o.Inv.Items {
				k := qt{o.Inv.Queue, it.TxID}
				if t, ok := pushedAt[k]; !ok || o.Start() < t {
					pushedAt[k] = o.Start()
				}
			}
		case (o.Inv.Op == OpPop || o.Inv.Op == OpHandler) && o.Phase() == OK:
			// Of a deleted queue, a pop that delivered nothing of the new
			// one and began before it surely existed may have subscribed
			// to the deleted queue, or found none (a pop of no queue
			// subscribes nothing): no contact with the new queue.
			if t, ok := c.reborn[o.Inv.Queue]; ok && len(delivered(o)) == 0 && o.Start() < t {
				continue
			}
			k := o.Inv.Queue + "\x00" + o.Inv.Group
			if t, ok := joined[k]; !ok || o.End() < t {
				joined[k] = o.End()
			}
		}
	}
	// The latest start of a delivery of each message id, to any group.
	lastRead := map[qt]int64{}
	for _, o := range ops {
		for _, m := range delivered(o) {
			k := qt{o.Inv.Queue, m.ID}
			lastRead[k] = max(lastRead[k], o.Start())
		}
	}
	// The lowest cursor each group was seen at on a partition (Status):
	// CompletedRetention keeps what a group's cursor has not passed, so
	// everything above it is owed to the group, deleted or not.
	cursor := map[qgp]int64{}
	for _, o := range ops {
		if o.Inv.Op == OpCall && o.Inv.Kind == "cursor" && o.Phase() == OK {
			k := qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}
			if v, ok := cursor[k]; !ok || o.Inv.Offset < v {
				cursor[k] = o.Inv.Offset
			}
		}
	}
	missing := map[string][]Stored{}
	for _, s := range c.st.Log {
		qi := c.st.Queues[s.Queue]
		if s.Failures != 0 || (qi.Retained && s.Offset < qi.LogStart[s.Partition]) || c.destroyed[qp{s.Queue, s.Partition}][s.Offset] {
			continue
		}
		for g, from := range qi.FromGroups {
			k := s.Queue + "\x00" + g
			at, pushed := pushedAt[qt{s.Queue, s.TxID}]
			if s.Reconstructed {
				// As below: a deleted message is owed only by a group
				// that existed when it was pushed.
				if t, ok := joined[k]; !ok || at < t {
					continue
				}
			}
			if pushed && at > from && !got[k][s.ID] {
				missing[k] = append(missing[k], s)
			}
		}
		for _, g := range qi.LateGroups {
			k := s.Queue + "\x00" + g
			t, ok := joined[k]
			if at, pushed := pushedAt[qt{s.Queue, s.TxID}]; ok && pushed && at > t && !got[k][s.ID] {
				missing[k] = append(missing[k], s)
			}
		}
		for _, g := range qi.Groups {
			k := s.Queue + "\x00" + g
			if s.Reconstructed {
				// Completed retention owes a deleted message only to the
				// groups that existed when it was pushed, or when some group
				// was still reading it (it was retained then, and a group
				// pins what it has not read from its first contact on): a
				// group that came later starts at the oldest message still
				// there.
				t, ok := joined[k]
				at, pushed := pushedAt[qt{s.Queue, s.TxID}]
				cur, seen := cursor[qgp{s.Queue, g, s.Partition}]
				pinned := qi.Completed && seen && cur < s.Offset
				if !pinned && (!ok || !pushed || (at < t && lastRead[qt{s.Queue, s.ID}] <= t)) {
					continue
				}
			}
			if !got[k][s.ID] {
				missing[k] = append(missing[k], s)
			}
		}
	}
	// Consume's own claims, as evidence of where a missing message went.
	claims := map[qgp][]*Op{}
	for _, o := range ops {
		if o.Inv.Op == OpClaim {
			k := qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}
			claims[k] = append(claims[k], o)
		}
	}
	for k, ss := range missing {
		if len(ss) <= unknown[k] {
			continue
		}
		g := k[strings.IndexByte(k, 0)+1:]
		for _, s := range ss {
			var ev []Event
			for _, o := range claims[qgp{s.Queue, g, s.Partition}] {
				if o.Inv.Offset <= s.Offset && s.Offset <= o.Inv.Last {
					ev = append(ev, o.Inv)
				}
			}
			c.where = Violation{Queue: s.Queue, Group: g, Partition: s.Partition}
			c.report("never-delivered", fmt.Sprintf("queue %s group %q: %s@%d id %s tx %q was never delivered (%d such; AutoAck pops of unknown outcome could explain %d; %d claims of Consume took it)",
				s.Queue, g, s.Partition, s.Offset, s.ID, s.TxID, len(ss), unknown[k], len(ev)), clip(ev, 6)...)
		}
	}
}

// delivered is what an operation handed to the application: a completed
// pop's messages, or the message a Consume handler was started with.
func delivered(o *Op) []Delivery {
	switch {
	case o.Inv.Op == OpPop && o.Done != nil && o.Done.Phase == OK:
		return o.Done.Msgs
	case o.Inv.Op == OpHandler:
		return o.Inv.Msgs
	}
	return nil
}

// index maps the log by partition and offset.
func (c *checker) index() map[qp]map[int64]Stored {
	log := map[qp]map[int64]Stored{}
	for _, s := range c.st.Log {
		k := qp{s.Queue, s.Partition}
		if log[k] == nil {
			log[k] = map[int64]Stored{}
		}
		log[k][s.Offset] = s
	}
	return log
}

// reconstruct adds to the log of retained queues the delivered messages
// whose rows retention deleted: a delivery proves the row existed.
func (c *checker) reconstruct(ops []*Op) {
	have := c.index()
	for _, o := range ops {
		if q := c.st.Queues[o.Inv.Queue]; !q.Retained && !q.Completed {
			continue
		}
		for _, m := range delivered(o) {
			k := qp{o.Inv.Queue, m.Partition}
			if _, ok := have[k][m.Offset]; ok {
				continue
			}
			s := Stored{Queue: o.Inv.Queue, Partition: m.Partition, Offset: m.Offset, ID: m.ID, TxID: m.TxID, Reconstructed: true}
			if have[k] == nil {
				have[k] = map[int64]Stored{}
			}
			have[k][m.Offset] = s
			c.st.Log = append(c.st.Log, s)
		}
	}
}

// pollSkip: a delivery never starts past the cursor. The cursor at a
// claim is at most the highest offset any commit that may have applied
// before the claim returned went through: acks, dead letters, fails
// (lenient: through the failed message), retries (through the message
// before), auto-acks and Consume handler
// completions (a handler's end precedes its batch's settle). An auto-ack
// pop of unknown outcome could have moved it anywhere, so its group is not
// checked after it.
func (c *checker) pollSkip(ops []*Op) {
	type commit struct {
		start  int64
		offset int64
	}
	commits := map[qgp][]commit{}
	blind := map[string]int64{} // queue/group -> start of the first unknown auto-ack pop
	for _, o := range ops {
		q := c.st.Queues[o.Inv.Queue]
		if !c.audited(o.Inv.Queue) || q.Retained {
			continue
		}
		switch o.Inv.Op {
		case OpSettle:
			if o.Phase() == Fail {
				continue
			}
			k := qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}
			switch o.Inv.Kind {
			case "ack", "dead", "fail":
				commits[k] = append(commits[k], commit{o.Start(), o.Inv.Offset})
			case "retry":
				// Completes the lease's earlier messages.
				commits[k] = append(commits[k], commit{o.Start(), o.Inv.Offset - 1})
			}
		case OpHandler:
			if o.Done != nil {
				k := qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}
				commits[k] = append(commits[k], commit{o.End(), o.Inv.Offset})
			}
		case OpPop:
			if !o.Inv.AutoAck {
				continue
			}
			if o.Phase() != OK {
				k := o.Inv.Queue + "\x00" + o.Inv.Group
				if t, ok := blind[k]; !ok || o.Start() < t {
					blind[k] = o.Start()
				}
				continue
			}
			for _, m := range o.Done.Msgs {
				k := qgp{o.Inv.Queue, o.Inv.Group, m.Partition}
				commits[k] = append(commits[k], commit{o.Start(), m.Offset})
			}
		}
	}
	// A reset moves the cursor as a commit does; a moving call of unknown
	// outcome may have moved it anywhere (check_offsets.go).
	for k, ms := range c.moved {
		for _, o := range ms {
			switch {
			case o.Inv.Kind == "release":
			case o.Phase() != OK:
				bk := k.queue + "\x00" + k.group
				if t, ok := blind[bk]; !ok || o.Start() < t {
					blind[bk] = o.Start()
				}
			case o.Inv.Kind == "reset":
				for _, mv := range o.Done.Moves {
					ck := qgp{k.queue, k.group, mv.Partition}
					commits[ck] = append(commits[ck], commit{o.Start(), mv.After})
				}
			}
		}
	}
	// An AutoAck Consume's logged claims committed from its start on; one
	// whose claims may have gone unseen blinds its group as above.
	uncertain, claims := c.autoAckConsumes(ops)
	for k, t := range uncertain {
		if b, ok := blind[k]; !ok || t < b {
			blind[k] = t
		}
	}
	for k, cs := range claims {
		for _, cl := range cs {
			commits[k] = append(commits[k], commit{cl.start, cl.last})
		}
	}
	// A late group's cursor starts wherever the tail was at its first
	// contact: its first delivery of a partition sets the baseline.
	// So does any group's on a CompletedRetention queue, where it may
	// start past messages deleted before it existed.
	late := map[qgp]bool{}
	for _, o := range ops {
		q := c.st.Queues[o.Inv.Queue]
		_, from := q.FromGroups[o.Inv.Group]
		if !q.Completed && !from && !slices.Contains(q.LateGroups, o.Inv.Group) {
			continue
		}
		for _, m := range delivered(o) {
			k := qgp{o.Inv.Queue, o.Inv.Group, m.Partition}
			if !late[k] {
				late[k] = true
				commits[k] = append(commits[k], commit{math.MinInt64, m.Offset - 1})
			}
		}
	}
	for k := range commits {
		slices.SortFunc(commits[k], func(a, b commit) int { return cmp.Compare(a.start, b.start) })
	}
	for _, o := range ops {
		if o.Inv.Op != OpPop || o.Phase() != OK || !c.audited(o.Inv.Queue) || c.st.Queues[o.Inv.Queue].Retained {
			continue
		}
		if t, ok := blind[o.Inv.Queue+"\x00"+o.Inv.Group]; ok && t < o.End() {
			continue
		}
		first := map[string]int64{}
		for _, m := range o.Done.Msgs {
			if _, ok := first[m.Partition]; !ok {
				first[m.Partition] = m.Offset
			}
		}
		for p, f := range first {
			cs := commits[qgp{o.Inv.Queue, o.Inv.Group, p}]
			bound := int64(-1)
			for _, cm := range cs {
				if cm.start >= o.End() {
					break
				}
				bound = max(bound, cm.offset)
			}
			// Destroyed messages are dead-lettered by whichever pop meets
			// them, which moves the cursor past them unseen.
			for bound+1 < f && c.destroyed[qp{o.Inv.Queue, p}][bound+1] {
				bound++
			}
			if f > bound+1 {
				c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: p}
				c.report("poll-skip", fmt.Sprintf("queue %s group %q partition %s: a pop started at offset %d, but no commit could have moved the cursor past %d",
					o.Inv.Queue, o.Inv.Group, p, f, bound), o.evidence()...)
			}
		}
	}
}

// ScheduledOutcomeUnknown is what a Push's error says when its scheduled
// items' commit went unanswered (queen's schedule.go words it).
const ScheduledOutcomeUnknown = "whether the scheduled items were stored is unknown"

// pushErrors: Push never fails for want of the database; during an outage
// it returns Buffered. (PushTx and Client.Tx report the caller's
// transaction and may fail; so may a push of scheduled items, which are
// never spooled, when the commit that would store them goes unanswered:
// its outcome is then unknown, and it says so.)
func (c *checker) pushErrors(ops []*Op) {
	for _, o := range ops {
		if o.Inv.Op == OpPush && o.Inv.Kind == "" && c.audited(o.Inv.Queue) && o.Done != nil && o.Done.Phase == Info &&
			!strings.Contains(o.Done.Err, ScheduledOutcomeUnknown) {
			c.report("push-error", fmt.Sprintf("queue %s: Push returned an error instead of Buffered: %s", o.Inv.Queue, o.Done.Err), o.evidence()...)
		}
	}
}

// allDestroyed reports whether every offset in [from, to) of the partition
// was destroyed on purpose: a pop dead-letters those and delivers past them.
func (c *checker) allDestroyed(queue, partition string, from, to int64) bool {
	d := c.destroyed[qp{queue, partition}]
	for o := from; o < to; o++ {
		if !d[o] {
			return false
		}
	}
	return from < to
}
