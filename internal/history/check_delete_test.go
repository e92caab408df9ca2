package history

import "testing"

// A Queue.Delete whose caller gave up (Info) may still commit after it
// returned: a push that completed after that return, and before the first
// message of the new queue was seen, may be gone with it.
func TestCheckDeleteOfUnknownOutcomeCommitsLate(t *testing.T) {
	h := newHB()
	h.call("a", "q", "", "delete", false, Info)
	h.push("b", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.push("b", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 0})
	h.pop("c", "q", "g", false, Delivery{"p", 0, "id2", "t2", "L1", 1, 1e18})
	h.settle("c", "q", "g", "ack", Delivery{"p", 0, "id2", "t2", "L1", 1, 1e18}, OK)
	s := stMore(Stored{"q", "p", 0, "id2", "t2", 0, false})
	if vs := Check(h.r.Events(), s, 0); len(vs) > 0 {
		t.Fatalf("want none, got %v", vs)
	}
}

// A Queue.Delete takes effect when it commits, which may be well before it
// returns: a pop that ended before that return, with a message of the new
// queue (at its place in the final log), read the new queue, and the
// group's later pops start past what it acked.
func TestCheckDeleteCommitsBeforeItReturns(t *testing.T) {
	h := newHB()
	push := h.r.Invoke(Event{Proc: "b", Op: OpPush, Queue: "q", Items: []Item{{"p", "t1"}, {"p", "t2"}}, T: 90})
	del := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "delete", Queue: "q", T: 100})
	pop := h.r.Invoke(Event{Proc: "c", Op: OpPop, Queue: "q", Group: "g", T: 150})
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	h.r.Done(pop, OK, Event{Msgs: []Delivery{d0}, T: 160})
	h.r.Done(push, OK, Event{Results: []Result{{"queued", "id1", 0}, {"queued", "id2", 1}}, T: 170})
	ack := h.r.Invoke(Event{Proc: "c", Op: OpSettle, Queue: "q", Group: "g", Kind: "ack", Partition: "p", Offset: 0, Lease: "L1", ID: "id1", T: 180})
	h.r.Done(ack, OK, Event{T: 190})
	h.r.Done(del, OK, Event{T: 300})
	h.t = 300
	h.pop("c", "q", "g", false, Delivery{"p", 1, "id2", "t2", "L2", 1, 1e18})
	s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false})
	if vs := Check(h.r.Events(), s, 0); len(vs) > 0 {
		t.Fatalf("want none, got %v", vs)
	}
}
