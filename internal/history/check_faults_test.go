package history

import "testing"

func (h *hb) rewrite(queue string, now []Delivery, unreadable []Delivery) {
	inv := h.r.Invoke(Event{Proc: "faults", Op: OpCall, Kind: "rewrite", Queue: queue, Msgs: now, Unreadable: unreadable, T: h.tick()})
	h.r.Done(inv, OK, Event{T: h.tick()})
}

// A rewritten segment is read as it is now: the check fails a delivery of
// what the offset held before, or of a message that cannot be opened, and
// passes the same history read after the rewrite correctly (or read before
// it). The queue is not audited: the rewrites run on queues of their own.
func TestCheckRewrittenReads(t *testing.T) {
	old0 := Delivery{"p", 0, "id1", "t1", "L1", 1, 1e18}
	new0 := Delivery{"p", 0, "id9", "t9", "L2", 1, 1e18}
	d1 := Delivery{"p", 1, "id2", "t2", "L2", 1, 1e18}
	cases := []struct {
		name  string
		build func(h *hb)
		want  int
	}{
		{"stale read", func(h *hb) {
			h.rewrite("x", []Delivery{new0}, nil)
			h.pop("a", "x", "", false, old0)
		}, 1},
		{"fresh read", func(h *hb) {
			h.rewrite("x", []Delivery{new0}, nil)
			h.pop("a", "x", "", false, new0)
		}, 0},
		{"read before the rewrite", func(h *hb) {
			h.pop("a", "x", "", false, old0)
			h.rewrite("x", []Delivery{new0}, nil)
		}, 0},
		{"unreadable delivered", func(h *hb) {
			h.rewrite("x", nil, []Delivery{old0, d1})
			h.pop("a", "x", "", false, d1)
		}, 1},
		{"unreadable dead-lettered", func(h *hb) {
			h.rewrite("x", nil, []Delivery{old0, d1})
			h.pop("a", "x", "", false)
		}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHB()
			tc.build(h)
			vs := Check(h.r.Events(), State{Queues: map[string]QueueInfo{}}, 0)
			if n := Counts(vs)["rewritten-read"]; n != tc.want || len(vs) != tc.want {
				t.Fatalf("want %d rewritten-read and nothing else, got %v", tc.want, vs)
			}
		})
	}
}
