package queen_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/sqlschema"
)

func TestOpenCloseLeavesNoGoroutines(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.Schema(t)
	pgtest.Pool(t) // the shared pool's goroutines exist before we count
	runtime.GC()
	before := runtime.NumGoroutine()

	ctx := ctxT(t)
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: schema, Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Queue("q").Push(ctx, []queen.Item{{Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Queue("q").Push(ctx, []queen.Item{{}}); !errors.Is(err, queen.ErrClosed) {
		t.Fatalf("push after close: %v, want ErrClosed", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("goroutines: %d before Open, %d after Close\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

func TestConcurrentOpensMigrateOnce(t *testing.T) {
	url := pgtest.URL(t)
	schema := pgtest.Schema(t)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make([]error, 10)
	clients := make([]*queen.Client, 10)
	for i := range 10 {
		wg.Go(func() {
			clients[i], errs[i] = queen.Open(ctx, queen.Config{DatabaseURL: url, Schema: schema, Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
			continue
		}
		defer clients[i].Close(ctx)
	}
	var n, distinct, max int
	err := pgtest.Pool(t).QueryRow(ctx, "SELECT count(*), count(DISTINCT version), max(version) FROM "+
		pgx.Identifier{schema, "schema_migrations"}.Sanitize()).Scan(&n, &distinct, &max)
	if err != nil {
		t.Fatal(err)
	}
	if n != sqlschema.Latest() || distinct != n || max != sqlschema.Latest() {
		t.Fatalf("version rows: %d (%d distinct, max %d), want each of 1..%d once", n, distinct, max, sqlschema.Latest())
	}
}

func TestOpenSchemaTooNew(t *testing.T) {
	c := open(t)
	_ = c
	ctx := ctxT(t)
	schema := schemaOf(t, c)
	_, err := pgtest.Pool(t).Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "schema_migrations"}.Sanitize()+
		" (version, name, checksum) VALUES ($1, 'from_the_future', 'x')", sqlschema.Latest()+1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = queen.Open(ctx, queen.Config{DatabaseURL: pgtest.URL(t), Schema: schema})
	if !errors.Is(err, queen.ErrSchemaTooNew) {
		t.Fatalf("Open: %v, want ErrSchemaTooNew", err)
	}
}

func TestOpenChangedMigrationIsAnError(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	schema := schemaOf(t, c)
	_, err := pgtest.Pool(t).Exec(ctx, "UPDATE "+pgx.Identifier{schema, "schema_migrations"}.Sanitize()+
		" SET checksum = 'edited' WHERE version = 1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = queen.Open(ctx, queen.Config{DatabaseURL: pgtest.URL(t), Schema: schema})
	if !errors.Is(err, sqlschema.ErrChecksumMismatch) {
		t.Fatalf("Open: %v, want ErrChecksumMismatch", err)
	}
}

func TestOpenValidatesConfig(t *testing.T) {
	ctx := ctxT(t)
	for name, cfg := range map[string]queen.Config{
		"bad schema":      {DatabaseURL: "postgres://x", Schema: "Robert'); DROP"},
		"short key":       {DatabaseURL: "postgres://x", EncryptionKey: []byte("short")},
		"negative shards": {DatabaseURL: "postgres://x", Fusion: queen.FusionConfig{Shards: -1}},
	} {
		if _, err := queen.Open(ctx, cfg); err == nil {
			t.Errorf("%s: Open succeeded", name)
		}
	}
	if _, err := queen.Open(ctx, queen.Config{DatabaseURL: "postgres://x", Schema: "Bad-Name"}); !errors.Is(err, queen.ErrInvalidName) {
		t.Errorf("bad schema: %v, want ErrInvalidName", err)
	}
}

func TestCallerPoolIsNotClosed(t *testing.T) {
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := queen.Open(ctx, queen.Config{Pool: pool, Schema: pgtest.Schema(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("caller's pool unusable after Close: %v", err)
	}
}

// Two schemas in one database are independent: a push to one is invisible
// in the other.
func TestSchemasAreIndependent(t *testing.T) {
	a, b := open(t), open(t)
	ctx := ctxT(t)
	if _, err := a.Queue("orders").Push(ctx, []queen.Item{{Data: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, b, "segments"); n != 0 {
		t.Fatalf("schema b has %d segments", n)
	}
	if n := countRows(t, a, "segments"); n != 1 {
		t.Fatalf("schema a has %d segments, want 1", n)
	}
}

func schemaOf(t testing.TB, c *queen.Client) string {
	t.Helper()
	return c.Schema()
}

func countRows(t testing.TB, c *queen.Client, table string) int {
	t.Helper()
	var n int
	if err := c.Pool().QueryRow(context.Background(), "SELECT count(*) FROM "+
		pgx.Identifier{c.Schema(), table}.Sanitize()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
