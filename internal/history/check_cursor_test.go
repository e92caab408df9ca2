package history

import "testing"

func (h *hb) cursor(proc, queue, group, partition string, committed int64) {
	inv := h.r.Invoke(Event{Proc: proc, Op: OpCall, Kind: "cursor", Queue: queue, Group: group, Partition: partition, Offset: committed, T: h.tick()})
	h.r.Done(inv, OK, Event{T: h.tick()})
}

// A message deleted by CompletedRetention after a late group's cursor was
// seen below it is owed to that group; without the cursor it is not (the
// group may have come after the deletion).
func TestCheckCompletedCursorPins(t *testing.T) {
	for _, seen := range []bool{false, true} {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
		d0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
		h.pop("a", "q", "g", false, d0)
		h.settle("a", "q", "g", "ack", d0, OK)
		h.pop("a", "q", "late", false) // first contact
		if seen {
			h.cursor("a", "q", "late", "p", -1)
		}
		h.pop("a", "q", "late", false)
		s := State{Queues: map[string]QueueInfo{"q": {Deduped: true, Completed: true, Groups: []string{"g", "late"}}}}
		got := kinds(Check(h.r.Events(), s, 0))
		if want := map[string]int{}; seen {
			want["never-delivered"] = 1
			if len(got) != 1 || got["never-delivered"] != 1 {
				t.Errorf("cursor seen: got %v, want %v", got, want)
			}
		} else if len(got) != 0 {
			t.Errorf("no cursor seen: got %v, want none", got)
		}
	}
}

// One call's two items of one transaction id in two lanes: each is stored
// in its own lane, or the one reported a duplicate names a lane without it.
func TestCheckDuplicatePerPartition(t *testing.T) {
	items := []Item{{"lane-1", "t1"}, {"lane-2", "t1"}}
	h := newHB()
	h.push("a", "q", items, OK, Result{"queued", "id1", 0}, Result{"queued", "id2", 0})
	h.pop("a", "q", "g", true, Delivery{"lane-1", 0, "id1", "t1", "", 1, 0}, Delivery{"lane-2", 0, "id2", "t1", "", 1, 0})
	if vs := Check(h.r.Events(), st(Stored{"q", "lane-1", 0, "id1", "t1", 0, false}, Stored{"q", "lane-2", 0, "id2", "t1", 0, false}), 0); len(vs) != 0 {
		t.Errorf("both stored: %v", vs)
	}
	h = newHB()
	h.push("a", "q", items, OK, Result{"queued", "id1", 0}, Result{"duplicate", "id1", -1})
	h.pop("a", "q", "g", true, Delivery{"lane-1", 0, "id1", "t1", "", 1, 0})
	if got := kinds(Check(h.r.Events(), st(Stored{"q", "lane-1", 0, "id1", "t1", 0, false}), 0)); len(got) != 1 || got["wrong-duplicate"] != 1 {
		t.Errorf("duplicate of another lane: got %v, want one wrong-duplicate", got)
	}
	// Twice in one lane is still a duplicate.
	h = newHB()
	h.push("a", "q", items[:1], OK, Result{"queued", "id1", 0})
	h.pop("a", "q", "g", true, Delivery{"lane-1", 0, "id1", "t1", "", 1, 0}, Delivery{"lane-1", 1, "id2", "t1", "", 1, 0})
	if got := kinds(Check(h.r.Events(), st(Stored{"q", "lane-1", 0, "id1", "t1", 0, false}, Stored{"q", "lane-1", 1, "id2", "t1", 0, false}), 0)); got["duplicated"] != 1 {
		t.Errorf("twice in a lane: got %v, want duplicated", got)
	}
}
