package history

import (
	"fmt"
	"maps"
	"testing"
)

// reset records a ResetGroup of group g on queue q; done completes it.
func (h *hb) reset(e Event, phase, refusal string, moves ...Move) {
	e.Proc, e.Op, e.Kind, e.Queue, e.Group, e.T = "op", OpCall, "reset", "q", "g", h.tick()
	inv := h.r.Invoke(e)
	h.r.Done(inv, phase, Event{Moves: moves, Refusal: refusal, T: h.tick()})
}

func (h *hb) deleteGroup(force bool, phase string, ended int) {
	inv := h.r.Invoke(Event{Proc: "op", Op: OpCall, Kind: "delete-group", Queue: "q", Group: "g", Force: force, T: h.tick()})
	h.r.Done(inv, phase, Event{Ended: ended, T: h.tick()})
}

func (h *hb) release(p string, absent bool, phase string, released bool) {
	inv := h.r.Invoke(Event{Proc: "op", Op: OpCall, Kind: "release", Queue: "q", Group: "g", Partition: p, Absent: absent, T: h.tick()})
	res := Event{Released: released, T: h.tick()}
	if absent && phase == Fail {
		res.Refusal = "not-found"
	}
	h.r.Done(inv, phase, res)
}

// offsetsLog pushes n messages to partition p of q, one push each, and
// returns the log and their deliveries under lease L1.
func (h *hb) offsetsLog(n int) ([]Stored, []Delivery) {
	var log []Stored
	var ds []Delivery
	for i := range int64(n) {
		id, tx := fmt.Sprintf("id%d", i), fmt.Sprintf("t%d", i)
		h.push("a", "q", []Item{{"p", tx}}, OK, Result{"queued", id, i})
		log = append(log, Stored{"q", "p", i, id, tx, 0, false})
		ds = append(ds, Delivery{"p", i, id, tx, "L1", 1, 1e18})
	}
	return log, ds
}

func leased(d Delivery, lease string) Delivery { d.Lease = lease; return d }

func stOffsets(log []Stored) State {
	return State{Queues: map[string]QueueInfo{"q": {Deduped: true, Moved: []string{"g"}}}, Log: log}
}

// Each case breaks exactly the promises it names (none: a history the
// moves explain); the other checks excuse what a move asked and nothing
// else.
func TestCheckOffsets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		want  map[string]int
		build func(h *hb) State
	}{
		{"latest skips what it passed", nil, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.pop("c", "q", "g", false, d[0], d[1])
			h.settle("c", "q", "g", "ack", d[1], OK)
			h.reset(Event{Reset: "latest"}, OK, "", Move{Partition: "p", Before: 1, After: 3})
			return stOffsets(log)
		}},
		{"nothing moved, nothing skipped", map[string]int{"reset-lost": 1}, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.pop("c", "q", "g", false, d[0], d[1])
			h.settle("c", "q", "g", "ack", d[1], OK)
			return stOffsets(log)
		}},
		{"earliest replays", nil, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.pop("c", "q", "g", false, d...)
			h.settle("c", "q", "g", "ack", d[3], OK)
			h.reset(Event{Reset: "earliest", Force: true}, OK, "", Move{Partition: "p", Before: 3, After: -1})
			h.pop("c", "q", "g", false, leased(d[0], "L2"), leased(d[1], "L2"), leased(d[2], "L2"), leased(d[3], "L2"))
			h.settle("c", "q", "g", "ack", leased(d[3], "L2"), OK)
			return stOffsets(log)
		}},
		{"earliest not replayed", map[string]int{"reset-lost": 1}, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.pop("c", "q", "g", false, d...)
			h.settle("c", "q", "g", "ack", d[3], OK)
			h.reset(Event{Reset: "earliest"}, OK, "", Move{Partition: "p", Before: 3, After: -1})
			h.pop("c", "q", "g", false, leased(d[0], "L2"), leased(d[1], "L2"))
			return stOffsets(log)
		}},
		{"an era committed what it never delivered", map[string]int{"reset-lost": 1}, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.pop("c", "q", "g", false, d[0])
			h.settle("c", "q", "g", "ack", d[0], OK)
			h.reset(Event{Reset: "earliest"}, OK, "", Move{Partition: "p", Before: 2, After: -1})
			h.pop("c", "q", "g", false, leased(d[0], "L2"), leased(d[1], "L2"), leased(d[2], "L2"), leased(d[3], "L2"))
			return stOffsets(log)
		}},
		{"a holder whose lease a forced reset ended still runs its batch", nil, func(h *hb) State {
			// A Consume claimed 0-2 (L1) before the reset ended its lease;
			// the next holder (L2) reads from the reset's position and acks
			// 3; the stale holder's handlers run on meanwhile (their
			// settles are refused).
			log, d := h.offsetsLog(4)
			h.pop("c", "q", "g", false, d[0], d[1], d[2])
			h.reset(Event{Reset: "offsets", Want: map[string]int64{"p": 3}, Force: true}, OK, "", Move{Partition: "p", Before: -1, After: 2, LeaseEnded: true})
			h.pop("c2", "q", "g", false, leased(d[3], "L2"))
			h.settle("c2", "q", "g", "ack", leased(d[3], "L2"), OK)
			h.handler("c", "q", "g", d[1], "")
			return stOffsets(log)
		}},
		{"a lease released before the log recorded its claim still runs its batch", nil, func(h *hb) State {
			// Consume's claim of 0 (L1) committed before the release, which
			// ended it, and was logged after; its expiry less the lease
			// time says so. The next holder (L2) reads and acks 0; the
			// stale holder's handler runs on.
			log, d := h.offsetsLog(1)
			claimedAt := h.tick()
			h.release("p", false, OK, true)
			h.pop("c2", "q", "g", false, leased(d[0], "L2"))
			h.settle("c2", "q", "g", "ack", leased(d[0], "L2"), OK)
			stale := leased(d[0], "L1")
			stale.LeaseExpires = claimedAt + 100
			h.handler("c", "q", "g", stale, "")
			st := stOffsets(log)
			qi := st.Queues["q"]
			qi.LeaseTime = 100
			st.Queues["q"] = qi
			return st
		}},
		{"a lease claimed after the release is no stale holder", map[string]int{"acked-redelivered": 1}, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.release("p", false, OK, true)
			h.pop("c2", "q", "g", false, leased(d[0], "L2"))
			h.settle("c2", "q", "g", "ack", leased(d[0], "L2"), OK)
			late := leased(d[0], "L1")
			late.LeaseExpires = h.tick() + 100
			h.handler("c", "q", "g", late, "")
			st := stOffsets(log)
			qi := st.Queues["q"]
			qi.LeaseTime = 100
			st.Queues["q"] = qi
			return st
		}},
		{"a reset that ended no lease excuses no stale read", map[string]int{"acked-redelivered": 1}, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.pop("c", "q", "g", false, d[0], d[1], d[2])
			h.reset(Event{Reset: "offsets", Want: map[string]int64{"p": 3}, Force: true}, OK, "", Move{Partition: "p", Before: -1, After: 2})
			h.pop("c2", "q", "g", false, leased(d[3], "L2"))
			h.settle("c2", "q", "g", "ack", leased(d[3], "L2"), OK)
			h.handler("c", "q", "g", d[1], "")
			return stOffsets(log)
		}},
		{"a refused reset is no excuse", map[string]int{"acked-redelivered": 1}, func(h *hb) State {
			log, d := h.offsetsLog(2)
			h.pop("c", "q", "g", false, d...)
			h.settle("c", "q", "g", "ack", d[1], OK)
			h.reset(Event{Reset: "earliest"}, Fail, "active")
			h.pop("c", "q", "g", false, leased(d[1], "L2"))
			return stOffsets(log)
		}},
		{"a reset of unknown outcome excuses its group", nil, func(h *hb) State {
			log, d := h.offsetsLog(2)
			h.pop("c", "q", "g", false, d...)
			h.settle("c", "q", "g", "ack", d[1], OK)
			h.reset(Event{Reset: "earliest"}, Info, "")
			h.pop("c", "q", "g", false, leased(d[1], "L2"))
			return stOffsets(log)
		}},
		{"judged again from an applied move after one of unknown outcome", map[string]int{"reset-lost": 1}, func(h *hb) State {
			log, _ := h.offsetsLog(2)
			h.reset(Event{Reset: "earliest"}, Info, "")
			h.reset(Event{Reset: "latest"}, OK, "", Move{Partition: "p", Before: 1, After: 1})
			more, dm := h.offsetsLogFrom(2, 2)
			h.pop("c", "q", "g", false, dm[1]) // a poll-skip too, but the unknown move blinds that check
			return stOffsets(append(log, more...))
		}},
		{"a delete replays", nil, func(h *hb) State {
			log, d := h.offsetsLog(2)
			h.pop("c", "q", "g", false, d...)
			h.settle("c", "q", "g", "ack", d[1], OK)
			h.deleteGroup(false, OK, 0)
			h.pop("c", "q", "g", false, leased(d[0], "L2"), leased(d[1], "L2"))
			return stOffsets(log)
		}},
		{"a delete not replayed", map[string]int{"reset-lost": 1}, func(h *hb) State {
			log, d := h.offsetsLog(2)
			h.pop("c", "q", "g", false, d...)
			h.settle("c", "q", "g", "ack", d[1], OK)
			h.deleteGroup(true, OK, 0)
			h.pop("c", "q", "g", false, leased(d[1], "L2"))
			return stOffsets(log)
		}},
		{"a pop past where latest put the cursor", map[string]int{"poll-skip": 1, "reset-lost": 1}, func(h *hb) State {
			log, _ := h.offsetsLog(2)
			h.reset(Event{Reset: "latest"}, OK, "", Move{Partition: "p", Before: -1, After: 1})
			more, dm := h.offsetsLogFrom(2, 2)
			h.pop("c", "q", "g", false, dm[1])
			return stOffsets(append(log, more...))
		}},
		{"latest short of the tail", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.reset(Event{Reset: "latest"}, OK, "", Move{Partition: "p", Before: -1, After: 2})
			h.pop("c", "q", "g", false, d[3])
			return stOffsets(log)
		}},
		{"latest past the tail", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, _ := h.offsetsLog(4)
			h.reset(Event{Reset: "latest"}, OK, "", Move{Partition: "p", Before: -1, After: 4})
			return stOffsets(log)
		}},
		{"earliest past the start", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, d := h.offsetsLog(2)
			h.reset(Event{Reset: "earliest"}, OK, "", Move{Partition: "p", Before: -1, After: 0})
			h.pop("c", "q", "g", false, d[1])
			return stOffsets(log)
		}},
		{"offsets as asked", nil, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.reset(Event{Reset: "offsets", Want: map[string]int64{"p": 2}}, OK, "", Move{Partition: "p", Before: -1, After: 1})
			h.pop("c", "q", "g", false, d[2], d[3])
			return stOffsets(log)
		}},
		{"offsets one too far", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.reset(Event{Reset: "offsets", Want: map[string]int64{"p": 2}}, OK, "", Move{Partition: "p", Before: -1, After: 2})
			h.pop("c", "q", "g", false, d[3])
			return stOffsets(log)
		}},
		{"offsets past the tail clamped", nil, func(h *hb) State {
			log, _ := h.offsetsLog(4)
			h.reset(Event{Reset: "offsets", Want: map[string]int64{"p": 9}}, OK, "", Move{Partition: "p", Before: -1, After: 3})
			return stOffsets(log)
		}},
		{"offsets moved a partition not named", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, _ := h.offsetsLog(4)
			h.reset(Event{Reset: "offsets", Want: map[string]int64{"p": 9}}, OK, "", Move{Partition: "p", Before: -1, After: 3}, Move{Partition: "r", Before: -1, After: -1})
			return stOffsets(log)
		}},
		{"time as asked", nil, func(h *hb) State {
			log, d := h.offsetsLog(2)
			at := h.tick()
			more, dm := h.offsetsLogFrom(2, 2)
			h.reset(Event{Reset: "time", At: at}, OK, "", Move{Partition: "p", Before: -1, After: 1})
			h.pop("c", "q", "g", false, dm...)
			_ = d
			return stOffsets(append(log, more...))
		}},
		{"time one too far", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, _ := h.offsetsLog(2)
			at := h.tick()
			more, dm := h.offsetsLogFrom(2, 2)
			h.reset(Event{Reset: "time", At: at}, OK, "", Move{Partition: "p", Before: -1, After: 2})
			h.pop("c", "q", "g", false, dm[1])
			return stOffsets(append(log, more...))
		}},
		{"a subset reset moved another partition", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, _ := h.offsetsLog(4)
			h.reset(Event{Reset: "latest", Parts: []string{"p"}}, OK, "", Move{Partition: "p", Before: -1, After: 3}, Move{Partition: "r", Before: -1, After: -1})
			return stOffsets(log)
		}},
		{"a cursor behind its reset", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, d := h.offsetsLog(4)
			h.reset(Event{Reset: "latest"}, OK, "", Move{Partition: "p", Before: -1, After: 3})
			h.reset(Event{Reset: "earliest"}, OK, "", Move{Partition: "p", Before: 1, After: -1})
			h.pop("c", "q", "g", false, d...)
			return stOffsets(log)
		}},
		{"a forced reset refused as active", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.reset(Event{Reset: "latest", Force: true}, Fail, "active")
			h.pop("c", "q", "g", false, d...)
			return stOffsets(log)
		}},
		{"a release of a missing partition applied", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.release("nope", true, OK, false)
			h.pop("c", "q", "g", false, d...)
			return stOffsets(log)
		}},
		{"a release of a missing partition refused", nil, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.release("nope", true, Fail, false)
			h.pop("c", "q", "g", false, d...)
			return stOffsets(log)
		}},
		{"the released holder's settle refused", nil, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.pop("c", "q", "g", false, d[0])
			h.release("p", false, OK, true)
			h.pop("c", "q", "g", false, leased(d[0], "L2"))
			h.settle("c", "q", "g", "ack", leased(d[0], "L2"), OK)
			h.settle("c", "q", "g", "ack", d[0], Fail)
			return stOffsets(log)
		}},
		{"the released holder's settle accepted", map[string]int{"released-double": 1, "released-settled": 1, "two-holders": 1}, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.pop("c", "q", "g", false, d[0])
			h.release("p", false, OK, true)
			h.pop("c", "q", "g", false, leased(d[0], "L2"))
			h.settle("c", "q", "g", "ack", leased(d[0], "L2"), OK)
			h.settle("c", "q", "g", "ack", d[0], OK)
			return stOffsets(log)
		}},
		{"a release that left the lease live", map[string]int{"released-settled": 1}, func(h *hb) State {
			log, d := h.offsetsLog(2)
			h.pop("c", "q", "g", false, d...)
			h.release("p", false, OK, true)
			h.settle("c", "q", "g", "ack", d[1], OK)
			return stOffsets(log)
		}},
		{"a release that found the lease settled", nil, func(h *hb) State {
			log, d := h.offsetsLog(2)
			h.pop("c", "q", "g", false, d...)
			h.settle("c", "q", "g", "ack", d[0], OK)
			h.release("p", false, OK, false)
			h.settle("c", "q", "g", "ack", d[1], OK)
			return stOffsets(log)
		}},
		{"a reset without Force ended a lease", map[string]int{"reset-wrong": 1}, func(h *hb) State {
			log, _ := h.offsetsLog(2)
			h.reset(Event{Reset: "latest"}, OK, "", Move{Partition: "p", Before: -1, After: 1, LeaseEnded: true})
			return stOffsets(log)
		}},
		{"settled again after a rewind", nil, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.pop("c", "q", "g", false, d[0])
			h.settle("c", "q", "g", "ack", d[0], OK)
			h.reset(Event{Reset: "earliest"}, OK, "", Move{Partition: "p", Before: 0, After: -1})
			h.pop("c", "q", "g", false, leased(d[0], "L2"))
			h.settle("c", "q", "g", "ack", leased(d[0], "L2"), OK)
			return stOffsets(log)
		}},
		{"handlers overlap after a release", nil, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.overlappingHandlers(d[0], true)
			return stOffsets(log)
		}},
		{"handlers overlap with no release", map[string]int{"concurrent-handlers": 1}, func(h *hb) State {
			log, d := h.offsetsLog(1)
			h.overlappingHandlers(d[0], false)
			return stOffsets(log)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			st := tc.build(h)
			vs := Check(h.r.Events(), st, 0)
			if got := Counts(vs); !maps.Equal(got, tc.want) && len(got)+len(tc.want) > 0 {
				t.Errorf("got %v, want %v", got, tc.want)
				for _, v := range vs {
					t.Log(v)
				}
			}
		})
	}
}

// offsetsLogFrom pushes n more messages from offset from, as offsetsLog.
func (h *hb) offsetsLogFrom(from, n int) ([]Stored, []Delivery) {
	var log []Stored
	var ds []Delivery
	for i := int64(from); i < int64(from+n); i++ {
		id, tx := fmt.Sprintf("id%d", i), fmt.Sprintf("t%d", i)
		h.push("a", "q", []Item{{"p", tx}}, OK, Result{"queued", id, i})
		log = append(log, Stored{"q", "p", i, id, tx, 0, false})
		ds = append(ds, Delivery{"p", i, id, tx, "L1", 1, 1e18})
	}
	return log, ds
}

// overlappingHandlers: a handler of lease L1 runs while one of lease L2
// starts on the same message; with release, a ReleaseLease ended L1
// between the two starts.
func (h *hb) overlappingHandlers(d Delivery, release bool) {
	a := h.r.Invoke(Event{Proc: "c", Op: OpHandler, Queue: "q", Group: "g", Partition: d.Partition, Offset: d.Offset, Lease: "L1", Msgs: []Delivery{d}, T: h.tick()})
	if release {
		h.release("p", false, OK, true)
	} else {
		h.tick()
	}
	d2 := leased(d, "L2")
	b := h.r.Invoke(Event{Proc: "d", Op: OpHandler, Queue: "q", Group: "g", Partition: d.Partition, Offset: d.Offset, Lease: "L2", Msgs: []Delivery{d2}, T: h.tick() + 1e9})
	h.t += 1e9
	h.r.Done(b, OK, Event{T: h.tick()})
	h.r.Done(a, OK, Event{T: h.tick()})
}
