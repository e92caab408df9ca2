package queen

import (
	"testing"
	"time"

	"github.com/e03140bc/queen/internal/stmt"
)

// After a move, the mover goes again at once only for a backlog, lets a
// stream gather for moveGather (longer after many segments), and otherwise sleeps until the next due
// time within the poll.
func TestMoveAfter(t *testing.T) {
	began := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	now := began.Add(5 * time.Millisecond) // the move took 5ms
	const poll = time.Second
	in := func(ms int64) *int64 { return &ms }
	for _, tc := range []struct {
		name      string
		r         stmt.MoveRow
		wantAt    time.Time
		wantAgain bool
	}{
		{"nothing scheduled", stmt.MoveRow{Moved: 3}, now.Add(poll), false},
		{"backlog: due before the move began", stmt.MoveRow{Moved: 5000, NextIn: in(-20)}, now, true},
		{"a dropped backlog", stmt.MoveRow{Dropped: 1, NextIn: in(-20)}, now, true},
		{"due during the move: gathers", stmt.MoveRow{Moved: 800, NextIn: in(-2)}, began.Add(moveGather), false},
		{"a stream: gathers", stmt.MoveRow{Moved: 800, NextIn: in(1)}, began.Add(moveGather), false},
		{"next due after the gather", stmt.MoveRow{Moved: 1, NextIn: in(300)}, now.Add(300 * time.Millisecond), false},
		{"next due after the poll", stmt.MoveRow{Moved: 1, NextIn: in(60_000)}, now.Add(poll), false},
		{"nothing due yet: no gather", stmt.MoveRow{NextIn: in(5)}, now.Add(5 * time.Millisecond), false},
		{"due but not taken", stmt.MoveRow{NextIn: in(-20)}, now.Add(moveIdle), false},
		{"only held", stmt.MoveRow{Held: 2, NextIn: in(40)}, began.Add(moveGather), false},
		{"a stream over many partitions: gathers longer", stmt.MoveRow{Moved: 640, WokeParts: make([]string, 64), NextIn: in(1)}, began.Add(64 * moveGatherPerSegment), false},
		{"a stream over very many partitions: gathers at most moveGatherMax", stmt.MoveRow{Moved: 1000, WokeParts: make([]string, 1000), NextIn: in(1)}, began.Add(moveGatherMax), false},
		{"many segments, next due later still", stmt.MoveRow{Moved: 80, WokeParts: make([]string, 64), NextIn: in(500)}, now.Add(500 * time.Millisecond), false},
		{"few segments: moveGather", stmt.MoveRow{Moved: 7000, WokeParts: make([]string, 7), NextIn: in(1)}, began.Add(moveGather), false},
		{"a backlog of thin segments: at once", stmt.MoveRow{Moved: 64, WokeParts: make([]string, 64), NextIn: in(-20)}, now, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at, again := moveAfter(&tc.r, began, now, poll)
			if !at.Equal(tc.wantAt) || again != tc.wantAgain {
				t.Errorf("moveAfter = %s, %v; want %s, %v", at.Sub(began), again, tc.wantAt.Sub(began), tc.wantAgain)
			}
		})
	}
}
