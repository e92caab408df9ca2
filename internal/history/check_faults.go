package history

import "fmt"

// rewrittenReads: a stored segment overwritten under its key (a restore, a
// failover, ciphertexts swapped between messages) is read as it is now. A
// delivery that began after a "rewrite" call returned is the message its
// offset holds since (Msgs), and a message whose payload no longer opens
// (Unreadable) is never delivered: it is dead-lettered. Every queue counts,
// audited or not: the rewrites are made on queues of their own.
func (c *checker) rewrittenReads(ops []*Op) {
	type rw struct {
		at  int64 // the rewrite's completion
		d   Delivery
		bad bool
	}
	now := map[qp]map[int64]rw{}
	var rewrites []*Op
	for _, o := range ops {
		if c.isCall(o, "rewrite") && o.Phase() == OK {
			rewrites = append(rewrites, o)
		}
	}
	if len(rewrites) == 0 {
		return
	}
	for _, o := range rewrites {
		add := func(d Delivery, bad bool) {
			k := qp{o.Inv.Queue, d.Partition}
			if now[k] == nil {
				now[k] = map[int64]rw{}
			}
			if prev, ok := now[k][d.Offset]; !ok || prev.at < o.End() {
				now[k][d.Offset] = rw{o.End(), d, bad}
			}
		}
		for _, d := range o.Inv.Msgs {
			add(d, false)
		}
		for _, d := range o.Inv.Unreadable {
			add(d, true)
		}
	}
	for _, o := range ops {
		for _, m := range delivered(o) {
			r, ok := now[qp{o.Inv.Queue, m.Partition}][m.Offset]
			if !ok || o.Start() <= r.at {
				continue
			}
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group, Partition: m.Partition}
			switch {
			case r.bad:
				c.report("rewritten-read", fmt.Sprintf("queue %s: %s@%d (id %s, transaction %q) was delivered although its stored payload cannot be opened since a rewrite",
					o.Inv.Queue, m.Partition, m.Offset, m.ID, m.TxID), o.evidence()...)
			case m.ID != r.d.ID || m.TxID != r.d.TxID:
				c.report("rewritten-read", fmt.Sprintf("queue %s: %s@%d was delivered as id %s (transaction %q); the segment holds id %s (transaction %q) since a rewrite",
					o.Inv.Queue, m.Partition, m.Offset, m.ID, m.TxID, r.d.ID, r.d.TxID), o.evidence()...)
			}
		}
	}
}
