package sqlschema_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// claim_end: a claim from start takes max offsets not skipped, each
// skipped offset inside the range widening it by one, never past limit.
func TestClaimEnd(t *testing.T) {
	ctx, pool, schema := migrated(t)
	q := "SELECT " + pgx.Identifier{schema}.Sanitize() + ".claim_end($1, $2, $3, $4)"
	for _, c := range []struct {
		start   int64
		max     int32
		skip    []int64
		limit   int64
		want    int64
		comment string
	}{
		{0, 10, nil, 1000, 9, "nothing skipped"},
		{5, 3, []int64{}, 1000, 7, "empty"},
		{0, 3, []int64{1, 2}, 1000, 4, "skipped inside the range widen it"},
		{0, 3, []int64{1, 2, 4, 5}, 1000, 6, "and the widened part too"},
		{10, 3, []int64{1, 2, 3}, 1000, 12, "skipped below start do not count"},
		{0, 3, []int64{3, 4, 50}, 1000, 2, "beyond the range do not count"},
		{0, 3, []int64{1, 2, 3, 4, 5, 6}, 5, 5, "at most limit"},
		{0, 10, nil, 4, 4, "limit below the batch"},
	} {
		var got int64
		if err := pool.QueryRow(ctx, q, c.start, c.max, c.skip, c.limit).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("claim_end(%d, %d, %v, %d) = %d, want %d (%s)", c.start, c.max, c.skip, c.limit, got, c.want, c.comment)
		}
	}
}

// waits_live and head_waits: the waits that hold at now, above the
// cursor and not settled; whether the first offset a claim would start
// at (past the settled run) is one of them.
func TestWaitsLive(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	later, earlier := now.Add(time.Minute), now.Add(-time.Minute)
	offs := []int64{3, 5, 7, 9}
	at := []time.Time{later, earlier, later, later}
	for _, c := range []struct {
		comm    int64
		settled []int64
		want    []int64
		head    bool
	}{
		{-1, nil, []int64{3, 7, 9}, false},
		{2, nil, []int64{3, 7, 9}, true},
		{3, nil, []int64{7, 9}, false},
		{5, []int64{7}, []int64{9}, false},
		{4, []int64{6}, []int64{7, 9}, false},
		{6, nil, []int64{7, 9}, true},
		{5, []int64{6}, []int64{7, 9}, true},
		{9, nil, nil, false},
	} {
		var got []int64
		var gotAt []time.Time
		var head bool
		if err := pool.QueryRow(ctx, "SELECT "+s+".waits_live($1, $2, $3, $4, $5), "+s+".waits_live_at($1, $2, $3, $4, $5), "+
			s+".head_waits($1, $2, $3, $4, $5)", offs, at, c.comm, c.settled, now).Scan(&got, &gotAt, &head); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) || len(gotAt) != len(got) || head != c.head {
			t.Errorf("cursor %d, settled %v: waits %v at %v, head %v; want %v, head %v", c.comm, c.settled, got, gotAt, head,
				c.want, c.head)
		}
	}
	var none []int64
	var head bool
	if err := pool.QueryRow(ctx, "SELECT "+s+".waits_live(NULL, NULL, 0, NULL, $1), "+s+".head_waits(NULL, NULL, 0, NULL, $1)",
		now).Scan(&none, &head); err != nil || none != nil || head {
		t.Fatalf("no waits: %v, %v, %v", none, head, err)
	}
}
