// Package pgtest gives this module's tests a PostgreSQL database: the
// database and cluster handling of package queentest (URL, Schema,
// NewCluster, Logger, Run), plus a pool shared by the test binary.
//
// Use it from TestMain, so the test binary shares one cluster:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
package pgtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/queentest"
	"github.com/e03140bc/queen/queentest/pgcluster"
	"github.com/e03140bc/queen/sqlschema"
)

// EnvURL names the environment variable holding an existing database to
// test against instead of a throwaway cluster.
const EnvURL = queentest.EnvURL

// EnvFsync set to "on" starts the shared cluster with fsync on, as the
// benchmarks need; ordinary test runs leave it off.
const EnvFsync = queentest.EnvFsync

const poolMaxConns = 20

var shared struct {
	mu        sync.Mutex
	poolTried bool
	pool      *pgxpool.Pool
	poolErr   error
}

// Run runs the tests with queentest.Run (which removes the shared cluster),
// closes the shared pool and returns the exit code for os.Exit.
func Run(m *testing.M) int {
	code := queentest.Run(m)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.pool != nil {
		shared.pool.Close()
		shared.pool = nil
	}
	shared.poolErr, shared.poolTried = errors.New("pgtest: used after Run returned"), true
	return code
}

// URL returns the database URL for this test binary; see queentest.URL.
func URL(tb testing.TB) string {
	tb.Helper()
	return queentest.URL(tb)
}

// ExampleURL is URL for Examples, which have no testing.TB to skip or
// fail: it returns the error instead; see queentest.SharedURL.
func ExampleURL() (string, error) { return queentest.SharedURL() }

// AtExit registers f to run when the tests are done, before Run stops the
// shared cluster: cleanup for Examples; see queentest.AtExit.
func AtExit(f func()) { queentest.AtExit(f) }

// SkipExamplesWithoutDatabase makes the test binary skip its Examples when
// no database can be had, as URL skips tests (Examples cannot skip
// themselves); on CI they run and fail. Call it from TestMain after
// flag.Parse. It starts nothing: a test binary re-executed as a child
// process must not pay for a cluster it never uses.
func SkipExamplesWithoutDatabase() error {
	if os.Getenv(EnvURL) != "" {
		return nil
	}
	err := pgcluster.Available()
	if err == nil || !(errors.Is(err, pgcluster.ErrNoBinaries) || errors.Is(err, pgcluster.ErrNoUser)) {
		return nil
	}
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		return nil
	}
	skip := "^Example"
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
		skip = f.Value.String() + "|" + skip
	}
	return flag.Set("test.skip", skip)
}

// Schema returns a fresh schema name, dropped when the test ends; see
// queentest.Schema.
func Schema(tb testing.TB) string {
	tb.Helper()
	return queentest.Schema(tb)
}

// NewCluster starts a dedicated cluster closed when the test ends; see
// queentest.NewCluster.
func NewCluster(tb testing.TB, o pgcluster.Options) *pgcluster.Cluster {
	tb.Helper()
	return queentest.NewCluster(tb, o)
}

// Logger returns a logger writing into the test's output; see
// queentest.Logger.
func Logger(tb testing.TB) *slog.Logger { return queentest.Logger(tb) }

// Pool returns the pool shared by the test binary (MaxConns 20). Do not
// close it; Run does.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := URL(tb)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.poolTried {
		shared.poolTried = true
		shared.pool, shared.poolErr = newPool(url)
	}
	if shared.poolErr != nil {
		tb.Fatal(shared.poolErr)
	}
	return shared.pool
}

// Migrated returns the shared pool (see Pool) and a fresh schema (see
// Schema) with every migration and the function layer applied: for tests
// of the SQL beneath the client.
func Migrated(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	pool, schema := Pool(tb), Schema(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := sqlschema.Migrate(ctx, pool, schema); err != nil {
		tb.Fatal(err)
	}
	return pool, schema
}

func newPool(url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	cfg.MaxConns = poolMaxConns
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	// Fail here, once, rather than in every test's first query.
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("pgtest: ping %s: %w", cfg.ConnConfig.Host, err)
	}
	return p, nil
}
