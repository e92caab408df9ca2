package history

import "testing"

// A push a client made between its own SetMaintenance(true) and (false)
// was stored straight: maintenance-direct, unless another proc's
// maintenance window (which ends the mode) overlaps it.
func TestCheckMaintenanceDirect(t *testing.T) {
	build := func(status string, otherOff bool) []Violation {
		h := newHB()
		call := func(proc, kind string) {
			inv := h.r.Invoke(Event{Proc: proc, Op: OpCall, Kind: kind, T: h.tick()})
			h.r.Done(inv, OK, Event{T: h.tick()})
		}
		call("m", CallMaintenanceOn)
		var f Event
		if otherOff {
			f = h.r.Invoke(Event{Proc: "nemesis", Op: OpFault, Kind: "maintenance", T: h.tick()})
		}
		h.push("m", "q", []Item{{"p", "t1"}}, OK, Result{status, "id1", 0})
		if otherOff {
			h.r.Done(f, OK, Event{T: h.tick()})
		}
		call("m", CallMaintenanceOff)
		// Outside the window: stored straight is fine.
		h.push("m", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 1})
		log := []Stored{{"q", "p", 0, "id1", "t1", 0, false}, {"q", "p", 1, "id2", "t2", 0, false}}
		return Check(h.r.Events(), State{Queues: map[string]QueueInfo{"q": {Deduped: true}}, Log: log}, 0)
	}
	if vs := build("buffered", false); len(vs) != 0 {
		t.Errorf("buffered in the window: %v", vs)
	}
	if vs := build("queued", true); len(vs) != 0 {
		t.Errorf("queued while another proc's window ended: %v", vs)
	}
	vs := build("queued", false)
	if len(vs) != 1 || vs[0].Kind != "maintenance-direct" {
		t.Fatalf("queued in the window: got %v, want one maintenance-direct", vs)
	}
	t.Log(vs[0])
}
