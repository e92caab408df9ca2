package sqlschema_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/sqlschema"
)

// On plain PostgreSQL, Distribute refuses and changes nothing; Distributed
// says no. (On Citus: TestOnCitus in the root package.)
func TestDistributeWithoutCitus(t *testing.T) {
	pool, schema := pgtest.Migrated(t)
	ctx := t.Context()
	if err := sqlschema.Distribute(ctx, pool, schema); !errors.Is(err, sqlschema.ErrNoCitus) {
		t.Fatalf("Distribute = %v, want ErrNoCitus", err)
	}
	if ok, err := sqlschema.Distributed(ctx, pool, schema); ok || err != nil {
		t.Fatalf("Distributed = %v, %v; want false", ok, err)
	}
	var unique bool
	if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'partitions_queue_name_key' AND connamespace = $1::regnamespace)",
		schema).Scan(&unique); err != nil || !unique {
		t.Fatalf("partitions' unique (queue_id, name) after a refused Distribute: %v, %v", unique, err)
	}
}

// On Citus ($QUEEN_TEST_CITUS_URL): a schema distributed by an earlier
// release, which left its rows in the coordinator's tables besides the
// shards, has them truncated by the next Distribute (relayout), its rows
// still read from the shards.
func TestDistributeTruncatesRowsLeftOnTheCoordinator(t *testing.T) {
	url := os.Getenv("QUEEN_TEST_CITUS_URL")
	if url == "" {
		t.Skip("QUEEN_TEST_CITUS_URL not set (internal/citus/cluster.sh start DIR prints one)")
	}
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("qs_trunc_%d", time.Now().UnixNano())
	defer func() {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	}()
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	if _, err := pool.Exec(ctx, "INSERT INTO "+tbl("queues")+" (tenant, name) VALUES (gen_random_uuid(), 'q')"); err != nil {
		t.Fatal(err)
	}
	// The earlier release's conversion: no truncation.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, q := range sqlschema.DistributeSQL(schema) {
			if strings.Contains(q, "truncate_local_data") {
				continue
			}
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	size := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, "SELECT pg_relation_size($1::regclass)", tbl("queues")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if size() == 0 {
		t.Fatal("the earlier conversion left no rows behind: nothing to test")
	}
	if err := sqlschema.Distribute(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	if n := size(); n != 0 {
		t.Errorf("queues: %d bytes left in the coordinator's table after Distribute", n)
	}
	var names []string
	rows, _ := pool.Query(ctx, "SELECT name FROM "+tbl("queues"))
	if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil || len(names) != 1 {
		t.Fatalf("queues after Distribute: %v, %v; want q", names, err)
	}
}
