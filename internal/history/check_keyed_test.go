package history

import "testing"

func (h *hb) keyedAck(proc, queue, group string, d Delivery) {
	inv := h.r.Invoke(Event{Proc: proc, Op: OpSettle, Queue: queue, Group: group, Kind: "ack", Partition: d.Partition, Offset: d.Offset,
		Lease: d.Lease, ID: d.ID, Keyed: true, T: h.tick()})
	h.r.Done(inv, OK, Event{T: h.tick()})
}

// A Tx.Ack in a Consume handler with KeyConcurrency > 1 settles its offset
// alone: an earlier offset of the claim may run after it; that offset
// itself must not come again. A plain ack still commits through it.
func TestCheckKeyedAckSettlesAlone(t *testing.T) {
	log := st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false})
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	d1 := Delivery{"p", 1, "id2", "t2", "L1", 1, 1e18}
	push := func(h *hb) {
		h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
	}

	h := newHB()
	push(h)
	h.handler("a", "q", "g", d1, "")
	h.keyedAck("a", "q", "g", d1)
	h.handler("a", "q", "g", d0, "") // another key's, after the ack
	h.pop("b", "q", "g", false, Delivery{"p", 0, "id1", "t1", "L2", 2, 1e18})
	if vs := Check(h.r.Events(), log, 0); len(vs) != 0 {
		t.Errorf("earlier offset after a keyed ack: %v", vs)
	}

	h = newHB()
	push(h)
	h.handler("a", "q", "g", d1, "")
	h.keyedAck("a", "q", "g", d1)
	h.pop("b", "q", "g", false, Delivery{"p", 0, "id1", "t1", "L2", 2, 1e18}, Delivery{"p", 1, "id2", "t2", "L2", 2, 1e18})
	if got := kinds(Check(h.r.Events(), log, 0)); len(got) != 1 || got["acked-redelivered"] != 1 {
		t.Errorf("the keyed-acked offset again: got %v, want one acked-redelivered", got)
	}

	h = newHB()
	push(h)
	h.handler("a", "q", "g", d1, "")
	h.settle("a", "q", "g", "ack", d1, OK)
	h.handler("a", "q", "g", d0, "")
	if got := kinds(Check(h.r.Events(), log, 0)); got["acked-redelivered"] != 1 {
		t.Errorf("earlier offset after a plain ack: got %v, want acked-redelivered", got)
	}
}
