package history

import "testing"

// A call's leader and layer-1 follower (one transaction id, keys whose
// lanes parted), both Buffered: each is owed in its own lane.
func TestCheckPartitionsOwed(t *testing.T) {
	build := func(log ...Stored) []Violation {
		h := newHB()
		h.push("a", "q", []Item{{"lane-0", "t1"}, {"lane-1", "t1"}}, OK, Result{"buffered", "id1", -1}, Result{"buffered", "id2", -1})
		// No groups: only the pushes are judged.
		return Check(h.r.Events(), State{Queues: map[string]QueueInfo{"q": {Deduped: true}}, Log: log}, 0)
	}
	leader := Stored{"q", "lane-0", 0, "id1", "t1", 0, false}
	follower := Stored{"q", "lane-1", 0, "id2", "t1", 0, false}
	if vs := build(leader, follower); len(vs) != 0 {
		t.Errorf("both stored: %v", vs)
	}
	vs := build(leader)
	if len(vs) != 1 || vs[0].Kind != "lost" {
		t.Fatalf("follower not stored: got %v, want one lost", vs)
	}
	t.Log(vs[0])
}
