package queen_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// gate makes a pool's new connections hang while it is closed, as for a
// host that has become unreachable. Opening it fails the hung attempts at
// once (pgxpool lets a connection attempt outlive the Acquire that started
// it, and would otherwise keep the pool's slots for ConnectTimeout).
type gate struct {
	mu     sync.Mutex
	closed chan struct{} // nil while open
}

func (g *gate) hang() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

func (g *gate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed != nil {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-closed:
			return nil, errors.New("test gate: host was unreachable")
		}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// gatedPool is a pool on url whose connections are dialled through g.
func gatedPool(t *testing.T, url string, g *gate) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = g.dial
	cfg.MaxConns = 64 // hung connection attempts keep their slots until the gate opens
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: the client registered after these
	// closes first, then hung dials are released, then the pool closes.
	t.Cleanup(pool.Close)
	t.Cleanup(g.open)
	return pool
}

// pushTimed runs Push with a context that has no deadline and fails the
// test if it has not returned after limit.
func pushTimed(t *testing.T, q *queen.Queue, limit time.Duration, items ...queen.Item) ([]queen.PushResult, time.Duration, error) {
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
		return o.res, time.Since(start), o.err
	case <-time.After(limit):
		t.Fatalf("Push to %q still blocked after %s", q.Name(), limit)
		return nil, 0, nil
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
// plaintext. A client without a key spools too, to a queue it never saw
// that was not encrypted at its last contact, and fails at once for one
// that was.
func TestPushDuringOutageBuffersWithinStatementTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	const timeout = 2 * time.Second
	bound := timeout + time.Second // the spool's fsync on a busy machine
	cl := pgtest.NewCluster(t, pgcluster.Options{})
	var g gate
	pool := gatedPool(t, cl.URL, &g)
	spoolDir := t.TempDir()
	c := open(t, func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema, cfg.Pool, cfg.SpoolDir = "", "outage", pool, spoolDir
		cfg.StatementTimeout, cfg.EncryptionKey = timeout, make([]byte, 32)
	})
	configure(t, c, "secret", queen.QueueOptions{Encryption: true})
	// A client without a key spools plaintext only for queues it knows
	// are not encrypted.
	noKeyDir := t.TempDir()
	noKey := open(t, func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema, cfg.Pool, cfg.SpoolDir = "", "outage", pool, noKeyDir
		cfg.StatementTimeout = timeout
	})
	t.Cleanup(g.open) // before the clients close, should the test fail mid-outage
	ctx := ctxT(t)
	seen := c.Queue("seen")
	push(t, seen, queen.Item{Partition: "seen", Data: []byte("before")})
	push(t, noKey.Queue("seen"), queen.Item{Partition: "seen", Data: []byte("before, without a key")})

	if err := cl.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	var want []string
	check := func(phase string, q *queen.Queue, data string) {
		t.Helper()
		queen.ExpireQueueMeta(c)
		queen.ExpireQueueMeta(noKey)
		res, took, err := pushTimed(t, q, 5*bound, queen.Item{Partition: q.Name(), Data: []byte(data)})
		if err != nil {
			t.Fatalf("%s: push to %q: %v (after %s)", phase, q.Name(), err, took)
		}
		if res[0].Status != queen.Buffered {
			t.Fatalf("%s: push to %q: %+v, want Buffered", phase, q.Name(), res[0])
		}
		t.Logf("%s: push to %q Buffered after %s", phase, q.Name(), took)
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
	g.hang()
	check("hanging", seen, "hanging-seen-payload")
	check("hanging", c.Queue("never2"), "hanging-never2-payload")
	// Pushes queued behind a partition's flush in flight must not wait for
	// a second timeout: the first push's flush and its settings refresh
	// hang in two connection attempts, then the others arrive.
	queen.ExpireQueueMeta(c)
	hung := pool.Stat().ConstructingConns()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	burst := func(i int) {
		data := fmt.Sprintf("burst-%d", i)
		want = append(want, data)
		wg.Go(func() {
			start := time.Now()
			res, err := seen.Push(context.Background(), []queen.Item{{Partition: "seen", Data: []byte(data)}})
			switch took := time.Since(start); {
			case err != nil:
				errs <- err
			case res[0].Status != queen.Buffered || took > bound:
				errs <- fmt.Errorf("push %d of a burst: %+v after %s; want Buffered within %s", i, res[0], took, bound)
			}
		})
	}
	burst(0)
	waitFor(t, bound, "the first push's two connection attempts", func() bool { return pool.Stat().ConstructingConns() >= hung+2 })
	for i := 1; i < 20; i++ {
		burst(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	res, took, err := pushTimed(t, noKey.Queue("seen"), 5*bound, queen.Item{Partition: "seen", Data: []byte("hanging-seen-without-key")})
	if err != nil || res[0].Status != queen.Buffered || took > bound {
		t.Fatalf("push without a key to a queue known to be plain: %v, %+v after %s; want Buffered within %s", err, res, took, bound)
	}
	want = append(want, "hanging-seen-without-key")
	res, took, err = pushTimed(t, noKey.Queue("never3"), 5*bound, queen.Item{Partition: "never3", Data: []byte("never3-without-key")})
	if err != nil || res[0].Status != queen.Buffered || took > bound {
		t.Fatalf("push without a key to a queue never seen, not encrypted: %v, %+v after %s; want Buffered within %s", err, res, took, bound)
	}
	want = append(want, "never3-without-key")
	res, took, err = pushTimed(t, noKey.Queue("secret"), 5*bound, queen.Item{Partition: "secret", Data: []byte("secret-without-key")})
	if !errors.Is(err, queen.ErrEncryption) || took > bound {
		t.Fatalf("push without a key to an encrypted queue never seen: %v, %+v after %s; want ErrEncryption within %s", err, res, took, bound)
	}
	t.Logf("push without a key to an encrypted queue never seen: %v", err)
	if spoolHolds(t, noKeyDir, []byte("secret-without-key")) {
		t.Fatal("a push that failed was spooled")
	}

	g.open()
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the spools to drain", func() bool {
		return c.SpoolStats().PendingRecords == 0 && noKey.SpoolStats().PendingRecords == 0
	})
	got := map[string]bool{}
	for _, name := range []string{"seen", "never", "never2", "never3"} {
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
