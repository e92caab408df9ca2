package history

import "testing"

// CheckBounds reports exactly the measures over their bounds.
func TestCheckBounds(t *testing.T) {
	ok := []Bound{
		{Kind: "unbounded-pop", Queue: "wide", Group: "late", What: "rows its first pop touched", Got: 7400, Max: 15000},
		{Kind: "slot-starved", Queue: "delayed", What: "empty pops", Got: 0, Max: 0},
	}
	if vs := CheckBounds(ok); len(vs) != 0 {
		t.Fatalf("measures within their bounds reported: %v", vs)
	}
	bad := append(ok, Bound{Kind: "ready-set-upkeep", Queue: "wide", Group: "live", What: "stale entries left", Got: 4063, Max: 0})
	vs := CheckBounds(bad)
	if len(vs) != 1 || vs[0].Kind != "ready-set-upkeep" || vs[0].Queue != "wide" || vs[0].Group != "live" {
		t.Fatalf("want one ready-set-upkeep violation on wide/live, got %v", vs)
	}
}
