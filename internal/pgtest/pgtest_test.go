package pgtest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	if code == 0 && atExit.registered && (!atExit.ran || atExit.err != nil) {
		fmt.Fprintf(os.Stderr, "AtExit: ran %v, database reachable from it: %v\n", atExit.ran, atExit.err)
		code = 1
	}
	// After Run: the shared pool and cluster must be fully shut down.
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

func TestSchemaNamesDistinct(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		s := pgtest.Schema(t)
		if !identifier.MatchString(s) || len(s) > 63 {
			t.Fatalf("Schema() = %q: not a valid unquoted identifier", s)
		}
		if seen[s] {
			t.Fatalf("Schema() repeated %q", s)
		}
		seen[s] = true
	}
}

func TestURLStable(t *testing.T) {
	a, b := pgtest.URL(t), pgtest.URL(t)
	if a != b || !strings.HasPrefix(a, "postgres") {
		t.Fatalf("URL() = %q then %q", a, b)
	}
}

func TestPoolAndSchemaCleanup(t *testing.T) {
	pool := pgtest.Pool(t)
	if pgtest.Pool(t) != pool {
		t.Fatal("Pool() is not shared")
	}
	ctx := t.Context()
	var one int
	if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	if got := pool.Config().MaxConns; got != 20 {
		t.Errorf("MaxConns = %d, want 20", got)
	}

	var name string
	t.Run("uses schema", func(t *testing.T) {
		name = pgtest.Schema(t)
		if _, err := pool.Exec(t.Context(), "CREATE SCHEMA "+name+"; CREATE TABLE "+name+".t (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("schema %s still exists after its test ended", name)
	}
}

func TestNewClusterFsync(t *testing.T) {
	t.Parallel() // overlaps its start-up with the shared cluster's
	c := pgtest.NewCluster(t, pgcluster.Options{Fsync: true})
	if c.URL == pgtest.URL(t) && os.Getenv(pgtest.EnvURL) == "" {
		t.Fatal("dedicated cluster shares the shared cluster's URL")
	}
	ctx := t.Context()
	for name, want := range map[string]string{"fsync": "on", "full_page_writes": "on", "synchronous_commit": "on"} {
		if got := setting(ctx, t, c.URL, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

func setting(ctx context.Context, t *testing.T, url, name string) string {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestLogger(t *testing.T) {
	log := pgtest.Logger(t)
	log.Debug("debug is shown", "k", 1)
	log.Info("info", "group", "x")
}

// atExit records what the function TestAtExit registers saw when Run ran it.
var atExit struct {
	registered, ran bool
	err             error
}

// AtExit functions run after the tests, while the shared database is still
// up (they clean up in it); TestMain checks what this one saw.
func TestAtExit(t *testing.T) {
	atExit.registered = true
	pgtest.URL(t) // start the shared database, as an Example would
	pgtest.AtExit(func() {
		atExit.ran = true
		url, err := pgtest.ExampleURL()
		if err != nil {
			atExit.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			atExit.err = err
			return
		}
		atExit.err = conn.Close(ctx)
	})
	if atExit.ran {
		t.Fatal("AtExit ran its function before the tests were done")
	}
}

// A test binary re-executed as a child process (the fault tests run their
// consumers that way) must not start a cluster of its own just to learn
// whether Examples can run: on a loaded machine that start took the child
// past its parent's deadlines. The child looks for processes of its own
// (a started server is one) before it exits.
func TestSkipExamplesStartsNoCluster(t *testing.T) {
	if os.Getenv("PGTEST_SKIP_CHILD") != "" {
		if err := pgtest.SkipExamplesWithoutDatabase(); err != nil {
			t.Fatal(err)
		}
		if kids := childProcesses(t); len(kids) > 0 {
			t.Fatalf("the child started processes %v: a cluster", kids)
		}
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSkipExamplesStartsNoCluster$")
	cmd.Env = append(os.Environ(), "PGTEST_SKIP_CHILD=1", pgtest.EnvURL+"=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// childProcesses lists the names of this process's live child processes.
func childProcesses(t *testing.T) []string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		for _, pid := range strings.Fields(string(b)) {
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			names = append(names, pid+":"+strings.TrimSpace(string(comm)))
		}
	}
	return names
}
