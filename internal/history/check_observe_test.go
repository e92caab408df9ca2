package history

import "testing"

// Each case of check_observe.go: a history with exactly that broken
// promise is found, and the same history without it is clean.
func TestCheckObserve(t *testing.T) {
	s0 := Stored{"q", "p", 0, "id1", "t1", 0, false}
	s1 := Stored{"q", "p", 1, "id2", "t2", 0, false}
	s2 := Stored{"q", "p", 2, "id3", "t3", 0, false}
	d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	d1 := Delivery{"p", 1, "id2", "t2", "L1", 1, 1e18}
	handler := func(h *hb, d Delivery, selfAck bool) {
		inv := h.r.Invoke(Event{Proc: "a", Op: OpHandler, Queue: "q", Group: "g", Partition: d.Partition, Offset: d.Offset, Lease: d.Lease, Msgs: []Delivery{d}, T: h.tick()})
		if selfAck {
			h.settle("a", "q", "g", "ack", d, OK)
		}
		h.r.Done(inv, OK, Event{T: h.tick()})
	}
	metrics := func(h *hb, counts map[string]int64) {
		inv := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "metrics", Queue: "q", Group: "g", Counts: counts, Procs: []string{"storm"}, T: h.tick()})
		h.r.Done(inv, OK, Event{T: h.tick()})
	}
	// Consume handles d0 (acked by its handler in Client.Tx) and d1 (acked
	// by Consume's settlement): two acks, two handler calls.
	consumed := func(h *hb) {
		h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
		handler(h, d0, true)
		handler(h, d1, false)
	}
	cases := []struct {
		name string
		kind string // "" : clean
		hist func(h *hb) State
	}{
		{"metrics agree", "", func(h *hb) State {
			consumed(h)
			metrics(h, map[string]int64{"ack": 2, "process": 2})
			return st(s0, s1)
		}},
		{"self-ack counted twice", "metrics-count", func(h *hb) State {
			consumed(h)
			metrics(h, map[string]int64{"ack": 3, "process": 2})
			return st(s0, s1)
		}},
		{"an ack it made not counted", "metrics-count", func(h *hb) State {
			consumed(h)
			metrics(h, map[string]int64{"ack": 0, "process": 2})
			return st(s0, s1)
		}},
		{"pops counted exactly", "", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			metrics(h, map[string]int64{"ack": 1, "receive": 2})
			return st(s0, s1)
		}},
		{"pops miscounted", "metrics-count", func(h *hb) State {
			h.push("a", "q", []Item{{"p", "t1"}, {"p", "t2"}}, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 1})
			h.pop("a", "q", "g", false, d0, d1)
			h.settle("a", "q", "g", "ack", d1, OK)
			metrics(h, map[string]int64{"ack": 1, "receive": 3})
			return st(s0, s1)
		}},
		{"warning after the handler acked the last itself", "false-warning", func(h *hb) State {
			consumed(h)
			h.push("a", "q", []Item{{"p", "t3"}}, OK, Result{"queued", "id3", 2})
			handler(h, Delivery{"p", 2, "id3", "t3", "L1", 1, 1e18}, true)
			inv := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "settle-log", Queue: "q", Partition: "p", T: h.tick()})
			h.r.Done(inv, OK, Event{Err: "queen: already acked", T: h.tick()})
			return st(s0, s1, s2)
		}},
		{"warning after Consume acked the last", "", func(h *hb) State {
			consumed(h)
			inv := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "settle-log", Queue: "q", Partition: "p", T: h.tick()})
			h.r.Done(inv, OK, Event{Err: "queen: already acked", T: h.tick()})
			// The lease was lost, a later pop redelivered.
			h.pop("b", "q", "g", false, Delivery{"p", 1, "id2", "t2", "L2", 2, 1e18})
			h.settle("b", "q", "g", "ack", Delivery{"p", 1, "id2", "t2", "L2", 2, 1e18}, OK)
			return st(s0, s1)
		}},
		{"from-edge", "from-boundary", func(h *hb) State {
			return edge(h, false)
		}},
		{"from-edge delivered", "", func(h *hb) State {
			return edge(h, true)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			s := tc.hist(h)
			vs := Check(h.r.Events(), s, 0)
			got := kinds(vs)
			if tc.kind == "" && len(vs) > 0 || tc.kind != "" && (got[tc.kind] == 0 || len(got) != 1) {
				for _, v := range vs {
					t.Log(v)
				}
				t.Fatalf("got %v, want only %q", got, tc.kind)
			}
		})
	}
}

// edge: t1 stored by a PushTx whose commit began after the group's from
// time, t2 above it (a push that waited for the row), delivered to the
// from group or not.
func edge(h *hb, delivered bool) State {
	h.push("a", "q", []Item{{"p", "t0"}}, OK, Result{"queued", "id0", 0})
	tx := h.r.Invoke(Event{Proc: "a", Op: OpPush, Kind: "pushtx", Queue: "q", Items: []Item{{"p", "t1"}}, T: h.tick()})
	w := h.r.Invoke(Event{Proc: "b", Op: OpPush, Queue: "q", Items: []Item{{"p", "t2"}}, T: h.tick()})
	e := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "from-edge", Queue: "q", Group: "f", Partition: "p", T: h.tick()})
	from := e.T
	h.r.Done(e, OK, Event{T: h.tick()})
	h.r.Done(tx, OK, Event{Results: []Result{{"queued", "id1", 1}}, T: h.tick()})
	h.r.Done(w, OK, Event{Results: []Result{{"queued", "id2", 2}}, T: h.tick()})
	d := Delivery{"p", 2, "id2", "t2", "L9", 1, 1e18}
	if delivered {
		h.pop("a", "q", "f", false, d)
		h.settle("a", "q", "f", "ack", d, OK)
	} else {
		h.pop("a", "q", "f", false)
	}
	dr := h.r.Invoke(Event{Proc: "a", Op: OpCall, Kind: "from-drained", Queue: "q", Group: "f", T: h.tick()})
	h.r.Done(dr, OK, Event{T: h.tick()})
	all := []Delivery{{"p", 0, "id0", "t0", "L8", 1, 1e18}, {"p", 1, "id1", "t1", "L8", 1, 1e18}, d}
	h.pop("a", "q", "g", false, all...)
	h.settle("a", "q", "g", "ack", all[2], OK)
	s := st(Stored{"q", "p", 0, "id0", "t0", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false}, Stored{"q", "p", 2, "id2", "t2", 0, false})
	qi := s.Queues["q"]
	qi.FromGroups = map[string]int64{"f": from}
	s.Queues["q"] = qi
	return s
}
