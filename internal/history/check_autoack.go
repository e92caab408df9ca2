package history

import "fmt"

// autoAckHandled: an AutoAck Consume that returned ran a handler for every
// message its logged claims took. The claim consumed them, so stopping
// cannot give them back; a fault nearby only hides claims that were never
// logged (that is what autoAckConsumes excuses), not these.
func (c *checker) autoAckHandled(ops []*Op) {
	type pqg struct{ proc, queue, group string }
	var calls []*Op
	claims := map[pqg][]*Op{}
	handled := map[pqg]map[string]map[int64]int64{} // partition, offset: first start
	for _, o := range ops {
		k := pqg{o.Inv.Proc, o.Inv.Queue, o.Inv.Group}
		switch {
		case c.isCall(o, "consume") && o.Inv.AutoAck && o.Done != nil:
			calls = append(calls, o)
		case o.Inv.Op == OpClaim && o.Inv.Lease == "":
			claims[k] = append(claims[k], o)
		case o.Inv.Op == OpHandler && o.Inv.AutoAck:
			if handled[k] == nil {
				handled[k] = map[string]map[int64]int64{}
			}
			if handled[k][o.Inv.Partition] == nil {
				handled[k][o.Inv.Partition] = map[int64]int64{}
			}
			if t, ok := handled[k][o.Inv.Partition][o.Inv.Offset]; !ok || o.Start() < t {
				handled[k][o.Inv.Partition][o.Inv.Offset] = o.Start()
			}
		}
	}
	for _, call := range calls {
		k := pqg{call.Inv.Proc, call.Inv.Queue, call.Inv.Group}
		for _, l := range claims[k] {
			if l.Start() < call.Start() || l.Start() > call.End() {
				continue
			}
			// A claim's messages lie between its first and last offset
			// (offsets settled above the cursor are skipped): count the
			// handled ones there, and those destroyed since (nobody's).
			n := 0
			for off := l.Inv.Offset; off <= l.Inv.Last; off++ {
				if t, ok := handled[k][l.Inv.Partition][off]; ok && t >= call.Start() && t <= call.End() ||
					c.destroyed[qp{l.Inv.Queue, l.Inv.Partition}][off] {
					n++
				}
			}
			if n < l.Inv.Batch {
				c.where = Violation{Queue: l.Inv.Queue, Group: l.Inv.Group, Partition: l.Inv.Partition}
				c.report("autoack-unhandled", fmt.Sprintf("queue %s group %q partition %s: an AutoAck Consume of %s returned having handled %d of the %d messages its claim of offsets %d..%d took",
					l.Inv.Queue, l.Inv.Group, l.Inv.Partition, call.Inv.Proc, n, l.Inv.Batch, l.Inv.Offset, l.Inv.Last), append(call.evidence(), l.evidence()...)...)
			}
		}
	}
}
