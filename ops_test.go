package queen_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// deadLetterSome pops every message of queue mode on partition part one at
// a time and dead-letters those whose data is in kill, acking the others.
func deadLetterSome(t *testing.T, q *queen.Queue, part string, kill ...string) {
	t.Helper()
	for {
		msgs := pop(t, q, queen.PopOptions{Partition: part})
		if len(msgs) == 0 {
			return
		}
		m := msgs[0]
		dead := false
		for _, k := range kill {
			dead = dead || string(m.Data) == k
		}
		if dead {
			if err := m.DeadLetter(ctxT(t), errors.New("bad "+string(m.Data))); err != nil {
				t.Fatal(err)
			}
		} else {
			ack(t, m)
		}
	}
}

func TestRequeueDeadLetters(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true, DedupWindow: time.Hour})
	hdr := map[string]string{"h": "v"}
	orig := push(t, q,
		queen.Item{Partition: "p", Key: "k0", TransactionID: "t0", Headers: hdr, Data: []byte("a0")},
		queen.Item{Partition: "p", Key: "k1", TransactionID: "t1", Data: []byte("a1")},
		queen.Item{Partition: "p", TransactionID: "t2", Data: []byte("a2")},
		queen.Item{Partition: "r", TransactionID: "t3", Data: []byte("b0")},
	)
	// Dead-lettered in offset order: a0, a1 (ids ascending), then b0.
	deadLetterSome(t, q, "p", "a0", "a1")
	deadLetterSome(t, q, "r", "b0")
	push(t, q, queen.Item{Partition: "p", TransactionID: "t4", Data: []byte("a3")})

	// A page: the first two dead letters (both of p).
	n, err := q.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{Limit: 2})
	if err != nil || n != 2 {
		t.Fatalf("requeue = %d, %v; want 2", n, err)
	}
	left, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(left) != 1 || string(left[0].Data) != "b0" {
		t.Fatalf("dead letters left: %+v, %v", left, err)
	}
	// The rest, then nothing: a retry doubles nothing.
	for i, want := range []int{1, 0} {
		if n, err := q.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || n != want {
			t.Fatalf("requeue %d = %d, %v; want %d", i, n, err, want)
		}
	}

	// At the tail, after a3, in dead-letter order; ids, transaction ids,
	// keys and headers kept; a fresh budget; not dropped as duplicates of
	// their originals.
	msgs := pop(t, q, queen.PopOptions{Partition: "p", Batch: 10})
	wantData(t, msgs, "a3", "a0", "a1")
	if msgs[1].Offset != 4 || msgs[2].Offset != 5 {
		t.Fatalf("offsets %d, %d; want 4, 5", msgs[1].Offset, msgs[2].Offset)
	}
	for i, m := range msgs[1:] {
		o := orig[i]
		if m.ID != o.MessageID || m.TransactionID != fmt.Sprint("t", i) || m.Key != fmt.Sprint("k", i) || m.Attempt != 1 {
			t.Fatalf("requeued %d: %+v, want id %v", i, m, o.MessageID)
		}
	}
	if !maps.Equal(msgs[1].Headers, hdr) || msgs[2].Headers != nil {
		t.Fatalf("headers %v, %v", msgs[1].Headers, msgs[2].Headers)
	}
	ack(t, msgs[2])
	wantData(t, pop(t, q, queen.PopOptions{Partition: "r"}), "b0")

	// Within the window a producer retry of a requeued message is a
	// Duplicate, naming the message.
	res := push(t, q, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("again")})
	if res[0].Status != queen.Duplicate || res[0].MessageID != orig[1].MessageID {
		t.Fatalf("retry of t1: %+v", res[0])
	}

	// Bad input and unknown queues.
	if _, err := c.Queue("").RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); !errors.Is(err, queen.ErrInvalidName) {
		t.Fatalf("bad queue name: %v", err)
	}
	if n, err := c.Queue("nope").RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || n != 0 {
		t.Fatalf("missing queue: %d, %v", n, err)
	}
}

// A requeue that does not commit (here: cancelled while it waits for a
// partition lock, as a crash would end it) changes nothing, and its retry
// requeues each dead letter once; so do concurrent requeues of the same
// dead letters.
func TestRequeueDeadLettersAtomic(t *testing.T) {
	skipOnLayout(t, "its SQL locks a partition row by name, a row lock over every shard, which Citus rejects")
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	pushN(t, q, "p", "m", 6)
	deadLetterSome(t, q, "p", "m0", "m1", "m2", "m3", "m4", "m5")
	s := pgx.Identifier{c.Schema()}.Sanitize()

	tx, err := c.Pool().Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctxT(t), "SELECT 1 FROM "+s+".partitions WHERE name = 'p' FOR NO KEY UPDATE"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	_, err = q.RequeueDeadLetters(ctx, queen.DeadLetterQuery{Limit: 4})
	cancel()
	if err == nil {
		t.Fatal("requeue behind a held partition lock succeeded")
	}
	// The cancelled statement is gone before the lock is released.
	poll(t, "the cancelled requeue to end", func() bool {
		var n int
		err := c.Pool().QueryRow(ctxT(t), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()").Scan(&n)
		return err == nil && n == 0
	})
	if err := tx.Rollback(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if dl, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || len(dl) != 6 {
		t.Fatalf("after the failed requeue: %d dead letters, %v", len(dl), err)
	}
	if st, err := q.Status(ctxT(t)); err != nil || st.Partitions[0].LastOffset != 5 {
		t.Fatalf("after the failed requeue: %+v, %v", st, err)
	}

	// The retry, racing a second caller with the same selection, and a
	// third for the rest.
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 2 {
		wg.Go(func() {
			n, err := q.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{Limit: 4})
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		})
	}
	wg.Wait()
	n, err := q.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || total+n != 6 {
		t.Fatalf("requeued %d + %d, %v; want 6 in all", total, n, err)
	}
	wantData(t, pop(t, q, queen.PopOptions{Batch: 100}), "m0", "m1", "m2", "m3", "m4", "m5")
	if dl, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || len(dl) != 0 {
		t.Fatalf("dead letters left: %d, %v", len(dl), err)
	}
}

// Dead letters of one message from several groups give one copy; a group
// filter requeues only that group's.
func TestRequeueDeadLettersGroups(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	push(t, q, queen.Item{Partition: "p", Data: []byte("m")})
	for _, g := range []string{"g1", "g2", "g3"} {
		msgs := pop(t, q, queen.PopOptions{Group: g})
		if len(msgs) != 1 {
			t.Fatalf("%s: %d messages", g, len(msgs))
		}
		if err := msgs[0].DeadLetter(ctxT(t), nil); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := q.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{Groups: []string{"g3"}}); err != nil || n != 1 {
		t.Fatalf("g3: %d, %v", n, err)
	}
	if n, err := q.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || n != 1 {
		t.Fatalf("g1 and g2: %d, %v; want one copy", n, err)
	}
	st, err := q.Status(ctxT(t))
	if err != nil || st.Partitions[0].LastOffset != 2 {
		t.Fatalf("status %+v, %v; want offsets 1 and 2 appended", st, err)
	}
}

// A dead letter of an encrypted queue is appended as stored: a client
// without the key requeues it, one with the key reads it. A plaintext dead
// letter of a queue encrypted since is sealed by a client with the key and
// refused by one without.
func TestRequeueDeadLettersEncrypted(t *testing.T) {
	keyed := open(t, withKey(testKey(5)))
	plain := open(t, func(cfg *queen.Config) { cfg.Schema = keyed.Schema() })
	q := configure(t, keyed, "q", queen.QueueOptions{DeadLetter: true, Encryption: true})
	push(t, q, queen.Item{Partition: "p", Key: "k", Headers: map[string]string{"h": "v"}, Data: []byte("secret")})
	deadLetterSome(t, q, "p", "secret")

	if n, err := plain.Queue("q").RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || n != 1 {
		t.Fatalf("requeue without the key: %d, %v", n, err)
	}
	var raw []byte
	s := pgx.Identifier{keyed.Schema()}.Sanitize()
	if err := keyed.Pool().QueryRow(ctxT(t), "SELECT blob FROM "+s+".segments ORDER BY base_offset DESC LIMIT 1").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if containsBytes(raw, []byte("secret")) {
		t.Fatal("the requeued segment holds the plaintext")
	}
	msgs := pop(t, q, queen.PopOptions{Partition: "p"})
	wantData(t, msgs, "secret")
	if msgs[0].Key != "k" || msgs[0].Headers["h"] != "v" {
		t.Fatalf("requeued %+v", msgs[0])
	}

	// Plaintext stored before the queue was encrypted.
	pq := configure(t, keyed, "late", queen.QueueOptions{DeadLetter: true})
	push(t, pq, queen.Item{Partition: "p", Data: []byte("old")})
	deadLetterSome(t, pq, "p", "old")
	configure(t, keyed, "late", queen.QueueOptions{DeadLetter: true, Encryption: true})
	if _, err := plain.Queue("late").RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); !errors.Is(err, queen.ErrEncryption) {
		t.Fatalf("plaintext into an encrypted queue without a key: %v", err)
	}
	if n, err := pq.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || n != 1 {
		t.Fatalf("sealed requeue: %d, %v", n, err)
	}
	if err := keyed.Pool().QueryRow(ctxT(t), "SELECT s.blob FROM "+s+".segments s JOIN "+s+".partitions p ON p.id = s.partition_id"+
		" JOIN "+s+".queues q ON q.id = p.queue_id WHERE q.name = 'late' ORDER BY s.base_offset DESC LIMIT 1").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if containsBytes(raw, []byte("old")) {
		t.Fatal("the sealed requeue stored plaintext")
	}
	wantData(t, pop(t, pq, queen.PopOptions{Partition: "p"}), "old")
}

func containsBytes(b, sub []byte) bool {
	for i := 0; i+len(sub) <= len(b); i++ {
		if string(b[i:i+len(sub)]) == string(sub) {
			return true
		}
	}
	return false
}

// A requeue wakes a consumer parked on the queue.
func TestRequeueDeadLettersWakes(t *testing.T) {
	c := open(t, queen.PopRescan(time.Hour)) // only a wake can find the requeued message
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	push(t, q, queen.Item{Partition: "p", Data: []byte("m")})
	deadLetterSome(t, q, "p", "m")
	got := make(chan []*queen.Message, 1)
	go func() {
		msgs, _ := q.Pop(ctxT(t), queen.PopOptions{Wait: time.Minute})
		got <- msgs
	}()
	poll(t, "the pop to park", func() bool { return queen.ParkedPops(c) == 1 })
	if n, err := q.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	select {
	case msgs := <-got:
		wantData(t, msgs, "m")
	case <-time.After(10 * time.Second):
		t.Fatal("the parked pop was not woken")
	}
}

func TestPauseResume(t *testing.T) {
	// Consume claims on wakes only: Resume's must arrive.
	a := open(t, queen.PopRescan(time.Hour))
	b := open(t, queen.PopRescan(time.Hour), func(cfg *queen.Config) { cfg.Schema = a.Schema() })
	qa, qb := a.Queue("q"), b.Queue("q")
	push(t, qa, queen.Item{Partition: "p", Data: []byte("m0")}, queen.Item{Partition: "p", Data: []byte("m1")})
	held := pop(t, qa, queen.PopOptions{Group: "g"}) // leased before the pause
	wantData(t, held, "m0")
	// Not affected: a leased message is settled and extended as usual.
	if err := qa.Pause(ctxT(t), "g"); err != nil {
		t.Fatal(err)
	}
	if err := qa.Pause(ctxT(t), "g"); err != nil {
		t.Fatalf("pause twice: %v", err)
	}
	if err := held[0].ExtendLease(ctxT(t), time.Minute); err != nil {
		t.Fatalf("extend a lease taken before the pause: %v", err)
	}
	ack(t, held[0])

	// Paused in both clients; other groups go on.
	for _, q := range []*queen.Queue{qa, qb} {
		if msgs := pop(t, q, queen.PopOptions{Group: "g"}); len(msgs) != 0 {
			t.Fatalf("a paused group popped %q", datas(msgs))
		}
	}
	wantData(t, pop(t, qb, queen.PopOptions{Group: "other", AutoAck: true, Batch: 10}), "m0", "m1")
	st, err := qb.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.Partitions[0].Groups {
		if g.Paused != (g.Group == "g") {
			t.Fatalf("status: %+v", g)
		}
	}

	// b's Consume idles while paused; pushes land meanwhile.
	got := make(chan string, 10)
	ctx, cancel := context.WithCancel(ctxT(t))
	var wg sync.WaitGroup
	wg.Go(func() {
		err := qb.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Group: "g"}},
			func(_ context.Context, m *queen.Message) error { got <- string(m.Data); return nil })
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Consume: %v", err)
		}
	})
	defer func() { cancel(); wg.Wait() }()
	res := push(t, qa, queen.Item{Partition: "p", Data: []byte("m2")})
	if res[0].Status != queen.Queued || res[0].Offset != 2 {
		t.Fatalf("push while paused: %+v", res[0])
	}
	// The push's wake makes Consume claim (in vain).
	select {
	case m := <-got:
		t.Fatalf("a paused group consumed %q", m)
	case <-time.After(time.Second):
	}

	start := time.Now()
	if err := qa.Resume(ctxT(t), "g"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"m1", "m2"} {
		select {
		case m := <-got:
			if m != want {
				t.Fatalf("consumed %q, want %q", m, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing consumed after Resume, want %q", want)
		}
	}
	t.Logf("first message %v after Resume", time.Since(start))
	if err := qa.Resume(ctxT(t), "g"); err != nil {
		t.Fatalf("resume twice: %v", err)
	}

	// Bad input.
	if err := qa.Pause(ctxT(t), "bad\x00group"); !errors.Is(err, queen.ErrInvalidName) {
		t.Fatalf("bad group: %v", err)
	}
	if err := a.Queue("").Resume(ctxT(t), ""); !errors.Is(err, queen.ErrInvalidName) {
		t.Fatalf("bad queue: %v", err)
	}
}

// Resume wakes another process's parked consumer at once (NOTIFY), not at
// its next rescan: a parked Pop with a long Wait has no rescan to fall back
// on before its timeout.
func TestResumeWakesOtherClient(t *testing.T) {
	a := open(t, queen.PopRescan(time.Hour))
	b := open(t, queen.PopRescan(time.Hour), func(cfg *queen.Config) { cfg.Schema = a.Schema() })
	qa, qb := a.Queue("q"), b.Queue("q")
	if err := qa.Pause(ctxT(t), ""); err != nil {
		t.Fatal(err)
	}
	push(t, qa, queen.Item{Partition: "p", Data: []byte("m")})
	got := make(chan []*queen.Message, 1)
	go func() {
		msgs, _ := qb.Pop(ctxT(t), queen.PopOptions{Wait: time.Minute})
		got <- msgs
	}()
	poll(t, "b's pop to park", func() bool { return queen.ParkedPops(b) == 1 })
	if err := qa.Resume(ctxT(t), ""); err != nil {
		t.Fatal(err)
	}
	select {
	case msgs := <-got:
		wantData(t, msgs, "m")
	case <-time.After(20 * time.Second):
		t.Fatal("the parked pop was not woken by Resume")
	}
}

func TestQueues(t *testing.T) {
	c := open(t)
	if qs, err := c.Queues(ctxT(t)); err != nil || len(qs) != 0 {
		t.Fatalf("no queues: %+v, %v", qs, err)
	}
	opts := queen.QueueOptions{LeaseTime: time.Minute, RetryLimit: -1, DeadLetter: true, DedupWindow: time.Hour,
		DelayedProcessing: time.Second, WindowBuffer: 2 * time.Second, Retention: time.Hour, CompletedRetention: time.Minute,
		FailurePolicy: queen.FailureSkip, Lanes: 8, RetryBackoff: queen.RetryBackoff{Min: 2 * time.Second, Max: time.Minute}}
	configure(t, c, "b-configured", opts)
	a := c.Queue("a")
	pushN(t, a, "p1", "x", 5)
	pushN(t, a, "p2", "y", 3)
	// Only the default tenant's queues.
	push(t, c.WithTenant(uuid.Must(uuid.NewV4())).Queue("other"), queen.Item{Data: []byte("z")})

	qs, err := c.Queues(ctxT(t))
	if err != nil || len(qs) != 2 || qs[0].Name != "a" || qs[1].Name != "b-configured" {
		t.Fatalf("queues %+v, %v", qs, err)
	}
	// No group yet: every retained message.
	if qa := qs[0]; qa.Partitions != 2 || qa.Depth != 8 || qa.OldestAge <= 0 || len(qa.Groups) != 0 ||
		qa.Tenant != queen.DefaultTenant {
		t.Fatalf("a before any group: %+v", qa)
	}
	want := opts
	if qb := qs[1]; qb.Options != want || qb.Partitions != 0 || qb.Depth != 0 || qb.OldestAge != 0 {
		t.Fatalf("b: %+v, want options %+v", qb, want)
	}
	// The stored options round-trip through Configure.
	if err := c.Queue("b-configured").Configure(ctxT(t), qs[1].Options); err != nil {
		t.Fatal(err)
	}
	if d := mustQueues(t, c)[0].Options; d.RetryLimit != 3 || d.LeaseTime != 5*time.Minute || d.Lanes != queen.DefaultLanes ||
		d.FailurePolicy != queen.FailurePause {
		t.Fatalf("defaults as stored: %+v", d)
	}

	// A group subscribed to a queue without partitions is listed.
	pop(t, c.Queue("b-configured"), queen.PopOptions{Group: "early"})
	if g := mustQueues(t, c)[1].Groups; len(g) != 1 || g[0].Group != "early" || g[0].Lag != 0 {
		t.Fatalf("groups of b: %+v", g)
	}

	// Queue mode consumed all of p1 and 1 of p2; g consumed 4 of p1 and is
	// paused; h is paused before its first pop.
	pop(t, a, queen.PopOptions{Partition: "p1", AutoAck: true, Batch: 10})
	pop(t, a, queen.PopOptions{Partition: "p2", AutoAck: true, Batch: 1})
	pop(t, a, queen.PopOptions{Group: "g", Partition: "p1", AutoAck: true, Batch: 4})
	for _, g := range []string{"g", "h"} {
		if err := a.Pause(ctxT(t), g); err != nil {
			t.Fatal(err)
		}
	}
	qa := mustQueues(t, c)[0]
	// Per partition the group furthest behind: p1 g (1), p2 g (3).
	if qa.Depth != 4 || qa.OldestAge <= 0 || len(qa.Groups) != 3 {
		t.Fatalf("a: %+v", qa)
	}
	g0, g1, g2 := qa.Groups[0], qa.Groups[1], qa.Groups[2]
	if g0.Group != "" || g0.Lag != 2 || g0.LagAge <= 0 || g0.Paused {
		t.Fatalf("queue mode: %+v", g0)
	}
	if g1.Group != "g" || g1.Lag != 4 || g1.LagAge <= 0 || !g1.Paused {
		t.Fatalf("g: %+v", g1)
	}
	if g2.Group != "h" || g2.Lag != 0 || !g2.Paused {
		t.Fatalf("h: %+v", g2)
	}

	// Everything consumed: no depth, no age.
	pop(t, a, queen.PopOptions{AutoAck: true, Batch: 10})
	if err := a.Resume(ctxT(t), "g"); err != nil {
		t.Fatal(err)
	}
	pop(t, a, queen.PopOptions{Group: "g", AutoAck: true, Batch: 10})
	pop(t, a, queen.PopOptions{Group: "g", AutoAck: true, Batch: 10})
	qa = mustQueues(t, c)[0]
	if qa.Depth != 0 || qa.OldestAge != 0 || qa.Groups[1].Paused || qa.Groups[1].Lag != 0 {
		t.Fatalf("a drained: %+v", qa)
	}
	// Pushed counts every message ever appended, consumed or not; the
	// dead letters are counted per queue.
	if qa.Pushed != 8 || qa.DeadLetters != 0 {
		t.Fatalf("a: pushed %d, dead letters %d; want 8 and 0", qa.Pushed, qa.DeadLetters)
	}
	pushN(t, a, "p3", "z", 2)
	for _, m := range pop(t, a, queen.PopOptions{Partition: "p3", Batch: 2}) {
		if err := m.DeadLetter(ctxT(t), nil); err != nil {
			t.Fatal(err)
		}
	}
	if qa = mustQueues(t, c)[0]; qa.Pushed != 10 || qa.DeadLetters != 2 || qa.Partitions != 3 {
		t.Fatalf("a after two dead letters: pushed %d, dead letters %d, partitions %d; want 10, 2, 3",
			qa.Pushed, qa.DeadLetters, qa.Partitions)
	}
	if qb := mustQueues(t, c)[1]; qb.Pushed != 0 || qb.DeadLetters != 0 {
		t.Fatalf("b: pushed %d, dead letters %d", qb.Pushed, qb.DeadLetters)
	}
}

func mustQueues(t *testing.T, c *queen.Client) []queen.QueueInfo {
	t.Helper()
	qs, err := c.Queues(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return qs
}

// The tail takes dead letters in dead-letter id order, not offset order.
func TestRequeueDeadLettersOrder(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	pushN(t, q, "p", "x", 2)
	g1 := pop(t, q, queen.PopOptions{Group: "g1", Batch: 2})
	if err := g1[1].DeadLetter(ctxT(t), nil); err != nil { // x1 first
		t.Fatal(err)
	}
	g2 := pop(t, q, queen.PopOptions{Group: "g2"})
	if err := g2[0].DeadLetter(ctxT(t), nil); err != nil { // then x0
		t.Fatal(err)
	}
	if n, err := q.RequeueDeadLetters(ctxT(t), queen.DeadLetterQuery{}); err != nil || n != 2 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	wantData(t, pop(t, q, queen.PopOptions{Group: "g3", Batch: 10, AutoAck: true}), "x0", "x1", "x1", "x0")
}

// BenchmarkQueuesManyQueues: Client.Queues over 2,000 queues of 4
// partitions, each with a queue-mode cursor holding two offsets settled out
// of order (written straight into the tables).
func BenchmarkQueuesManyQueues(b *testing.B) {
	c := open(b, manual)
	s := pgx.Identifier{c.Schema()}.Sanitize()
	ctx := ctxT(b)
	for _, sql := range []string{
		`INSERT INTO ` + s + `.queues (tenant, name) SELECT '00000000-0000-0000-0000-000000000000', 'q' || i FROM generate_series(1, 2000) i`,
		`INSERT INTO ` + s + `.partitions (id, queue_id, name, last_offset) SELECT ` + s + `.partition_key(q.id, 'p' || k, 0), q.id, 'p' || k, 1000 FROM ` + s + `.queues q, generate_series(1, 4) k`,
		`INSERT INTO ` + s + `.subscriptions (queue_id, group_name, mode) SELECT id, '', 'all' FROM ` + s + `.queues`,
		`INSERT INTO ` + s + `.consumers (partition_id, group_name, committed, settled) SELECT id, '', 500, '{502,504}' FROM ` + s + `.partitions`,
		`ANALYZE`,
	} {
		if _, err := c.Pool().Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		qs, err := c.Queues(ctx)
		if err != nil || len(qs) != 2000 || qs[0].Groups[0].Lag != 4*498 {
			b.Fatalf("Queues: %d queues, %v; want 2000 with a lag of %d", len(qs), err, 4*498)
		}
	}
}
