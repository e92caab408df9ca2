package queen_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/internal/segment"
)

func push(t testing.TB, q *queen.Queue, items ...queen.Item) []queen.PushResult {
	t.Helper()
	res, err := q.Push(ctxT(t), items)
	if err != nil {
		t.Fatalf("Push: %v", err)
	}
	if len(res) != len(items) {
		t.Fatalf("Push returned %d results for %d items", len(res), len(items))
	}
	for i, r := range res {
		if r.Status == queen.Failed {
			t.Fatalf("item %d failed: %v", i, r.Err)
		}
	}
	return res
}

func withWindow(t testing.TB, c *queen.Client, name string) *queen.Queue {
	t.Helper()
	q := c.Queue(name)
	if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return q
}

func TestPushEmptyReturnsEmpty(t *testing.T) {
	c := open(t)
	res, err := c.Queue("q").Push(ctxT(t), nil)
	if err != nil || res == nil || len(res) != 0 {
		t.Fatalf("Push(nil) = %v, %v; want empty, nil", res, err)
	}
	if n := countRows(t, c, "queues"); n != 0 {
		t.Fatalf("an empty push created %d queues", n)
	}
}

func TestPushDefaults(t *testing.T) {
	c := open(t)
	items := make([]queen.Item, 100)
	for i := range items {
		items[i].Data = []byte(fmt.Sprintf(`{"n":%d}`, i))
	}
	res := push(t, c.Queue("q"), items...)
	seen := map[uuid.UUID]bool{}
	for i, r := range res {
		if r.Status != queen.Queued {
			t.Fatalf("item %d: %s", i, r.Status)
		}
		if r.MessageID.Version() != 7 {
			t.Fatalf("item %d: id %s is not UUIDv7", i, r.MessageID)
		}
		if seen[r.MessageID] {
			t.Fatalf("item %d: id %s repeated", i, r.MessageID)
		}
		seen[r.MessageID] = true
		if r.TransactionID != r.MessageID.String() {
			t.Fatalf("item %d: txn %q, want the message id", i, r.TransactionID)
		}
		if r.Partition != "Default" || r.Offset != int64(i) || r.CreatedAt.IsZero() {
			t.Fatalf("item %d: partition %q offset %d created %v", i, r.Partition, r.Offset, r.CreatedAt)
		}
	}
	// The stored frames carry the same ids, transaction ids and payloads.
	frames := storedFrames(t, c, "Default")
	if len(frames) != 100 {
		t.Fatalf("stored %d frames, want 100", len(frames))
	}
	for i, f := range frames {
		if f.ID != res[i].MessageID || f.TransactionID != res[i].TransactionID || !bytes.Equal(f.Payload, items[i].Data) {
			t.Fatalf("frame %d = %s %q %q", i, f.ID, f.TransactionID, f.Payload)
		}
	}
}

// storedFrames unpacks every segment of a partition, in offset order.
func storedFrames(t testing.TB, c *queen.Client, partition string) []frame.Frame {
	t.Helper()
	rows, err := c.Pool().Query(context.Background(), "SELECT s.base_offset, s.end_offset, s.blob FROM "+
		pgx.Identifier{c.Schema(), "segments"}.Sanitize()+" s JOIN "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		" p ON p.id = s.partition_id WHERE p.name = $1 ORDER BY s.base_offset", partition)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []frame.Frame
	for rows.Next() {
		var base, end int64
		var blob []byte
		if err := rows.Scan(&base, &end, &blob); err != nil {
			t.Fatal(err)
		}
		raw, err := segment.Decompress(nil, blob)
		if err != nil {
			t.Fatal(err)
		}
		fs, err := frame.DecodeAll(raw)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(out)) != base || int64(len(fs)) != end-base+1 {
			t.Fatalf("segment [%d,%d] holds %d frames after %d", base, end, len(fs), len(out))
		}
		out = append(out, fs...)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPushLayer1SameTxnInOneCall(t *testing.T) {
	c := open(t)
	res := push(t, c.Queue("q"),
		queen.Item{TransactionID: "t1", Data: []byte("a")},
		queen.Item{TransactionID: "t1", Data: []byte("b")},
		queen.Item{TransactionID: "t1", Data: []byte("c")})
	if res[0].Status != queen.Queued {
		t.Fatalf("leader: %s", res[0].Status)
	}
	for _, r := range res[1:] {
		if r.Status != queen.Duplicate || r.MessageID != res[0].MessageID || r.Offset != -1 {
			t.Fatalf("follower: %+v, want Duplicate of %s", r, res[0].MessageID)
		}
	}
	if f := storedFrames(t, c, "Default"); len(f) != 1 || string(f[0].Payload) != "a" {
		t.Fatalf("stored %d frames, want only the leader", len(f))
	}
}

func TestPushDuplicateInsideWindow(t *testing.T) {
	c := open(t)
	q := withWindow(t, c, "q")
	first := push(t, q, queen.Item{TransactionID: "order-1", Data: []byte("v1")})[0]
	again := push(t, q, queen.Item{TransactionID: "order-1", Data: []byte("v1 again")})[0]
	if again.Status != queen.Duplicate || again.MessageID != first.MessageID {
		t.Fatalf("re-push: %+v, want Duplicate of %s", again, first.MessageID)
	}
	// A follower of a leader that duplicates stored data reports the stored id.
	res := push(t, q, queen.Item{TransactionID: "order-1"}, queen.Item{TransactionID: "order-1"})
	for i, r := range res {
		if r.Status != queen.Duplicate || r.MessageID != first.MessageID {
			t.Fatalf("item %d: %+v, want Duplicate of %s", i, r, first.MessageID)
		}
	}
	if n := len(storedFrames(t, c, "Default")); n != 1 {
		t.Fatalf("stored %d frames, want 1", n)
	}
}

// Part of a segment duplicates stored messages: the duplicates report the
// originals and the rest is stored, gapless and in order.
func TestPushPartialDuplicateSegment(t *testing.T) {
	c := open(t)
	q := withWindow(t, c, "q")
	a := push(t, q, queen.Item{TransactionID: "a"})[0]
	res := push(t, q, queen.Item{TransactionID: "b"}, queen.Item{TransactionID: "a"}, queen.Item{TransactionID: "c"})
	if res[1].Status != queen.Duplicate || res[1].MessageID != a.MessageID {
		t.Fatalf("a again: %+v", res[1])
	}
	if res[0].Status != queen.Queued || res[2].Status != queen.Queued || res[0].Offset != 1 || res[2].Offset != 2 {
		t.Fatalf("b, c: %+v %+v; want Queued at 1 and 2", res[0], res[2])
	}
	var txns []string
	for _, f := range storedFrames(t, c, "Default") {
		txns = append(txns, f.TransactionID)
	}
	if strings.Join(txns, ",") != "a,b,c" {
		t.Fatalf("stored %v", txns)
	}
}

func TestPushSameTxnOnTwoPartitions(t *testing.T) {
	c := open(t)
	q := withWindow(t, c, "q")
	res := push(t, q, queen.Item{TransactionID: "x", Partition: "p1"}, queen.Item{TransactionID: "x", Partition: "p2"})
	for i, r := range res {
		if r.Status != queen.Queued || r.Offset != 0 {
			t.Fatalf("item %d: %+v, want Queued at 0", i, r)
		}
	}
}

func TestPushConcurrentSameTxn(t *testing.T) {
	c := open(t)
	q := withWindow(t, c, "q")
	ctx := ctxT(t)
	res := make([]queen.PushResult, 8)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() {
			r, err := q.Push(ctx, []queen.Item{{TransactionID: "once", Data: []byte{byte(i)}}})
			if err != nil {
				t.Error(err)
				return
			}
			res[i] = r[0]
		})
	}
	wg.Wait()
	var queued []queen.PushResult
	for _, r := range res {
		if r.Status == queen.Queued {
			queued = append(queued, r)
		}
	}
	if len(queued) != 1 {
		t.Fatalf("%d Queued, want exactly 1: %+v", len(queued), res)
	}
	for _, r := range res {
		if r.Status != queen.Queued && (r.Status != queen.Duplicate || r.MessageID != queued[0].MessageID) {
			t.Fatalf("%+v, want Duplicate of %s", r, queued[0].MessageID)
		}
	}
}

// Without a dedup window, repeats in separate flushes are all stored.
func TestPushNoWindowNoCrossCallDedup(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{TransactionID: "same"})
	if r := push(t, q, queen.Item{TransactionID: "same"})[0]; r.Status != queen.Queued || r.Offset != 1 {
		t.Fatalf("second push: %+v, want Queued at 1", r)
	}
}

// A duplicate of a message retention deleted (its hashes kept in a hash
// row, inside the window) has no stored message to name.
func TestPushDuplicateOfRetainedAwayIsZeroID(t *testing.T) {
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{DedupWindow: time.Hour, Retention: time.Minute})
	push(t, q, queen.Item{TransactionID: "gone"})
	ageSegmentsBy(t, c, 2*time.Minute)
	if rep := maintain(t, c); rep.SegmentsDeleted != 1 {
		t.Fatalf("retention deleted %d segments, want 1", rep.SegmentsDeleted)
	}
	r := push(t, q, queen.Item{TransactionID: "gone"})[0]
	if r.Status != queen.Duplicate || r.MessageID != uuid.Nil {
		t.Fatalf("%+v, want Duplicate with the zero UUID", r)
	}
}

// 50 concurrent pushers on one partition, from two clients (two fusion
// engines, so their isolated pushes race for the partition's row in the
// database): offsets are gapless, each pusher sees its own pushes in
// increasing offsets, and created_at never goes back.
func TestPushOffsetsGaplessInCommitOrder(t *testing.T) {
	c := open(t)
	c2 := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	ctx := ctxT(t)
	const pushers, each = 50, 20
	var mu sync.Mutex
	var all []queen.PushResult
	var wg sync.WaitGroup
	for p := range pushers {
		q := []*queen.Queue{c.Queue("q"), c2.Queue("q")}[p%2]
		wg.Go(func() {
			last := int64(-1)
			for i := range each {
				res, err := q.Push(ctx, []queen.Item{{Data: []byte(fmt.Sprintf("%d-%d", p, i))}, {Data: []byte("x")}})
				if err != nil {
					t.Error(err)
					return
				}
				for _, r := range res {
					if r.Status != queen.Queued || r.Offset <= last {
						t.Errorf("pusher %d: %+v after offset %d", p, r, last)
					}
					last = r.Offset
				}
				mu.Lock()
				all = append(all, res...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	sort.Slice(all, func(i, j int) bool { return all[i].Offset < all[j].Offset })
	for i, r := range all {
		if r.Offset != int64(i) {
			t.Fatalf("offset %d at position %d: gap or repeat", r.Offset, i)
		}
		if i > 0 && r.CreatedAt.Before(all[i-1].CreatedAt) {
			t.Fatalf("created_at goes back at offset %d", i)
		}
	}
	if len(all) != pushers*each*2 {
		t.Fatalf("%d results", len(all))
	}
	frames := storedFrames(t, c, "Default")
	for i, f := range frames {
		if f.ID != all[i].MessageID {
			t.Fatalf("offset %d holds %s, push reported %s", i, f.ID, all[i].MessageID)
		}
	}
}

// Under concurrent load over many partitions, one commit carries several
// partitions' segments.
func TestPushBundlesAcrossPartitions(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for g := range 200 {
		wg.Go(func() {
			for i := range 10 {
				if _, err := q.Push(ctx, []queen.Item{{Partition: fmt.Sprintf("p%d", (g+i)%64)}}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	st := c.Stats()
	t.Logf("commits %d, segments %d, items %d", st.Commits, st.Segments, st.Items)
	if st.Items != 2000 || st.Segments <= st.Commits {
		t.Fatalf("stats %+v: want 2000 items and more segments than commits", st)
	}
}

// countingTracer counts the statements that reach PostgreSQL, except the
// background traffic (NOTIFY after a commit, the listener's LISTEN, the
// drain's maintenance-flag read).
type countingTracer struct {
	n   atomic.Int64
	mu  sync.Mutex
	sql []string
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	background := strings.Contains(d.SQL, "pg_notify") || strings.HasPrefix(d.SQL, "LISTEN") ||
		strings.Contains(d.SQL, ".settings") || // the drain re-reads the maintenance flag
		strings.Contains(d.SQL, ".move_scheduled(") // the scheduled-delivery mover's 1 s poll
	if !background {
		c.n.Add(1)
		c.mu.Lock()
		c.sql = append(c.sql, d.SQL)
		c.mu.Unlock()
	}
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// An idle push is dispatched at once (fire-on-idle: a one-minute Hold tick
// would otherwise be waited for) and costs one statement: the bundle.
func TestPushIdleIsOneRoundTrip(t *testing.T) {
	skipOnLayout(t, "a statement count: on the layout the client also reads the queue's settings (its id, to route by worker)")
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := &countingTracer{}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := open(t, manual, func(c *queen.Config) { c.Pool = pool; c.Fusion.Hold = time.Minute })
	q := c.Queue("q")
	push(t, q, queen.Item{}) // creates the queue and caches its options
	before := tr.n.Load()
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := q.Push(pctx, []queen.Item{{Data: []byte("idle")}})
	if err != nil || res[0].Status != queen.Queued {
		t.Fatalf("%v %+v", err, res)
	}
	if n := tr.n.Load() - before; n != 1 {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		t.Fatalf("idle push ran %d statements, want 1: %q", n, tr.sql[len(tr.sql)-int(n):])
	}
}

func TestPushBadInput(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	long := strings.Repeat("x", 256)
	for name, tc := range map[string]struct {
		queue string
		items []queen.Item
		want  error
	}{
		"empty queue":       {"", []queen.Item{{}}, queen.ErrInvalidName},
		"long queue":        {long, []queen.Item{{}}, queen.ErrInvalidName},
		"control queue":     {"a\nb", []queen.Item{{}}, queen.ErrInvalidName},
		"long partition":    {"q", []queen.Item{{}, {Partition: long}}, queen.ErrInvalidName},
		"control partition": {"q", []queen.Item{{Partition: "p\x00"}}, queen.ErrInvalidName},
		"invalid utf8":      {"q", []queen.Item{{Partition: "\xff"}}, queen.ErrInvalidName},
		"long txn":          {"q", []queen.Item{{TransactionID: strings.Repeat("t", queen.MaxTransactionIDLen+1)}}, queen.ErrTooLarge},
		"big payload":       {"q", []queen.Item{{Data: make([]byte, queen.MaxPayloadSize+1)}}, queen.ErrTooLarge},
	} {
		res, err := c.Queue(tc.queue).Push(ctx, tc.items)
		if !errors.Is(err, tc.want) || res != nil {
			t.Errorf("%s: %v, %v; want %v", name, res, err, tc.want)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Queue("q").Push(cancelled, []queen.Item{{}}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	if n := countRows(t, c, "queues"); n != 0 {
		t.Fatalf("bad input created %d queues", n)
	}
}

func TestPushTenantsAreSeparate(t *testing.T) {
	c := open(t)
	other := c.WithTenant(uuid.Must(uuid.NewV4()))
	a := push(t, c.Queue("orders"), queen.Item{Data: []byte("a")})[0]
	b := push(t, other.Queue("orders"), queen.Item{Data: []byte("b")})[0]
	if a.Offset != 0 || b.Offset != 0 {
		t.Fatalf("offsets %d %d: tenants share a partition", a.Offset, b.Offset)
	}
	if n := countRows(t, c, "queues"); n != 2 {
		t.Fatalf("%d queues, want one per tenant", n)
	}
}

func TestPushEncryption(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	c := open(t, func(c *queen.Config) { c.EncryptionKey = key })
	ctx := ctxT(t)
	q := c.Queue("secret")
	if err := q.Configure(ctx, queen.QueueOptions{Encryption: true}); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Data: []byte("plaintext payload")})
	f := storedFrames(t, c, "Default")
	if len(f) != 1 || f[0].Flags&frame.FlagEncrypted == 0 || bytes.Contains(f[0].Payload, []byte("plaintext")) {
		t.Fatalf("stored frame %+v is not encrypted", f)
	}

	// A client without a key refuses to write to the encrypted queue.
	keyless := c.Schema()
	c2 := open(t, func(c *queen.Config) { c.Schema = keyless })
	if _, err := c2.Queue("secret").Push(ctx, []queen.Item{{Data: []byte("x")}}); !errors.Is(err, queen.ErrEncryption) {
		t.Fatalf("keyless push: %v, want ErrEncryption", err)
	}
}

// Encryption switched on after a client cached the queue's options: the
// database rejects the plaintext segment and the client encrypts and resends.
func TestPushEncryptionTurnedOnElsewhere(t *testing.T) {
	key := bytes.Repeat([]byte{9}, 32)
	c := open(t, func(c *queen.Config) { c.EncryptionKey = key })
	ctx := ctxT(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("before")})
	if _, err := c.Pool().Exec(ctx, "UPDATE "+pgx.Identifier{c.Schema(), "queues"}.Sanitize()+" SET encryption = true"); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Data: []byte("after")})
	f := storedFrames(t, c, "Default")
	if len(f) != 2 || f[1].Flags&frame.FlagEncrypted == 0 || bytes.Contains(f[1].Payload, []byte("after")) {
		t.Fatalf("second frame not encrypted: %+v", f)
	}
}

func TestPushNotifiesOtherProcesses(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{"queen_" + c.Schema()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	push(t, c.Queue("orders"), queen.Item{}, queen.Item{Partition: "b"})
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(n.Payload, "/orders") {
		t.Fatalf("payload %q does not name the queue", n.Payload)
	}
}

// slowTracer delays every push bundle, standing in for a slow database.
type slowTracer struct {
	d       time.Duration
	started chan<- struct{} // if set, told (without blocking) when a push statement starts
}

func (s slowTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if containsBundle(d.SQL) {
		select {
		case s.started <- struct{}{}:
		default:
		}
		time.Sleep(s.d)
	}
	return ctx
}
func (slowTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A caller that gives up only stops waiting: the shared transaction is not
// cancelled and commits what it carries. (The push writes two partitions,
// so it is not flushed inline, on its own goroutine, where giving up
// cancels the statement as for an INSERT: see
// TestPushCancelledDuringInlineFlushIsLikeAnInsert.)
func TestPushCancelledCallerStopsWaiting(t *testing.T) {
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 1)
	cfg.ConnConfig.Tracer = slowTracer{300 * time.Millisecond, started}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := open(t, func(c *queen.Config) { c.Pool = pool })
	select { // Open's migration statements name the push functions too
	case <-started:
	default:
	}
	// The caller gives up once its push is in a statement, not after a fixed
	// time: on a loaded machine a fixed time can end before the push was
	// handed over at all.
	short, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-started:
			cancel()
		case <-short.Done():
		}
	}()
	late := []queen.Item{{Data: []byte("late")}, {Partition: "other", Data: []byte("late")}}
	if _, err := c.Queue("q").Push(short, late); !errors.Is(err, context.Canceled) {
		t.Fatalf("Push: %v, want Canceled", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for countRows(t, c, "segments") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the abandoned push never committed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close drains what fusion holds: every push that reported Queued is stored,
// and pushes after Close fail with ErrClosed.
func TestCloseFlushesPendingPushes(t *testing.T) {
	ctx := ctxT(t)
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: pgtest.URL(t), Schema: pgtest.Schema(t), Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var queued atomic.Int64
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := 0; ; i++ {
				res, err := c.Queue("q").Push(ctx, []queen.Item{{Partition: fmt.Sprintf("p%d", (g+i)%8)}})
				if errors.Is(err, queen.ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if res[0].Status != queen.Queued {
					t.Errorf("%+v", res[0])
				}
				queued.Add(1)
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var stored int64
	err = pgtest.Pool(t).QueryRow(ctx, "SELECT coalesce(sum(end_offset - base_offset + 1), 0) FROM "+
		pgx.Identifier{c.Schema(), "segments"}.Sanitize()).Scan(&stored)
	if err != nil {
		t.Fatal(err)
	}
	if stored != queued.Load() || stored == 0 {
		t.Fatalf("stored %d messages, %d pushes reported Queued", stored, queued.Load())
	}
}

// Layer-2 dedup: pushes from different calls that meet in one flush are
// deduplicated on their hashes even without a dedup window; followers report
// the leader's id. The first push holds the partition in flight (a slow
// bundle) so the next five accumulate into one segment.
func TestPushLayer2AcrossCallsInOneFlush(t *testing.T) {
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = slowTracer{d: 200 * time.Millisecond}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := open(t, func(c *queen.Config) { c.Pool = pool })
	q := c.Queue("q")
	push(t, q, queen.Item{}) // creates the queue; caches its options
	first := make(chan struct{})
	go func() {
		defer close(first)
		if _, err := q.Push(ctx, []queen.Item{{TransactionID: "holder"}}); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(50 * time.Millisecond) // "holder" is in flight now
	res := make([]queen.PushResult, 5)
	var wg sync.WaitGroup
	for i := range res {
		wg.Go(func() {
			r, err := q.Push(ctx, []queen.Item{{TransactionID: "same", Data: []byte{byte(i)}}})
			if err != nil {
				t.Error(err)
				return
			}
			res[i] = r[0]
		})
	}
	wg.Wait()
	<-first
	var leader *queen.PushResult
	for i := range res {
		if res[i].Status == queen.Queued {
			if leader != nil {
				t.Fatalf("two Queued: %+v", res)
			}
			leader = &res[i]
		}
	}
	if leader == nil {
		t.Fatalf("none Queued: %+v", res)
	}
	for _, r := range res {
		if r.Status == queen.Duplicate && r.MessageID != leader.MessageID {
			t.Fatalf("follower %+v does not carry the leader's id %s", r, leader.MessageID)
		}
	}
	if n := len(storedFrames(t, c, "Default")); n != 3 {
		t.Fatalf("stored %d frames, want 3 (first, holder, one of five)", n)
	}
}

// ValidName is the rule Push, Pop and the operator calls apply: a name it
// refuses fails a push with ErrInvalidName, one it accepts does not.
func TestValidNameIsThePushRule(t *testing.T) {
	c := open(t)
	for _, name := range []string{"", "ok", "a\x00b", "tab\there", "\xff", strings.Repeat("n", queen.MaxNameLen),
		strings.Repeat("n", queen.MaxNameLen+1), "é-ü", "\u0085"} {
		_, err := c.Queue("q").Push(ctxT(t), []queen.Item{{Partition: name, Data: []byte("x")}})
		if name == "" {
			continue // "" is the Default partition for a push, not a name
		}
		if refused := errors.Is(err, queen.ErrInvalidName); refused == queen.ValidName(name) {
			t.Errorf("%q: ValidName %v, push error %v", name, queen.ValidName(name), err)
		}
	}
	if queen.ValidName("") {
		t.Error(`ValidName("") = true`)
	}
}

// TestPushInterleavedPartitionsKeepOrder: one call whose items alternate
// between partitions, some with one item and some with many, and a repeated
// transaction id among them, stores each partition's items in call order
// (a group's first item has its own storage; adding more must not disturb
// another group's), by Push and by a transaction's Push alike.
func TestPushInterleavedPartitionsKeepOrder(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	for _, via := range []string{"push", "tx"} {
		t.Run(via, func(t *testing.T) {
			q := c.Queue("q-" + via)
			var items []queen.Item
			for i := range 300 {
				// Partition names are per subtest: storedFrames finds a
				// partition by name alone.
				part := fmt.Sprintf("%s-single-%d", via, i) // one item each
				switch {
				case i%3 == 0:
					part = fmt.Sprintf("%s-many-%d", via, i%4) // interleaved, many each
				case i%7 == 0:
					part = via + "-sevens"
				}
				items = append(items, queen.Item{Partition: part, TransactionID: fmt.Sprintf("%s-%d", via, i), Data: []byte(fmt.Sprint(i))})
			}
			// A layer-1 duplicate: the same transaction id again, later.
			items = append(items, queen.Item{Partition: via + "-many-0", TransactionID: via + "-0", Data: []byte("dup")})
			var res []queen.PushResult
			if via == "push" {
				res = push(t, q, items...)
			} else {
				tx, err := c.Pool().Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if res, err = q.PushTx(ctx, tx, items); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			}
			want := map[string][]string{}
			for i, it := range items[:len(items)-1] {
				if res[i].Status != queen.Queued {
					t.Fatalf("item %d: %+v", i, res[i])
				}
				want[it.Partition] = append(want[it.Partition], string(it.Data))
			}
			if r := res[len(res)-1]; r.Status != queen.Duplicate || r.MessageID != res[0].MessageID {
				t.Fatalf("the repeated transaction id: %+v, want a duplicate of %s", r, res[0].MessageID)
			}
			for part, w := range want {
				var got []string
				for _, f := range storedFrames(t, c, part) {
					got = append(got, string(f.Payload))
				}
				if strings.Join(got, ",") != strings.Join(w, ",") {
					t.Fatalf("partition %s holds %v, want %v", part, got, w)
				}
			}
		})
	}
}

// Pushes spread over many partitions reuse their item slabs (see
// pushBatch.recycle), which tests poison on the way back: every stored
// frame and every result is still the call's own, with and without a
// transaction id, and a layer-1 duplicate among them. A slab given
// back while a flush still read it would store poisoned frames (and race).
func TestPushRecycledSlabsAreNotReadAfterReuse(t *testing.T) {
	c := open(t)
	q := withWindow(t, c, "recycle")
	ctx := ctxT(t)
	before := queen.RecycledSlabs()
	const workers, calls, perCall, parts = 8, 12, 90, 40
	type want struct {
		payload string
		id      uuid.UUID
	}
	var (
		mu    sync.Mutex
		wants = map[string]want{} // by transaction id
	)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for k := range calls {
				items := make([]queen.Item, perCall)
				for i := range items {
					items[i] = queen.Item{
						Partition: fmt.Sprintf("recycle-%d", (w*7+k*3+i)%parts),
						Data:      []byte(fmt.Sprintf("w%d-c%d-i%d", w, k, i)),
					}
					if i%3 != 0 {
						items[i].TransactionID = fmt.Sprintf("t-w%d-c%d-i%d", w, k, i)
					}
				}
				// A layer-1 duplicate of item 1 (same call, its partition).
				items[perCall-1].TransactionID, items[perCall-1].Partition = items[1].TransactionID, items[1].Partition
				res, err := q.Push(ctx, items)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for i, r := range res {
					it := items[i]
					switch {
					case i == perCall-1:
						if r.Status != queen.Duplicate || r.MessageID != res[1].MessageID {
							t.Errorf("w%d c%d: the repeated item: %+v, want a duplicate of %s", w, k, r, res[1].MessageID)
						}
						continue
					case r.Status != queen.Queued:
						t.Errorf("w%d c%d item %d: %+v", w, k, i, r)
						continue
					case r.Partition != it.Partition || r.Offset < 0:
						t.Errorf("w%d c%d item %d: %+v, pushed to %s", w, k, i, r, it.Partition)
					case it.TransactionID == "" && r.TransactionID != r.MessageID.String():
						t.Errorf("w%d c%d item %d: minted transaction id %q for message %s", w, k, i, r.TransactionID, r.MessageID)
					case it.TransactionID != "" && r.TransactionID != it.TransactionID:
						t.Errorf("w%d c%d item %d: transaction id %q, pushed %q", w, k, i, r.TransactionID, it.TransactionID)
					}
					wants[r.TransactionID] = want{payload: string(it.Data), id: r.MessageID}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := queen.RecycledSlabs() - before; n == 0 {
		t.Fatal("no slab was recycled: the test proves nothing")
	}
	stored := 0
	for p := range parts {
		for _, f := range storedFrames(t, c, fmt.Sprintf("recycle-%d", p)) {
			w, ok := wants[f.TransactionID]
			if !ok || string(f.Payload) != w.payload || f.ID != w.id {
				t.Fatalf("stored frame %s %q %q, pushed %+v", f.ID, f.TransactionID, f.Payload, w)
			}
			stored++
		}
	}
	if stored != len(wants) {
		t.Fatalf("%d frames stored, %d pushed", stored, len(wants))
	}
}
