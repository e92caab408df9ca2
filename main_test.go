package queen_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// TestMain runs the package's tests and Examples against one throwaway
// cluster and fails the binary if any goroutine outlives them.
func TestMain(m *testing.M) {
	flag.Parse()
	if err := pgtest.SkipExamplesWithoutDatabase(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := pgtest.Run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// open returns a client on a fresh schema, closed when the test ends.
func open(t testing.TB, mod ...func(*queen.Config)) *queen.Client {
	t.Helper()
	cfg := queen.Config{
		DatabaseURL: pgtest.URL(t),
		Schema:      pgtest.Schema(t),
		Logger:      pgtest.Logger(t),
		SpoolDir:    t.TempDir(),
		// With QUEEN_TEST_DATABASE_URL at a Citus coordinator: the suite on
		// the distributed layout (DESIGN.md, "On Citus", lists what fails).
		Citus: onLayout(),
	}
	for _, f := range mod {
		f(&cfg)
	}
	if cfg.DatabaseURL != pgtest.URL(t) {
		cfg.Citus = false // a test's own cluster: PostgreSQL
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := queen.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// onLayout reports whether the suite runs on the Citus distributed layout
// (QUEEN_TEST_CITUS_DISTRIBUTE with QUEEN_TEST_DATABASE_URL at a
// coordinator).
func onLayout() bool { return os.Getenv("QUEEN_TEST_CITUS_DISTRIBUTE") != "" }

// skipOnLayout skips a test that asserts a PostgreSQL-only detail (a
// statement count, a lock shape, SQL of its own that Citus rejects) on the
// distributed layout; DESIGN.md, "On Citus", lists them.
func skipOnLayout(t testing.TB, why string) {
	t.Helper()
	if onLayout() {
		t.Skip("on the Citus layout: " + why)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// tracedPool is a pool on the test's database whose connections report
// every statement to tr. It closes after the test's client (a cleanup
// registered before the client's runs after it).
func tracedPool(t *testing.T, tr pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
