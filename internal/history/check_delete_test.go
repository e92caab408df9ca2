package history

import "testing"

// A Queue.Delete whose caller gave up (Info) may still commit after it
// returned: a push that completed after that return, and before the first
// message of the new queue was seen, may be gone with it.
func TestCheckDeleteOfUnknownOutcomeCommitsLate(t *testing.T) {
	h := newHB()
	h.call("a", "q", "", "delete", false, Info)
	h.push("b", "q", []Item{{"p", "t1"}}, OK, Result{"queued", "id1", 0})
	h.push("b", "q", []Item{{"p", "t2"}}, OK, Result{"queued", "id2", 0})
	h.pop("c", "q", "g", false, Delivery{"p", 0, "id2", "t2", "L1", 1, 1e18})
	h.settle("c", "q", "g", "ack", Delivery{"p", 0, "id2", "t2", "L1", 1, 1e18}, OK)
	s := stMore(Stored{"q", "p", 0, "id2", "t2", 0, false})
	if vs := Check(h.r.Events(), s, 0); len(vs) > 0 {
		t.Fatalf("want none, got %v", vs)
	}
}
