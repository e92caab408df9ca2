package history

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Moving offsets: Queue.ResetGroup, DeleteGroup and ReleaseLease, called by
// an operator beside live consumers of the groups they move.
//
// A reset (or a delete: the group comes back at its first contact, from
// the oldest message, as SubscribeAll) starts an era of (queue, group,
// partition): the cursor is at the move's After (-1 after a delete) and
// rises only as the group settles what it was delivered. So:
//   - reset-lost: every offset an era committed (above its start, up to
//     the next reset's Before) was delivered in that era, and every stored
//     offset above the last era's start was delivered after it began;
//   - reset-wrong: a move is where the call asked (earliest: the log's
//     start; latest: the tail when it ran; time: between the messages
//     stored before and after; offsets: the named offset, clamped), only
//     on the partitions it named, never behind the previous era's start;
//     a call naming something missing is refused, a forced one never
//     refused as active, and one without Force ends no live lease;
//   - released-double: two settlements of one offset by different leases
//     both succeed only if a rewind came between them;
//   - released-settled: a lease ReleaseLease ended (one claimed before the
//     release began and live past its end, nothing settled since) settles
//     nothing after the release returned true.
//
// The other checks excuse exactly these calls: acked-redelivered a
// delivery after a rewind that came after the commit, and a read under a
// lease a call ended after its claim (the holder runs on through its
// batch, its settles refused); poll-skip counts a
// reset's After as a commit; concurrent-handlers two leases' handlers
// when a call ended the first lease meanwhile. A refused call (Fail) is
// no excuse; one of unknown outcome (Info) excuses its group from its
// start on.

type qg struct{ queue, group string }

// movers indexes the moving calls that may have applied (OK or Info) by
// queue and group.
func (c *checker) movers(ops []*Op) map[qg][]*Op {
	m := map[qg][]*Op{}
	for _, o := range ops {
		if o.Inv.Op != OpCall || o.Phase() == Fail || o.Inv.Absent {
			continue
		}
		switch o.Inv.Kind {
		case "reset", "delete-group", "release":
			k := qg{o.Inv.Queue, o.Inv.Group}
			m[k] = append(m[k], o)
		}
	}
	return m
}

// moveOn is o's move of partition p, if it made one.
func moveOn(o *Op, p string) (Move, bool) {
	if o.Done == nil {
		return Move{}, false
	}
	for _, mv := range o.Done.Moves {
		if mv.Partition == p {
			return mv, true
		}
	}
	return Move{}, false
}

// rewound: a reset or delete of the group that may have taken effect
// after from and before to put the cursor of partition p below offset.
func (c *checker) rewound(k qgp, offset, from, to int64) bool {
	for _, o := range c.moved[qg{k.queue, k.group}] {
		if o.End() <= from || o.Start() >= to {
			continue
		}
		switch {
		case o.Inv.Kind == "release":
		case o.Phase() != OK, o.Inv.Kind == "delete-group":
			return true
		default:
			if mv, ok := moveOn(o, k.partition); ok && mv.After < offset {
				return true
			}
		}
	}
	return false
}

// leaseEnded: a call that may have taken effect after from and before to
// ended the group's lease on partition p.
func (c *checker) leaseEnded(k qgp, from, to int64) bool {
	for _, o := range c.moved[qg{k.queue, k.group}] {
		if o.End() <= from || o.Start() >= to {
			continue
		}
		if o.Phase() != OK {
			return true
		}
		switch o.Inv.Kind {
		case "release":
			if o.Inv.Partition == k.partition && o.Done.Released {
				return true
			}
		case "delete-group":
			if o.Done.Ended > 0 {
				return true
			}
		case "reset":
			if mv, ok := moveOn(o, k.partition); ok && mv.LeaseEnded {
				return true
			}
		}
	}
	return false
}

// span is when a delivery happened.
type span struct{ start, end int64 }

// resetLost: see above. A move of unknown outcome (Info) leaves the
// cursor unknown until the group's next applied move that began after it
// returned: only the eras from there on are judged.
func (c *checker) resetLost(ops []*Op) {
	got := map[qgp]map[int64][]span{}
	for _, o := range ops {
		for _, m := range delivered(o) {
			k := qgp{o.Inv.Queue, o.Inv.Group, m.Partition}
			if got[k] == nil {
				got[k] = map[int64][]span{}
			}
			got[k][m.Offset] = append(got[k][m.Offset], span{o.Start(), o.End()})
		}
	}
	// A delivery in (from, to): its claim may lie anywhere in its span.
	in := func(k qgp, off, from, to int64) bool {
		return slices.ContainsFunc(got[k][off], func(s span) bool { return s.end > from && s.start < to })
	}
	log := map[qp][]Stored{}
	for _, s := range c.st.Log {
		if s.Failures == 0 && len(c.st.Queues[s.Queue].Moved) > 0 {
			log[qp{s.Queue, s.Partition}] = append(log[qp{s.Queue, s.Partition}], s)
		}
	}
	for pk, ss := range log {
		slices.SortFunc(ss, func(a, b Stored) int { return cmp.Compare(a.Offset, b.Offset) })
	group:
		for _, g := range c.st.Queues[pk.queue].Moved {
			k := qgp{pk.queue, g, pk.partition}
			var bounds []*Op
			unknown := int64(math.MinInt64) // the last end of a move of unknown outcome
			for _, o := range c.moved[qg{pk.queue, g}] {
				if o.Inv.Kind == "release" {
					continue
				}
				if o.Phase() != OK {
					unknown = max(unknown, o.End())
					continue
				}
				if _, ok := moveOn(o, pk.partition); ok || o.Inv.Kind == "delete-group" {
					bounds = append(bounds, o)
				}
			}
			slices.SortFunc(bounds, func(a, b *Op) int { return cmp.Compare(a.End(), b.End()) })
			if unknown > math.MinInt64 {
				i := slices.IndexFunc(bounds, func(o *Op) bool { return o.Start() > unknown })
				if i < 0 {
					continue group
				}
				// The era it begins is judged from its own position.
				bounds = bounds[i:]
			}
			pos, from := int64(-1), int64(math.MinInt64)
			var start *Op // the call that began the era (nil: the first contact)
			lost := func(s Stored, detail string, ev ...Event) {
				c.where = Violation{Queue: pk.queue, Group: g, Partition: pk.partition}
				c.report("reset-lost", fmt.Sprintf("queue %s group %q: %s@%d id %s tx %q %s", pk.queue, g, s.Partition, s.Offset, s.ID, s.TxID, detail), ev...)
			}
			for i, b := range bounds {
				mv, isReset := moveOn(b, pk.partition)
				if isReset && !mv.Created && (i > 0 || unknown == math.MinInt64) {
					if mv.Before < pos {
						c.where = Violation{Queue: pk.queue, Group: g, Partition: pk.partition}
						c.report("reset-wrong", fmt.Sprintf("queue %s group %q partition %s: a reset found the cursor at %d, behind %d where the previous move left it",
							pk.queue, g, pk.partition, mv.Before, pos), append(evidenceOfOp(start), b.evidence()...)...)
					}
					for _, s := range ss {
						if s.Offset > pos && s.Offset <= mv.Before && !in(k, s.Offset, from, b.End()) {
							lost(s, fmt.Sprintf("was committed (the cursor at %d when a reset moved it) but never delivered since the cursor was at %d", mv.Before, pos),
								append(evidenceOfOp(start), b.evidence()...)...)
							break
						}
					}
				}
				pos, from, start = -1, b.Start(), b
				if isReset {
					pos = mv.After
				}
			}
			for _, s := range ss {
				if s.Offset > pos && !in(k, s.Offset, from, math.MaxInt64) {
					lost(s, fmt.Sprintf("was never delivered after the cursor was put at %d", pos), evidenceOfOp(start)...)
					break
				}
			}
		}
	}
}

func evidenceOfOp(o *Op) []Event {
	if o == nil {
		return nil
	}
	return o.evidence()
}

// resetWrong: see above.
func (c *checker) resetWrong(ops []*Op) {
	type pushed struct {
		start  int64 // the earliest push of its transaction id began
		queued int64 // the earliest push reporting it Queued returned (MaxInt64: none)
	}
	at := map[qt]*pushed{}
	for _, o := range ops {
		if o.Inv.Op != OpPush || len(c.st.Queues[o.Inv.Queue].Moved) == 0 {
			continue
		}
		for i, it := range o.Inv.Items {
			k := qt{o.Inv.Queue, it.TxID}
			p := at[k]
			if p == nil {
				p = &pushed{start: o.Start(), queued: math.MaxInt64}
				at[k] = p
			}
			p.start = min(p.start, o.Start())
			if o.Phase() == OK && i < len(o.Done.Results) && o.Done.Results[i].Status == "queued" {
				p.queued = min(p.queued, o.End())
			}
		}
	}
	log := map[qp][]Stored{}
	for _, s := range c.st.Log {
		if s.Failures == 0 && len(c.st.Queues[s.Queue].Moved) > 0 {
			log[qp{s.Queue, s.Partition}] = append(log[qp{s.Queue, s.Partition}], s)
		}
	}
	for _, o := range ops {
		if o.Inv.Op != OpCall || !slices.Contains([]string{"reset", "delete-group", "release"}, o.Inv.Kind) {
			continue
		}
		wrong := func(p, detail string) {
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: p}
			c.report("reset-wrong", fmt.Sprintf("queue %s group %q: %s %s", o.Inv.Queue, o.Inv.Group, o.Inv.Kind, detail), o.evidence()...)
		}
		switch {
		case o.Inv.Absent && o.Phase() == OK:
			wrong("", "naming a missing partition or group succeeded")
			continue
		case o.Inv.Absent && o.Phase() == Fail && o.Done.Refusal != "not-found" && o.Done.Refusal != "unsent":
			wrong("", "naming a missing partition or group was refused, but not as not found: "+o.Done.Err)
			continue
		case o.Inv.Force && o.Phase() == Fail && o.Done.Refusal == "active":
			wrong("", "with Force was refused as active")
			continue
		case o.Inv.Kind != "reset" || o.Phase() != OK:
			continue
		}
		if !o.Inv.Force && slices.ContainsFunc(o.Done.Moves, func(mv Move) bool { return mv.LeaseEnded }) {
			wrong("", "without Force applied while the group held a live lease")
		}
		for _, mv := range o.Done.Moves {
			switch {
			case o.Inv.Reset == "offsets":
				if _, ok := o.Inv.Want[mv.Partition]; !ok {
					wrong(mv.Partition, fmt.Sprintf("to offsets moved partition %s, which it did not name", mv.Partition))
					continue
				}
			case len(o.Inv.Parts) > 0 && !slices.Contains(o.Inv.Parts, mv.Partition):
				wrong(mv.Partition, fmt.Sprintf("moved partition %s, not among the partitions it named %v", mv.Partition, o.Inv.Parts))
				continue
			}
			ss := log[qp{o.Inv.Queue, mv.Partition}]
			first, lo, hi := int64(0), int64(-1), int64(-1)
			for i, s := range ss {
				if i == 0 || s.Offset < first {
					first = s.Offset
				}
				p := at[qt{s.Queue, s.TxID}]
				if p == nil {
					continue
				}
				if p.queued < o.Start() {
					lo = max(lo, s.Offset)
				}
				if p.start < o.End() {
					hi = max(hi, s.Offset)
				}
			}
			lo = max(lo, first-1)
			hi = max(hi, first-1)
			// The move's target lies in [wantLo, wantHi].
			wantLo, wantHi := lo, hi
			switch o.Inv.Reset {
			case "earliest":
				wantLo, wantHi = first-1, first-1
			case "time":
				wantLo = first - 1
				for _, s := range ss {
					p := at[qt{s.Queue, s.TxID}]
					switch {
					case p == nil:
					case p.queued < o.Inv.At: // stored before the time
						wantLo = max(wantLo, s.Offset)
					case p.start > o.Inv.At: // stored after it
						wantHi = min(wantHi, s.Offset-1)
					}
				}
			case "offsets":
				n := o.Inv.Want[mv.Partition] - 1
				switch {
				case n <= first-1:
					wantLo, wantHi = first-1, first-1
				case n <= lo:
					wantLo, wantHi = n, n
				default: // past what surely was stored: clamped to the tail
					wantHi = min(n, hi)
				}
			}
			if mv.After < wantLo || mv.After > wantHi {
				want := fmt.Sprintf("%d..%d", wantLo, wantHi)
				if wantLo == wantHi {
					want = fmt.Sprint(wantLo)
				}
				wrong(mv.Partition, fmt.Sprintf("to %s moved partition %s's cursor to %d; the call asked for %s", o.Inv.Reset, mv.Partition, mv.After, want))
			}
		}
	}
}

// releasedDouble: see above. Judged on the queues with Moved groups.
func (c *checker) releasedDouble(ops []*Op) {
	type qgpo struct {
		qgp
		offset int64
	}
	settles := map[qgpo][]*Op{}
	for _, o := range ops {
		if o.Inv.Op != OpSettle || o.Phase() != OK || o.Inv.Lease == "" || (o.Inv.Kind != "ack" && o.Inv.Kind != "dead") ||
			len(c.st.Queues[o.Inv.Queue].Moved) == 0 {
			continue
		}
		k := qgpo{qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}, o.Inv.Offset}
		settles[k] = append(settles[k], o)
	}
	for k, ss := range settles {
		slices.SortFunc(ss, func(a, b *Op) int { return cmp.Compare(a.End(), b.End()) })
		for i := 1; i < len(ss); i++ {
			a, b := ss[i-1], ss[i]
			if a.Inv.Lease != b.Inv.Lease && !c.rewound(k.qgp, k.offset, a.Start(), b.End()) {
				c.where = Violation{Queue: k.queue, Group: k.group, Partition: k.partition}
				c.report("released-double", fmt.Sprintf("queue %s group %q partition %s: offset %d settled by lease %s and again by lease %s, with no rewind between",
					k.queue, k.group, k.partition, k.offset, a.Inv.Lease, b.Inv.Lease), append(a.evidence(), b.evidence()...)...)
				break
			}
		}
	}
}

// releasedSettled: see above. Judged on the queues with Moved groups, for
// leases of recorded pops (Consume's own settlements are not recorded).
func (c *checker) releasedSettled(ops []*Op) {
	type lease struct {
		pop     *Op
		last    int64 // its last offset on the partition
		exp     int64
		settles []*Op
	}
	leases := map[qgp]map[string]*lease{}
	for _, o := range ops {
		if len(c.st.Queues[o.Inv.Queue].Moved) == 0 {
			continue
		}
		switch {
		case o.Inv.Op == OpPop && o.Phase() == OK && !o.Inv.AutoAck:
			for _, m := range o.Done.Msgs {
				k := qgp{o.Inv.Queue, o.Inv.Group, m.Partition}
				if leases[k] == nil {
					leases[k] = map[string]*lease{}
				}
				l := leases[k][m.Lease]
				if l == nil {
					l = &lease{pop: o}
					leases[k][m.Lease] = l
				}
				l.last, l.exp = max(l.last, m.Offset), max(l.exp, m.LeaseExpires)
			}
		case o.Inv.Op == OpSettle:
			if l := leases[qgp{o.Inv.Queue, o.Inv.Group, o.Inv.Partition}][o.Inv.Lease]; l != nil {
				l.settles = append(l.settles, o)
			}
		}
	}
	for _, ms := range c.moved {
		for _, r := range ms {
			if r.Inv.Kind != "release" || r.Phase() != OK || !r.Done.Released {
				continue
			}
			k := qgp{r.Inv.Queue, r.Inv.Group, r.Inv.Partition}
		lease:
			for id, l := range leases[k] {
				if l.pop.End() >= r.Start() || l.exp <= r.End() {
					continue
				}
				var after *Op
				for _, s := range l.settles {
					switch {
					case s.Start() < r.End():
						// Settled before or during the release: it may have
						// ended (or outlived) the lease the release met.
						continue lease
					case s.Phase() == OK && after == nil:
						after = s
					}
				}
				if after != nil {
					c.where = Violation{Queue: k.queue, Group: k.group, Partition: k.partition}
					c.report("released-settled", fmt.Sprintf("queue %s group %q partition %s: lease %s, live when ReleaseLease ended it, settled offset %d afterwards",
						k.queue, k.group, k.partition, id, after.Inv.Offset), append(append(l.pop.evidence(), r.evidence()...), after.evidence()...)...)
				}
			}
		}
	}
}
