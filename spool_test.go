package queen_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drainAll consumes everything in q with AutoAck and returns the payloads
// by message id.
func drainAll(t testing.TB, q *queen.Queue) map[uuid.UUID]string {
	t.Helper()
	got := map[uuid.UUID]string{}
	for {
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{Batch: 1000, Partitions: 100, AutoAck: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			return got
		}
		for _, m := range msgs {
			if _, dup := got[m.ID]; dup {
				t.Fatalf("message %s delivered twice", m.ID)
			}
			got[m.ID] = string(m.Data)
		}
	}
}

func TestMaintenanceModeSpoolsThenDrains(t *testing.T) {
	c := open(t, func(c *queen.Config) { c.SpoolDir = t.TempDir() })
	other := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema(); cfg.SpoolDir = t.TempDir() })
	ctx := ctxT(t)
	q := withWindow(t, c, "q")
	if err := c.SetMaintenance(ctx, true); err != nil {
		t.Fatal(err)
	}
	res := push(t, q, queen.Item{TransactionID: "a", Data: []byte("A")}, queen.Item{TransactionID: "b", Partition: "p2", Data: []byte("B")})
	for _, r := range res {
		if r.Status != queen.Buffered || r.MessageID == uuid.Nil {
			t.Fatalf("%+v, want Buffered", r)
		}
	}
	if n := countRows(t, c, "segments"); n != 0 {
		t.Fatalf("maintenance push reached PostgreSQL: %d segments", n)
	}
	// Another process follows the schema-wide flag.
	waitFor(t, 5*time.Second, "the other client to see maintenance", other.Maintenance)
	if r := push(t, other.Queue("q"), queen.Item{TransactionID: "c"})[0]; r.Status != queen.Buffered {
		t.Fatalf("other client: %+v", r)
	}
	if st := c.SpoolStats(); st.PendingRecords != 2 {
		t.Fatalf("spool stats %+v", st)
	}
	time.Sleep(1500 * time.Millisecond) // the drain stays paused
	if n := countRows(t, c, "segments"); n != 0 {
		t.Fatalf("drained during maintenance: %d segments", n)
	}
	if err := c.SetMaintenance(ctx, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "both spools to drain", func() bool {
		return c.SpoolStats().PendingRecords == 0 && other.SpoolStats().PendingRecords == 0
	})
	got := drainAll(t, q)
	if len(got) != 3 || got[res[0].MessageID] != "A" || got[res[1].MessageID] != "B" {
		t.Fatalf("consumed %v; want the three spooled messages under their Buffered ids", got)
	}
}

// A bundle blocked by a lock another session holds times out: it is
// spooled, its statement is cancelled on the server and its connection is
// closed rather than reused; the drain stores it once the lock is gone.
func TestStatementTimeoutCancelsAndSpools(t *testing.T) {
	skipOnLayout(t, "its SQL locks partition rows over several shards (FOR UPDATE), which Citus rejects")
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	var pid atomic.Uint32
	cfg.ConnConfig.Tracer = pidTracer{&pid}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := open(t, manual, func(c *queen.Config) {
		c.Pool, c.StatementTimeout, c.SpoolDir = pool, 500*time.Millisecond, t.TempDir()
	})
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("first")})

	blocker, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(ctx)
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT * FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	pid.Store(0)
	r := push(t, q, queen.Item{TransactionID: "blocked", Data: []byte("second")})[0]
	if r.Status != queen.Buffered {
		t.Fatalf("%+v, want Buffered", r)
	}
	timedOut := pid.Load()
	if timedOut == 0 {
		t.Fatal("no bundle was traced")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var state, query, wait string
		// Not in tx: a transaction reads pg_stat_activity from one snapshot
		// taken at its first look, so it would never see the backend go.
		err := pgtest.Pool(t).QueryRow(ctx, "SELECT coalesce(state, ''), left(query, 60), coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1", timedOut).Scan(&state, &query, &wait)
		if errors.Is(err, pgx.ErrNoRows) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d of the timed-out bundle is still there: state %q, wait %q, query %q", timedOut, state, wait, query)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	f := storedFrames(t, c, "Default")
	if len(f) != 2 || f[1].ID != r.MessageID || string(f[1].Payload) != "second" {
		t.Fatalf("stored %d frames", len(f))
	}
}

// pidTracer records the backend of the first push bundle after a reset.
type pidTracer struct{ pid *atomic.Uint32 }

func (p pidTracer) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if containsBundle(d.SQL) {
		p.pid.CompareAndSwap(0, c.PgConn().PID()) // the first since the test reset it
	}
	return ctx
}
func (pidTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// containsBundle tells a push statement: a bundle, or the single segment
// of an isolated push.
func containsBundle(sql string) bool {
	return strings.Contains(sql, "push_bundle") || strings.Contains(sql, "push_segment") ||
		strings.Contains(sql, appendSegmentMark)
}

// Fault test: PostgreSQL stopped in immediate mode and restarted while 50
// goroutines push unique transaction ids into a queue with a dedup window.
// After the drain every item reported Queued or Buffered is consumed exactly
// once, and none reported Queued is missing.
func TestFaultPostgresRestartUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	cl := pgtest.NewCluster(t, pgcluster.Options{Fsync: true})
	ctx := ctxT(t)
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: cl.URL, Schema: "fault", SpoolDir: t.TempDir(),
		Logger: pgtest.Logger(t), StatementTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	q := c.Queue("q")
	if err := q.Configure(ctx, queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		accepted = map[uuid.UUID]queen.PushStatus{}
		stop     atomic.Bool
		wg       sync.WaitGroup
		failed   atomic.Int64
	)
	for g := range 50 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				res, err := q.Push(ctx, []queen.Item{{TransactionID: fmt.Sprintf("g%d-%d", g, i), Partition: fmt.Sprintf("p%d", g%10),
					Data: []byte(fmt.Sprintf("g%d-%d", g, i))}})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				switch res[0].Status {
				case queen.Queued, queen.Buffered:
					accepted[res[0].MessageID] = res[0].Status
				default:
					failed.Add(1)
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	if err := cl.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()
	waitFor(t, 60*time.Second, "the spool to drain", func() bool { return c.SpoolStats().PendingRecords == 0 })

	var buffered int
	for _, s := range accepted {
		if s == queen.Buffered {
			buffered++
		}
	}
	t.Logf("accepted %d (%d buffered), failed %d, spool %+v", len(accepted), buffered, failed.Load(), c.SpoolStats())
	if buffered == 0 {
		t.Fatal("the outage buffered nothing: the test did not exercise the spool")
	}
	got := drainAll(t, q)
	for id, s := range accepted {
		if _, ok := got[id]; !ok {
			t.Fatalf("message %s reported %s is missing", id, s)
		}
	}
	if len(got) != len(accepted) {
		// Anything stored beyond the accepted set was reported Failed.
		t.Logf("%d consumed, %d accepted", len(got), len(accepted))
		if int64(len(got)-len(accepted)) > failed.Load() {
			t.Fatalf("%d consumed, %d accepted, %d failed: duplicates", len(got), len(accepted), failed.Load())
		}
	}
}

// Fault test: maintenance on for a while under load, then off: received
// equals produced, exactly once.
func TestFaultMaintenanceUnderLoad(t *testing.T) {
	c := open(t, func(c *queen.Config) { c.SpoolDir = t.TempDir() })
	ctx := ctxT(t)
	q := withWindow(t, c, "q")
	var (
		mu       sync.Mutex
		produced = map[uuid.UUID]bool{}
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	for g := range 20 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				res, err := q.Push(ctx, []queen.Item{{TransactionID: fmt.Sprintf("g%d-%d", g, i), Partition: fmt.Sprintf("p%d", g%5)}})
				if err != nil {
					t.Error(err)
					return
				}
				if s := res[0].Status; s != queen.Queued && s != queen.Buffered {
					t.Errorf("%+v", res[0])
					return
				}
				mu.Lock()
				produced[res[0].MessageID] = true
				mu.Unlock()
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	if err := c.SetMaintenance(ctx, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := c.SetMaintenance(ctx, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	waitFor(t, 30*time.Second, "the spool to drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	if c.SpoolStats().Appended == 0 {
		t.Fatal("maintenance spooled nothing")
	}
	got := drainAll(t, q)
	if len(got) != len(produced) {
		t.Fatalf("received %d, produced %d", len(got), len(produced))
	}
	for id := range produced {
		if _, ok := got[id]; !ok {
			t.Fatalf("%s missing", id)
		}
	}
}
