// Package pgtest gives tests a PostgreSQL database: QUEEN_TEST_DATABASE_URL
// when set, otherwise one throwaway cluster per test binary, started on
// first use and torn down by Run. Tests isolate themselves with a fresh
// schema from Schema; fault tests get a dedicated cluster from NewCluster.
//
// Without a database URL or PostgreSQL binaries, tests are skipped, except
// when CI=true, where they fail so a missing server cannot pass silently.
//
// Use it from TestMain, or the shared cluster's files are left in /tmp:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/internal/pgcluster"
)

// EnvURL names the environment variable holding an existing database to
// test against instead of a throwaway cluster.
const EnvURL = "QUEEN_TEST_DATABASE_URL"

// EnvFsync set to "on" starts the shared cluster with fsync on, as the
// benchmarks need; ordinary test runs leave it off.
const EnvFsync = "QUEEN_TEST_FSYNC"

const (
	poolMaxConns = 20
	startTimeout = 2 * time.Minute
)

// shared is the per-binary database. A mutex rather than sync.Once: the
// first caller starts the cluster while others wait, the outcome
// (including failure) is remembered, and Run can read it safely.
var shared struct {
	mu      sync.Mutex
	tried   bool
	url     string
	cluster *pgcluster.Cluster
	err     error

	poolTried bool
	pool      *pgxpool.Pool
	poolErr   error

	atExit []func()
}

// Run runs the tests, then closes the shared pool and cluster (if any
// were started) and returns the exit code for os.Exit.
func Run(m *testing.M) int {
	code := m.Run()
	shared.mu.Lock()
	atExit := shared.atExit
	shared.atExit = nil
	shared.mu.Unlock()
	// Before the cluster goes: these clean up in it.
	for _, f := range atExit {
		f()
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.pool != nil {
		shared.pool.Close()
		shared.pool = nil
	}
	if c := shared.cluster; c != nil {
		if code != 0 {
			// Failing tests often explain themselves in the server log.
			fmt.Fprintf(os.Stderr, "pgtest: shared cluster log tail:\n%s\n", tail(c.ServerLog(), 40))
		}
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			if code == 0 {
				code = 1
			}
		}
		shared.cluster = nil
	}
	// Later calls fail rather than use a cluster that is gone.
	shared.url, shared.err = "", errors.New("pgtest: used after Run returned")
	shared.poolErr = shared.err
	shared.tried, shared.poolTried = true, true
	return code
}

// URL returns the database URL for this test binary: $QUEEN_TEST_DATABASE_URL,
// or else a shared throwaway cluster's.
func URL(tb testing.TB) string {
	tb.Helper()
	url, err := sharedURL()
	if err != nil {
		unavailable(tb, err)
	}
	return url
}

func sharedURL() (string, error) {
	if u := os.Getenv(EnvURL); u != "" {
		return u, nil
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.tried {
		shared.tried = true
		// Not the test's context: the cluster outlives the first test.
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		// Benchmarks want the durability cost real: QUEEN_TEST_FSYNC=on.
		shared.cluster, shared.err = pgcluster.Start(ctx, pgcluster.Options{Fsync: os.Getenv(EnvFsync) == "on"})
		if shared.err == nil {
			shared.url = shared.cluster.URL
		}
	}
	return shared.url, shared.err
}

// ExampleURL is URL for Examples, which have no testing.TB to skip or
// fail: it returns the error instead.
func ExampleURL() (string, error) { return sharedURL() }

// AtExit registers f to run when the tests are done, before Run stops the
// shared cluster: cleanup for Examples, which have no Cleanup of their own.
func AtExit(f func()) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.atExit = append(shared.atExit, f)
}

// SkipExamplesWithoutDatabase makes the test binary skip its Examples when
// no database can be had, as URL skips tests (Examples cannot skip
// themselves); on CI they run and fail. Call it from TestMain after
// flag.Parse. It starts the shared cluster if it has to look.
func SkipExamplesWithoutDatabase() error {
	_, err := sharedURL()
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

// unavailable skips when PostgreSQL is simply not installed (unless on
// CI) and fails on anything else.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, pgcluster.ErrNoBinaries) || errors.Is(err, pgcluster.ErrNoUser) {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); !ci {
			tb.Skipf("no PostgreSQL: set %s or install the PostgreSQL server: %v", EnvURL, err)
		}
	}
	tb.Fatal(err)
}

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

// Schema returns a fresh schema name for this test in the shared database
// and drops the schema (CASCADE) when the test ends. It does not create
// the schema.
func Schema(tb testing.TB) string {
	tb.Helper()
	pool := Pool(tb)
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails
	// Lower-case hex after a letter prefix: a valid unquoted identifier,
	// 27 bytes, far below the 63-byte limit.
	name := "qt_" + hex.EncodeToString(b[:])
	tb.Cleanup(func() {
		// The test's own context is already cancelled here.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	return name
}

// NewCluster starts a dedicated cluster, e.g. with Fsync for fault tests
// that stop and restart the server, and closes it when the test ends. It
// needs PostgreSQL binaries even when QUEEN_TEST_DATABASE_URL is set.
func NewCluster(tb testing.TB, o pgcluster.Options) *pgcluster.Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := pgcluster.Start(ctx, o)
	if err != nil {
		unavailable(tb, err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("pgtest: cluster log tail:\n%s", tail(c.ServerLog(), 40))
		}
		if err := c.Close(); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// Logger returns a logger writing into the test's output (shown on
// failure or with -v). Records logged after the test's cleanups have run,
// e.g. by a leaked goroutine, are dropped: the testing package panics on
// output after a test completes.
func Logger(tb testing.TB) *slog.Logger {
	w := &testWriter{w: tb.Output()}
	tb.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			// Wall-clock time of day, to line up with the server log.
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.String(slog.TimeKey, a.Value.Time().Format("15:04:05.000"))
			}
			return a
		},
	}))
}

type testWriter struct {
	mu   sync.Mutex
	done bool
	w    io.Writer
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return len(p), nil
	}
	return w.w.Write(p)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
