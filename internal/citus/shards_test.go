package citus_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/internal/citus"
	"github.com/e03140bc/queen/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func values() []int64 {
	vs := []int64{0, 1, -1, 2, 42, math.MaxInt32, math.MinInt32, math.MaxInt32 + 1, math.MaxInt64, math.MinInt64, 1 << 40, -(1 << 40)}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		vs = append(vs, r.Int64N(1<<20), int64(r.Uint64()))
	}
	return vs
}

// HashInt8 is PostgreSQL's own hashint8, bit for bit (no Citus needed).
func TestHashInt8MatchesPostgres(t *testing.T) {
	vs := values()
	var want []int32
	if err := pgtest.Pool(t).QueryRow(ctxT(t), "SELECT array_agg(hashint8(v) ORDER BY o) FROM unnest($1::bigint[]) WITH ORDINALITY AS u(v, o)",
		vs).Scan(&want); err != nil {
		t.Fatal(err)
	}
	for i, v := range vs {
		if got := citus.HashInt8(v); got != want[i] {
			t.Fatalf("HashInt8(%d) = %d, PostgreSQL says %d", v, got, want[i])
		}
	}
}

// On a Citus coordinator ($QUEEN_TEST_CITUS_URL, else skipped): Of names
// the shard and worker group Citus routes each id to.
func TestShardsMatchCitus(t *testing.T) {
	url := os.Getenv("QUEEN_TEST_CITUS_URL")
	if url == "" {
		t.Skip("QUEEN_TEST_CITUS_URL not set (internal/citus/cluster.sh start DIR prints one)")
	}
	pool, err := pgxpool.New(ctxT(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close) // after the drop below: cleanups run last first
	schema := pgx.Identifier{"qshards_" + time.Now().Format("150405")}.Sanitize()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
	for _, q := range []string{"CREATE SCHEMA " + schema, "CREATE TABLE " + schema + ".t (id bigint PRIMARY KEY)",
		"SELECT create_distributed_table('" + schema + ".t', 'id')"} {
		if _, err := pool.Exec(ctxT(t), q); err != nil {
			t.Fatal(err)
		}
	}
	shards, err := citus.Load(ctxT(t), pool, schema+".t")
	if err != nil {
		t.Fatal(err)
	}
	vs := values()
	var ids []int64
	var groups []int32
	if err := pool.QueryRow(ctxT(t), `SELECT array_agg(s ORDER BY o), array_agg(g ORDER BY o) FROM (
			SELECT u.o, get_shard_id_for_distribution_column($2::regclass, u.v) AS s
			FROM unnest($1::bigint[]) WITH ORDINALITY AS u(v, o)) x,
			LATERAL (SELECT min(pl.groupid) AS g FROM pg_dist_placement pl WHERE pl.shardid = x.s) y`,
		vs, schema+".t").Scan(&ids, &groups); err != nil {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	for i, v := range vs {
		sh, ok := shards.Of(v)
		if !ok || sh.ID != ids[i] || sh.Group != groups[i] {
			t.Fatalf("Of(%d) = %+v, %v; Citus routes it to shard %d on group %d", v, sh, ok, ids[i], groups[i])
		}
		seen[sh.Group] = true
	}
	if len(seen) < 2 {
		t.Fatalf("ids on %d worker groups, want every worker", len(seen))
	}
}

// PartitionKey is the function layer's partition_key, for both probes,
// names in and beyond ASCII, and queue ids of every size.
func TestPartitionKeyMatchesSQL(t *testing.T) {
	pool, schema := pgtest.Migrated(t)
	type c struct {
		qid   int64
		name  string
		probe int32
	}
	var cs []c
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []string{"", "Default", "lane-7", "p", "ключ", "日本語", "a\tb", "k99999"} {
		for _, q := range []int64{1, 2, 42, math.MaxInt64, r.Int64()} {
			cs = append(cs, c{q, n, 0}, c{q, n, 1})
		}
	}
	for range 500 {
		cs = append(cs, c{r.Int64N(1 << 20), fmt.Sprint("k", r.Uint64()), int32(r.IntN(2))})
	}
	var qids []int64
	var names []string
	var probes []int32
	for _, x := range cs {
		qids, names, probes = append(qids, x.qid), append(names, x.name), append(probes, x.probe)
	}
	var want []int64
	if err := pool.QueryRow(ctxT(t), `SELECT array_agg(`+pgx.Identifier{schema}.Sanitize()+`.partition_key(q, n, p) ORDER BY o)
		FROM unnest($1::bigint[], $2::text[], $3::int4[]) WITH ORDINALITY AS u(q, n, p, o)`, qids, names, probes).Scan(&want); err != nil {
		t.Fatal(err)
	}
	for i, x := range cs {
		got := citus.PartitionKey(x.qid, x.name, x.probe)
		if got != want[i] {
			t.Fatalf("PartitionKey(%d, %q, %d) = %d, partition_key says %d", x.qid, x.name, x.probe, got, want[i])
		}
		if got <= 0 {
			t.Fatalf("PartitionKey(%d, %q, %d) = %d, want positive", x.qid, x.name, x.probe, got)
		}
	}
	if citus.PartitionKey(1, "p", 0) == citus.PartitionKey(1, "p", 1) || citus.PartitionKey(1, "p", 0) == citus.PartitionKey(2, "p", 0) {
		t.Fatal("the probe and the queue id do not change the key")
	}
}
