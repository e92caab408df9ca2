package queen_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// pushN pushes n messages "<prefix><i>" to one partition, one call.
func pushN(t testing.TB, q *queen.Queue, partition, prefix string, n int) []queen.PushResult {
	t.Helper()
	items := make([]queen.Item, n)
	for i := range items {
		items[i] = queen.Item{Partition: partition, Data: []byte(fmt.Sprintf("%s%d", prefix, i))}
	}
	return push(t, q, items...)
}

func pop(t testing.TB, q *queen.Queue, o queen.PopOptions) []*queen.Message {
	t.Helper()
	msgs, err := q.Pop(ctxT(t), o)
	if err != nil {
		t.Fatalf("Pop(%+v): %v", o, err)
	}
	return msgs
}

func datas(msgs []*queen.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Data)
	}
	return out
}

func wantData(t testing.TB, msgs []*queen.Message, want ...string) {
	t.Helper()
	got := datas(msgs)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func ack(t testing.TB, m *queen.Message) {
	t.Helper()
	if err := m.Ack(ctxT(t)); err != nil {
		t.Fatalf("Ack offset %d: %v", m.Offset, err)
	}
}

func configure(t testing.TB, c *queen.Client, name string, o queen.QueueOptions) *queen.Queue {
	t.Helper()
	q := c.Queue(name)
	if err := q.Configure(ctxT(t), o); err != nil {
		t.Fatal(err)
	}
	return q
}

func TestPopBasic(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	if got := pop(t, q, queen.PopOptions{}); len(got) != 0 {
		t.Fatalf("pop of a missing queue returned %d messages", len(got))
	}
	res := pushN(t, q, "", "m", 3)
	msgs := pop(t, q, queen.PopOptions{Batch: 10})
	wantData(t, msgs, "m0", "m1", "m2")
	for i, m := range msgs {
		if m.ID != res[i].MessageID || m.TransactionID != res[i].TransactionID || m.Offset != int64(i) ||
			m.Partition != queen.DefaultPartition || m.Queue != "q" || m.Attempt != 1 || m.LeaseID == "" ||
			!m.CreatedAt.Equal(res[i].CreatedAt) || m.LeaseExpiresAt.IsZero() {
			t.Fatalf("message %d = %+v, pushed %+v", i, m, res[i])
		}
	}
	// Leased: nothing more to pop.
	if got := pop(t, q, queen.PopOptions{Batch: 10}); len(got) != 0 {
		t.Fatalf("leased messages popped again: %q", datas(got))
	}
	ack(t, msgs[2])
	pushN(t, q, "", "n", 1)
	wantData(t, pop(t, q, queen.PopOptions{Batch: 10}), "n0")
}

func TestPopEmptyAndNil(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Data: nil}, queen.Item{Data: []byte{}}, queen.Item{Data: []byte("x")})
	msgs := pop(t, q, queen.PopOptions{Batch: 3, AutoAck: true})
	if len(msgs) != 3 || len(msgs[0].Data) != 0 || len(msgs[1].Data) != 0 || string(msgs[2].Data) != "x" {
		t.Fatalf("got %q", datas(msgs))
	}
}

func TestPopBadInput(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	for _, o := range []queen.PopOptions{{Group: "\x00"}, {Partition: "a\nb"}} {
		if _, err := c.Queue("q").Pop(ctx, o); !errors.Is(err, queen.ErrInvalidName) {
			t.Fatalf("Pop(%+v) = %v, want ErrInvalidName", o, err)
		}
	}
	if _, err := c.Queue("").Pop(ctx, queen.PopOptions{}); !errors.Is(err, queen.ErrInvalidName) {
		t.Fatalf("Pop on empty queue name = %v", err)
	}
	if _, err := c.Queue("q").Pop(ctx, queen.PopOptions{Batch: -1}); err == nil {
		t.Fatal("negative Batch accepted")
	}
}

// Two groups each receive all 100 messages while a queue-mode consumer
// drains the same queue independently.
func TestPopGroupsFanOut(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	want := map[string]bool{}
	for p := 0; p < 4; p++ {
		for _, r := range pushN(t, q, fmt.Sprintf("p%d", p), fmt.Sprintf("p%d-", p), 25) {
			want[r.MessageID.String()] = true
		}
	}
	var wg sync.WaitGroup
	got := make([]map[string]int, 3)
	errs := make([]error, 3)
	for i, group := range []string{"", "g1", "g2"} {
		got[i] = map[string]int{}
		wg.Go(func() {
			for empty := 0; empty < 3; {
				msgs, err := q.Pop(ctxT(t), queen.PopOptions{Group: group, Batch: 7, Partitions: 2})
				if err != nil {
					errs[i] = err
					return
				}
				if len(msgs) == 0 {
					empty++
					continue
				}
				empty = 0
				for _, m := range msgs {
					got[i][m.ID.String()]++
					if m.Group != group {
						errs[i] = fmt.Errorf("message of group %q in group %q", m.Group, group)
					}
				}
				// Ack the last of each partition: commits the whole lease.
				last := map[string]*queen.Message{}
				for _, m := range msgs {
					last[m.Partition] = m
				}
				for _, m := range last {
					if err := m.Ack(ctxT(t)); err != nil {
						errs[i] = err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if len(got[i]) != 100 {
			t.Fatalf("consumer %d got %d distinct messages, want 100", i, len(got[i]))
		}
		for id, n := range got[i] {
			if !want[id] || n != 1 {
				t.Fatalf("consumer %d: message %s delivered %d times", i, id, n)
			}
		}
	}
}

// 1000 single pushes to one partition, consumed in strict order by 10
// concurrent consumers: the lease is the per-partition mutual exclusion.
func TestPopStrictOrderConcurrent(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	const n = 1000
	var pw sync.WaitGroup
	pw.Go(func() {
		for i := 0; i < n; i++ {
			push(t, q, queen.Item{Partition: "k", Data: []byte(fmt.Sprint(i))})
		}
	})
	var mu sync.Mutex
	var order []int64
	var wg sync.WaitGroup
	var failed error
	for w := 0; w < 10; w++ {
		wg.Go(func() {
			for {
				mu.Lock()
				done := len(order) >= n || failed != nil
				mu.Unlock()
				if done {
					return
				}
				msgs, err := q.Pop(ctxT(t), queen.PopOptions{Batch: 1 + w%3, Wait: 100 * time.Millisecond})
				if err == nil {
					for _, m := range msgs {
						mu.Lock()
						order = append(order, m.Offset)
						mu.Unlock()
						if string(m.Data) != fmt.Sprint(m.Offset) {
							err = fmt.Errorf("offset %d holds %q", m.Offset, m.Data)
							break
						}
						if err = m.Ack(ctxT(t)); err != nil {
							break
						}
					}
				}
				if err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
					return
				}
			}
		})
	}
	pw.Wait()
	wg.Wait()
	if failed != nil {
		t.Fatal(failed)
	}
	if len(order) != n {
		t.Fatalf("consumed %d, want %d", len(order), n)
	}
	for i, off := range order {
		if off != int64(i) {
			t.Fatalf("position %d consumed offset %d: out of order", i, off)
		}
	}
}

func TestPopBatchAndPartitions(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	for _, p := range []string{"a", "b", "c"} {
		pushN(t, q, p, p, 4)
	}
	// Batch caps across partitions; Partitions caps the partitions.
	msgs := pop(t, q, queen.PopOptions{Batch: 6, Partitions: 3})
	if len(msgs) != 6 {
		t.Fatalf("Batch 6 over 3 partitions returned %d", len(msgs))
	}
	parts := map[string]int{}
	for _, m := range msgs {
		parts[m.Partition]++
	}
	if len(parts) != 2 {
		t.Fatalf("6 messages from partitions %v, want 4+2 from two", parts)
	}
	msgs = pop(t, q, queen.PopOptions{Batch: 100})
	if len(msgs) != 4 {
		t.Fatalf("Partitions 1 (default) returned %d, want one partition's 4", len(msgs))
	}
	// A named partition.
	c2 := c.Queue("q2")
	pushN(t, c2, "x", "x", 2)
	pushN(t, c2, "y", "y", 2)
	wantData(t, pop(t, c2, queen.PopOptions{Partition: "y", Batch: 10}), "y0", "y1")
	wantData(t, pop(t, c2, queen.PopOptions{Partition: "y", Batch: 10}))
	wantData(t, pop(t, c2, queen.PopOptions{Partition: "nope", Batch: 10}))
}

func TestPopAutoAck(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 3)
	msgs := pop(t, q, queen.PopOptions{Batch: 2, AutoAck: true})
	wantData(t, msgs, "m0", "m1")
	if msgs[0].LeaseID != "" || !msgs[0].LeaseExpiresAt.IsZero() {
		t.Fatalf("auto-acked message has a lease: %+v", msgs[0])
	}
	if err := msgs[1].Ack(ctxT(t)); !errors.Is(err, queen.ErrAlreadyAcked) {
		t.Fatalf("Ack of an auto-acked message = %v, want ErrAlreadyAcked", err)
	}
	wantData(t, pop(t, q, queen.PopOptions{Batch: 10, AutoAck: true}), "m2")
}

func TestPopSubscribeNew(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "old", "h", 3)
	// First contact stores "new": no history.
	wantData(t, pop(t, q, queen.PopOptions{Group: "g", Subscription: queen.SubscribeNew, Batch: 10}))
	pushN(t, q, "old", "after", 1)
	// A partition created after the subscription is read from its start.
	pushN(t, q, "later", "l", 2)
	got := map[string]bool{}
	for {
		msgs := pop(t, q, queen.PopOptions{Group: "g", Batch: 10, Subscription: queen.SubscribeAll})
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			got[string(m.Data)] = true
		}
		ack(t, msgs[len(msgs)-1])
	}
	if len(got) != 3 || !got["after0"] || !got["l0"] || !got["l1"] {
		t.Fatalf("group subscribed new got %v", got)
	}
	// Another group with the default subscription sees everything.
	n := len(pop(t, q, queen.PopOptions{Group: "all", Batch: 100, Partitions: 5}))
	if onLayout() {
		// A claim there takes one worker's partitions: a pop per worker.
		n += len(pop(t, q, queen.PopOptions{Group: "all", Batch: 100, Partitions: 5}))
	}
	if n != 6 {
		t.Fatalf("SubscribeAll group got %d, want 6", n)
	}
}

func TestPopSubscribeFrom(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "a", 2)
	time.Sleep(20 * time.Millisecond)
	mid := time.Now()
	time.Sleep(20 * time.Millisecond)
	pushN(t, q, "", "b", 2)
	wantData(t, pop(t, q, queen.PopOptions{Group: "g", Subscription: queen.SubscribeFrom(mid), Batch: 10}), "b0", "b1")
}

func TestPopDelayedProcessing(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DelayedProcessing: 700 * time.Millisecond})
	start := time.Now()
	pushN(t, q, "", "m", 2)
	if got := pop(t, q, queen.PopOptions{Batch: 10}); len(got) != 0 {
		t.Fatalf("delayed messages visible at once: %q", datas(got))
	}
	msgs := pop(t, q, queen.PopOptions{Batch: 10, Wait: 5 * time.Second})
	wantData(t, msgs, "m0", "m1")
	if el := time.Since(start); el < 650*time.Millisecond {
		t.Fatalf("delayed messages visible after %s", el)
	}
}

func TestPopWindowBuffer(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{WindowBuffer: 700 * time.Millisecond})
	pushN(t, q, "", "m", 1)
	time.Sleep(400 * time.Millisecond)
	last := time.Now()
	pushN(t, q, "", "n", 1)
	if got := pop(t, q, queen.PopOptions{Batch: 10}); len(got) != 0 {
		t.Fatalf("window not closed, yet delivered %q", datas(got))
	}
	msgs := pop(t, q, queen.PopOptions{Batch: 10, Wait: 5 * time.Second})
	wantData(t, msgs, "m0", "n0")
	if el := time.Since(last); el < 650*time.Millisecond {
		t.Fatalf("delivered %s after the newest push", el)
	}
}

func TestPopEncrypted(t *testing.T) {
	key := make([]byte, 32)
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = key })
	q := configure(t, c, "q", queen.QueueOptions{Encryption: true, DeadLetter: true, RetryLimit: -1})
	pushN(t, q, "", "secret", 2)
	msgs := pop(t, q, queen.PopOptions{Batch: 10})
	wantData(t, msgs, "secret0", "secret1")
	if err := msgs[0].Fail(ctxT(t), errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	dl, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dl) != 1 || string(dl[0].Data) != "secret0" {
		t.Fatalf("DeadLetters = %+v, %v", dl, err)
	}
}

func TestPopTenantsAreSeparate(t *testing.T) {
	c := open(t)
	a := c.WithTenant(uuid.Must(uuid.NewV4()))
	b := c.WithTenant(uuid.Must(uuid.NewV4()))
	pushN(t, a.Queue("orders"), "", "a", 2)
	if got := pop(t, b.Queue("orders"), queen.PopOptions{Batch: 10}); len(got) != 0 {
		t.Fatalf("tenant b popped tenant a's messages: %q", datas(got))
	}
	wantData(t, pop(t, a.Queue("orders"), queen.PopOptions{Batch: 10}), "a0", "a1")
}

func TestPopCancelledContext(t *testing.T) {
	c := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Queue("q").Pop(ctx, queen.PopOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Pop on a cancelled ctx = %v", err)
	}
}

// A group's first contact stores its subscription and seeds only the
// cursors its pop looks at (bounded work, whatever the number of
// partitions); later pops seed the partitions they meet without one.
func TestPopSeedsOnFirstContact(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	for _, p := range []string{"a", "b", "c"} {
		pushN(t, q, p, p, 1)
	}
	wantData(t, pop(t, q, queen.PopOptions{Group: "g", Partition: "b"}), "b0")
	if n := countRows(t, c, "consumers"); n != 1 {
		t.Fatalf("first contact seeded %d cursors, want 1", n)
	}
	if n := countRows(t, c, "subscriptions"); n != 1 {
		t.Fatalf("%d subscriptions stored, want 1", n)
	}
	// In partition id order, which is not creation order.
	got := datas(pop(t, q, queen.PopOptions{Group: "g", Batch: 10, Partitions: 10}))
	slices.Sort(got)
	if fmt.Sprint(got) != "[a0 c0]" {
		t.Fatalf("got %q, want a0 and c0", got)
	}
	for i := 0; i < 3; i++ {
		pop(t, q, queen.PopOptions{Group: "g", Batch: 10})
	}
	if n := countRows(t, c, "consumers"); n != 3 {
		t.Fatalf("pops created cursors: %d", n)
	}
	pushN(t, q, "d", "d", 1)
	wantData(t, pop(t, q, queen.PopOptions{Group: "g", Partition: "d"}), "d0")
	if n := countRows(t, c, "consumers"); n != 4 {
		t.Fatalf("%d cursors after a new partition, want 4", n)
	}
}

// Messages of one segment popped one at a time, by two groups at different
// positions, come back whole and in order (a client keeps a partly read
// segment decompressed between pops).
func TestPopOneAtATimeFromOneSegment(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 50)
	for i := range 50 {
		for _, g := range []string{"a", "b"} {
			if g == "b" && i%2 == 1 {
				continue // b reads half as fast, so the two positions differ
			}
			k := i
			if g == "b" {
				k = i / 2
			}
			msgs := pop(t, q, queen.PopOptions{Group: g})
			if len(msgs) != 1 || string(msgs[0].Data) != fmt.Sprintf("m%d", k) || msgs[0].Offset != int64(k) {
				t.Fatalf("group %s pop %d: got %q", g, i, datas(msgs))
			}
			ack(t, msgs[0])
		}
	}
	var rest []string
	for i := 25; i < 50; i++ {
		rest = append(rest, fmt.Sprintf("m%d", i))
	}
	wantData(t, pop(t, q, queen.PopOptions{Group: "b", Batch: 100}), rest...)
	if got := pop(t, q, queen.PopOptions{Group: "a"}); len(got) != 0 {
		t.Fatalf("group a drained, still got %q", datas(got))
	}
}

// Several groups reading the same segments at once, some a message at a
// time and some in big batches, each see every message once and intact
// (decompressed segments are shared between pops; none may be reused as
// another pop's buffer while still read).
func TestPopSharedSegmentsConcurrentGroups(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	const segs, per = 4, 100
	for s := range segs {
		items := make([]queen.Item, per)
		for i := range items {
			items[i] = queen.Item{Data: []byte(fmt.Sprintf("m%d", s*per+i))}
		}
		push(t, q, items...)
	}
	var wg sync.WaitGroup
	for g, batch := range []int{1, 1, 7, 150, 400} {
		wg.Go(func() {
			group := fmt.Sprintf("g%d", g)
			next := 0
			for next < segs*per {
				msgs, err := q.Pop(ctxT(t), queen.PopOptions{Group: group, Batch: batch})
				if err != nil {
					t.Error(err)
					return
				}
				for _, m := range msgs {
					if want := fmt.Sprintf("m%d", next); string(m.Data) != want || m.Offset != int64(next) {
						t.Errorf("group %s: got %q at offset %d, want %q at %d", group, m.Data, m.Offset, want, next)
						return
					}
					next++
				}
				if len(msgs) > 0 {
					if err := msgs[len(msgs)-1].Ack(ctxT(t)); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// Every pop waits for its WAL flush. An auto-ack pop moves the cursor past
// what it delivers; a leasing pop's lease is the mutual exclusion: a lease
// lost in a PostgreSQL crash would let a second consumer claim the
// partition while the first still handles it. And a pop never changes the
// durability of a larger transaction it is part of. Each case is one
// simple-protocol query string: its statements share one implicit
// transaction, as a pop on its own has.
func TestClaimCommitDurability(t *testing.T) {
	schema := pgtest.Schema(t)
	c := open(t, func(cfg *queen.Config) { cfg.Schema = schema })
	q := c.Queue("durable")
	pushN(t, q, "p", "m", 4)
	s := pgx.Identifier{schema}.Sanitize()
	ctx := ctxT(t)
	popSQL := func(group string, autoAck bool) string {
		return fmt.Sprintf(`SELECT count(*) FROM %s.pop('00000000-0000-0000-0000-000000000000', 'durable', '%s', NULL, '{}', 1, 1, 0, %t, 'test', 'all', NULL, NULL);`, s, group, autoAck)
	}
	for _, tc := range []struct {
		name  string
		query string
		want  string
	}{
		{"leasing pop", popSQL("a", false), "on"},
		{"auto-ack pop", popSQL("b", true), "on"},
		{"leasing pop after a write of its transaction", "SELECT txid_current();" + popSQL("c", false), "on"},
		{"leasing pop in a transaction begun earlier", "", "on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := pgtest.Pool(t).Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			if tc.query == "" {
				// pgx sends BEGIN on its own: the pop is a later statement.
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck
				tc.query = popSQL("d", false)
			}
			res, err := conn.Conn().PgConn().Exec(ctx, tc.query+"SHOW synchronous_commit").ReadAll()
			if err != nil {
				t.Fatal(err)
			}
			pop := res[len(res)-2]
			if len(pop.Rows) != 1 || string(pop.Rows[0][0]) != "1" {
				t.Fatalf("pop returned %q, want one row", pop.Rows)
			}
			if got := string(res[len(res)-1].Rows[0][0]); got != tc.want {
				t.Fatalf("synchronous_commit after the pop: %s, want %s", got, tc.want)
			}
		})
	}
}
