package history

import "testing"

func (h *hb) call(proc, queue, group, kind string, invalid bool, phase string, msgs ...Delivery) {
	inv := h.r.Invoke(Event{Proc: proc, Op: OpCall, Kind: kind, Queue: queue, Group: group, Invalid: invalid, Msgs: msgs, T: h.tick()})
	h.r.Done(inv, phase, Event{T: h.tick()})
}

func (h *hb) handler(proc, queue, group string, d Delivery, err string) {
	inv := h.r.Invoke(Event{Proc: proc, Op: OpHandler, Queue: queue, Group: group, Partition: d.Partition, Offset: d.Offset, Lease: d.Lease, Msgs: []Delivery{d}, T: h.tick()})
	h.r.Done(inv, OK, Event{Err: err, T: h.tick()})
}

func stMore(log ...Stored) State {
	s := st(log...)
	s.Queues["q"] = QueueInfo{Deduped: true, Groups: []string{"g"}, DeadLetter: true, Encrypted: true}
	return s
}

// Each case has exactly one broken promise of the calls beyond push, pop
// and settle; the checker must name it and nothing else.
func TestCheckFindsEachCallViolation(t *testing.T) {
	s0 := Stored{"q", "p", 0, "id1", "t1", 0, false}
	s1 := Stored{"q", "p", 1, "id2", "t2", 0, false}
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	d1 := Delivery{"p", 1, "id2", "t2", "L1", 1, 1e18}
	pushed := func(h *hb) {
		h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
	}
	cases := []struct {
		name  string
		build func(h *hb) State
	}{
		{"failed-not-redelivered", func(h *hb) State {
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.handler("a", "q", "g", d0, "boom")
			h.settle("a", "q", "g", "ack", d1, OK) // commits past the failed one
			return stMore(s0, s1)
		}},
		{"paused-delivered", func(h *hb) State {
			pushed(h)
			h.call("a", "q", "g", "pause", false, OK)
			h.pop("b", "q", "g", false, d0, d1)
			h.settle("b", "q", "g", "ack", d1, OK)
			h.call("a", "q", "g", "resume", false, OK)
			return stMore(s0, s1)
		}},
		{"invalid-accepted", func(h *hb) State {
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			h.call("a", "q", "bad\x00", "deadletters", true, OK)
			return stMore(s0, s1)
		}},
		{"wrong-key-consumed", func(h *hb) State {
			pushed(h)
			inv := h.r.Invoke(Event{Proc: "w", Op: OpPop, Queue: "q", Group: "g", WrongKey: true, T: h.tick()})
			h.r.Done(inv, OK, Event{Msgs: []Delivery{d0, d1}, T: h.tick()})
			h.settle("w", "q", "g", "ack", d1, OK)
			return stMore(s0, s1)
		}},
		{"deleted-survived", func(h *hb) State {
			pushed(h)
			h.call("a", "q", "", "delete", false, OK)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			return stMore(s0, s1)
		}},
		{"requeue-lost", func(h *hb) State {
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "dead", d0, OK)
			h.settle("a", "q", "g", "ack", d1, OK)
			h.call("a", "q", "g", "requeue", false, OK, d0)
			// The copy is stored but never reaches the group.
			return stMore(s0, s1, Stored{"q", "p", 2, "id1", "t1", 0, false})
		}},
		{"requeue-unbounded", func(h *hb) State {
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "dead", d0, OK)
			h.settle("a", "q", "g", "dead", d1, OK)
			inv := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "requeue", Queue: "q", Group: "g", Msgs: []Delivery{d0}, Kept: []Delivery{d1}, T: h.tick()})
			h.r.Done(inv, OK, Event{T: h.tick()})
			// id2 lay above the call's MaxID, yet it was requeued too.
			c0 := Delivery{"p", 2, "id1", "t1", "L2", 1, 1e18}
			c1 := Delivery{"p", 3, "id2", "t2", "L2", 1, 1e18}
			h.pop("a", "q", "g", false, c0, c1)
			h.settle("a", "q", "g", "ack", c1, OK)
			return stMore(s0, s1, Stored{"q", "p", 2, "id1", "t1", 0, false}, Stored{"q", "p", 3, "id2", "t2", 0, false})
		}},
		{"raw-error", func(h *hb) State {
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			inv := h.r.Invoke(Event{Proc: "a", Op: OpPush, Kind: "pushtx", Queue: "q", Items: []Item{{"p", "t9"}}, T: h.tick()})
			h.r.Done(inv, Fail, Event{Err: `queen: push: ERROR: insert or update on table "partitions" violates foreign key constraint "partitions_queue_id_fkey" (SQLSTATE 23503)`, T: h.tick()})
			return stMore(s0, s1)
		}},
		{"raw-error", func(h *hb) State {
			// Push reports a failed item in its result, not as its error.
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			inv := h.r.Invoke(Event{Proc: "a", Op: OpPush, Queue: "q", Items: []Item{{"p", "t9"}}, T: h.tick()})
			h.r.Done(inv, OK, Event{Results: []Result{{Status: "failed", Offset: -1}}, T: h.tick(),
				ItemErr: `queen: push: ERROR: insert or update on table "partitions" violates foreign key constraint "partitions_queue_id_fkey" (SQLSTATE 23503)`})
			return stMore(s0, s1)
		}},
		{"deadlock", func(h *hb) State {
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			inv := h.r.Invoke(Event{Proc: "a", Op: OpPush, Kind: "pushtx", Queue: "q", Items: []Item{{"p", "t9"}}, T: h.tick()})
			h.r.Done(inv, Fail, Event{Err: "queen: push: ERROR: deadlock detected (SQLSTATE 40P01)", T: h.tick()})
			return stMore(s0, s1)
		}},
		{"orphan-rows", func(h *hb) State {
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			s := stMore(s0, s1)
			s.Orphans = []Orphan{{"segments", 42, 1}}
			return s
		}},
		{"corrupt-payload", func(h *hb) State {
			pushed(h)
			inv := h.r.Invoke(Event{Proc: "a", Op: OpPop, Queue: "q", Group: "g", T: h.tick()})
			h.r.Done(inv, OK, Event{Msgs: []Delivery{d0, d1}, BadData: []Delivery{d1}, T: h.tick()})
			h.settle("a", "q", "g", "ack", d1, OK)
			return stMore(s0, s1)
		}},
		{"status-lag", func(h *hb) State {
			pushed(h)
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			// One offset settled above the cursor is still counted as lag.
			inv := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "status", Queue: "q", Group: "g", Partition: "p",
				Lag: &LagRead{LastOffset: 5, LogStart: 0, Committed: 1, Settled: 1, Lag: 4}, T: h.tick()})
			h.r.Done(inv, OK, Event{T: h.tick()})
			return stMore(s0, s1)
		}},
		{"wrong-duplicate", func(h *hb) State {
			pushed(h)
			h.push("a", "q", []Item{{"p", "t3"}}, OK, Result{"duplicate", "id9", -1})
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			return stMore(s0, s1)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			state := tc.build(h)
			got := Counts(Check(h.r.Events(), state, 0))
			if got[tc.name] == 0 || len(got) != 1 {
				t.Errorf("want only %s, got %v", tc.name, got)
			}
		})
	}
}

// The same calls, used as documented, break nothing.
func TestCheckCallsClean(t *testing.T) {
	h := newHB()
	s0 := Stored{"q", "p", 0, "id1", "t1", 0, false}
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.call("a", "q", "g", "pause", false, OK)
	h.pop("b", "q", "g", false)
	h.call("a", "q", "g", "resume", false, OK)
	h.pop("a", "q", "g", false, d0)
	h.handler("a", "q", "g", d0, "boom")
	h.settle("a", "q", "g", "dead", d0, OK)
	h.call("a", "q", "g", "requeue", false, OK, d0)
	d2 := Delivery{"p", 1, "id1", "t1", "L2", 1, 1e18}
	h.pop("a", "q", "g", false, d2)
	h.settle("a", "q", "g", "ack", d2, OK)
	h.call("a", "q", "bad\x00", "pop", true, Fail)
	vs := Check(h.r.Events(), stMore(s0, Stored{"q", "p", 1, "id1", "t1", 0, false}), 0)
	for _, v := range vs {
		t.Error(v)
	}
}

// A requeued copy that retention deleted (a delivery stands in for it, as
// for its original) is a copy, not a second push of its transaction; a
// second push stored within the window still is.
func TestCheckRequeueCopyRetained(t *testing.T) {
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	d1 := Delivery{"p", 1, "id1", "t1", "L2", 1, 1e18}
	d2 := Delivery{"p", 2, "id2", "t1", "L3", 1, 1e18}
	for _, qi := range []QueueInfo{
		{Deduped: true, Groups: []string{"g"}, DeadLetter: true, Retained: true, LogStart: map[string]int64{"p": 3}},
		{Deduped: true, Groups: []string{"g"}, DeadLetter: true, Completed: true},
	} {
		build := func(again bool) []Event {
			h := newHB()
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			h.pop("a", "q", "g", false, d0)
			h.settle("a", "q", "g", "dead", d0, OK)
			h.call("a", "q", "g", "requeue", false, OK, d0)
			if again {
				h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id2", 2})
			}
			h.pop("a", "q", "g", false, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			if again {
				h.pop("a", "q", "g", false, d2)
				h.settle("a", "q", "g", "ack", d2, OK)
			}
			return h.r.Events()
		}
		s := State{Queues: map[string]QueueInfo{"q": qi}}
		// Every row is gone; the deliveries stand in for them.
		for _, v := range Check(build(false), s, 0) {
			t.Errorf("retained %v: %v", qi.Retained, v)
		}
		if got := kinds(Check(build(true), s, 0)); got["duplicated"] != 1 || len(got) != 1 {
			t.Errorf("retained %v, pushed again: got %v, want only duplicated", qi.Retained, got)
		}
		// Only the original's row is gone.
		s.Log = []Stored{{"q", "p", 1, "id1", "t1", 0, false}}
		for _, v := range Check(build(false), s, 0) {
			t.Errorf("retained %v, the copy kept: %v", qi.Retained, v)
		}
	}
}

// A pause whose process was killed before its Resume lasts until another
// process resumes the group (the heal before the final drain): pops after
// that Resume may deliver, a pop before it may not.
func TestCheckPauseResumedByOther(t *testing.T) {
	s0 := Stored{"q", "p", 0, "id1", "t1", 0, false}
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	for _, early := range []bool{false, true} {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		h.call("child", "q", "g", "pause", false, OK) // killed before its Resume
		if early {
			h.pop("b", "q", "g", false, d0)
		}
		h.call("heal", "q", "g", "resume", false, OK)
		if !early {
			h.pop("final", "q", "g", false, d0)
		}
		h.settle("final", "q", "g", "ack", d0, OK)
		got := Counts(Check(h.r.Events(), stMore(s0), 0))
		want := map[string]int{}
		if early {
			want["paused-delivered"] = 1
		}
		if len(got) != len(want) || got["paused-delivered"] != want["paused-delivered"] {
			t.Errorf("early=%v: got %v, want %v", early, got, want)
		}
	}
}

// A dead letter of a destroyed message holds nothing of it (nil id, no
// transaction id); its requeued copies are copies, not phantom pushes,
// although no row of that id is left to be their original. The same row
// without such a requeue still is a phantom.
func TestCheckRequeuedCopyOfDestroyed(t *testing.T) {
	const nilID = "00000000-0000-0000-0000-000000000000"
	for _, requeued := range []bool{true, false} {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		if requeued {
			h.call("a", "q", "g", "requeue", false, OK, Delivery{"p", 0, nilID, "", "", 0, 0})
		}
		d1 := Delivery{"p", 1, nilID, "", "L1", 1, 1e18}
		h.pop("a", "q", "g", false, d1)
		h.settle("a", "q", "g", "ack", d1, OK)
		s := stMore(Stored{"q", "p", 1, nilID, "", 0, false})
		s.Destroyed = []Stored{{"q", "p", 0, "id1", "t1", 0, false}}
		got := kinds(Check(h.r.Events(), s, 0))
		if requeued && len(got) != 0 {
			t.Errorf("requeued: want no violation, got %v", got)
		}
		if !requeued && (got["phantom"] != 1 || len(got) != 1) {
			t.Errorf("not requeued: want only phantom, got %v", got)
		}
	}
}

// A dead letter made before its message's segment was destroyed holds its
// id: requeued, its copy is a copy of that id, and the oldest row of the
// id (the original, still stored below the destroyed one, here a skip
// policy's re-enqueued copy) stays the push.
func TestCheckRequeuedDeadLetterOfLaterDestroyed(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.call("a", "q", "g", "requeue", false, OK, Delivery{"p", 1, "id1", "t1", "", 0, 0})
	d0, d2 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}, Delivery{"p", 2, "id1", "t1", "L1", 1, 1e18}
	h.pop("a", "q", "g", false, d0, d2)
	h.settle("a", "q", "g", "ack", d2, OK)
	s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 2, "id1", "t1", 0, false})
	s.Destroyed = []Stored{{"q", "p", 1, "id1", "t1", 1, false}}
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Errorf("want no violation, got %v", vs)
	}
}

// A message failed on a skip-policy queue is redelivered as its copy at
// the tail; when the nemesis destroyed that copy, the copy is dead-lettered
// without its id, which is no lost redelivery. A copy left alone still
// must come again.
func TestCheckFailedWhoseCopyWasDestroyed(t *testing.T) {
	for _, destroyed := range []bool{true, false} {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		h.handler("w", "q", "g", Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}, "failed on purpose")
		s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false})
		copy1 := Stored{"q", "p", 1, "id1", "t1", 1, false}
		if destroyed {
			s.Destroyed = []Stored{copy1}
			s.DeadLetters = []DeadStored{{"q", "g", "p", 1, zeroUUID, "", "undecodable"}}
		} else {
			s.Log = append(s.Log, copy1)
		}
		got := kinds(Check(h.r.Events(), s, 0))
		if destroyed && len(got) != 0 {
			t.Errorf("copy destroyed: want no violation, got %v", got)
		}
		if !destroyed && (got["failed-not-redelivered"] != 1 || len(got) != 1) {
			t.Errorf("copy stored, never delivered: want only failed-not-redelivered, got %v", got)
		}
	}
}

// A dead letter above a requeue's MaxID that stays a dead letter, or that
// another call requeued, is as promised.
func TestCheckRequeueBoundedClean(t *testing.T) {
	h := newHB()
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	d1 := Delivery{"p", 1, "id2", "t2", "L1", 1, 1e18}
	h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
	h.pop("a", "q", "g", false, d0, d1)
	h.settle("a", "q", "g", "dead", d0, OK)
	h.settle("a", "q", "g", "dead", d1, OK)
	inv := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "requeue", Queue: "q", Group: "g", Msgs: []Delivery{d0}, Kept: []Delivery{d1}, T: h.tick()})
	h.r.Done(inv, OK, Event{T: h.tick()})
	c0 := Delivery{"p", 2, "id1", "t1", "L2", 1, 1e18}
	h.pop("a", "q", "g", false, c0)
	h.settle("a", "q", "g", "ack", c0, OK)
	s := stMore(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false}, Stored{"q", "p", 2, "id1", "t1", 0, false})
	s.DeadLetters = []DeadStored{{"q", "g", "p", 1, "id2", "t2", "history: dead"}}
	for _, v := range Check(h.r.Events(), s, 0) {
		t.Error(v)
	}
}

// A push's deadlock is excused when its client logged that it could not
// mark a queue keyed ahead (the push then marks it, as before the fix).
func TestCheckDeadlockAfterMarkFailed(t *testing.T) {
	h := newHB()
	inv := h.r.Invoke(Event{Proc: "a", Op: OpPush, Kind: "pushtx", Queue: "q", Items: []Item{{"p", "t9"}}, T: h.tick()})
	m := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "mark-failed", T: h.tick()})
	h.r.Done(m, OK, Event{Err: "timeout", T: h.tick()})
	h.r.Done(inv, Fail, Event{Err: "queen: push: ERROR: deadlock detected (SQLSTATE 40P01)", T: h.tick()})
	for _, v := range Check(h.r.Events(), stMore(), 0) {
		t.Error(v)
	}
}

// Status lag as documented: retained messages after the cursor less the
// settled ones; past a retention cut, settled offsets below it may linger.
func TestCheckStatusLag(t *testing.T) {
	for _, tc := range []struct {
		l  LagRead
		ok bool
	}{
		{LagRead{LastOffset: 5, LogStart: 0, Committed: 1, Settled: 1, Lag: 3}, true},
		{LagRead{LastOffset: 5, LogStart: 0, Committed: 1, Settled: 1, Lag: 4}, false},
		{LagRead{LastOffset: -1, LogStart: 0, Committed: -1, Lag: 0}, true},
		// Retention took 0..3 unread: lag is 4..5, not 5 (5 - 0).
		{LagRead{LastOffset: 5, LogStart: 4, Committed: 0, Lag: 2}, true},
		{LagRead{LastOffset: 5, LogStart: 4, Committed: 0, Lag: 5}, false},
		{LagRead{LastOffset: 5, LogStart: 4, Committed: 0, Settled: 2, Lag: 1}, true},
		{LagRead{LastOffset: 5, LogStart: 4, Committed: 0, Settled: 2, Lag: 2}, true},
	} {
		h := newHB()
		l := tc.l
		inv := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "status", Queue: "q", Group: "g", Partition: "p", Lag: &l, T: h.tick()})
		h.r.Done(inv, OK, Event{T: h.tick()})
		got := Counts(Check(h.r.Events(), stMore(), 0))["status-lag"]
		if (got == 0) != tc.ok {
			t.Errorf("%+v: %d status-lag violations, want ok=%v", tc.l, got, tc.ok)
		}
	}
}

// An AutoAck Consume: what its logged claims took is consumed, so a message
// claimed and never handed to a handler is never delivered, unless the
// call may have made claims nobody saw (a fault near it): that excuses
// never-delivered, not autoack-unhandled. A handler's
// error is only logged (nothing to redeliver), and a pop after the claim
// starts past it.
func TestCheckAutoAckConsume(t *testing.T) {
	d := func(o int64, id, tx string) Delivery { return Delivery{"p", o, id, tx, "", 1, 0} }
	build := func(fault, handleAll bool) (*hb, State) {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}, {"p", "t3"}}, OK,
			Result{"queued", "id1", 0}, Result{"queued", "id2", 1}, Result{"queued", "id3", 2})
		call := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "consume", Queue: "q", Group: "g", AutoAck: true, T: h.tick()})
		if fault {
			f := h.r.Invoke(Event{Proc: "nemesis", Op: OpFault, Kind: "terminate", T: h.tick()})
			h.r.Done(f, OK, Event{T: h.tick()})
		}
		cl := h.r.Invoke(Event{Proc: "a", Op: OpClaim, Queue: "q", Group: "g", Partition: "p", Offset: 0, Last: 1, Batch: 2, T: h.tick()})
		h.r.Done(cl, OK, Event{T: h.tick()})
		// Another consumer's pop, after the claim: starts past it.
		h.pop("b", "q", "g", true, d(2, "id3", "t3"))
		hd := h.r.Invoke(Event{Proc: "a", Op: OpHandler, Queue: "q", Group: "g", Partition: "p", Offset: 0, AutoAck: true, Msgs: []Delivery{d(0, "id1", "t1")}, T: h.tick()})
		h.r.Done(hd, OK, Event{Err: "boom", T: h.tick()})
		if handleAll {
			hd := h.r.Invoke(Event{Proc: "a", Op: OpHandler, Queue: "q", Group: "g", Partition: "p", Offset: 1, AutoAck: true, Msgs: []Delivery{d(1, "id2", "t2")}, T: h.tick()})
			h.r.Done(hd, OK, Event{T: h.tick()})
		}
		h.r.Done(call, OK, Event{T: h.tick()})
		return h, stMore(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false}, Stored{"q", "p", 2, "id3", "t3", 0, false})
	}
	// A message of a logged claim not handled by a call that returned is
	// also autoack-unhandled, fault or not: no fault stops a process's own
	// handlers (only claims never logged may have gone unseen).
	for _, tc := range []struct {
		name             string
		fault, handleAll bool
		want, unhandled  int
	}{
		{"all handled", false, true, 0, 0},
		{"claimed, not handled", false, false, 1, 1},
		{"fault near: never-delivered excused, not the claim", true, false, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, s := build(tc.fault, tc.handleAll)
			vs := Check(h.r.Events(), s, 0)
			got := Counts(vs)
			if got["never-delivered"] != tc.want || got["autoack-unhandled"] != tc.unhandled || len(vs) != tc.want+tc.unhandled {
				t.Errorf("got %v, want %d never-delivered and %d autoack-unhandled", vs, tc.want, tc.unhandled)
			}
		})
	}
}
