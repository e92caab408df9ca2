package queen_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// pushLog records which push statements a pool ran, in order.
type pushLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *pushLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	for _, fn := range []string{"push_segment", "push_bundle"} {
		if strings.Contains(d.SQL, "."+fn+"(") {
			l.add(fn)
		}
	}
	if strings.Contains(d.SQL, appendSegmentMark) {
		l.add("append_segment")
	}
	return ctx
}

// appendSegmentMark is text only the AppendSegment statement has.
const appendSegmentMark = "qq.dedup_window_ms = 0"

func (l *pushLog) add(call string) {
	l.mu.Lock()
	l.calls = append(l.calls, call)
	l.mu.Unlock()
}

func (*pushLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the calls since the last take.
func (l *pushLog) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(l.calls, ",")
	l.calls = nil
	return s
}

// An isolated push to a partition the client wrote to before is one
// statement: AppendSegment for a queue without a dedup window, a
// push_segment call for one with. Every verdict the bundle path gives
// comes out of it the same: queued, duplicate, encryption switched on since
// the client looked, lanes changed, and the queue's first keyed message,
// which only push_bundle may store.
func TestIsolatedPushVerdicts(t *testing.T) {
	skipOnLayout(t, "an isolated push is push_segment on the layout (AppendSegment is PostgreSQL's), by design")
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	log := &pushLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	key := bytes.Repeat([]byte{7}, 32)
	schema := pgtest.Schema(t)
	c1 := open(t, func(c *queen.Config) { c.Pool, c.Schema, c.EncryptionKey = pool, schema, key })
	c2 := open(t, func(c *queen.Config) { c.Schema, c.EncryptionKey = schema, key })

	one := func(q *queen.Queue, it queen.Item) queen.PushResult {
		t.Helper()
		res, err := q.Push(ctx, []queen.Item{it})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	want := func(step, calls string) {
		t.Helper()
		if got := log.take(); got != calls {
			t.Fatalf("%s: push statements %q, want %q", step, got, calls)
		}
	}

	q := c1.Queue("plain")
	one(q, queen.Item{Partition: "p", Data: []byte("a")})
	log.take()
	if r := one(q, queen.Item{Partition: "p", Data: []byte("b")}); r.Status != queen.Queued || r.Offset != 1 {
		t.Fatalf("second push: %+v", r)
	}
	want("queued", "append_segment")

	dq := configure(t, c1, "dedup", queen.QueueOptions{DedupWindow: 60e9})
	first := one(dq, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("a")})
	log.take()
	if r := one(dq, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("again")}); r.Status != queen.Duplicate || r.MessageID != first.MessageID {
		t.Fatalf("repeat: %+v, want Duplicate of %s", r, first.MessageID)
	}
	want("duplicate", "push_segment")

	// A dedup window set by another client since c1 cached the queue's
	// settings: AppendSegment declines, and push_bundle finds the message
	// c1 stored through AppendSegment before the window was set.
	sq := c1.Queue("window-later")
	one(sq, queen.Item{Partition: "p", Data: []byte("creates the partition")})
	log.take()
	orig := one(sq, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("a")})
	want("before the window", "append_segment")
	configure(t, c2, "window-later", queen.QueueOptions{DedupWindow: time.Hour})
	if r := one(sq, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("again")}); r.Status != queen.Duplicate || r.MessageID != orig.MessageID {
		t.Fatalf("repeat after the window was set elsewhere: %+v, want Duplicate of %s", r, orig.MessageID)
	}
	want("window set elsewhere", "append_segment,push_bundle")

	eq := c1.Queue("enc")
	one(eq, queen.Item{Partition: "p", Data: []byte("plain")}) // c1 caches: not encrypted
	configure(t, c2, "enc", queen.QueueOptions{Encryption: true})
	log.take()
	if r := one(eq, queen.Item{Partition: "p", Data: []byte("secret")}); r.Status != queen.Queued || r.Offset != 1 {
		t.Fatalf("push after encryption was switched on: %+v", r)
	}
	// AppendSegment declines the plaintext segment, push_bundle answers
	// EncryptionRequired, and the sealed one goes again the same way.
	want("encryption switched on", "append_segment,push_bundle,append_segment")
	var stored []byte
	if err := c1.Pool().QueryRow(ctx, "SELECT blob FROM "+pgx.Identifier{c1.Schema(), "segments"}.Sanitize()+
		" s JOIN "+pgx.Identifier{c1.Schema(), "partitions"}.Sanitize()+" p ON p.id = s.partition_id"+
		" JOIN "+pgx.Identifier{c1.Schema(), "queues"}.Sanitize()+" q ON q.id = p.queue_id"+
		" WHERE q.name = 'enc' AND s.base_offset = 1").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stored, []byte("secret")) {
		t.Fatal("the message pushed after encryption was switched on is stored in plaintext")
	}

	// The first keyed message marks its queue keyed: AppendSegment leaves
	// it to push_bundle, even on a known partition.
	kq := c1.Queue("keyed")
	one(kq, queen.Item{Partition: "lane-33", Data: []byte("unkeyed")})
	log.take()
	if r := one(kq, queen.Item{Key: "customer-42", Data: []byte("k")}); r.Status != queen.Queued || r.Partition != "lane-33" {
		t.Fatalf("first keyed push: %+v", r)
	}
	want("first keyed", "append_segment,push_bundle")
	if err := c2.Queue("keyed").Configure(ctx, queen.QueueOptions{Lanes: 8}); !errors.Is(err, queen.ErrLanesFixed) {
		t.Fatalf("Configure after the first keyed push: %v, want ErrLanesFixed", err)
	}
	if r := one(kq, queen.Item{Key: "customer-42", Data: []byte("k2")}); r.Status != queen.Queued || r.Offset != 2 {
		t.Fatalf("second keyed push: %+v", r)
	}
	want("keyed", "append_segment")

	// Lanes changed while c1 held a stale count: c2 set 8 and stored a
	// keyed message, fixing it; c1 routes customer-42 to lane-33 of 64, a
	// partition it knows, and is sent back to route it again.
	lq := c1.Queue("lanes")
	one(lq, queen.Item{Partition: "lane-33", Data: []byte("unkeyed")}) // c1 caches 64 lanes
	configure(t, c2, "lanes", queen.QueueOptions{Lanes: 8})
	push(t, c2.Queue("lanes"), queen.Item{Key: "other", Data: []byte("x")})
	log.take()
	if r := one(lq, queen.Item{Key: "customer-42", Data: []byte("k")}); r.Status != queen.Queued || r.Partition != "lane-1" {
		t.Fatalf("push with a stale lane count: %+v, want Queued to lane-1", r)
	}
	if got := log.take(); !strings.HasPrefix(got, "append_segment,push_bundle,") {
		t.Fatalf("stale lanes: push statements %q, want append_segment, then push_bundle first", got)
	}
}

// knownPartition opens a client with queue "q" (with the dedup window, or
// none) and pushes once to its partition "p", which the client then knows:
// its next push there alone is an isolated push.
func knownPartition(t *testing.T, window time.Duration) (*queen.Client, *queen.Queue) {
	t.Helper()
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DedupWindow: window})
	push(t, q, queen.Item{Partition: "p", Data: []byte("first")})
	return c, q
}

type pushOutcome struct {
	res queen.PushResult
	err error
}

// pushBehind pushes data to partition "p" of q in the background, while
// the caller holds p's row, and returns once the push's statement waits for
// it: AppendSegment without a dedup window, push_segment with one.
func pushBehind(t *testing.T, c *queen.Client, q *queen.Queue, window time.Duration, data string) <-chan pushOutcome {
	t.Helper()
	done := make(chan pushOutcome, 1)
	go func() {
		var o pushOutcome
		var res []queen.PushResult
		if res, o.err = q.Push(ctxT(t), []queen.Item{{Partition: "p", Data: []byte(data)}}); o.err == nil {
			o.res = res[0]
		}
		done <- o
	}()
	mark := ".push_segment("
	if window == 0 {
		mark = appendSegmentMark
	}
	waitForBlockedStatement(t, c, mark)
	return done
}

// A partition deleted (the idle purge) while an isolated push to it waits
// for its row: the push must not report Queued for a message it did not
// store. It lands in the partition created again under the same name.
func TestIsolatedPushRacingPartitionDelete(t *testing.T) {
	skipOnLayout(t, "a lock shape: it waits for a push blocked on a partition row lock taken by name over every shard")
	for _, window := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprintf("window %v", window), func(t *testing.T) {
			ctx := ctxT(t)
			c, q := knownPartition(t, window)
			tx, err := c.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			// As the idle purge deletes one (it takes only a partition
			// without segments; its hash rows go with it).
			for _, tbl := range []string{"segments", "txns"} {
				if _, err := tx.Exec(ctx, "DELETE FROM "+pgx.Identifier{c.Schema(), tbl}.Sanitize()+" WHERE partition_id IN (SELECT id FROM "+
					pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" WHERE name = 'p')"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := tx.Exec(ctx, "DELETE FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" WHERE name = 'p'"); err != nil {
				t.Fatal(err)
			}
			done := pushBehind(t, c, q, window, "raced")
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			o := <-done
			if o.err != nil {
				t.Fatal(o.err)
			}
			if r := o.res; r.Status != queen.Queued {
				t.Fatalf("%+v, want Queued", r)
			}
			msgs, err := q.Peek(ctx, queen.PeekOptions{Partition: "p"})
			if err != nil {
				t.Fatal(err)
			}
			if len(msgs) != 1 || string(msgs[0].Data) != "raced" || msgs[0].Offset != o.res.Offset {
				t.Fatalf("partition p holds %d messages after the race (want the raced one at offset %d)", len(msgs), o.res.Offset)
			}
		})
	}
}

// The allocation is written three times (the AppendSegment statement for an
// isolated push without a dedup window, push_one for one with a window, a
// set-based statement in push_bundle for a bundle of segments without a
// window; one shape for all measured slower for some of them): all leave
// the same rows behind.
func TestAllocationPathsAgree(t *testing.T) {
	skipOnLayout(t, "an isolated push is push_segment on the layout (AppendSegment is PostgreSQL's), by design")
	ctx := ctxT(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	log := &pushLog{}
	cfg.ConnConfig.Tracer = log
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c := open(t, func(c *queen.Config) { c.Pool = pool })
	q := c.Queue("q")
	for _, p := range []string{"bundled-a", "bundled-b", "alone"} {
		push(t, q, queen.Item{Partition: p, Data: []byte("first")}) // known from now on
	}
	wq := configure(t, c, "w", queen.QueueOptions{DedupWindow: time.Hour})
	push(t, wq, queen.Item{Partition: "windowed", Data: []byte("first")})
	log.take()
	// Two partitions in one PushTx: one bundle of two segments (set-based).
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := q.PushTx(ctx, tx, []queen.Item{{Partition: "bundled-a", Data: []byte("x"), TransactionID: "t1"},
			{Partition: "bundled-a", Data: []byte("y"), TransactionID: "t2"},
			{Partition: "bundled-b", Data: []byte("z"), TransactionID: "t3"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := log.take(); got != "push_bundle" {
		t.Fatalf("a two-partition PushTx ran %q, want one push_bundle", got)
	}
	// One partition: AppendSegment.
	push(t, q, queen.Item{Partition: "alone", Data: []byte("x"), TransactionID: "t1"},
		queen.Item{Partition: "alone", Data: []byte("y"), TransactionID: "t2"})
	if got := log.take(); got != "append_segment" {
		t.Fatalf("a one-partition push ran %q, want one AppendSegment", got)
	}
	// One partition of a queue with a dedup window: push_segment, that is
	// push_one.
	push(t, wq, queen.Item{Partition: "windowed", Data: []byte("x"), TransactionID: "t1"},
		queen.Item{Partition: "windowed", Data: []byte("y"), TransactionID: "t2"})
	if got := log.take(); got != "push_segment" {
		t.Fatalf("a one-partition push to a queue with a dedup window ran %q, want one push_segment", got)
	}
	type row struct {
		last           int64
		pending        bool
		segs, txns     int // txns: hash rows, none (the hashes are in the segment rows)
		base, end, n16 int64
		failures       int
	}
	read := func(part string) row {
		t.Helper()
		var r row
		s := pgx.Identifier{c.Schema()}.Sanitize()
		err := c.Pool().QueryRow(ctx, `
SELECT p.last_offset, p.pending,
    (SELECT count(*) FROM `+s+`.segments x WHERE x.partition_id = p.id),
    (SELECT count(*) FROM `+s+`.txns x WHERE x.partition_id = p.id),
    g.base_offset, g.end_offset, octet_length(g.hashes) / 16, g.failures
FROM `+s+`.partitions p
JOIN `+s+`.segments g ON g.partition_id = p.id AND g.base_offset = 1
WHERE p.name = $1`, part).Scan(&r.last, &r.pending, &r.segs, &r.txns, &r.base, &r.end, &r.n16, &r.failures)
		if err != nil {
			t.Fatalf("%s: %v", part, err)
		}
		return r
	}
	bundled, alone, windowed := read("bundled-a"), read("alone"), read("windowed")
	want := row{last: 2, pending: true, segs: 2, txns: 0, base: 1, end: 2, n16: 2}
	if bundled != want || alone != want || windowed != want {
		t.Fatalf("bundled %+v, alone %+v, windowed %+v, want all %+v", bundled, alone, windowed, want)
	}
	if b := read("bundled-b"); b.last != 1 || b.end != 1 || b.n16 != 1 {
		t.Fatalf("bundled-b %+v", b)
	}
}

// created_at is monotone in offset order within a partition (retention and
// SubscribeFrom rely on it). An isolated push does not lock its partition
// row ahead of the allocation, so its timestamp must be taken once it holds
// the row: here it waits behind another transaction that appends a segment
// stamped later than the push began, and must still be stamped after it.
func TestIsolatedPushWaitingForTheRowKeepsCreatedAtMonotone(t *testing.T) {
	skipOnLayout(t, "its SQL locks a partition row by name, a row lock over every shard, which Citus rejects")
	for _, window := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprintf("window %v", window), func(t *testing.T) {
			ctx := ctxT(t)
			c, q := knownPartition(t, window)
			s := pgx.Identifier{c.Schema()}.Sanitize()

			tx, err := c.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			var pid int64
			if err := tx.QueryRow(ctx, `SELECT id FROM `+s+`.partitions WHERE name = 'p' FOR NO KEY UPDATE`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			done := pushBehind(t, c, q, window, "waited")
			// Another writer of the partition, stamped after the push began.
			if _, err := tx.Exec(ctx, `SELECT `+s+`.push_one($1::int8, 1, $2::bytea, -1, '\x00'::bytea, 0, clock_timestamp())`,
				pid, make([]byte, 16)); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if o := <-done; o.err != nil {
				t.Fatal(o.err)
			}
			rows, err := c.Pool().Query(ctx, `SELECT base_offset, created_at FROM `+s+`.segments WHERE partition_id = $1 ORDER BY base_offset`, pid)
			if err != nil {
				t.Fatal(err)
			}
			type seg struct {
				Off int64
				At  time.Time
			}
			segs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[seg])
			if err != nil {
				t.Fatal(err)
			}
			if len(segs) != 3 {
				t.Fatalf("%d segments, want 3", len(segs))
			}
			for i := 1; i < len(segs); i++ {
				if segs[i].At.Before(segs[i-1].At) {
					t.Fatalf("offset %d stamped %v, before offset %d's %v", segs[i].Off, segs[i].At, segs[i-1].Off, segs[i-1].At)
				}
			}
		})
	}
}
