package sqlschema_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BenchmarkDedupProbe: dedup_probe on a partition holding a minute's
// window of 100 one-message segments, behind kept segments two hours old
// (retention keeps them, the window does not reach them), for 1 and 10
// incoming hashes that repeat nothing.
//
//	go test -run '^$' -bench DedupProbe ./sqlschema
func BenchmarkDedupProbe(b *testing.B) {
	ctx, pool, schema := migrated(b)
	s := pgx.Identifier{schema}.Sanitize()
	const recent = 100
	for _, kept := range []int{0, 10_000, 100_000} {
		pid := windowPartition(b, ctx, pool, s, int64(kept+recent-1), kept, recent, 100*time.Millisecond)
		if _, err := pool.Exec(ctx, "ANALYZE "+s+".segments"); err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{1, 10} {
			var in []byte
			for i := range n {
				in = append(in, []byte(fmt.Sprintf("absent-hash-%04d", i))...)
			}
			b.Run(fmt.Sprintf("kept=%d/incoming=%d", kept, n), func(b *testing.B) {
				for b.Loop() {
					var idx []int32
					if err := pool.QueryRow(ctx, "SELECT dup_idx FROM "+s+".dedup_probe($1, $2, $3, -1, $4, 0, 60000, now())",
						pid, n, slices.Clone(in), kept+recent-1).Scan(&idx); err != nil {
						b.Fatal(err)
					}
					if idx != nil {
						b.Fatalf("a duplicate of an absent hash: %v", idx)
					}
				}
			})
		}
	}
}

// BenchmarkDedupHits: dedup_hits' search against its join over
// 20,000 stored hashes, as one-message rows and as rows of 100, for
// incoming counts around the probe's cut-over (16), absent hashes.
//
//	go test -run '^$' -bench DedupHits ./sqlschema
func BenchmarkDedupHits(b *testing.B) {
	ctx, pool, schema := migrated(b)
	s := pgx.Identifier{schema}.Sanitize()
	// The stored side lives in a table, as the probe's blob lives in the
	// server: sent as a parameter it would cost more than the match. Read
	// through "|| ''" it is whole in memory, as the probe's is (a stored
	// value is TOASTed, and each slot of the join would fetch its slice).
	if _, err := pool.Exec(ctx, `CREATE TABLE `+s+`.match_bench AS
SELECT per, string_agg((SELECT string_agg(decode(md5((r * per + j)::text), 'hex'), ''::bytea ORDER BY j)
                        FROM generate_series(0, per - 1) j), ''::bytea ORDER BY r) AS blob
FROM (VALUES (1), (100)) p(per), LATERAL generate_series(0, 20000 / per - 1) r
GROUP BY per`); err != nil {
		b.Fatal(err)
	}
	for _, per := range []int{1, 100} {
		for _, n := range []int{1, 8, 16, 32} {
			var in []byte
			for i := range n {
				in = append(in, []byte(fmt.Sprintf("absent-hash-%04d", i))...)
			}
			for _, way := range []struct {
				name    string
				scanMax int
			}{{"search", 1 << 20}, {"join", 0}} {
				b.Run(fmt.Sprintf("rows-of-%d/incoming=%d/%s", per, n, way.name), func(b *testing.B) {
					for b.Loop() {
						var idx []int32
						if err := pool.QueryRow(ctx, "SELECT (m).hit_k FROM (SELECT "+s+".dedup_hits($1, $2, a.blob || ''::bytea, true, $3) AS m FROM "+
							s+".match_bench a WHERE a.per = $4) x", n, in, way.scanMax, per).Scan(&idx); err != nil {
							b.Fatal(err)
						}
						if len(idx) != 0 {
							b.Fatalf("an absent hash found: %v", idx)
						}
					}
				})
			}
		}
	}
}
