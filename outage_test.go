package queen_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgcluster"
	"github.com/e03140bc/queen/internal/pgtest"
)

// gatedPool is a pool on url whose new connections hang (until their
// context ends) while hang is set: a host that has become unreachable.
func gatedPool(t *testing.T, url string, hang *atomic.Bool) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if hang.Load() {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-release:
				return nil, errors.New("test over")
			}
		}
		return d.DialContext(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the client registered after this
	// closes first, then hung dials are released, then the pool closes.
	t.Cleanup(pool.Close)
	t.Cleanup(func() { close(release) })
	return pool
}

// pushTimed runs Push with a context that has no deadline and fails the
// test if it has not returned after limit.
func pushTimed(t *testing.T, q *queen.Queue, limit time.Duration, items ...queen.Item) ([]queen.PushResult, error, time.Duration) {
	t.Helper()
	type out struct {
		res []queen.PushResult
		err error
	}
	ch := make(chan out, 1)
	start := time.Now()
	go func() {
		res, err := q.Push(context.Background(), items)
		ch <- out{res, err}
	}()
	select {
	case o := <-ch:
		return o.res, o.err, time.Since(start)
	case <-time.After(limit):
		t.Fatalf("Push to %q still blocked after %s", q.Name(), limit)
		return nil, nil, 0
	}
}

// spoolHolds reports whether any file under dir contains b.
func spoolHolds(t *testing.T, dir string, b []byte) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(data, b) {
			found = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// During an outage every push is Buffered within StatementTimeout (plus
// the spool's own write): to a queue whose cached settings expired and to
// a queue this client never saw, whether the server refuses connections or
// connection attempts hang. Nothing it spools is plaintext (the client has
// a key), and after the outage the plain queue's messages are stored as
// plaintext.
func TestPushDuringOutageBuffersWithinStatementTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	const timeout = 2 * time.Second
	bound := timeout + time.Second // the spool's fsync on a busy machine
	cl := pgtest.NewCluster(t, pgcluster.Options{})
	var hang atomic.Bool
	pool := gatedPool(t, cl.URL, &hang)
	spoolDir := t.TempDir()
	c := open(t, func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema, cfg.Pool, cfg.SpoolDir = "", "outage", pool, spoolDir
		cfg.StatementTimeout, cfg.EncryptionKey = timeout, make([]byte, 32)
	})
	ctx := ctxT(t)
	seen := c.Queue("seen")
	push(t, seen, queen.Item{Partition: "seen", Data: []byte("before")})

	if err := cl.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	var want []string
	check := func(phase string, q *queen.Queue, data string) {
		t.Helper()
		queen.ExpireQueueMeta(c)
		res, err, took := pushTimed(t, q, 5*bound, queen.Item{Partition: q.Name(), Data: []byte(data)})
		if err != nil {
			t.Fatalf("%s: push to %q: %v (after %s)", phase, q.Name(), err, took)
		}
		if res[0].Status != queen.Buffered {
			t.Fatalf("%s: push to %q: %+v, want Buffered", phase, q.Name(), res[0])
		}
		if took > bound {
			t.Fatalf("%s: push to %q took %s, want at most %s", phase, q.Name(), took, bound)
		}
		if spoolHolds(t, spoolDir, []byte(data)) {
			t.Fatalf("%s: the spool holds %q in plaintext", phase, data)
		}
		want = append(want, data)
	}
	check("refused", seen, "refused-seen-payload")
	check("refused", c.Queue("never"), "refused-never-payload")
	hang.Store(true)
	check("hanging", seen, "hanging-seen-payload")
	check("hanging", c.Queue("never2"), "hanging-never2-payload")

	hang.Store(false)
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the spool to drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	got := map[string]bool{}
	for _, name := range []string{"seen", "never", "never2"} {
		for _, f := range storedFrames(t, c, name) {
			if f.Flags != 0 {
				t.Fatalf("queue %q holds a frame with flags %#x; it is not encrypted", name, f.Flags)
			}
			got[string(f.Payload)] = true
		}
	}
	for _, d := range want {
		if !got[d] {
			t.Fatalf("%q was not stored after the outage (stored %v)", d, got)
		}
	}
}
