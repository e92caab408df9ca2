// Package queentest gives tests of code that uses queen a client on a real
// PostgreSQL, and assertions on what a queue holds and how a handler settles
// a message.
//
// The database is $QUEEN_TEST_DATABASE_URL when set. Otherwise it is a
// throwaway cluster started from the locally installed PostgreSQL server
// binaries (see package pgcluster): with Main called from TestMain, one
// cluster for the whole test binary, started on first use and removed when
// the tests end:
//
//	func TestMain(m *testing.M) { queentest.Main(m) }
//
// Without Main, every test that needs a database starts its own cluster and
// removes it when the test ends: nothing is left behind, but each such test
// spends a second or more on initdb. Each Open (and Schema) works in a fresh
// schema dropped when the test ends, so tests sharing a cluster do not see
// each other's queues and may run in parallel.
//
// With neither a URL nor PostgreSQL binaries the tests are skipped, except
// when the environment has CI=true: there they fail, so a missing server
// cannot pass a build silently.
package queentest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// EnvURL names the environment variable holding an existing database to
// test against instead of a throwaway cluster. Each test works in its own
// schema there, dropped when the test ends.
const EnvURL = "QUEEN_TEST_DATABASE_URL"

// EnvFsync set to "on" starts the throwaway clusters with fsync on, as
// benchmarks need; ordinary test runs leave it off, which loses nothing
// unless the machine itself crashes.
const EnvFsync = "QUEEN_TEST_FSYNC"

const startTimeout = 2 * time.Minute

// shared is the per-binary cluster. A mutex rather than sync.Once: the
// first caller starts the cluster while others wait, the outcome
// (including failure) is remembered, and Run can read it safely.
var shared struct {
	mu      sync.Mutex
	inMain  bool // Run is running the tests
	done    bool // Run has returned
	tried   bool
	url     string
	cluster *pgcluster.Cluster
	err     error
	// own is the cluster of each test that needed one outside Main.
	own map[testing.TB]string
	// atExit runs after the tests, before the shared cluster stops.
	atExit []func()
}

// Main runs the tests with Run and exits with its code. Call it from
// TestMain.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run runs the tests, then stops and removes the shared cluster if one was
// started, and returns the exit code for os.Exit. It is Main for a TestMain
// with more to do after the tests (e.g. a goroutine leak check). When tests
// failed, the tail of the cluster's server log goes to stderr.
func Run(m *testing.M) int {
	shared.mu.Lock()
	shared.inMain = true
	shared.mu.Unlock()
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
	shared.inMain, shared.done = false, true
	if c := shared.cluster; c != nil {
		if code != 0 {
			// Failing tests often explain themselves in the server log.
			fmt.Fprintf(os.Stderr, "queentest: shared cluster log tail:\n%s\n", tail(c.ServerLog(), 40))
		}
		if err := c.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "queentest:", err)
			if code == 0 {
				code = 1
			}
		}
		shared.cluster = nil
	}
	// Later calls fail rather than use a cluster that is gone.
	shared.url, shared.err, shared.tried = "", errors.New("queentest: used after Run returned"), true
	return code
}

// URL returns the database URL for tb: $QUEEN_TEST_DATABASE_URL, else the
// shared cluster's (under Main), else that of a cluster started for tb
// alone and removed when tb ends. It skips tb when there is no PostgreSQL
// (fails it when CI=true).
func URL(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv(EnvURL); u != "" {
		return u
	}
	shared.mu.Lock()
	if !shared.inMain && !shared.done {
		u, ok := shared.own[tb]
		shared.mu.Unlock()
		if ok {
			return u
		}
		c := NewCluster(tb, clusterOptions())
		shared.mu.Lock()
		if shared.own == nil {
			shared.own = make(map[testing.TB]string)
		}
		shared.own[tb] = c.URL
		shared.mu.Unlock()
		tb.Cleanup(func() {
			shared.mu.Lock()
			delete(shared.own, tb)
			shared.mu.Unlock()
		})
		return c.URL
	}
	defer shared.mu.Unlock()
	u, err := sharedLocked()
	if err != nil {
		unavailable(tb, err)
	}
	return u
}

// sharedLocked starts the shared cluster once. shared.mu is held.
func sharedLocked() (string, error) {
	if !shared.tried {
		shared.tried = true
		// Not the test's context: the cluster outlives the first test.
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		shared.cluster, shared.err = pgcluster.Start(ctx, clusterOptions())
		if shared.err == nil {
			shared.url = shared.cluster.URL
		}
	}
	return shared.url, shared.err
}

// SharedURL is URL for code without a testing.TB, such as Examples: the
// database of $QUEEN_TEST_DATABASE_URL, else the shared cluster of the test
// binary, which only Main or Run stop: call it from TestMain or while they
// run the tests. It returns an error where URL would skip or fail.
func SharedURL() (string, error) {
	if u := os.Getenv(EnvURL); u != "" {
		return u, nil
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	return sharedLocked()
}

// AtExit registers f to run when Run has run the tests, before it stops the
// shared cluster: cleanup for Examples, which have no Cleanup of their own.
func AtExit(f func()) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.atExit = append(shared.atExit, f)
}

func clusterOptions() pgcluster.Options {
	return pgcluster.Options{Fsync: os.Getenv(EnvFsync) == "on"}
}

// unavailable skips when PostgreSQL is simply not installed (unless on
// CI) and fails on anything else.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, pgcluster.ErrNoBinaries) || errors.Is(err, pgcluster.ErrNoUser) {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); !ci {
			tb.Skipf("queentest: no PostgreSQL: set %s or install the PostgreSQL server: %v", EnvURL, err)
		}
	}
	tb.Fatal(err)
}

// NewCluster starts a cluster for tb alone, e.g. with Fsync for a test
// that stops and restarts the server, and removes it when tb ends. It
// needs PostgreSQL binaries even when QUEEN_TEST_DATABASE_URL is set, and
// skips tb without them (fails it when CI=true).
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
			tb.Logf("queentest: cluster log tail:\n%s", tail(c.ServerLog(), 40))
		}
		if err := c.Close(); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// Schema returns a fresh schema name in the database of URL(tb) and drops
// that schema (CASCADE) when tb ends. It does not create the schema:
// queen.Open does.
func Schema(tb testing.TB) string {
	tb.Helper()
	url := URL(tb)
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails
	// Lower-case hex after a letter prefix: a valid unquoted identifier,
	// 27 bytes, far below the 63-byte limit.
	name := "qt_" + hex.EncodeToString(b[:])
	tb.Cleanup(func() {
		// The test's own context is already cancelled here.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dropSchema(ctx, url, name); err != nil {
			tb.Errorf("queentest: drop schema %s: %v", name, err)
		}
	})
	return name
}

func dropSchema(ctx context.Context, url, name string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	return err
}

// Option changes how Open opens its client.
type Option struct {
	config func(*queen.Config)
}

// WithConfig changes the client's Config after Open filled in its defaults
// (DatabaseURL, Schema, SpoolDir, Logger), e.g. to set an EncryptionKey or
// to connect elsewhere. A Schema set here is not dropped when the test
// ends, and the fresh one is then never created.
func WithConfig(f func(*queen.Config)) Option { return Option{config: f} }

// Open returns a queen client for tb and closes it when tb ends. Its Config
// has DatabaseURL from URL(tb), a fresh Schema from Schema(tb) (dropped
// after the client is closed), SpoolDir tb.TempDir() and a Logger writing
// into the test's output (shown on failure or with -v); opts change it. It
// fails tb if the client does not open or Close returns an error, and
// skips tb when there is no PostgreSQL (fails it when CI=true).
func Open(tb testing.TB, opts ...Option) *queen.Client {
	tb.Helper()
	cfg := queen.Config{
		DatabaseURL: URL(tb),
		Schema:      Schema(tb),
		SpoolDir:    tb.TempDir(),
		Logger:      Logger(tb),
	}
	for _, o := range opts {
		if o.config != nil {
			o.config(&cfg)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := queen.Open(ctx, cfg)
	if err != nil {
		tb.Fatalf("queentest: queen.Open: %v", err)
	}
	// Registered after Schema's: cleanups run last first, so the client is
	// closed before its schema is dropped.
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			tb.Errorf("queentest: Close: %v", err)
		}
	})
	return c
}

// Logger returns a logger writing into tb's output (shown on failure or
// with -v), at Debug level. Records logged after tb's cleanups have run,
// e.g. by a goroutine that outlived the test, are dropped: the testing
// package panics on output after a test completes.
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
