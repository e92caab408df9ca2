package history

import "testing"

// pushKind records a completed push of the given kind ("pushtx" for
// Queue.PushTx), which the plain push helper leaves empty (Queue.Push).
func (h *hb) pushKind(proc, queue, kind string, items []Item, res ...Result) {
	inv := h.r.Invoke(Event{Proc: proc, Op: OpPush, Kind: kind, Queue: queue, Items: items, T: h.tick()})
	h.r.Done(inv, OK, Event{Results: res, T: h.tick()})
}

// PushTx and Client.Tx run in the caller's transaction and are never
// spooled, so the library lets them overtake the same client's Buffered
// items (Queue.Push's documented order covers Push only). The checker must
// not report that as a client-order violation, and must still report a
// PushTx stored before a Queued item of an earlier call, and a Push stored
// before a Buffered one.
func TestCheckPushTxMayOvertakeBufferedItems(t *testing.T) {
	for _, tc := range []struct {
		name    string
		earlier string // status of the earlier Push's item
		kind    string // kind of the later push
		want    int    // client-order violations
	}{
		{"PushTx overtakes Buffered", "buffered", "pushtx", 0},
		{"Push overtakes Buffered", "buffered", "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{tc.earlier, "id1", -1})
			h.pushKind("a", "q", tc.kind, []Item{{"p", "t2"}}, Result{"queued", "id2", 0})
			h.pop("a", "q", "g", true, Delivery{"p", 0, "id2", "t2", "", 1, 0}, Delivery{"p", 1, "id1", "t1", "", 1, 0})
			vs := Check(h.r.Events(), st(Stored{"q", "p", 0, "id2", "t2", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false}), 0)
			if got := kinds(vs)["client-order"]; got != tc.want {
				t.Errorf("client-order violations = %d, want %d: %v", got, tc.want, vs)
			}
			if n := len(vs) - kinds(vs)["client-order"]; n != 0 {
				t.Errorf("unexpected other violations: %v", vs)
			}
		})
	}

	// A PushTx stored before an earlier call's Queued item is still out of
	// order: only spooled items may be overtaken.
	t.Run("PushTx overtakes Queued", func(t *testing.T) {
		h := newHB()
		h.push("a", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 1})
		h.pushKind("a", "q", "pushtx", []Item{{"p", "t2"}}, Result{"queued", "id2", 0})
		h.pop("a", "q", "g", true, Delivery{"p", 0, "id2", "t2", "", 1, 0}, Delivery{"p", 1, "id1", "t1", "", 1, 0})
		vs := Check(h.r.Events(), st(Stored{"q", "p", 0, "id2", "t2", 0, false}, Stored{"q", "p", 1, "id1", "t1", 0, false}), 0)
		if kinds(vs)["client-order"] == 0 {
			t.Errorf("a PushTx stored before an earlier Queued item was not reported: %v", vs)
		}
	})
}

// A Client.Tx's pushes (committed, no offsets reported) are stored in call
// order: a partition's items of its Push calls, one push to the checker,
// stored out of that order are reported.
func TestCheckTxPushOrder(t *testing.T) {
	tx := func(h *hb) {
		inv := h.r.Invoke(Event{Proc: "a", Op: OpPush, Kind: "tx", Queue: "q", Items: []Item{{"p", "t1"}, {"p", "t2"}}, T: h.tick()})
		h.r.Done(inv, OK, Event{Results: []Result{{"committed", "", -1}, {"committed", "", -1}}, T: h.tick()})
	}
	for _, tc := range []struct {
		name string
		log  []Stored
		want int
	}{
		{"in order", []Stored{{"q", "p", 0, "id1", "t1", 0, false}, {"q", "p", 1, "id2", "t2", 0, false}}, 0},
		{"reversed", []Stored{{"q", "p", 0, "id2", "t2", 0, false}, {"q", "p", 1, "id1", "t1", 0, false}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			tx(h)
			h.pop("a", "q", "g", true, Delivery{"p", 0, tc.log[0].ID, tc.log[0].TxID, "", 1, 0}, Delivery{"p", 1, tc.log[1].ID, tc.log[1].TxID, "", 1, 0})
			vs := Check(h.r.Events(), st(tc.log...), 0)
			if got := kinds(vs)["int-nonmonotonic-send"]; got != tc.want || len(vs) != tc.want {
				t.Errorf("got %v, want %d int-nonmonotonic-send", vs, tc.want)
			}
		})
	}
}
