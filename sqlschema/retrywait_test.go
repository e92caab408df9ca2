package sqlschema_test

import (
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"
)

// retry_wait_ms, the retry backoff schedule: uniform whole milliseconds in
// [min, least(max, min * 2^n)], 0 when disabled.
func TestRetryWaitMs(t *testing.T) {
	ctx, pool, schema := migrated(t)
	q := "SELECT " + pgx.Identifier{schema}.Sanitize() + ".retry_wait_ms($1, $2, $3, $4)"
	wait := func(n int32, lo, hi int64, u float64) int64 {
		t.Helper()
		var got int64
		if err := pool.QueryRow(ctx, q, n, lo, hi, u).Scan(&got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, c := range []struct {
		n       int32
		min     int64
		max     int64
		u       float64
		want    int64
		comment string
	}{
		{1, 1000, 300000, 0, 1000, "u = 0 is Min"},
		{1, 1000, 300000, 0.9999999, 2000, "first failure: at most 2·Min"},
		{2, 1000, 300000, 0.9999999, 4000, "second: 4·Min"},
		{9, 1000, 300000, 0.9999999, 300000, "capped at Max"},
		{1000, 1000, 300000, 0.9999999, 300000, "no overflow"},
		{3, 1000, 300000, 1, 8000, "u = 1 stays in range"},
		{3, 1000, 300000, -1, 1000, "u < 0 is 0"},
		{0, 200, 800, 0.9999999, 400, "n < 1 counts as the first"},
		{5, 0, 0, 0.5, 0, "disabled"},
		{5, 500, 500, 0.5, 500, "Min = Max: fixed"},
		{2, 500, 100, 0.5, 500, "Max < Min: Min"},
	} {
		if got := wait(c.n, c.min, c.max, c.u); got != c.want {
			t.Errorf("retry_wait_ms(%d, %d, %d, %v) = %d, want %d (%s)", c.n, c.min, c.max, c.u, got, c.want, c.comment)
		}
	}
	// Random points: always within [min, least(max, min·2^n)].
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		n := int32(r.IntN(70))
		lo := int64(1 + r.IntN(5000))
		hi := lo + int64(r.IntN(1_000_000))
		u := r.Float64()
		got := wait(n, lo, hi, u)
		top := hi
		if n < 40 && lo<<max(n, 1) < hi {
			top = lo << max(n, 1)
		}
		if got < lo || got > top {
			t.Fatalf("retry_wait_ms(%d, %d, %d, %v) = %d, outside [%d, %d]", n, lo, hi, u, got, lo, top)
		}
	}
}
