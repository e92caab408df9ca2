package alloc_test

import (
	"context"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/alloc"
	"github.com/e03140bc/queen/internal/pgtest"
)

// A bundle binds and reads the same under the exec modes that describe the
// statement first (so its parameter types are known), which a user's pool
// may have: binary arguments and verdicts, duplicates (array columns)
// included. (The modes without a describe cannot bind the tenants' uuid[]
// from [16]byte values.)
func TestBundleExecModes(t *testing.T) {
	ctx, pool, sql := setup(t)
	tenant := uuid.Must(uuid.NewV4())
	if _, err := pool.Exec(ctx, "INSERT INTO "+sql.Schema+".queues (tenant, name, dedup_window_ms) VALUES ($1, 'dedup', 60000)", tenant); err != nil {
		t.Fatal(err)
	}
	hash := func(b byte) []byte {
		h := make([]byte, 16)
		h[0], h[15] = b, b
		return h
	}
	modes := map[string]pgx.QueryExecMode{
		"cache_statement": pgx.QueryExecModeCacheStatement,
		"cache_describe":  pgx.QueryExecModeCacheDescribe,
		"describe_exec":   pgx.QueryExecModeDescribeExec,
	}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = mode
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var b alloc.Bundle
			first := &alloc.Segment{Tenant: tenant, Queue: "dedup", Partition: name, Count: 2,
				Hashes: append(hash(1), hash(2)...), Blob: []byte{0, 'a', '"', '\\', ',', '{'}}
			b.Add(first)
			b.Add(&alloc.Segment{Tenant: tenant, Queue: "dedup", Partition: name + "-keyed", Count: 1,
				Hashes: hash(3), Blob: []byte{0}, Flags: alloc.FlagKeyed, Lanes: 0})
			v, err := b.Push(ctx, p, sql.PushBundle, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(v) != 2 || v[0].Status != alloc.Queued || v[1].Status != alloc.Queued || v[0].BaseOffset != 0 ||
				v[0].PartitionID == 0 || v[0].PartitionID == v[1].PartitionID || v[0].CreatedAt.IsZero() || !v[0].CreatedAt.Equal(v[1].CreatedAt) {
				t.Fatalf("verdicts %+v", v)
			}
			var blob []byte
			if err := pool.QueryRow(ctx, "SELECT blob FROM "+sql.Schema+".segments WHERE partition_id = $1", v[0].PartitionID).Scan(&blob); err != nil || string(blob) != string(first.Blob) {
				t.Fatalf("stored blob %q (%v), want %q", blob, err, first.Blob)
			}
			// The second hash again, after a new one: a duplicate of offset 1.
			b.Reset()
			b.Add(&alloc.Segment{Tenant: tenant, Queue: "dedup", Partition: name, Count: 2,
				Hashes: append(hash(4), hash(2)...), Blob: []byte{0}})
			d, err := b.Push(ctx, p, sql.PushBundle, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(d) != 1 || d[0].Status != alloc.Duplicate || len(d[0].DupIdx) != 1 || d[0].DupIdx[0] != 1 || d[0].DupOff[0] != 1 {
				t.Fatalf("duplicate verdict %+v", d)
			}
		})
	}
}

// Verdicts come back in the location the pool's type map scans timestamps
// in, as pgx would give them.
func TestBundleScanLocation(t *testing.T) {
	ctx, _, sql := setup(t)
	loc := time.FixedZone("UTC+5:30", 5*3600+1800)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		c.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID, Codec: &pgtype.TimestamptzCodec{ScanLocation: loc}})
		return nil
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var b alloc.Bundle
	b.Add(seg("q", "a", 1))
	v, err := b.Push(ctx, p, sql.PushBundle, nil)
	if err != nil || len(v) != 1 || v[0].CreatedAt.Location() != loc {
		t.Fatalf("verdicts %+v (%v); want created_at in %v", v, err, loc)
	}
}
