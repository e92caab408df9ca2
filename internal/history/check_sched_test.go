package history

import (
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

// at records an event at time t.
func (h *hb) at(e Event, t int64) Event {
	e.T = t
	if t > h.t {
		h.t = t
	}
	return e
}

func (h *hb) schedPush(tx, id string, due int64, status string) {
	inv := h.r.Invoke(h.at(Event{Proc: "a", Op: OpPush, Queue: "q", Items: []Item{{"p", tx}}}, h.t+ms))
	off := int64(-1)
	if status == "queued" {
		off = 0
	}
	h.r.Done(inv, OK, h.at(Event{Results: []Result{{status, id, off}}, DeliverAt: []int64{due}}, h.t+ms))
}

func (h *hb) popAt(queue, group string, t int64, msgs ...Delivery) {
	inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpPop, Queue: queue, Group: group}, t-ms))
	h.r.Done(inv, OK, h.at(Event{Msgs: msgs}, t))
}

func (h *hb) cancelSched(tx string, n int64) {
	inv := h.r.Invoke(h.at(Event{Proc: "a", Op: OpCall, Kind: "cancel-scheduled", Queue: "q", Msgs: []Delivery{{TxID: tx}}}, h.t+ms))
	h.r.Done(inv, OK, h.at(Event{Counts: map[string]int64{"cancelled": n}}, h.t+ms))
}

func stSched(log ...Stored) State {
	return State{Queues: map[string]QueueInfo{"q": {Groups: []string{""}}}, Log: log}
}

// Each case breaks at most the one promise it names (none: "clean").
func TestCheckScheduled(t *testing.T) {
	s0 := Stored{"q", "p", 0, "id1", "t1", 0, false}
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 0}
	due := int64(10 * time.Second)
	cases := []struct {
		name, want string
		build      func(h *hb) State
	}{
		{"due, delivered", "", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.popAt("q", "", due+20*ms, d0)
			return stSched(s0)
		}},
		{"delivered within the clock's slack", "", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.popAt("q", "", due-20*ms, d0)
			return stSched(s0)
		}},
		{"delivered before its time", "delivered-early", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.popAt("q", "", due-500*ms, d0)
			return stSched(s0)
		}},
		{"never appended", "scheduled-lost", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			return stSched()
		}},
		{"appended under another id", "scheduled-lost", func(h *hb) State {
			h.schedPush("t1", "id9", due, "scheduled")
			h.popAt("q", "", due+20*ms, d0)
			return stSched(s0)
		}},
		{"a repeat while waiting is a duplicate", "", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.schedPush("t1", "id1", due+ms, "duplicate")
			h.popAt("q", "", due+20*ms, d0)
			return stSched(s0)
		}},
		{"scheduled again after its move", "", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.popAt("q", "", due+20*ms, d0)
			h.settle("c", "q", "", "ack", d0, OK)
			h.schedPush("t1", "id2", 2*due, "scheduled")
			h.popAt("q", "", 2*due+20*ms, Delivery{"p", 1, "id2", "t1", "L2", 1, 0})
			return stSched(s0, Stored{"q", "p", 1, "id2", "t1", 0, false})
		}},
		{"appended twice", "duplicated", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.popAt("q", "", due+20*ms, d0, Delivery{"p", 1, "id1", "t1", "L1", 1, 0})
			return stSched(s0, Stored{"q", "p", 1, "id1", "t1", 0, false})
		}},
		{"cancelled", "", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.cancelSched("t1", 1)
			return stSched()
		}},
		{"cancelled too late: delivered", "", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.popAt("q", "", due+20*ms, d0)
			h.cancelSched("t1", 0)
			return stSched(s0)
		}},
		{"two buffered repeats folded by one replay flush", "", func(h *hb) State {
			// Spooled apart, replayed in one flush: deduplicated inside it.
			h.schedPush("t1", "id1", due, "scheduled")
			h.schedPush("t1", "id2", 0, "buffered")
			h.schedPush("t1", "id3", 0, "buffered")
			h.popAt("q", "", due+20*ms, d0, Delivery{"p", 1, "id2", "t1", "L1", 1, 0})
			return stSched(s0, Stored{"q", "p", 1, "id2", "t1", 0, false})
		}},
		{"a buffered repeat lost", "scheduled-lost", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.schedPush("t1", "id2", 0, "buffered")
			h.popAt("q", "", due+20*ms, d0)
			return stSched(s0)
		}},
		{"counted cancelled, yet delivered", "cancelled-delivered", func(h *hb) State {
			h.schedPush("t1", "id1", due, "scheduled")
			h.cancelSched("t1", 1)
			h.popAt("q", "", due+20*ms, d0)
			return stSched(s0)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			s := tc.build(h)
			vs := Check(h.r.Events(), s, 0)
			got := kinds(vs)
			if tc.want == "" && len(vs) > 0 || tc.want != "" && (got[tc.want] == 0 || len(got) != 1) {
				t.Fatalf("want %q only, got %v: %v", tc.want, got, vs)
			}
		})
	}
}

func TestCheckRetryEarly(t *testing.T) {
	st := func(log ...Stored) State {
		return State{Queues: map[string]QueueInfo{"q": {Groups: []string{""}, RetryMin: 300 * time.Millisecond}}, Log: log}
	}
	s0 := Stored{"q", "p", 0, "id1", "t1", 0, false}
	d1 := Delivery{"p", 0, "id1", "t1", "L1", 1, int64(20 * time.Second)}
	d2 := Delivery{"p", 0, "id1", "t1", "L2", 2, int64(40 * time.Second)}
	t0 := int64(10 * time.Second)
	fail := func(h *hb, wait int64) {
		inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpSettle, Queue: "q", Kind: "fail", Partition: "p", Offset: 0, Lease: "L1", ID: "id1",
			Counts: map[string]int64{"wait_ms": wait}}, t0))
		h.r.Done(inv, OK, h.at(Event{}, t0+ms))
	}
	handler := func(h *hb, wait int64) {
		inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpHandler, Queue: "q", Partition: "p", Offset: 0, Lease: "L1", Msgs: []Delivery{d1}}, t0-ms))
		h.r.Done(inv, OK, h.at(Event{Err: "boom", Counts: map[string]int64{"wait_ms": wait}}, t0))
	}
	pushed := func(h *hb) {
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		h.popAt("q", "", t0-10*ms, d1)
	}
	ack := func(h *hb, d Delivery) {
		inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpSettle, Queue: "q", Kind: "ack", Partition: "p", Offset: 0, Lease: d.Lease, ID: "id1"}, h.t+ms))
		h.r.Done(inv, OK, h.at(Event{}, h.t+ms))
	}
	cases := []struct {
		name, want string
		build      func(h *hb) State
	}{
		{"after the backoff", "", func(h *hb) State {
			pushed(h)
			fail(h, 0)
			h.popAt("q", "", t0+310*ms, d2)
			ack(h, d2)
			return st(s0)
		}},
		{"a higher attempt delivered before the failure", "", func(h *hb) State {
			// Attempt is not monotonic per offset: a message behind a
			// failing head carries the batch's delivery count.
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			h.popAt("q", "", t0-50*ms, Delivery{"p", 0, "id1", "t1", "L0", 3, int64(20 * time.Second)})
			h.popAt("q", "", t0-10*ms, d1)
			fail(h, 0)
			h.popAt("q", "", t0+310*ms, d2)
			ack(h, d2)
			return st(s0)
		}},
		{"before the backoff", "retry-early", func(h *hb) State {
			pushed(h)
			fail(h, 0)
			h.popAt("q", "", t0+100*ms, d2)
			ack(h, d2)
			return st(s0)
		}},
		{"an explicit wait shorter than the backoff", "", func(h *hb) State {
			pushed(h)
			fail(h, 200)
			h.popAt("q", "", t0+210*ms, d2)
			ack(h, d2)
			return st(s0)
		}},
		{"before an explicit wait", "retry-early", func(h *hb) State {
			pushed(h)
			fail(h, 900)
			h.popAt("q", "", t0+500*ms, d2)
			ack(h, d2)
			return st(s0)
		}},
		{"a handler's wait", "", func(h *hb) State {
			pushed(h)
			handler(h, 800)
			h.popAt("q", "", t0+810*ms, d2)
			ack(h, d2)
			return st(s0)
		}},
		{"before a handler's wait", "retry-early", func(h *hb) State {
			pushed(h)
			handler(h, 800)
			h.popAt("q", "", t0+400*ms, d2)
			ack(h, d2)
			return st(s0)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			s := tc.build(h)
			vs := Check(h.r.Events(), s, 0)
			got := kinds(vs)
			if tc.want == "" && len(vs) > 0 || tc.want != "" && (got[tc.want] == 0 || len(got) != 1) {
				t.Fatalf("want %q only, got %v: %v", tc.want, got, vs)
			}
		})
	}
}

func TestCheckDiscards(t *testing.T) {
	s0 := Stored{"q", "p", 0, "id1", "t1", 0, false}
	s1 := Stored{"q", "p", 1, "id2", "t2", 0, false}
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	d1 := Delivery{"p", 1, "id2", "t2", "L1", 1, 1e18}
	st := func(dead ...DeadStored) State {
		s := State{Queues: map[string]QueueInfo{"q": {Deduped: true, Groups: []string{"g"}, DeadLetter: true}}, Log: []Stored{s0, s1}}
		s.DeadLetters = dead
		return s
	}
	dead := DeadStored{"q", "g", "p", 0, "id1", "t1", "boom"}
	// The failed message is dead-lettered (its budget spent), then
	// discarded.
	failed := func(h *hb) {
		h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
		h.pop("a", "q", "g", false, d0, d1)
		h.handler("a", "q", "g", d0, "boom")
		h.pop("a", "q", "g", false, d1)
		h.settle("a", "q", "g", "ack", d1, OK)
	}
	discard := func(h *hb, n int64) {
		inv := h.r.Invoke(Event{Proc: "d", Op: OpCall, Kind: "discard", Queue: "q", Group: "g", Counts: map[string]int64{"dl": 7},
			Msgs: []Delivery{{Partition: "p", Offset: 0, ID: "id1", TxID: "t1"}}, T: h.tick()})
		h.r.Done(inv, OK, Event{Counts: map[string]int64{"discarded": n}, T: h.tick()})
	}
	list := func(h *hb, n int64) {
		inv := h.r.Invoke(Event{Proc: "d", Op: OpCall, Kind: "deadletters", Queue: "q", Group: "g", Counts: map[string]int64{"dl": 7}, T: h.tick()})
		h.r.Done(inv, OK, Event{Counts: map[string]int64{"listed": n}, T: h.tick()})
	}
	cases := []struct {
		name, want string
		build      func(h *hb) State
	}{
		{"a dead letter", "", func(h *hb) State {
			failed(h)
			return st(dead)
		}},
		{"gone without a discard", "failed-not-redelivered", func(h *hb) State {
			failed(h)
			return st()
		}},
		{"discarded", "", func(h *hb) State {
			failed(h)
			discard(h, 1)
			list(h, 0)
			return st()
		}},
		{"a discard that deleted nothing", "failed-not-redelivered", func(h *hb) State {
			failed(h)
			discard(h, 0)
			return st()
		}},
		{"discarded, still there at the end", "discarded-back", func(h *hb) State {
			failed(h)
			discard(h, 1)
			return st(dead)
		}},
		{"discarded; a replayed copy with its id dead-lettered at another offset", "", func(h *hb) State {
			// A requeued copy of the message (or a replay's second copy on a
			// queue without a window) holds id1 at offset 1: discarding
			// offset 0's dead letter leaves offset 1's.
			c0 := Delivery{"p", 1, "id1", "t1", "L2", 1, 1e18}
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"buffered", "id1", -1})
			h.pop("a", "q", "g", false, d0)
			h.handler("a", "q", "g", d0, "boom")
			h.pop("a", "q", "g", false, c0)
			h.handler("a", "q", "g", c0, "boom")
			discard(h, 1)
			s := st(DeadStored{"q", "g", "p", 1, "id1", "t1", "boom"})
			s.Queues["q"] = QueueInfo{Groups: []string{"g"}, DeadLetter: true}
			s.Log = []Stored{s0, {"q", "p", 1, "id1", "t1", 0, false}}
			return s
		}},
		{"discarded, listed again", "discarded-back", func(h *hb) State {
			failed(h)
			discard(h, 1)
			list(h, 1)
			return st()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			s := tc.build(h)
			vs := Check(h.r.Events(), s, 0)
			got := kinds(vs)
			if tc.want == "" && len(vs) > 0 || tc.want != "" && (got[tc.want] == 0 || len(got) != 1) {
				t.Fatalf("want %q only, got %v: %v", tc.want, got, vs)
			}
		})
	}
}

// Under FailureSkip the failed message comes back as a copy at a new
// offset: retry-early judges the next delivery of its id, not of its
// offset.
func TestCheckRetryEarlySkip(t *testing.T) {
	st := func(log ...Stored) State {
		return State{Queues: map[string]QueueInfo{"q": {Groups: []string{""}, RetryMin: 300 * time.Millisecond, Skip: true}},
			Log: log}
	}
	s0 := Stored{"q", "p", 0, "id1", "t1", 0, false}
	s1 := Stored{"q", "p", 1, "id1", "t1", 1, false} // the copy
	d1 := Delivery{"p", 0, "id1", "t1", "L1", 1, int64(20 * time.Second)}
	d2 := Delivery{"p", 1, "id1", "t1", "L2", 2, int64(40 * time.Second)}
	t0 := int64(10 * time.Second)
	build := func(h *hb, redeliver int64) {
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		h.popAt("q", "", t0-10*ms, d1)
		inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpSettle, Queue: "q", Kind: "fail", Partition: "p", Offset: 0, Lease: "L1",
			ID: "id1", Counts: map[string]int64{"wait_ms": 0}}, t0))
		h.r.Done(inv, OK, h.at(Event{}, t0+ms))
		h.popAt("q", "", t0+redeliver, d2)
		inv = h.r.Invoke(h.at(Event{Proc: "c", Op: OpSettle, Queue: "q", Kind: "ack", Partition: "p", Offset: 1, Lease: "L2", ID: "id1"},
			h.t+ms))
		h.r.Done(inv, OK, h.at(Event{}, h.t+ms))
	}
	for _, tc := range []struct {
		name, want string
		at         int64
	}{
		{"the copy after the backoff", "", 310 * ms},
		{"the copy before the backoff", "retry-early", 100 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			build(h, tc.at)
			vs := Check(h.r.Events(), st(s0, s1), 0)
			got := kinds(vs)
			if tc.want == "" && len(vs) > 0 || tc.want != "" && (got[tc.want] == 0 || len(got) != 1) {
				t.Fatalf("want %q only, got %v: %v", tc.want, got, vs)
			}
		})
	}
}
