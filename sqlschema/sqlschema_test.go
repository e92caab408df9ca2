package sqlschema_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/sqlschema"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func TestMigrationsAreContiguousAndChecksummed(t *testing.T) {
	ms := sqlschema.Migrations()
	if len(ms) != sqlschema.Latest() || len(ms) == 0 {
		t.Fatalf("%d migrations, Latest %d", len(ms), sqlschema.Latest())
	}
	for i, m := range ms {
		if m.Version != i+1 || len(m.Checksum) != 64 || m.Name == "" {
			t.Fatalf("migration %d: %+v", i, m)
		}
		sql := m.SQL("some_schema")
		if strings.Contains(sql, "{{") || !strings.Contains(sql, `"some_schema".`) {
			t.Fatalf("migration %d not rendered for the schema", m.Version)
		}
	}
}

func TestValidSchema(t *testing.T) {
	for _, ok := range []string{"queen", "q_1", "_x"} {
		if err := sqlschema.ValidSchema(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Queen", "1q", "a-b", "pg_catalog", "x y", strings.Repeat("a", 64), `a";drop`} {
		if err := sqlschema.ValidSchema(bad); !errors.Is(err, sqlschema.ErrInvalidSchema) {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Teams with their own migration tool apply Script's SQL; Migrate then finds
// nothing to do and accepts the result.
func TestScriptMatchesMigrate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	script, err := sqlschema.Script(schema, 0, sqlschema.Latest())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Conn().PgConn().Exec(ctx, script).ReadAll(); err != nil {
		t.Fatal(err)
	}
	applied, err := sqlschema.Migrate(ctx, pool, schema)
	if err != nil || len(applied) != 0 {
		t.Fatalf("Migrate after Script applied %v, %v; want nothing", applied, err)
	}
	if _, err := sqlschema.Script(schema, 2, 1); err == nil {
		t.Fatal("backwards range accepted")
	}
}

// Concurrent Migrate calls on an empty schema apply each version once.
func TestConcurrentMigrate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	var wg sync.WaitGroup
	total := make([]int, 8)
	for i := range total {
		wg.Go(func() {
			applied, err := sqlschema.Migrate(ctx, pool, schema)
			if err != nil {
				t.Error(err)
			}
			total[i] = len(applied)
		})
	}
	wg.Wait()
	sum := 0
	for _, n := range total {
		sum += n
	}
	if sum != sqlschema.Latest() {
		t.Fatalf("applied %d migrations across callers, want %d", sum, sqlschema.Latest())
	}
	vs, err := sqlschema.Version(ctx, pool, schema)
	if err != nil || len(vs) != sqlschema.Latest() {
		t.Fatalf("versions %v %v", vs, err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&n); err != nil || n != sqlschema.Latest() {
		t.Fatalf("%d version rows, %v", n, err)
	}
}
