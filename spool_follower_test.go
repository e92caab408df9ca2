package queen_test

import (
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// Two keyed items of one call with one TransactionID that share a lane when
// spooled are leader and follower; if the queue's lane count changes before
// the replay and their keys part, each Buffered item is stored once, in its
// key's lane under the count it was stored with. Without the change, the
// follower is a duplicate of the leader and only the leader is stored.
func TestSpoolLayer1FollowerKeyMovesAtReplay(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
		fresh  int  // the lane count at replay
		locked bool // spooled by a failed bundle, not by maintenance mode
	}{
		{"window/lanes-change", time.Hour, 5, false},
		{"no-window/lanes-change", 0, 5, false},
		{"window/same-lanes", time.Hour, queen.DefaultLanes, false},
		{"no-window/same-lanes", 0, queen.DefaultLanes, false},
		{"failed-bundle/window/lanes-change", time.Hour, 5, true},
		{"failed-bundle/no-window/same-lanes", 0, queen.DefaultLanes, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c1, c2, _ := openPair(t, manual, func(c *queen.Config) {
				if tc.locked {
					c.StatementTimeout = time.Second // how long the locked bundle waits
				}
			})
			opts := queen.QueueOptions{DedupWindow: tc.window}
			configure(t, c2, "q", opts)
			q1 := c1.Queue("q")
			k1, k2 := keysSharingLaneOnlyUnder(t, queen.DefaultLanes, 5)
			stale := laneName(k1, queen.DefaultLanes)
			push(t, q1, queen.Item{Partition: stale, Data: []byte("warm")}) // c1 caches 64 lanes; stale exists
			release := func() {}
			if tc.locked {
				release = lockPartition(t, c1, stale)
			} else {
				setMaintenance(t, c1, true)
			}
			items := []queen.Item{
				{Data: []byte("a"), Key: k1, TransactionID: "T"},
				{Data: []byte("b"), Key: k2, TransactionID: "T"},
			}
			res := push(t, q1, items...)
			for i, r := range res {
				if r.Status != queen.Buffered {
					t.Fatalf("item %d: %+v, want Buffered", i, r)
				}
			}
			opts.Lanes = tc.fresh
			configure(t, c2, "q", opts)
			queen.ForgetQueueMeta(c1, "q")
			if tc.locked {
				release()
			} else {
				setMaintenance(t, c1, false)
			}
			waitFor(t, 20*time.Second, "the drain", func() bool { return c1.SpoolStats().PendingRecords == 0 })

			// Where each key's message with id T is stored, under the count
			// of the replay.
			stored := map[string]int{}
			total := 0
			for _, k := range []string{k1, k2} {
				lane := laneName(k, tc.fresh)
				for _, f := range storedFrames(t, c2, lane) {
					if f.TransactionID == "T" && f.Key == k {
						stored[k]++
					}
				}
			}
			for _, n := range stored {
				total += n
			}
			if tc.fresh == queen.DefaultLanes {
				// One partition, one id: the follower is a duplicate.
				if stored[k1] != 1 || total != 1 {
					t.Fatalf("stored %v, want the leader (%s) once and nothing else", stored, k1)
				}
				return
			}
			for i, it := range items {
				if stored[it.Key] != 1 {
					t.Errorf("item %d (key %q): reported %s, but %s holds it %d times, want once",
						i, it.Key, res[i].Status, laneName(it.Key, tc.fresh), stored[it.Key])
				}
			}
		})
	}
}
