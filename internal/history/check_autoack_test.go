package history

import "testing"

// An AutoAck Consume that returned ran a handler for every message its
// logged claims took: the claim consumed them, so one not handled is lost,
// faults nearby or not (they can only hide claims that were never logged).
func TestCheckAutoAckClaimsHandled(t *testing.T) {
	build := func(handled int) *hb {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t0"}, {"p", "t1"}, {"p", "t2"}}, OK,
			Result{"queued", "id0", 0}, Result{"queued", "id1", 1}, Result{"queued", "id2", 2})
		call := h.r.Invoke(Event{Proc: "w", Op: OpCall, Kind: "consume", Queue: "q", Group: "g", AutoAck: true, T: h.tick()})
		h.r.Done(h.r.Invoke(Event{Proc: "w", Op: OpClaim, Queue: "q", Group: "g", Partition: "p", Offset: 0, Last: 2, Batch: 3, T: h.tick()}), OK, Event{T: h.tick()})
		f := h.r.Invoke(Event{Proc: "nemesis", Op: OpFault, Kind: "terminate", T: h.tick()})
		h.r.Done(f, OK, Event{T: h.tick()})
		for i := range handled {
			d := Delivery{"p", int64(i), "id" + string(rune('0'+i)), "t" + string(rune('0'+i)), "", 1, 0}
			inv := h.r.Invoke(Event{Proc: "w", Op: OpHandler, Queue: "q", Group: "g", Partition: "p", Offset: int64(i), Msgs: []Delivery{d}, AutoAck: true, T: h.tick()})
			h.r.Done(inv, OK, Event{T: h.tick()})
		}
		h.r.Done(call, OK, Event{T: h.tick()})
		return h
	}
	s := stMore(Stored{"q", "p", 0, "id0", "t0", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false}, Stored{"q", "p", 2, "id2", "t2", 0, false})
	if got := kinds(Check(build(3).r.Events(), s, 0)); got["autoack-unhandled"] != 0 {
		t.Errorf("every claimed message handled: got %v", got)
	}
	if got := kinds(Check(build(1).r.Events(), s, 0)); got["autoack-unhandled"] != 1 {
		t.Errorf("two claimed messages never handled: got %v, want one autoack-unhandled", got)
	}
}
