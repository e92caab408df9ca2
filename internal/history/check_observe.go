package history

import (
	"fmt"
	"strings"
)

// Checks of what a client reports beside the log: its metrics, its log's
// warnings, and where a SubscribeFrom group starts.

// observe runs the checks of this file.
func (c *checker) observe(ops []*Op) {
	c.metricCounts(ops)
	c.falseWarnings(ops)
	c.fromEdges(ops)
}

type pqg struct{ proc, queue, group string }

// selfSettled: per handler, whether the handler settled its own message
// (a settle of its proc, message and lease that began while it ran), and
// that settle.
func selfSettled(ops []*Op) map[*Op]*Op {
	type key struct {
		proc, queue, partition, lease string
		offset                        int64
	}
	settles := map[key][]*Op{}
	for _, o := range ops {
		if o.Inv.Op == OpSettle {
			k := key{o.Inv.Proc, o.Inv.Queue, o.Inv.Partition, o.Inv.Lease, o.Inv.Offset}
			settles[k] = append(settles[k], o)
		}
	}
	out := map[*Op]*Op{}
	for _, o := range ops {
		if o.Inv.Op != OpHandler {
			continue
		}
		for _, s := range settles[key{o.Inv.Proc, o.Inv.Queue, o.Inv.Partition, o.Inv.Lease, o.Inv.Offset}] {
			if s.Start() >= o.Start() && s.Start() <= o.End() {
				out[o] = s
				break
			}
		}
	}
	return out
}

// metricCounts: a client's queen.client.settled.messages and
// messaging.client.consumed.messages agree with its history, per queue and
// group. Each ack it made counts once when the database applied it: at
// least its acks that succeeded, at most those plus the ones of unknown
// outcome plus one per Consume handler that returned nil without surely
// acking its message itself (Consume acks those; a message the handler
// acked in Client.Tx was counted then). receive is exactly the messages its
// pops returned (at most those of unknown outcome more), process exactly
// its handler calls.
func (c *checker) metricCounts(ops []*Op) {
	type tally struct {
		ackOK, ackUnk, handlerNil, handlers, recv, popUnk int64
	}
	own := selfSettled(ops)
	tallies := map[pqg]*tally{}
	at := func(proc, q, g string) *tally {
		k := pqg{proc, q, g}
		if tallies[k] == nil {
			tallies[k] = &tally{}
		}
		return tallies[k]
	}
	for _, o := range ops {
		switch o.Inv.Op {
		case OpSettle:
			if o.Inv.Kind != "ack" {
				continue
			}
			t := at(o.Inv.Proc, o.Inv.Queue, o.Inv.Group)
			switch o.Phase() {
			case OK:
				t.ackOK++
			case Info:
				t.ackUnk++
			}
		case OpHandler:
			t := at(o.Inv.Proc, o.Inv.Queue, o.Inv.Group)
			t.handlers++
			// A handler's own ack that did not surely apply leaves its
			// message to Consume's settlement.
			if s := own[o]; !o.Inv.AutoAck && (o.Done == nil || o.Done.Err == "") && (s == nil || s.Phase() != OK) {
				t.handlerNil++
			}
		case OpPop:
			t := at(o.Inv.Proc, o.Inv.Queue, o.Inv.Group)
			switch o.Phase() {
			case OK:
				t.recv += int64(len(o.Done.Msgs))
			case Info:
				t.popUnk++
			}
		}
	}
	for _, o := range ops {
		if !c.isCall(o, "metrics") {
			continue
		}
		mine := at(o.Inv.Proc, o.Inv.Queue, o.Inv.Group)
		var shared tally
		for _, p := range o.Inv.Procs {
			t := at(p, o.Inv.Queue, o.Inv.Group)
			shared.ackOK += t.ackOK
			shared.ackUnk += t.ackUnk
			shared.recv += t.recv
			shared.popUnk += t.popUnk
		}
		n := o.Inv.Counts
		bad := func(what string, got, lo, hi int64) {
			c.where = Violation{Queue: o.Inv.Queue, Group: o.Inv.Group}
			want := fmt.Sprintf("%d..%d", lo, hi)
			if hi < 0 {
				want = fmt.Sprintf("at least %d", lo)
			}
			c.report("metrics-count", fmt.Sprintf("client %s queue %s group %q: %s counted %d, its history allows %s "+
				"(acks: %d applied, %d unknown, %d of other procs; %d handlers returned nil without acking; pops: %d messages, %d unknown; %d handler calls)",
				o.Inv.Proc, o.Inv.Queue, o.Inv.Group, what, got, want, mine.ackOK, mine.ackUnk, shared.ackOK+shared.ackUnk, mine.handlerNil,
				mine.recv, mine.popUnk, mine.handlers), o.evidence()...)
		}
		lo := mine.ackOK
		hi := mine.ackOK + mine.ackUnk + shared.ackOK + shared.ackUnk + mine.handlerNil
		if a := n["ack"]; a < lo || a > hi {
			bad("queen.client.settled.messages ack", a, lo, hi)
		}
		lo, hi = mine.recv, mine.recv+shared.recv
		if mine.popUnk+shared.popUnk > 0 {
			hi = -1 // a pop that failed after its messages were counted
		}
		if r := n["receive"]; r < lo || hi >= 0 && r > hi {
			bad("messaging.client.consumed.messages receive", r, lo, hi)
		}
		if p := n["process"]; p != mine.handlers {
			bad("messaging.client.consumed.messages process", p, mine.handlers, mine.handlers)
		}
	}
}

// falseWarnings: Consume logs a settle failure of a batch only if one
// happened. When the last message it handled was acked by its handler
// itself (in Client.Tx) and the batch's settlement then finds the cursor
// already past it, nothing failed: that warning is a false alarm.
func (c *checker) falseWarnings(ops []*Op) {
	own := selfSettled(ops)
	type pqp struct{ proc, queue, partition string }
	handlers := map[pqp][]*Op{}
	for _, o := range ops {
		if o.Inv.Op == OpHandler && o.Done != nil {
			k := pqp{o.Inv.Proc, o.Inv.Queue, o.Inv.Partition}
			handlers[k] = append(handlers[k], o)
		}
	}
	for _, w := range ops {
		if !c.isCall(w, "settle-log") || w.Done == nil || !strings.Contains(w.Done.Err, "already acked") {
			continue
		}
		// The batch it is about: the last handler of its client on its
		// partition to end before it, with no other lease's handler
		// running since that batch's last one began.
		var last *Op
		for _, h := range handlers[pqp{w.Inv.Proc, w.Inv.Queue, w.Inv.Partition}] {
			if h.End() <= w.Start() && (last == nil || h.End() > last.End()) {
				last = h
			}
		}
		if last == nil || last.Done.Err != "" {
			continue
		}
		s := own[last]
		if s == nil || s.Inv.Kind != "ack" || s.Inv.Keyed || s.Phase() != OK {
			continue
		}
		alone := true
		for _, h := range handlers[pqp{w.Inv.Proc, w.Inv.Queue, w.Inv.Partition}] {
			if h.Inv.Lease != last.Inv.Lease && h.End() > last.Start() && h.Start() < w.Start() {
				alone = false
			}
		}
		if !alone {
			continue
		}
		c.where = Violation{Queue: w.Inv.Queue, Group: last.Inv.Group, Partition: w.Inv.Partition}
		c.report("false-warning", fmt.Sprintf("queue %s: Consume logged a settle failure (%s) for a batch whose last message, %s@%d, its handler had acked itself",
			w.Inv.Queue, w.Done.Err, w.Inv.Partition, last.Inv.Offset), append(append(last.evidence(), s.evidence()...), w.evidence()...)...)
	}
}

// fromEdges: a group subscribed from time t starts at the first message
// stored at or after t. A "from-edge" call began at t and ended before the
// commit of a PushTx of its queue and partition began: every other push
// stored above that PushTx's items waited for the row it held, so it was
// stored after t and is the group's (judged once a "from-drained" call
// says the group was read to its end).
func (c *checker) fromEdges(ops []*Op) {
	drained := map[string]bool{}
	for _, o := range ops {
		if c.isCall(o, "from-drained") && o.Phase() == OK {
			drained[o.Inv.Queue+"\x00"+o.Inv.Group] = true
		}
	}
	for _, e := range ops {
		if !c.isCall(e, "from-edge") || e.Phase() != OK || !drained[e.Inv.Queue+"\x00"+e.Inv.Group] {
			continue
		}
		q, p, g := e.Inv.Queue, e.Inv.Partition, e.Inv.Group
		held := map[string]bool{}
		for _, o := range ops {
			if o.Inv.Op == OpPush && o.Inv.Kind == "pushtx" && o.Inv.Queue == q && o.Phase() == OK && !o.Inv.Rollback &&
				o.Start() < e.Start() && o.End() > e.End() {
				for _, it := range o.Inv.Items {
					if it.Partition == p {
						held[it.TxID] = true
					}
				}
			}
		}
		boundary := int64(-1)
		for _, s := range c.st.Log {
			if s.Queue == q && s.Partition == p && held[s.TxID] && s.Failures == 0 {
				boundary = max(boundary, s.Offset)
			}
		}
		if boundary < 0 {
			continue
		}
		got := map[string]bool{}
		for _, o := range ops {
			if o.Inv.Queue == q && o.Inv.Group == g {
				for _, m := range delivered(o) {
					got[m.ID] = true
				}
			}
		}
		for _, s := range c.st.Log {
			if s.Queue != q || s.Partition != p || s.Offset <= boundary || s.Failures != 0 || got[s.ID] {
				continue
			}
			c.where = Violation{Queue: q, Group: g, Partition: p}
			c.report("from-boundary", fmt.Sprintf("queue %s group %q: %s@%d (tx %q), stored after a PushTx whose commit began after the group's from time, was never delivered to it",
				q, g, p, s.Offset, s.TxID), e.evidence()...)
		}
	}
}
