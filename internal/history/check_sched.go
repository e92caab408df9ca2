package history

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Recorded by the "sched", "retrywait" and "discard" generators
// (gen_sched_test.go):
//   - a push's Event.DeliverAt (on its completion) holds each item's
//     Item.DeliverAt;
//   - a "cancel-scheduled" call cancels one transaction id (Msgs[0].TxID),
//     so the count its completion holds (Counts["cancelled"], 0 or 1) says
//     whether that item was cancelled;
//   - a settle "fail" or a failing handler that asked for a wait holds it
//     in Counts["wait_ms"] (on the settle's invoke, on the handler's
//     completion; 0: the queue's schedule);
//   - a "discard" call discards one dead letter by its id
//     (Counts["dl"]; Msgs[0] its message, Group its group), its
//     completion Counts["discarded"]; a "deadletters" call of that id
//     (Counts["dl"]) lists it again, its completion Counts["listed"].

// schedTolerance is the clock slack of delivered-early: the due time is
// compared by the database, on the same machine's clock.
const schedTolerance = 50 * time.Millisecond

// retryTolerance is retry-early's: the failure's time is taken at the
// settle's start (or the handler's return), before the database's.
const retryTolerance = 20 * time.Millisecond

// scheduled judges Item.DeliverAt and CancelScheduled:
//   - delivered-early: a message reported Scheduled is delivered no
//     sooner than its DeliverAt;
//   - scheduled-lost: each transaction id is stored as often as it was
//     reported Scheduled or stored (Buffered ones of a partition at least
//     once: a replay flush deduplicates), less the cancels that counted it, and
//     (with no cancel and no unknown outcome) under each Scheduled id;
//   - cancelled-delivered: a cancel that counted an item leaves it
//     unstored (more copies than the pushes less the cancels).
func (c *checker) scheduled(ops []*Op) {
	type fate struct {
		sched    []Result // scheduled results
		at       []int64
		definite int // queued or buffered now
		buffered int
		bufParts map[string]bool // partitions of the buffered ones
		unknown  int
		cancels  int // counted by a cancel
		cUnknown int // cancels of unknown outcome
		ev       []Event
	}
	fates := map[qt]*fate{}
	get := func(k qt) *fate {
		if fates[k] == nil {
			fates[k] = &fate{}
		}
		return fates[k]
	}
	schedQ := map[string]bool{}
	for _, o := range ops {
		if o.Inv.Op == OpPush && len(deliverAt(o)) > 0 {
			schedQ[o.Inv.Queue] = true
		}
	}
	dueAt := map[string]int64{} // scheduled message id -> its DeliverAt
	for _, o := range ops {
		if !schedQ[o.Inv.Queue] {
			continue
		}
		switch {
		case o.Inv.Op == OpPush:
			for i, it := range o.Inv.Items {
				f := get(qt{o.Inv.Queue, it.TxID})
				f.ev = append(f.ev, o.evidence()...)
				if o.Inv.Rollback {
					continue
				}
				if o.Phase() != OK || o.Done == nil || i >= len(o.Done.Results) {
					f.unknown++
					continue
				}
				switch r := o.Done.Results[i]; r.Status {
				case "scheduled":
					var at int64
					if ats := deliverAt(o); i < len(ats) {
						at = ats[i]
					}
					f.sched = append(f.sched, r)
					f.at = append(f.at, at)
					dueAt[r.ID] = at
				case "queued", "committed":
					f.definite++
				case "buffered":
					f.definite++
					f.buffered++
					if f.bufParts == nil {
						f.bufParts = map[string]bool{}
					}
					f.bufParts[it.Partition] = true
				case "duplicate":
				default: // failed: not written, unless the reply was lost
					f.unknown++
				}
			}
		case c.isCall(o, "cancel-scheduled") && len(o.Inv.Msgs) == 1:
			f := get(qt{o.Inv.Queue, o.Inv.Msgs[0].TxID})
			f.ev = append(f.ev, o.evidence()...)
			switch {
			case o.Phase() == OK && o.Done != nil:
				f.cancels += int(o.Done.Counts["cancelled"])
			case o.Phase() != Fail:
				f.cUnknown++
			}
		}
	}
	if len(schedQ) == 0 {
		return
	}
	// delivered-early
	for _, o := range ops {
		if !schedQ[o.Inv.Queue] {
			continue
		}
		var t int64
		switch {
		case o.Inv.Op == OpPop && o.Done != nil && o.Done.Phase == OK:
			t = o.Done.T // delivered by then
		case o.Inv.Op == OpHandler:
			t = o.Inv.T
		default:
			continue
		}
		for _, m := range delivered(o) {
			at, ok := dueAt[m.ID]
			if !ok || at == 0 || t >= at-int64(schedTolerance) {
				continue
			}
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: m.Partition}
			c.report("delivered-early", fmt.Sprintf("queue %s group %q: %s@%d id %s (transaction %q), scheduled for %s, was delivered by %s, %s early",
				o.Inv.Queue, o.Inv.Group, m.Partition, m.Offset, m.ID, m.TxID, time.Unix(0, at).Format("15:04:05.000"),
				time.Unix(0, t).Format("15:04:05.000"), time.Duration(at-t).Round(time.Millisecond)), o.evidence()...)
		}
	}
	stored := map[qt][]Stored{}
	for _, s := range c.st.Log {
		if s.Failures == 0 && schedQ[s.Queue] {
			stored[qt{s.Queue, s.TxID}] = append(stored[qt{s.Queue, s.TxID}], s)
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(fates), func(a, b qt) int {
		if a.queue != b.queue {
			return cmp.Compare(a.queue, b.queue)
		}
		return cmp.Compare(a.tx, b.tx)
	}) {
		f := fates[k]
		if len(f.sched) == 0 && f.cancels == 0 {
			continue // ordinary pushes: pushes() judges them
		}
		ss := stored[k]
		// Buffered repeats of one partition may be replayed in one flush,
		// which deduplicates them (as it does any flush): one copy each.
		lower := len(f.sched) + f.definite - f.buffered + len(f.bufParts) - f.cancels - f.cUnknown
		upper := len(f.sched) + f.definite + f.buffered + f.unknown - f.cancels
		ev := clip(f.ev, 6)
		c.where = Violation{Queue: k.queue}
		switch {
		case len(ss) < lower:
			c.report("scheduled-lost", fmt.Sprintf("queue %s: transaction %q reported scheduled %d times and stored %d (%d buffered), %d counted cancelled (%d cancels unknown), is stored %d times (%s)",
				k.queue, k.tx, len(f.sched), f.definite, f.buffered, f.cancels, f.cUnknown, len(ss), where(ss)), ev...)
			continue
		case len(ss) > upper && f.cancels > 0:
			c.report("cancelled-delivered", fmt.Sprintf("queue %s: transaction %q reported scheduled %d times and stored %d (%d unknown), %d counted cancelled, is stored %d times (%s)",
				k.queue, k.tx, len(f.sched), f.definite, f.unknown, f.cancels, len(ss), where(ss)), ev...)
			continue
		}
		if f.cancels > 0 || f.cUnknown > 0 {
			continue
		}
		for _, r := range f.sched {
			if !slices.ContainsFunc(ss, func(s Stored) bool { return s.ID == r.ID }) {
				c.where = Violation{Queue: k.queue}
				c.report("scheduled-lost", fmt.Sprintf("queue %s: transaction %q reported scheduled as id %s is not stored under it (the log has %s)",
					k.queue, k.tx, r.ID, where(ss)), ev...)
				break
			}
		}
	}
}

// deliverAt is a push's DeliverAt times: on its completion (set after
// the invoke was recorded) or its invoke.
func deliverAt(o *Op) []int64 {
	if o.Done != nil && len(o.Done.DeliverAt) > 0 {
		return o.Done.DeliverAt
	}
	return o.Inv.DeliverAt
}

// retryEarly: on a queue with RetryMin, a charged failure (a Fail that
// applied; a Consume handler's error that recorded its wait) is not
// followed by a delivery of that offset to that group with a higher
// Attempt before the failure's time plus the wait: RetryMin, or the
// RetryAfter it asked for. On a Skip queue the failed message comes back
// as a copy at the partition's tail, so it is the next delivery of its id
// (at any offset) that is judged. A handler's failure whose settle did not
// apply comes back when its lease ends, so only deliveries before that
// count.
func (c *checker) retryEarly(ops []*Op) {
	// offset is -1 on a Skip queue: a message's deliveries by id.
	type qgpo struct {
		queue, group, partition string
		offset                  int64
		id                      string
	}
	keyOf := func(qi QueueInfo, queue, group string, m Delivery) qgpo {
		if qi.Skip {
			return qgpo{queue, group, m.Partition, -1, m.ID}
		}
		return qgpo{queue, group, m.Partition, m.Offset, ""}
	}
	type del struct {
		op *Op
		d  Delivery
		t  int64
	}
	dels := map[qgpo][]del{}
	byLease := map[qgpo]map[string]Delivery{}
	for _, o := range ops {
		if c.st.Queues[o.Inv.Queue].RetryMin <= 0 {
			continue
		}
		var t int64
		switch {
		case o.Inv.Op == OpPop && o.Done != nil && o.Done.Phase == OK && !o.Inv.AutoAck:
			t = o.Done.T
		case o.Inv.Op == OpHandler && !o.Inv.AutoAck:
			t = o.Inv.T
		default:
			continue
		}
		for _, m := range delivered(o) {
			k := keyOf(c.st.Queues[o.Inv.Queue], o.Inv.Queue, o.Inv.Group, m)
			dels[k] = append(dels[k], del{o, m, t})
			if byLease[k] == nil {
				byLease[k] = map[string]Delivery{}
			}
			byLease[k][m.Lease] = m
		}
	}
	for _, o := range ops {
		qi := c.st.Queues[o.Inv.Queue]
		if qi.RetryMin <= 0 || o.Inv.Keyed || o.Phase() != OK || o.Done == nil {
			continue
		}
		var k qgpo
		var failed Delivery
		var at, wait int64
		lease := int64(1<<63 - 1)
		switch {
		case o.Inv.Op == OpSettle && o.Inv.Kind == "fail" && !o.Done.LeaseLost:
			k = keyOf(qi, o.Inv.Queue, o.Inv.Group, Delivery{Partition: o.Inv.Partition, Offset: o.Inv.Offset, ID: o.Inv.ID})
			d, ok := byLease[k][o.Inv.Lease]
			if !ok {
				continue
			}
			failed, at, wait = d, o.Inv.T, o.Inv.Counts["wait_ms"]
		case o.Inv.Op == OpHandler && !o.Inv.AutoAck && o.Done.Err != "" && len(o.Inv.Msgs) == 1 && o.Done.Counts != nil:
			w, ok := o.Done.Counts["wait_ms"]
			if !ok {
				continue // its Consume's settings are not known
			}
			failed = o.Inv.Msgs[0]
			k = keyOf(qi, o.Inv.Queue, o.Inv.Group, failed)
			at, wait = o.Done.T, w
			if failed.LeaseExpires > 0 {
				lease = failed.LeaseExpires
			}
		default:
			continue
		}
		need := qi.RetryMin
		if wait > 0 {
			need = time.Duration(wait) * time.Millisecond
		}
		due := at + int64(need) - int64(retryTolerance)
		for _, d := range dels[k] {
			// Only a claim begun after the failure returned is its
			// redelivery: Attempt is not monotonic per offset (a message
			// behind a failing head carries the batch's delivery count),
			// so an earlier delivery may show a higher one.
			if d.d.Attempt <= failed.Attempt || d.op.Inv.T < o.Done.T || d.t >= due || d.t >= lease {
				continue
			}
			c.where = Violation{Queue: k.queue, Group: k.group, Partition: k.partition}
			c.report("retry-early", fmt.Sprintf("queue %s group %q: %s@%d (attempt %d) failed at %s with a wait of %s, and was delivered again (attempt %d) by %s, %s after the failure",
				k.queue, k.group, failed.Partition, failed.Offset, failed.Attempt, time.Unix(0, at).Format("15:04:05.000"), need, d.d.Attempt,
				time.Unix(0, d.t).Format("15:04:05.000"), time.Duration(d.t-at).Round(time.Millisecond)),
				append(o.evidence(), d.op.evidence()...)...)
			break
		}
	}
}

// discardedBy returns the discard calls that may have deleted a dead letter
// (ok and counted, or of unknown outcome), by queue, group and message id.
func (c *checker) discardedBy(ops []*Op) map[qgi][]*Op {
	out := map[qgi][]*Op{}
	for _, o := range ops {
		if !c.isCall(o, "discard") || len(o.Inv.Msgs) != 1 || o.Inv.Msgs[0].ID == zeroUUID {
			continue
		}
		if o.Phase() == Fail || o.Phase() == OK && (o.Done == nil || o.Done.Counts["discarded"] < 1) {
			continue
		}
		k := qgi{o.Inv.Queue, o.Inv.Group, o.Inv.Msgs[0].ID}
		out[k] = append(out[k], o)
	}
	return out
}

// addDiscarded marks the dead letters a discard may have deleted as
// accounted for, as the final dead-letter store's are: a failed or
// requeued message that was then discarded is not lost.
func (c *checker) addDiscarded(dead map[qgi]bool, ops []*Op) {
	for k := range c.discardedBy(ops) {
		dead[k] = true
	}
}

// discards: a dead letter a DiscardDeadLetters call counted as deleted is
// gone for good: not in the final store, not listed by a later call, not
// delivered to its group again (nothing requeued it).
func (c *checker) discards(ops []*Op) {
	by := c.discardedBy(ops)
	// By offset too: a requeued copy keeps the message id at a new offset,
	// and its own dead letter is another one.
	type dlAt struct {
		k   qgi
		p   string
		off int64
	}
	final := map[dlAt]bool{}
	for _, d := range c.st.DeadLetters {
		final[dlAt{qgi{d.Queue, d.Group, d.ID}, d.Partition, d.Offset}] = true
	}
	pops := map[qgi][]*Op{}
	for _, o := range ops {
		if o.Inv.Op == OpPop {
			for _, m := range delivered(o) {
				k := qgi{o.Inv.Queue, o.Inv.Group, m.ID}
				if by[k] != nil {
					pops[k] = append(pops[k], o)
				}
			}
		}
	}
	lists := map[string][]*Op{} // queue/dead letter id -> later listings
	for _, o := range ops {
		if c.isCall(o, "deadletters") && o.Phase() == OK && o.Done != nil && o.Done.Counts["listed"] > 0 {
			if id, ok := o.Inv.Counts["dl"]; ok {
				lists[fmt.Sprint(o.Inv.Queue, "/", id)] = append(lists[fmt.Sprint(o.Inv.Queue, "/", id)], o)
			}
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(by), func(a, b qgi) int { return cmp.Compare(a.queue+a.group+a.id, b.queue+b.group+b.id) }) {
		for _, o := range by[k] {
			if o.Phase() != OK {
				continue
			}
			m := o.Inv.Msgs[0]
			c.where = Violation{Queue: k.queue, Group: k.group, Partition: m.Partition}
			if final[dlAt{k, m.Partition, m.Offset}] {
				c.report("discarded-back", fmt.Sprintf("queue %s group %q: dead letter %s@%d id %s was discarded, yet is a dead letter at the end",
					k.queue, k.group, m.Partition, m.Offset, m.ID), o.evidence()...)
				continue
			}
			if l := lists[fmt.Sprint(k.queue, "/", o.Inv.Counts["dl"])]; len(l) > 0 {
				if i := slices.IndexFunc(l, func(x *Op) bool { return x.Start() > o.End() }); i >= 0 {
					c.report("discarded-back", fmt.Sprintf("queue %s group %q: dead letter %d (%s@%d id %s) was discarded, yet a later call listed it",
						k.queue, k.group, o.Inv.Counts["dl"], m.Partition, m.Offset, m.ID), append(o.evidence(), l[i].evidence()...)...)
					continue
				}
			}
			for _, p := range pops[k] {
				// The same offset: a requeued copy of the message (of
				// another group's dead letter, or the skip policy's) keeps
				// its id at a new offset, and every group reads it.
				same := slices.ContainsFunc(delivered(p), func(d Delivery) bool {
					return d.ID == m.ID && d.Partition == m.Partition && d.Offset == m.Offset
				})
				if same && p.Start() > o.End() {
					c.report("discarded-back", fmt.Sprintf("queue %s group %q: dead letter %s@%d id %s was discarded, yet a later pop delivered it",
						k.queue, k.group, m.Partition, m.Offset, m.ID), append(o.evidence(), p.evidence()...)...)
					break
				}
			}
		}
	}
}
