package history

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
)

// autoAckOrder: one AutoAck Consume call hands each partition's messages to
// its handlers in offset order, across its batches too (Consume's promise:
// a partition's messages one at a time in offset order). AutoAck commits
// the cursor at the claim and nothing comes back, so within one call a
// handler never starts on an offset below one already started there.
// Excluded: calls with KeyConcurrency above 1 (Keyed: order only per key),
// calls of one proc, queue and group that overlap (their handlers cannot
// be told apart), and calls overlapping a Delete of their queue (offsets
// start again).
func (c *checker) autoAckOrder(ops []*Op) {
	type pqg struct{ proc, queue, group string }
	calls := map[pqg][]*Op{}
	handlers := map[pqg][]*Op{}
	deletes := map[string][]*Op{}
	for _, o := range ops {
		k := pqg{o.Inv.Proc, o.Inv.Queue, o.Inv.Group}
		switch {
		case c.isCall(o, "consume") && o.Inv.AutoAck:
			calls[k] = append(calls[k], o)
		case c.isCall(o, "delete"):
			deletes[o.Inv.Queue] = append(deletes[o.Inv.Queue], o)
		case o.Inv.Op == OpHandler && o.Inv.AutoAck:
			handlers[k] = append(handlers[k], o)
		}
	}
	overlaps := func(a, b *Op) bool { return a.Start() < b.End() && b.Start() < a.End() }
	for k, cs := range calls {
	call:
		for _, call := range cs {
			if call.Inv.Keyed {
				continue
			}
			for _, o := range cs {
				if o != call && overlaps(o, call) {
					continue call
				}
			}
			for _, d := range deletes[k.queue] {
				if overlaps(d, call) {
					continue call
				}
			}
			// Each partition's handlers in start order: their offsets rise.
			parts := map[string][]*Op{}
			for _, h := range handlers[k] {
				if h.Start() >= call.Start() && h.Start() <= call.End() {
					parts[h.Inv.Partition] = append(parts[h.Inv.Partition], h)
				}
			}
			for _, p := range slices.Sorted(maps.Keys(parts)) {
				hs := parts[p]
				slices.SortStableFunc(hs, func(a, b *Op) int {
					return cmp.Or(cmp.Compare(a.Start(), b.Start()), cmp.Compare(a.Inv.Offset, b.Inv.Offset))
				})
				var top, first, firstTop *Op // the highest offset started so far; the first handler below it
				n := 0
				for _, h := range hs {
					if top != nil && h.Inv.Offset < top.Inv.Offset {
						if n == 0 {
							first, firstTop = h, top
						}
						n++
						continue
					}
					top = h
				}
				if n > 0 {
					c.where = Violation{Queue: k.queue, Group: k.group, Partition: p}
					c.report("autoack-order", fmt.Sprintf("queue %s group %q partition %s: one AutoAck Consume of %s started the handler of offset %d after that of offset %d (%d handlers started below an offset already started)",
						k.queue, k.group, p, k.proc, first.Inv.Offset, firstTop.Inv.Offset, n),
						append(append(call.evidence(), firstTop.evidence()...), first.evidence()...)...)
				}
			}
		}
	}
}
