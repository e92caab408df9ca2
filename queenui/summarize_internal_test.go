package queenui

import (
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// summarize sums lag and settled offsets per group over the partitions and
// adds the groups paused before their first pop, which no partition shows.
func TestSummarize(t *testing.T) {
	st := queen.QueueStatus{Partitions: []queen.PartitionStatus{
		{Name: "a", Groups: []queen.GroupStatus{{Group: "", Lag: 3, Settled: 2, LagAge: time.Second}, {Group: "x", Lag: 1, Paused: true}}},
		{Name: "b", Groups: []queen.GroupStatus{{Group: "", Lag: 4, Settled: 1, LagAge: time.Minute}, {Group: "x", Paused: true}}},
	}}
	got := summarize(st, []queen.QueueGroupInfo{{Group: ""}, {Group: "new", Paused: true}, {Group: "x", Paused: true}})
	want := []groupRow{
		{Name: "", Lag: 7, Settled: 3, LagAge: time.Minute},
		{Name: "new", Paused: true, Unsubscribed: true},
		{Name: "x", Lag: 1, Paused: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
