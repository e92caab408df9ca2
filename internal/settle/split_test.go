package settle_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/settle"
	"github.com/e03140bc/queen/internal/stmt"
)

// partsQuerier records the partitions of the leases each statement carries
// (the first argument of an ack or settle batch: its partition ids).
type partsQuerier struct {
	q  stmt.Querier
	mu sync.Mutex
	// calls holds, per statement, the lease partitions it was given.
	calls [][]int64
}

func (p *partsQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	var pids []int64
	for _, a := range args {
		if v, ok := a.([]int64); ok {
			pids = slices.Clone(v)
			break
		}
	}
	p.mu.Lock()
	p.calls = append(p.calls, pids)
	p.mu.Unlock()
	return p.q.Query(ctx, sql, args...)
}

// With Config.Worker, a flush whose settlements lie on two workers' partitions
// commits one statement per worker, each holding that worker's partitions
// only, and every op still gets its own verdict: acks applied, an ack under a
// wrong lease lost, a failure applied. Without it, one statement carries all.
func TestSettleSplitByWorker(t *testing.T) {
	const parts, per = 6, 4
	sql, pool, ls := leases(t, parts, per)
	group := map[int64]int32{}
	for i, l := range ls {
		group[l.Partition] = int32(i % 2)
	}
	for _, split := range []bool{false, true} {
		pq := &partsQuerier{q: pool}
		cfg := settle.Config{Pool: pq, SQL: sql, Hold: 50 * time.Millisecond, Timeout: 30 * time.Second}
		if split {
			cfg.Worker = func(pid int64) (int32, bool) { g, ok := group[pid]; return g, ok }
		}
		f := settle.New(context.Background(), cfg)
		// Through offset `through` of each lease: round 0 acks 0, round 1 acks 1.
		round := 0
		if split {
			round = 1
		}
		var ops []settle.Op
		var want []int16
		for i, l := range ls {
			switch {
			case i == 1:
				wrong := l
				wrong.ID = uuid.Must(uuid.NewV4())
				ops = append(ops, settle.Op{Settle: stmt.SettleParams{Lease: wrong, Through: int64(round), At: -1}})
				want = append(want, stmt.SettleLeaseLost)
			case i == 2 && split:
				// Through the offset and letting the lease go: the
				// general statement, beside the acks' one.
				ops = append(ops, settle.Op{Settle: stmt.SettleParams{Lease: l, Through: int64(round), At: -1, Release: true}})
				want = append(want, stmt.SettleApplied)
			default:
				ops = append(ops, settle.Op{Settle: stmt.SettleParams{Lease: l, Through: int64(round), At: -1}})
				want = append(want, stmt.SettleApplied)
			}
		}
		res, err := f.Settle(context.Background(), ops)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Err != nil || r.Status != want[i] {
				t.Errorf("split %v: op %d: %+v, want status %d", split, i, r, want[i])
			}
		}
		if err := f.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		groups := 0
		for _, c := range pq.calls {
			seen := map[int32]bool{}
			for _, pid := range c {
				seen[group[pid]] = true
			}
			if split && len(seen) > 1 {
				t.Errorf("split: a statement carried both workers' partitions: %v", c)
			}
			groups = max(groups, len(seen))
		}
		t.Logf("split %v: %d statements %v", split, len(pq.calls), pq.calls)
		if !split && groups < 2 {
			t.Errorf("unsplit: no statement carried both workers' partitions (%v): the test does not fuse", pq.calls)
		}
	}
}
