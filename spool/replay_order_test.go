package spool

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
)

// TestReplayHaltKeepsKeyOrder: once calls have failed 2 × ReplayConcurrency
// times in a row, a worker takes no new key; a call still running may then
// succeed. A key skipped that way must not have its records of a later
// chunk offered in the same pass, before the skipped ones.
func TestReplayHaltKeepsKeyOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Chunk 1: a, f1..f4, x (x's first record); chunk 2: x's second.
		s := openT(t, t.TempDir(), func(o *Options) { o.ReplayConcurrency = 2; o.ReplayBatchRecords = 6 })
		r := func(part string, i int) Record {
			x := rec(0, i)
			x.Partition = part
			return x
		}
		all := []Record{r("a", 0), r("f1", 1), r("f2", 2), r("f3", 3), r("f4", 4), r("x", 5), r("x", 6)}
		appendAll(t, s, all)

		down := errors.New("lock timeout")
		var (
			mu    sync.Mutex
			fail  = true
			order []string // transaction ids of partition x, as offered
		)
		fn := func(ctx context.Context, b []Record) (int, error) {
			switch b[0].Partition {
			case "a":
				// Still running when the other worker's fourth failure in
				// a row halts the pass and it skips x: succeed only then.
				synctest.Wait()
				return len(b), nil
			case "x":
				mu.Lock()
				for _, r := range b {
					order = append(order, r.TransactionID)
				}
				mu.Unlock()
				return len(b), nil
			}
			mu.Lock()
			defer mu.Unlock()
			if fail {
				return 0, down
			}
			return len(b), nil
		}
		if _, err := s.Replay(context.Background(), fn); !errors.Is(err, down) {
			t.Fatalf("first pass: %v", err)
		}
		mu.Lock()
		fail = false
		mu.Unlock()
		if _, err := s.Replay(context.Background(), fn); err != nil {
			t.Fatalf("second pass: %v", err)
		}
		want := []string{all[5].TransactionID, all[6].TransactionID}
		if !slices.Equal(order, want) {
			t.Fatalf("partition x offered %v, want %v", order, want)
		}
		if st := s.Stats(); st.PendingRecords != 0 {
			t.Fatalf("%+v", st)
		}
	})
}
