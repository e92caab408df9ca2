package pgcluster_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/e03140bc/queen/queentest/pgcluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// needBinaries skips without a PostgreSQL installation, except on CI
// where a missing server must not turn the suite silently green.
func needBinaries(t *testing.T) {
	t.Helper()
	if _, err := pgcluster.FindBinaries(); err != nil {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

func TestFindBinariesHere(t *testing.T) {
	needBinaries(t)
	dir, _ := pgcluster.FindBinaries()
	for _, n := range []string{"pg_ctl", "initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			t.Errorf("FindBinaries() = %q: %v", dir, err)
		}
	}
	// This machine's layout: Debian's PostgreSQL 15.
	const deb = "/usr/lib/postgresql/15/bin"
	if _, err := os.Stat(deb); err == nil && dir != deb {
		t.Logf("FindBinaries() = %q (PATH has a server), not %q", dir, deb)
	}
	t.Logf("FindBinaries() = %q", dir)
}

func queryInt(t *testing.T, url, sql string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func show(t *testing.T, url, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func exec(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestLifecycle(t *testing.T) {
	needBinaries(t)
	ctx := t.Context()
	var log strings.Builder
	t0 := time.Now()
	c, err := pgcluster.Start(ctx, pgcluster.Options{
		Settings: map[string]string{"work_mem": "8MB"},
		Log:      &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Start took %v", time.Since(t0))
	defer c.Close()

	if got := queryInt(t, c.URL, "SELECT 1"); got != 1 {
		t.Fatalf("SELECT 1 = %d", got)
	}
	for name, want := range map[string]string{
		"work_mem":           "8MB",
		"fsync":              "off",
		"full_page_writes":   "off",
		"synchronous_commit": "on",
		"max_connections":    "200",
		"server_encoding":    "UTF8",
	} {
		if got := show(t, c.URL, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	sock := filepath.Join(c.SocketDir, ".s.PGSQL."+strconv.Itoa(c.Port))
	if _, err := os.Stat(sock); err != nil {
		t.Errorf("unix socket: %v", err)
	}
	if len(sock) > 100 {
		t.Errorf("socket path %q is %d bytes, too long for sun_path", sock, len(sock))
	}

	// A committed row must survive a crash-like stop and restart.
	exec(t, c.URL, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
	if err := c.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop("immediate"); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	t0 = time.Now()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart after immediate stop took %v", time.Since(t0))
	if got := queryInt(t, c.URL, "SELECT count(*) FROM t"); got != 1 {
		t.Fatalf("rows after restart = %d, want 1", got)
	}
	if err := c.Start(ctx); err == nil {
		t.Error("Start on a running cluster succeeded")
	}
	if !strings.Contains(c.ServerLog(), "database system is ready") {
		t.Errorf("server log lacks readiness line:\n%s", c.ServerLog())
	}
	if !strings.Contains(log.String(), "initdb") {
		t.Errorf("Options.Log got no initdb line:\n%s", log.String())
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.DataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir after Close: %v", err)
	}
	if _, err := os.Stat(c.SocketDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket dir after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := c.Start(ctx); !errors.Is(err, pgcluster.ErrClosed) {
		t.Errorf("Start after Close = %v, want ErrClosed", err)
	}
}

func TestStartFailureReportsServerLog(t *testing.T) {
	needBinaries(t)
	c, err := pgcluster.Start(t.Context(), pgcluster.Options{
		Settings: map[string]string{"shared_buffers": "plenty"},
	})
	if err == nil {
		c.Close()
		t.Fatal("Start with a bad setting succeeded")
	}
	if !strings.Contains(err.Error(), `invalid value for parameter "shared_buffers"`) {
		t.Fatalf("error lacks the server log: %v", err)
	}
}

func TestStopBadMode(t *testing.T) {
	var c pgcluster.Cluster
	if err := c.Stop("smart"); err == nil {
		t.Fatal("Stop(smart) succeeded")
	}
}

// TestProductionProfileApplies: a cluster started with Production runs with
// the production-like settings, crash-safe I/O included.
func TestProductionProfileApplies(t *testing.T) {
	needBinaries(t)
	c, err := pgcluster.Start(t.Context(), pgcluster.Production())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, want := range map[string]string{
		"shared_buffers": "512MB", "wal_buffers": "16MB", "max_wal_size": "4GB", "min_wal_size": "512MB",
		"checkpoint_timeout": "15min", "fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
	} {
		if got := show(t, c.URL, name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}
