package history

import (
	"bytes"
	"strings"
	"testing"
)

// hb builds histories by hand, one clock tick per event.
type hb struct {
	r *Recorder
	t int64
}

func newHB() *hb { return &hb{r: NewRecorder(nil, true)} }

func (h *hb) tick() int64 { h.t += 10; return h.t }

func (h *hb) push(proc, queue string, items []Item, phase string, res ...Result) {
	inv := h.r.Invoke(Event{Proc: proc, Op: OpPush, Queue: queue, Items: items, T: h.tick()})
	h.r.Done(inv, phase, Event{Results: res, T: h.tick()})
}

// pushOpen records a push whose process died before it completed.
func (h *hb) pushOpen(proc, queue string, items []Item) {
	h.r.Invoke(Event{Proc: proc, Op: OpPush, Queue: queue, Items: items, T: h.tick()})
}

func (h *hb) pop(proc, queue, group string, autoAck bool, msgs ...Delivery) {
	inv := h.r.Invoke(Event{Proc: proc, Op: OpPop, Queue: queue, Group: group, AutoAck: autoAck, T: h.tick()})
	h.r.Done(inv, OK, Event{Msgs: msgs, T: h.tick()})
}

func (h *hb) settle(proc, queue, group, kind string, d Delivery, phase string) {
	inv := h.r.Invoke(Event{Proc: proc, Op: OpSettle, Queue: queue, Group: group, Kind: kind, Partition: d.Partition, Offset: d.Offset, Lease: d.Lease, ID: d.ID, T: h.tick()})
	h.r.Done(inv, phase, Event{T: h.tick()})
}

func st(log ...Stored) State {
	return State{Queues: map[string]QueueInfo{"q": {Deduped: true, Groups: []string{"g"}}}, Log: log}
}

func kinds(vs []Violation) map[string]int { return Counts(vs) }

// A push whose scheduled items' commit went unanswered fails saying their
// outcome is unknown: not a push-error, since scheduled items are never
// spooled.
func TestCheckScheduledOutcomeUnknownIsNoPushError(t *testing.T) {
	h := newHB()
	inv := h.r.Invoke(Event{Proc: "a", Op: OpPush, Queue: "q", Items: []Item{{"p", "t1"}}, T: h.tick()})
	h.r.Done(inv, Info, Event{Err: "queen: schedule: " + ScheduledOutcomeUnknown + " (their commit was not answered): timeout", T: h.tick()})
	if got := kinds(Check(h.r.Events(), st(), 0)); got["push-error"] != 0 {
		t.Fatalf("violations %v", got)
	}
	h = newHB()
	inv = h.r.Invoke(Event{Proc: "a", Op: OpPush, Queue: "q", Items: []Item{{"p", "t1"}}, T: h.tick()})
	h.r.Done(inv, Info, Event{Err: "context deadline exceeded", T: h.tick()})
	if got := kinds(Check(h.r.Events(), st(), 0)); got["push-error"] == 0 {
		t.Fatalf("a push failing for its deadline: violations %v, want a push-error", got)
	}
}

func TestCheckCleanHistory(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"duplicate", "id1", -1})
	h.push("b", "q", []Item{{"p", "t3"}}, OK, Result{"buffered", "id3", -1})
	h.pushOpen("c", "q", []Item{{"p", "t4"}}) // unknown outcome: may be stored
	d1 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	d2 := Delivery{"p", 1, "id2", "t2", "L1", 1, 1e18}
	h.pop("a", "q", "g", false, d1, d2)
	h.settle("a", "q", "g", "ack", d2, OK)
	h.pop("a", "q", "g", true, Delivery{"p", 2, "id3", "t3", "", 1, 0}, Delivery{"p", 3, "id4", "t4", "", 1, 0})
	vs := Check(h.r.Events(), st(
		Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false},
		Stored{"q", "p", 2, "id3", "t3", 0, false}, Stored{"q", "p", 3, "id4", "t4", 0, false}), 0)
	for _, v := range vs {
		t.Error(v)
	}
}

// Each case is a history with exactly one kind of broken promise; the
// checker must name it.
func TestCheckFindsEachViolation(t *testing.T) {
	cases := []struct {
		name  string
		build func(h *hb) State
	}{
		{"lost", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"buffered", "id1", -1})
			return st()
		}},
		{"duplicated", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"buffered", "id1", -1})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0}, Delivery{"p", 1, "id1", "t1", "", 1, 0})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false})
		}},
		{"phantom", func(h *hb) State {
			h.pop("a", "q", "g", true, Delivery{"p", 0, "idx", "tx", "", 1, 0})
			return st(Stored{"q", "p", 0, "idx", "tx", 0, false})
		}},
		{"aborted-write", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, Fail)
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false})
		}},
		{"wrong-result", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 5})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false})
		}},
		{"wrong-duplicate", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"duplicate", "id9", -1})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false})
		}},
		{"gap", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"buffered", "id1", -1}, Result{"buffered", "id2", -1})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
			h.pop("a", "q", "g", true, Delivery{"p", 2, "id2", "t2", "", 1, 0})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 2, "id2", "t2", 0, false})
		}},
		{"client-order", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"buffered", "id1", -1})
			h.push("a", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 0})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id2", "t2", "", 1, 0}, Delivery{"p", 1, "id1", "t1", "", 1, 0})
			return st(Stored{"q", "p", 0, "id2", "t2", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false})
		}},
		{"nonmonotonic-send", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 1})
			h.push("b", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 0})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id2", "t2", "", 1, 0}, Delivery{"p", 1, "id1", "t1", "", 1, 0})
			return st(Stored{"q", "p", 0, "id2", "t2", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false})
		}},
		{"int-nonmonotonic-send", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"buffered", "id1", -1}, Result{"buffered", "id2", -1})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id2", "t2", "", 1, 0}, Delivery{"p", 1, "id1", "t1", "", 1, 0})
			return st(Stored{"q", "p", 0, "id2", "t2", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false})
		}},
		{"inconsistent-read", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t-other", "", 1, 0})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false})
		}},
		{"int-poll-skip", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}, {"p", "t3"}}, OK,
				Result{"queued", "id1", 0}, Result{"queued", "id2", 1}, Result{"queued", "id3", 2})
			h.pop("a", "q", "g", false, Delivery{"p", 0, "id1", "t1", "L1", 1, 0}, Delivery{"p", 2, "id3", "t3", "L1", 1, 0})
			h.pop("a", "q", "g", false, Delivery{"p", 0, "id1", "t1", "L2", 1, 0}, Delivery{"p", 1, "id2", "t2", "L2", 1, 0})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false}, Stored{"q", "p", 2, "id3", "t3", 0, false})
		}},
		{"acked-redelivered", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			d := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
			h.pop("a", "q", "g", false, d)
			h.settle("a", "q", "g", "ack", d, OK)
			h.pop("b", "q", "g", false, Delivery{"p", 0, "id1", "t1", "L2", 2, 1e18})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false})
		}},
		{"two-holders", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			d := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
			h.pop("a", "q", "g", false, d)
			h.pop("b", "q", "g", false, Delivery{"p", 0, "id1", "t1", "L2", 1, 1e18})
			h.settle("a", "q", "g", "ack", d, OK)
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false})
		}},
		{"concurrent-handlers", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			d1 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
			d2 := Delivery{"p", 0, "id1", "t1", "L2", 1, 1e18}
			ha := h.r.Invoke(Event{Proc: "a", Op: OpHandler, Queue: "q", Group: "g", Partition: "p", Lease: "L1", Msgs: []Delivery{d1}, T: h.tick()})
			hb := h.r.Invoke(Event{Proc: "b", Op: OpHandler, Queue: "q", Group: "g", Partition: "p", Lease: "L2", Msgs: []Delivery{d2}, T: h.tick()})
			h.r.Done(ha, OK, Event{T: h.tick()})
			h.r.Done(hb, OK, Event{T: h.tick()})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false})
		}},
		{"poll-skip", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
			d := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
			h.pop("a", "q", "g", false, d)
			h.settle("a", "q", "g", "retry", d, OK)
			h.pop("a", "q", "g", false, Delivery{"p", 1, "id2", "t2", "L2", 1, 1e18})
			h.pop("a", "q", "g", false, d) // so id1 was delivered again; the skip above is the finding
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false})
		}},
		{"push-error", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, Info)
			return st()
		}},
		{"never-delivered", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
			return st(Stored{"q", "p", 0, "id1", "t1", 0, false})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			s := tc.build(h)
			vs := Check(h.r.Events(), s, 0)
			got := kinds(vs)
			if got[tc.name] == 0 {
				t.Fatalf("not found; got %v", vs)
			}
			for k := range got {
				if k != tc.name {
					t.Errorf("also reported %s: %v", k, vs)
				}
			}
		})
	}
}

// A deduplicated queue stores a transaction once; without a window every
// definite push is stored, and an unknown outcome may add one.
func TestCheckWindowlessCounts(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id2", 1})
	h.pushOpen("b", "q", []Item{{"p", "t1"}})
	h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0}, Delivery{"p", 1, "id2", "t1", "", 1, 0}, Delivery{"p", 2, "id3", "t1", "", 1, 0})
	s := st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t1", 0, false}, Stored{"q", "p", 2, "id3", "t1", 0, false})
	s.Queues["q"] = QueueInfo{Groups: []string{"g"}}
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Fatal(vs)
	}
	s.Log = append(s.Log, Stored{"q", "p", 3, "id4", "t1", 0, false})
	if got := kinds(Check(h.r.Events(), s, 0)); got["duplicated"] != 1 {
		t.Fatalf("4 stored of 2 definite + 1 unknown: %v", got)
	}
	// Two buffered pushes of one id that met in a replay flush are stored once.
	h = newHB()
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"buffered", "id1", -1})
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"buffered", "id2", -1})
	h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
	s.Log = s.Log[:1]
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Fatal(vs)
	}
}

func TestRecorderRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	r := NewRecorder(&buf, false)
	inv := r.Invoke(Event{Proc: "a", Op: OpPush, Queue: "q", Items: []Item{{"p", "t"}}})
	r.Done(inv, OK, Event{Results: []Result{{"queued", "id", 3}}})
	buf.WriteString(`{"proc":"a","se`) // torn by a kill
	evs, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[1].Results[0].Offset != 3 || evs[0].Seq != evs[1].Seq {
		t.Fatalf("%+v", evs)
	}
}

// On a retained queue, messages retention took are neither lost nor owed;
// what was delivered before it was deleted still counts against the log.
func TestCheckRetainedQueue(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}, {"p", "t3"}}, OK,
		Result{"queued", "id1", 0}, Result{"queued", "id2", 1}, Result{"queued", "id3", 2})
	h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
	h.pop("a", "q", "g", true, Delivery{"p", 2, "id3", "t3", "", 1, 0}) // retention took offset 1
	s := st(Stored{"q", "p", 2, "id3", "t3", 0, false})
	s.Queues["q"] = QueueInfo{Deduped: true, Groups: []string{"g"}, Retained: true, LogStart: map[string]int64{"p": 2}}
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Fatal(vs)
	}
	// A delivery that contradicts the reconstructed row is still caught.
	h.pop("b", "q", "g2", true, Delivery{"p", 0, "id9", "t1", "", 1, 0})
	if got := kinds(Check(h.r.Events(), s, 0)); got["inconsistent-read"] != 1 {
		t.Fatalf("%v", got)
	}
}

// A SubscribeNew group owes only what was pushed after its first contact.
func TestCheckLateGroup(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
	h.pop("a", "q", "late", true) // first contact: nothing
	h.push("a", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 1})
	h.pop("a", "q", "g", true, Delivery{"p", 1, "id2", "t2", "", 1, 0})
	s := st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false})
	s.Queues["q"] = QueueInfo{Deduped: true, Groups: []string{"g"}, LateGroups: []string{"late"}}
	vs := Check(h.r.Events(), s, 0)
	if len(vs) != 1 || vs[0].Kind != "never-delivered" || vs[0].Group != "late" || vs[0].Partition != "p" {
		t.Fatalf("want id2 owed to the late group only: %v", vs)
	}
}

// A CompletedRetention queue may drop a message only after every group
// read it.
func TestCheckCompletedQueue(t *testing.T) {
	h := newHB()
	h.pop("a", "q", "g", true) // both groups exist before the pushes
	h.pop("a", "q", "g2", true)
	h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
	h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0}, Delivery{"p", 1, "id2", "t2", "", 1, 0})
	h.pop("a", "q", "g2", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
	s := st(Stored{"q", "p", 1, "id2", "t2", 0, false})
	s.Queues["q"] = QueueInfo{Deduped: true, Groups: []string{"g", "g2"}, Completed: true}
	vs := Check(h.r.Events(), s, 0)
	if len(vs) != 1 || vs[0].Kind != "never-delivered" || vs[0].Group != "g2" {
		t.Fatalf("want id2 owed to g2 only: %v", vs)
	}
	// Deleted although g2 never read it: the delivery to g stands in for
	// the row, so g2 is still owed it.
	s.Log = nil
	if got := kinds(Check(h.r.Events(), s, 0)); got["never-delivered"] != 1 || len(got) != 1 {
		t.Fatalf("%v", got)
	}
	// Deleted and read by nobody: lost.
	h.push("a", "q", []Item{{"p", "t3"}}, OK, Result{"queued", "id3", 2})
	if got := kinds(Check(h.r.Events(), s, 0)); got["lost"] != 1 {
		t.Fatalf("%v", got)
	}
}

// A SubscribeFrom group owes what was pushed after its time, nothing before.
func TestCheckFromGroup(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	from := h.tick()
	h.push("a", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 1})
	h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0}, Delivery{"p", 1, "id2", "t2", "", 1, 0})
	s := st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false})
	s.Queues["q"] = QueueInfo{Deduped: true, Groups: []string{"g"}, FromGroups: map[string]int64{"from": from}}
	vs := Check(h.r.Events(), s, 0)
	if len(vs) != 1 || vs[0].Kind != "never-delivered" || vs[0].Group != "from" || !strings.Contains(vs[0].Detail, "id2") {
		t.Fatalf("want id2 owed to the from group only: %v", vs)
	}
}

// A message whose segment was destroyed on purpose counts as stored and is
// owed to nobody; the others of the pop still are.
func TestCheckDestroyed(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}, {"o", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 0})
	s := st(Stored{"q", "o", 0, "id2", "t2", 0, false})
	s.Destroyed = []Stored{{"q", "p", 0, "id1", "t1", 0, false}}
	vs := Check(h.r.Events(), s, 0)
	if len(vs) != 1 || vs[0].Kind != "never-delivered" || vs[0].Partition != "o" {
		t.Fatalf("want only id2 owed: %v", vs)
	}
}

// A never-delivered message names the claims of Consume that took it (and
// no other claim): where to look for it.
func TestCheckNeverDeliveredNamesItsClaims(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	for _, c := range []Event{
		{Proc: "b", Op: OpClaim, Queue: "q", Group: "g", Partition: "p", Offset: 0, Last: 3, Lease: "L1", Batch: 4},
		{Proc: "b", Op: OpClaim, Queue: "q", Group: "g", Partition: "p", Offset: 4, Last: 5, Lease: "L2", Batch: 2},
		{Proc: "b", Op: OpClaim, Queue: "q", Group: "other", Partition: "p", Offset: 0, Last: 0, Lease: "L3", Batch: 1},
	} {
		h.r.Done(h.r.Invoke(c), OK, Event{})
	}
	vs := Check(h.r.Events(), st(Stored{"q", "p", 0, "id1", "t1", 0, false}), 0)
	if len(vs) != 1 || vs[0].Kind != "never-delivered" || len(vs[0].Evidence) != 1 || vs[0].Evidence[0].Lease != "L1" {
		t.Fatalf("want one never-delivered naming claim L1: %v", vs)
	}
}

// On a CompletedRetention queue, a SubscribeFrom group that first popped
// after a message was deleted does not owe it.
func TestCheckCompletedQueueFromGroupJoiningLate(t *testing.T) {
	h := newHB()
	from := h.tick()
	h.pop("a", "q", "g", true)
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0})
	h.pop("a", "q", "from", true) // first contact after the deletion
	s := st()
	s.Queues["q"] = QueueInfo{Deduped: true, Groups: []string{"g"}, Completed: true, FromGroups: map[string]int64{"from": from}}
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Fatal(vs)
	}
}

// A pop may deliver past messages destroyed on purpose (they are
// dead-lettered), but not past others.
func TestCheckPopSkipsOnlyDestroyed(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}, {"p", "t3"}}, OK,
		Result{"queued", "id1", 0}, Result{"queued", "id2", 1}, Result{"queued", "id3", 2})
	h.pop("a", "q", "g", true, Delivery{"p", 0, "id1", "t1", "", 1, 0}, Delivery{"p", 2, "id3", "t3", "", 1, 0})
	s := st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 2, "id3", "t3", 0, false})
	s.Destroyed = []Stored{{"q", "p", 1, "id2", "t2", 0, false}}
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Fatal(vs)
	}
	s.Destroyed = nil
	s.Log = append(s.Log, Stored{"q", "p", 1, "id2", "t2", 0, false})
	if got := kinds(Check(h.r.Events(), s, 0)); got["int-poll-skip"] != 1 {
		t.Fatalf("%v", got)
	}
}

// A pop that skips an offset a Consume handler took before it (settled out
// of order with KeyConcurrency > 1) is no int-poll-skip; the same gap with
// the handler starting only after the pop is.
func TestCheckSkipsSettledOutOfOrder(t *testing.T) {
	for _, before := range []bool{true, false} {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}, {"p", "t3"}}, OK,
			Result{"queued", "id1", 0}, Result{"queued", "id2", 1}, Result{"queued", "id3", 2})
		d2 := Delivery{"p", 1, "id2", "t2", "L1", 1, 1e18}
		handler := func() {
			inv := h.r.Invoke(Event{Proc: "a", Op: OpHandler, Queue: "q", Group: "g", Partition: "p", Offset: 1, Lease: "L1",
				Msgs: []Delivery{d2}, T: h.tick()})
			h.r.Done(inv, OK, Event{T: h.tick()})
		}
		if before {
			handler()
		}
		h.pop("b", "q", "g", false, Delivery{"p", 0, "id1", "t1", "L2", 2, 1e18}, Delivery{"p", 2, "id3", "t3", "L2", 2, 1e18})
		if !before {
			handler()
		}
		got := kinds(Check(h.r.Events(), st(Stored{"q", "p", 0, "id1", "t1", 0, false}, Stored{"q", "p", 1, "id2", "t2", 0, false},
			Stored{"q", "p", 2, "id3", "t3", 0, false}), 0))
		if want := map[bool]int{true: 0, false: 1}[before]; got["int-poll-skip"] != want {
			t.Fatalf("handler before the pop %v: %v, want %d int-poll-skip", before, got, want)
		}
	}
}

// CompletedRetention may delete what nobody read while no group has
// subscribed yet: a push before the queue's first contact may be gone
// unread; one after it is lost if gone unread.
func TestCheckCompletedBeforeAnyGroup(t *testing.T) {
	h := newHB()
	h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.pop("a", "q", "g", true) // the first contact: g subscribes
	s := st()
	s.Queues["q"] = QueueInfo{Deduped: true, Groups: []string{"g"}, Completed: true}
	if vs := Check(h.r.Events(), s, 0); len(vs) != 0 {
		t.Fatalf("a push before any group is not owed: %v", vs)
	}
	h.push("a", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 1})
	if got := kinds(Check(h.r.Events(), s, 0)); got["lost"] != 1 || got["wrong-result"] != 1 || len(got) != 2 {
		t.Fatalf("%v", got)
	}
}
