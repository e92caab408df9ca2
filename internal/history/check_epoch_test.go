package history

import (
	"strings"
	"testing"
)

// A pop that began before Queue.Delete and returned after it may have
// waited into the recreated queue: what it delivered of the new queue
// counts; what it delivered of the old one is gone with it.
func TestCheckPopAcrossDelete(t *testing.T) {
	s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false})
	build := func(got Delivery) *hb {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t0"}}, OK, Result{"queued", "id0", 0})
		old := h.r.Invoke(Event{Proc: "v", Op: OpPop, Queue: "q", Group: "g", T: h.tick()})
		pop := h.r.Invoke(Event{Proc: "w", Op: OpPop, Queue: "q", Group: "g", T: h.tick()})
		h.r.Done(old, OK, Event{Msgs: []Delivery{{"p", 0, "id0", "t0", "L0", 1, 1e18}}, T: h.tick()})
		h.call("a", "q", "", "delete", false, OK)
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		var msgs []Delivery
		if got.ID != "" {
			msgs = []Delivery{got}
		}
		h.r.Done(pop, OK, Event{Msgs: msgs, T: h.tick()})
		if got.ID != "" {
			h.settle("w", "q", "g", "ack", got, OK)
		}
		return h
	}
	d1 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	if vs := Check(build(d1).r.Events(), s, 0); len(vs) != 0 {
		t.Errorf("delivered from the new queue: %v", vs)
	}
	// Still caught: a wrong read of the new queue, and nothing delivered.
	bad := d1
	bad.TxID = "t-other"
	if got := kinds(Check(build(bad).r.Events(), s, 0)); got["inconsistent-read"] != 1 {
		t.Errorf("wrong read: got %v, want inconsistent-read", got)
	}
	if got := kinds(Check(build(Delivery{}).r.Events(), s, 0)); len(got) != 1 || got["never-delivered"] != 1 {
		t.Errorf("nothing delivered: got %v, want one never-delivered", got)
	}
}

// A Consume handler that starts after Queue.Delete on a batch its claim
// took before it runs a message of the deleted queue: the new queue's log
// does not hold it, and that is no wrong read.
func TestCheckHandlerOfBatchClaimedBeforeDelete(t *testing.T) {
	s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false})
	build := func(claimAfter bool, got Delivery) *hb {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t0"}}, OK, Result{"queued", "id0", 0})
		old := Delivery{"p", 0, "id0", "t0", "L0", 1, 1e18}
		claim := func(d Delivery) {
			h.r.Done(h.r.Invoke(Event{Proc: "w", Op: OpClaim, Queue: "q", Group: "g", Partition: "p", Offset: d.Offset, Last: d.Offset, Batch: 1, Lease: d.Lease, T: h.tick()}), OK, Event{T: h.tick()})
		}
		if !claimAfter {
			claim(old)
		}
		h.call("a", "q", "", "delete", false, OK)
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		if claimAfter {
			claim(got)
		} else {
			h.handler("w", "q", "g", old, "")
		}
		h.handler("w", "q", "g", got, "")
		h.settle("w", "q", "g", "ack", got, OK)
		return h
	}
	d1 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	if vs := Check(build(false, d1).r.Events(), s, 0); len(vs) != 0 {
		t.Errorf("a handler of the deleted queue's batch: %v", vs)
	}
	// A handler of the new queue's message counts: without it the message
	// was never delivered.
	if vs := Check(build(true, d1).r.Events(), s, 0); len(vs) != 0 {
		t.Errorf("a handler of the new queue's batch: %v", vs)
	}
	h := build(true, d1)
	var evs []Event
	for _, e := range h.r.Events() {
		if e.Op != OpHandler && e.Op != OpSettle {
			evs = append(evs, e)
		}
	}
	if got := kinds(Check(evs, s, 0)); got["never-delivered"] != 1 {
		t.Errorf("no handler: got %v, want never-delivered", got)
	}
}

// A Queue.Delete of unknown outcome that the final log shows did not
// happen (a message read before it began is still stored) cuts nothing:
// the reads before it count. One that may have happened still cuts.
func TestCheckDeleteOfUnknownOutcome(t *testing.T) {
	build := func() *hb {
		h := newHB()
		h.call("a", "q", "", "delete", false, OK)
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		d := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
		h.pop("w", "q", "g", false, d)
		h.settle("w", "q", "g", "ack", d, OK)
		inv := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "delete", Queue: "q", T: h.tick()})
		h.r.Done(inv, Info, Event{Err: "failed to connect", T: h.tick()})
		return h
	}
	s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false})
	if vs := Check(build().r.Events(), s, 0); len(vs) != 0 {
		t.Errorf("a Delete that did not happen: %v", vs)
	}
	// It happened: the message is gone, which is no loss.
	if vs := Check(build().r.Events(), stMore(), 0); len(vs) != 0 {
		t.Errorf("a Delete of unknown outcome that happened: %v", vs)
	}
}

// A Queue.Delete whose process died before it returned took effect, if at
// all, before the new queue's first message was stored: what read the new
// queue after that counts.
func TestCheckDeleteNeverReturned(t *testing.T) {
	build := func() *hb {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t0"}}, OK, Result{"queued", "id0", 0})
		h.r.Invoke(Event{Proc: "dead", Op: OpCall, Kind: "delete", Queue: "q", T: h.tick()})
		h.push("a", "q", []Item{{"p2", "t1"}}, OK, Result{"queued", "id1", 0})
		d := Delivery{"p2", 0, "id1", "t1", "L1", 1, 1e18}
		h.pop("w", "q", "g", false, d)
		h.settle("w", "q", "g", "ack", d, OK)
		return h
	}
	s1 := Stored{"q", "p2", 0, "id1", "t1", 0, false}
	if vs := Check(build().r.Events(), stMore(s1), 0); len(vs) != 0 {
		t.Errorf("a Delete that happened: %v", vs)
	}
	// It did not happen: the first message is still there, and owed.
	got := kinds(Check(build().r.Events(), stMore(Stored{"q", "p", 0, "id0", "t0", 0, false}, s1), 0))
	if len(got) != 1 || got["never-delivered"] != 1 {
		t.Errorf("a Delete that did not happen: got %v, want never-delivered of the first message", got)
	}
}

// A push that began before Queue.Delete is of unknown outcome in the new
// queue, but an item it reported Buffered may still be stored twice there
// (its flush committed unseen, then its replay), as on a queue without a
// dedup window it may anywhere.
func TestCheckBufferedPushAcrossDelete(t *testing.T) {
	h := newHB()
	push := h.r.Invoke(Event{Proc: "a", Op: OpPush, Queue: "q", Items: []Item{{"p", "t1"}}, T: h.tick()})
	h.call("b", "q", "", "delete", false, OK)
	h.r.Done(push, OK, Event{Results: []Result{{"buffered", "id1", -1}}, T: h.tick()})
	d0, d1 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}, Delivery{"p", 1, "id1", "t1", "L1", 1, 1e18}
	h.pop("w", "q", "g", false, d0, d1)
	h.settle("w", "q", "g", "ack", d1, OK)
	s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false})
	s.Queues["q"] = QueueInfo{Groups: []string{"g"}}
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Errorf("want no violation, got %v", vs)
	}
}

// A claim is logged after it returned, so one logged after Queue.Delete
// returned may have taken its batch from the deleted queue: its handler
// runs a message the new queue's log does not hold, and that is no wrong
// read either.
func TestCheckHandlerOfClaimLoggedAfterDelete(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t0"}}, OK, Result{"queued", "id0", 0})
	h.call("b", "q", "", "delete", false, OK)
	old := Delivery{"p", 0, "id0", "t0", "L0", 1, 1e18}
	h.r.Done(h.r.Invoke(Event{Proc: "w", Op: OpClaim, Queue: "q", Group: "g", Partition: "p", Offset: 0, Last: 0, Batch: 1, Lease: "L0", T: h.tick()}), OK, Event{T: h.tick()})
	h.handler("w", "q", "g", old, "")
	if vs := Check(h.r.Events(), stMore(), 0); len(vs) != 0 {
		t.Errorf("want no violation, got %v", vs)
	}
}

// A SubscribeNew group's first contact with a queue deleted and recreated
// is its first pop that ran on the new queue: one that began before the
// queue surely existed again (during the Delete, or between it and the
// recreation) may have subscribed to the deleted queue or found none, and
// returned empty either way. A message pushed before the real first
// contact is not owed; one pushed after it is.
func TestCheckLateGroupAcrossDelete(t *testing.T) {
	for _, during := range []bool{true, false} {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t0"}}, OK, Result{"queued", "id0", 0})
		del := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "delete", Queue: "q", T: h.tick()})
		var early Event
		if during {
			early = h.r.Invoke(Event{Proc: "w", Op: OpPop, Queue: "q", Group: "late", T: h.tick()})
		}
		h.r.Done(del, OK, Event{T: h.tick()})
		if !during {
			early = h.r.Invoke(Event{Proc: "w", Op: OpPop, Queue: "q", Group: "late", T: h.tick()})
		}
		h.r.Done(early, OK, Event{T: h.tick()})
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		h.pop("w", "q", "late", true) // the first contact with the new queue
		h.push("a", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 1})
		h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0}, Delivery{"p", 1, "id2", "t2", "", 1, 0})
		s := st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false})
		s.Queues["q"] = QueueInfo{Groups: []string{"g"}, LateGroups: []string{"late"}}
		vs := Check(h.r.Events(), s, 0)
		if len(vs) != 1 || vs[0].Kind != "never-delivered" || vs[0].Group != "late" || !strings.Contains(vs[0].Detail, "id2") {
			t.Errorf("early pop during the Delete %v: want id2 (not id1) owed to the late group: %v", during, vs)
		}
	}
}

// A Queue.Delete that never returned, whose new queue's message is first
// known by the pop that delivers it (its push's completion was never
// recorded: the process died with its history unwritten): the Delete took
// effect before that pop read it, so the delivery counts.
func TestCheckDeleteNeverReturnedMessageKnownByItsPop(t *testing.T) {
	h := newHB()
	h.r.Invoke(Event{Proc: "dead", Op: OpCall, Kind: "delete", Queue: "q", T: h.tick()})
	h.pushOpen("dead", "q", []Item{{"p", "t1"}})
	d := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	h.pop("w", "q", "g", false, d)
	h.settle("w", "q", "g", "ack", d, OK)
	s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false})
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Errorf("delivered by the pop that first saw it: %v", vs)
	}
}
