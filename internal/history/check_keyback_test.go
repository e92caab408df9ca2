package history

import (
	"testing"
	"time"
)

// kbPush records a Queued push of one item at t.
func (h *hb) kbPush(queue, partition, tx, id string, off int64, t int64) {
	inv := h.r.Invoke(h.at(Event{Proc: "a", Op: OpPush, Queue: queue, Items: []Item{{partition, tx}}}, t-ms))
	h.r.Done(inv, OK, h.at(Event{Results: []Result{{"queued", id, off}}}, t))
}

// kbHandle records a Consume handler run on d (key key) from t, failing
// when fail.
func (h *hb) kbHandle(queue string, d Delivery, key string, t int64, fail bool) {
	inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpHandler, Queue: queue, Partition: d.Partition, Offset: d.Offset, Lease: d.Lease,
		Msgs: []Delivery{d}, Keys: []string{key}}, t))
	var err string
	if fail {
		err = "failed"
	}
	h.r.Done(inv, OK, h.at(Event{Err: err}, t+10*ms))
}

// kbConsume records a Consume call of queue from t to end.
func (h *hb) kbConsume(queue string, t, end int64, keyed bool) {
	inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpCall, Kind: "consume", Queue: queue, Keyed: keyed, Batch: 4}, t))
	h.r.Done(inv, OK, h.at(Event{}, end))
}

func stKB(queue string, skip bool, log ...Stored) State {
	return State{Queues: map[string]QueueInfo{queue: {Groups: []string{""}, DeadLetter: true, HoldWait: 5 * time.Second, Skip: skip}}, Log: log}
}

// Each case breaks at most the one promise it names (none: "clean").
func TestCheckHeld(t *testing.T) {
	sec := int64(time.Second)
	a0 := Delivery{"lane-0", 0, "ida", "a", "L1", 1, 0}
	a1 := Delivery{"lane-0", 0, "ida", "a", "L3", 2, 0}
	b := Delivery{"lane-0", 1, "idb", "b", "L2", 1, 0}
	keyed := []Stored{{"k", "lane-0", 0, "ida", "a", 0, false}, {"k", "lane-0", 1, "idb", "b", 0, false}}
	// a fails at 0.2 s; b, another key, is pushed at 0.3 s; a comes back at 5.2 s
	keyedRun := func(h *hb, bKey string, bAt int64, end int64) {
		h.kbConsume("k", ms, end, true)
		h.kbPush("k", "lane-0", "a", "ida", 0, 100*ms)
		h.kbHandle("k", a0, "k0", 200*ms, true)
		h.kbPush("k", "lane-0", "b", "idb", 1, 300*ms)
		if bAt < 5*sec {
			h.kbHandle("k", b, bKey, bAt, false)
			h.kbHandle("k", a1, "k0", 5200*ms, false)
		} else {
			h.kbHandle("k", a1, "k0", 5200*ms, false)
			h.kbHandle("k", b, bKey, bAt, false)
		}
	}
	s0 := Delivery{"p", 0, "ida", "a", "L1", 1, 0}
	s1 := Delivery{"p", 1, "idb", "b", "L2", 1, 0}
	sc := Delivery{"p", 2, "ida", "a", "L3", 2, 0}
	skipped := []Stored{{"s", "p", 0, "ida", "a", 0, false}, {"s", "p", 1, "idb", "b", 0, false}, {"s", "p", 2, "ida", "a", 1, false}}
	// a fails at 0.2 s, its copy goes to offset 2 behind b
	skipRun := func(h *hb, bAt int64) {
		h.kbConsume("s", ms, 20*sec, false)
		h.kbPush("s", "p", "a", "ida", 0, 50*ms)
		h.kbPush("s", "p", "b", "idb", 1, 100*ms)
		h.popAt("s", "", 150*ms, s0)
		inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpSettle, Queue: "s", Kind: "fail", Partition: "p", Offset: 0, Lease: "L1", ID: "ida"}, 200*ms))
		h.r.Done(inv, OK, h.at(Event{}, 210*ms))
		h.kbHandle("s", s1, "", bAt, false)
		h.kbHandle("s", sc, "", bAt+100*ms, false)
	}
	cases := []struct {
		name, want string
		build      func(h *hb) State
	}{
		{"keyed: another key flows", "", func(h *hb) State {
			keyedRun(h, "k1", 500*ms, 20*sec)
			return stKB("k", false, keyed...)
		}},
		{"keyed: another key waits for the failed one", "key-stalled", func(h *hb) State {
			keyedRun(h, "k1", 5300*ms, 20*sec)
			return stKB("k", false, keyed...)
		}},
		{"keyed: another key more than a Batch ahead of the failed one", "", func(h *hb) State {
			keyedRun(h, "k1", 5300*ms, 20*sec)
			h.r.events[0].Batch = 1 // the Consume's invoke, recorded first: b is one offset above a
			return stKB("k", false, keyed...)
		}},
		{"keyed: another key pushed after the failed message came back, slow for another reason", "", func(h *hb) State {
			// a fails at 0.2 s and is handled again at 1 s; b, pushed at
			// 1.5 s, waits until 5.3 s, but not for a.
			h.kbConsume("k", ms, 20*sec, true)
			h.kbPush("k", "lane-0", "a", "ida", 0, 100*ms)
			h.kbHandle("k", a0, "k0", 200*ms, true)
			h.kbHandle("k", a1, "k0", sec, false)
			h.kbPush("k", "lane-0", "b", "idb", 1, 1500*ms)
			h.kbHandle("k", b, "k1", 5300*ms, false)
			return stKB("k", false, keyed...)
		}},
		{"keyed: another key waits past the failed message's return", "key-stalled", func(h *hb) State {
			// b, pushed at 0.3 s, waits until a comes back at 3.5 s.
			h.kbConsume("k", ms, 20*sec, true)
			h.kbPush("k", "lane-0", "a", "ida", 0, 100*ms)
			h.kbHandle("k", a0, "k0", 200*ms, true)
			h.kbPush("k", "lane-0", "b", "idb", 1, 300*ms)
			h.kbHandle("k", a1, "k0", 3500*ms, false)
			h.kbHandle("k", b, "k1", 3600*ms, false)
			return stKB("k", false, keyed...)
		}},
		{"keyed: the failed key's own message waits", "", func(h *hb) State {
			keyedRun(h, "k0", 5300*ms, 20*sec)
			return stKB("k", false, keyed...)
		}},
		{"keyed: the failed key's own message, read again by a pop that records no keys", "", func(h *hb) State {
			keyedRun(h, "k0", 5300*ms, 20*sec)
			h.popAt("k", "", 21*sec, b)
			return stKB("k", false, keyed...)
		}},
		{"keyed: no Consume ran throughout", "", func(h *hb) State {
			keyedRun(h, "k1", 5300*ms, 2*sec)
			h.kbConsume("k", 5*sec, 20*sec, true)
			return stKB("k", false, keyed...)
		}},
		{"keyed: the database restarted meanwhile", "", func(h *hb) State {
			keyedRun(h, "k1", 5300*ms, 20*sec)
			inv := h.r.Invoke(Event{Proc: "nemesis", Op: OpFault, Kind: "restart", T: 2 * sec})
			h.r.Done(inv, OK, Event{T: 3 * sec})
			return stKB("k", false, keyed...)
		}},
		{"keyed: the Consume still backing off after a restart", "", func(h *hb) State {
			inv := h.r.Invoke(Event{Proc: "nemesis", Op: OpFault, Kind: "restart", T: 10 * ms})
			h.r.Done(inv, OK, Event{T: 20 * ms})
			keyedRun(h, "k1", 5300*ms, 20*sec)
			return stKB("k", false, keyed...)
		}},
		{"keyed: another client's pool exhausted meanwhile", "key-stalled", func(h *hb) State {
			keyedRun(h, "k1", 5300*ms, 20*sec)
			inv := h.r.Invoke(Event{Proc: "nemesis", Op: OpFault, Kind: "exhaust", T: 2 * sec})
			h.r.Done(inv, OK, Event{T: 3 * sec})
			return stKB("k", false, keyed...)
		}},
		{"keyed: not judged without a HoldWait", "", func(h *hb) State {
			keyedRun(h, "k1", 5300*ms, 20*sec)
			s := stKB("k", false, keyed...)
			s.Queues["k"] = QueueInfo{Groups: []string{""}, DeadLetter: true}
			return s
		}},
		{"skip: the partition flows", "", func(h *hb) State {
			skipRun(h, 400*ms)
			return stKB("s", true, skipped...)
		}},
		{"skip: under the bound", "", func(h *hb) State {
			skipRun(h, 2800*ms)
			return stKB("s", true, skipped...)
		}},
		{"skip: a pop begun before b's push returned it at once", "", func(h *hb) State {
			h.kbConsume("s", ms, 20*sec, false)
			h.kbPush("s", "p", "a", "ida", 0, 50*ms)
			h.popAt("s", "", 150*ms, s0)
			inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpSettle, Queue: "s", Kind: "fail", Partition: "p", Offset: 0, Lease: "L1", ID: "ida"}, 200*ms))
			h.r.Done(inv, OK, h.at(Event{}, 210*ms))
			pop := h.r.Invoke(h.at(Event{Proc: "d", Op: OpPop, Queue: "s"}, 250*ms))
			h.kbPush("s", "p", "b", "idb", 1, 300*ms)
			h.r.Done(pop, OK, h.at(Event{Msgs: []Delivery{s1}}, 400*ms))
			h.kbHandle("s", s1, "", 4*sec, false) // its lease ended before it was settled
			h.kbHandle("s", sc, "", 4*sec+100*ms, false)
			return stKB("s", true, skipped...)
		}},
		{"skip: a claim took b at once, its lease ended before the handler", "", func(h *hb) State {
			skipRun(h, 4*sec)
			claim := h.r.Invoke(Event{Proc: "c", Op: OpClaim, Queue: "s", Partition: "p", Offset: 1, Last: 2, T: 300 * ms})
			h.r.Done(claim, OK, Event{T: 300 * ms})
			return stKB("s", true, skipped...)
		}},
		{"skip: the failure's settle lost its lease: the partition waits for its expiry", "", func(h *hb) State {
			// a's handler fails at 0.2 s, but its settle returns lease lost
			// at 3.2 s (the lease expired meanwhile): a is redelivered in
			// place and b waits behind it, as behind any expired lease.
			h.kbConsume("s", ms, 20*sec, false)
			h.kbPush("s", "p", "a", "ida", 0, 50*ms)
			h.kbPush("s", "p", "b", "idb", 1, 100*ms)
			h.kbHandle("s", s0, "", 150*ms, true)
			inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpCall, Kind: "settle-log", Queue: "s", Partition: "p"}, 3200*ms))
			h.r.Done(inv, OK, h.at(Event{Err: "queen: lease lost"}, 3200*ms))
			h.kbHandle("s", Delivery{"p", 0, "ida", "a", "L3", 2, 0}, "", 3400*ms, false)
			h.kbHandle("s", Delivery{"p", 1, "idb", "b", "L3", 1, 0}, "", 3500*ms, false)
			return stKB("s", true, Stored{"s", "p", 0, "ida", "a", 0, false}, Stored{"s", "p", 1, "idb", "b", 0, false})
		}},
		{"skip: b read before its push returned, then failed: its copy waits its own backoff", "", func(h *hb) State {
			h.kbConsume("s", ms, 20*sec, false)
			h.kbPush("s", "p", "a", "ida", 0, 50*ms)
			h.popAt("s", "", 150*ms, s0)
			inv := h.r.Invoke(h.at(Event{Proc: "c", Op: OpSettle, Queue: "s", Kind: "fail", Partition: "p", Offset: 0, Lease: "L1", ID: "ida"}, 200*ms))
			h.r.Done(inv, OK, h.at(Event{}, 210*ms))
			push := h.r.Invoke(h.at(Event{Proc: "a", Op: OpPush, Queue: "s", Items: []Item{{"p", "b"}}}, 250*ms))
			h.popAt("s", "", 350*ms, s1)
			h.r.Done(push, OK, h.at(Event{Results: []Result{{"queued", "idb", 1}}}, 400*ms))
			inv = h.r.Invoke(h.at(Event{Proc: "c", Op: OpSettle, Queue: "s", Kind: "fail", Partition: "p", Offset: 1, Lease: "L2", ID: "idb"}, 500*ms))
			h.r.Done(inv, OK, h.at(Event{}, 510*ms))
			h.kbHandle("s", sc, "", 5200*ms, false)
			h.kbHandle("s", Delivery{"p", 3, "idb", "b", "L4", 2, 0}, "", 5500*ms, false)
			return stKB("s", true, append(skipped, Stored{"s", "p", 3, "idb", "b", 1, false})...)
		}},
		{"skip: the partition waits for the failed message", "skip-stalled", func(h *hb) State {
			skipRun(h, 4*sec)
			return stKB("s", true, skipped...)
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
