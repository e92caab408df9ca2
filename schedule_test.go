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

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

// scheduleItems schedules one item per partition name in parts (data and
// transaction id "<prefix><i>"), all due at due.
func scheduleItems(t testing.TB, q *queen.Queue, due time.Time, prefix string, parts ...string) []queen.PushResult {
	t.Helper()
	items := make([]queen.Item, len(parts))
	for i, p := range parts {
		id := fmt.Sprintf("%s%d", prefix, i)
		items[i] = queen.Item{Partition: p, TransactionID: id, Data: []byte(id), DeliverAt: due}
	}
	res, err := q.Push(ctxT(t), items)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != queen.Scheduled || r.Offset != -1 || r.Err != nil {
			t.Fatalf("item %d: %+v, want Scheduled", i, r)
		}
	}
	return res
}

// drain pops (auto-acked) until want messages arrived or until deadline,
// and returns them with the time each pop returned.
func drainUntil(t testing.TB, q *queen.Queue, want int, deadline time.Time) ([]*queen.Message, []time.Time) {
	t.Helper()
	var got []*queen.Message
	var at []time.Time
	for len(got) < want && time.Now().Before(deadline) {
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{Batch: 500, Partitions: 16, AutoAck: true, Wait: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		for _, m := range msgs {
			got = append(got, m)
			at = append(at, now)
		}
	}
	return got, at
}

// A scheduled message is in no partition before its time: a pop before
// then gets nothing, and the message arrives after it, with the id Push
// reported.
func TestScheduledNotVisibleBeforeDue(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	due := time.Now().Add(1500 * time.Millisecond)
	res := scheduleItems(t, q, due, "s", "p")
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Scheduled != 1 || !st.NextDue.Equal(due.Truncate(time.Microsecond)) {
		t.Fatalf("status: Scheduled %d, NextDue %v; want 1, %v", st.Scheduled, st.NextDue, due)
	}
	for _, p := range st.Partitions {
		if p.LastOffset >= 0 {
			t.Fatalf("partition %s has offset %d before the due time", p.Name, p.LastOffset)
		}
	}
	var got *queen.Message
	var gotAt time.Time
	for deadline := due.Add(30 * time.Second); got == nil && time.Now().Before(deadline); {
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{AutoAck: true, Wait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) > 0 {
			got, gotAt = msgs[0], time.Now()
		}
	}
	if got == nil {
		t.Fatal("the scheduled message never arrived")
	}
	if gotAt.Before(due) || got.CreatedAt.Before(due.Truncate(time.Microsecond)) {
		t.Fatalf("delivered at %v (appended %v), before its time %v", gotAt, got.CreatedAt, due)
	}
	if got.ID != res[0].MessageID || got.Partition != "p" || string(got.Data) != "s0" || got.TransactionID != "s0" {
		t.Fatalf("got %+v, want the scheduled %+v", got, res[0])
	}
	t.Logf("delivered %v after its time", gotAt.Sub(due))
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 0 || !st.NextDue.IsZero() {
		t.Fatalf("status after the move: %+v, %v", st, err)
	}
}

// One call mixes items for now, for a time already past (an ordinary push)
// and for later; results keep the input order.
func TestScheduledMixedCall(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	due := time.Now().Add(time.Second)
	res, err := q.Push(ctxT(t), []queen.Item{
		{Data: []byte("now")},
		{Data: []byte("past"), DeliverAt: time.Now().Add(-time.Hour)},
		{Data: []byte("later"), DeliverAt: due},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != queen.Queued || res[1].Status != queen.Queued || res[2].Status != queen.Scheduled {
		t.Fatalf("statuses %s %s %s", res[0].Status, res[1].Status, res[2].Status)
	}
	msgs, _ := drainUntil(t, q, 3, time.Now().Add(30*time.Second))
	wantData(t, msgs, "now", "past", "later")
	if msgs[2].CreatedAt.Before(due.Truncate(time.Microsecond)) {
		t.Fatalf("the scheduled item was appended at %v, before %v", msgs[2].CreatedAt, due)
	}
}

// Two clients of a schema move at once: each scheduled message is
// delivered exactly once.
func TestScheduledExactlyOnceWithTwoMovers(t *testing.T) {
	a := open(t)
	b := open(t, func(cfg *queen.Config) { cfg.Schema = a.Schema() })
	const n = 3000
	due := time.Now().Add(6 * time.Second) // after both calls, on a loaded machine
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("p%d", i%7)
	}
	// Half scheduled through each client, so both movers know the time.
	scheduleItems(t, a.Queue("q"), due, "a", parts[:n/2]...)
	scheduleItems(t, b.Queue("q"), due, "b", parts[n/2:]...)
	msgs, _ := drainUntil(t, a.Queue("q"), n, time.Now().Add(60*time.Second))
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m.TransactionID]++
		if m.CreatedAt.Before(due.Truncate(time.Microsecond)) {
			t.Fatalf("%s appended at %v, before %v", m.TransactionID, m.CreatedAt, due)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages delivered, want %d", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("%s delivered %d times", id, k)
		}
	}
	// Nothing more comes.
	if more, _ := drainUntil(t, a.Queue("q"), 1, time.Now().Add(500*time.Millisecond)); len(more) != 0 {
		t.Fatalf("%d more messages", len(more))
	}
	if st, err := a.Queue("q").Status(ctxT(t)); err != nil || st.Scheduled != 0 {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// Due messages are appended in due order within a partition.
func TestScheduledInDueOrder(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	base := time.Now().Add(800 * time.Millisecond)
	var items []queen.Item
	for i := 4; i >= 0; i-- { // pushed latest first
		items = append(items, queen.Item{Partition: "p", Data: []byte(fmt.Sprint(i)),
			DeliverAt: base.Add(time.Duration(i) * 10 * time.Millisecond)})
	}
	if _, err := q.Push(ctxT(t), items); err != nil {
		t.Fatal(err)
	}
	msgs, _ := drainUntil(t, q, 5, time.Now().Add(30*time.Second))
	wantData(t, msgs, "0", "1", "2", "3", "4")
}

// A message scheduled by a client that closes before its time is moved by
// the next client to open.
func TestScheduledSurvivesRestart(t *testing.T) {
	var schema string
	{
		a := open(t)
		schema = a.Schema()
		due := time.Now().Add(time.Second)
		scheduleItems(t, a.Queue("q"), due, "r", "p")
		if err := a.Close(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(due)) // due while no client runs
	}
	b := open(t, func(cfg *queen.Config) { cfg.Schema = schema })
	msgs, _ := drainUntil(t, b.Queue("q"), 1, time.Now().Add(30*time.Second))
	wantData(t, msgs, "r0")
}

// A cancelled message is never delivered; the others are.
func TestCancelScheduled(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	due := time.Now().Add(1500 * time.Millisecond)
	scheduleItems(t, q, due, "c", "p", "p", "p")
	n, err := q.CancelScheduled(ctxT(t), []string{"c0", "c2", "nope"})
	if err != nil || n != 2 {
		t.Fatalf("cancel: %d, %v; want 2", n, err)
	}
	if n, err := q.CancelScheduled(ctxT(t), []string{"c0"}); err != nil || n != 0 {
		t.Fatalf("second cancel: %d, %v; want 0", n, err)
	}
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 1 {
		t.Fatalf("status %+v, %v", st, err)
	}
	msgs, _ := drainUntil(t, q, 2, due.Add(3*time.Second)) // waits past due for a wrong second one
	wantData(t, msgs, "c1")
	if _, err := q.CancelScheduled(ctxT(t), []string{""}); !errors.Is(err, queen.ErrInvalidName) {
		t.Fatalf("empty transaction id: %v", err)
	}
}

// Cancels racing the move: each message is delivered or cancelled, never
// both and never neither.
func TestCancelScheduledRacingTheMove(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	const n = 400
	due := time.Now().Add(3 * time.Second)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf("p%d", i%5)
	}
	scheduleItems(t, q, due, "x", parts...)
	var mu sync.Mutex
	cancelled := map[string]bool{}
	var wg sync.WaitGroup
	time.Sleep(time.Until(due.Add(-20 * time.Millisecond)))
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				id := fmt.Sprintf("x%d", i)
				k, err := q.CancelScheduled(context.Background(), []string{id})
				if err != nil {
					t.Error(err)
					return
				}
				if k == 1 {
					mu.Lock()
					cancelled[id] = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	msgs, _ := drainUntil(t, q, n-len(cancelled), time.Now().Add(30*time.Second))
	if more, _ := drainUntil(t, q, 1, time.Now().Add(500*time.Millisecond)); len(more) != 0 {
		msgs = append(msgs, more...)
	}
	delivered := map[string]bool{}
	for _, m := range msgs {
		if delivered[m.TransactionID] || cancelled[m.TransactionID] {
			t.Fatalf("%s delivered twice or delivered and cancelled", m.TransactionID)
		}
		delivered[m.TransactionID] = true
	}
	if len(delivered)+len(cancelled) != n {
		t.Fatalf("%d delivered + %d cancelled, want %d", len(delivered), len(cancelled), n)
	}
	t.Logf("%d cancelled, %d delivered", len(cancelled), len(delivered))
}

// A transaction id scheduled twice in a queue, in one call or two, is a
// Duplicate of the first, and delivered once.
func TestScheduleDuplicate(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	due := time.Now().Add(time.Second)
	first := scheduleItems(t, q, due, "d", "p")
	res, err := q.Push(ctxT(t), []queen.Item{
		{Partition: "p", TransactionID: "d0", Data: []byte("again"), DeliverAt: due},
		{Partition: "other", TransactionID: "e", Data: []byte("e"), DeliverAt: due},
		{Partition: "third", TransactionID: "e", Data: []byte("e again"), DeliverAt: due},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != queen.Duplicate || res[0].MessageID != first[0].MessageID {
		t.Fatalf("repeat in a second call: %+v, want Duplicate of %v", res[0], first[0].MessageID)
	}
	if res[1].Status != queen.Scheduled || res[2].Status != queen.Duplicate || res[2].MessageID != res[1].MessageID {
		t.Fatalf("repeat in one call: %+v, %+v", res[1], res[2])
	}
	msgs, _ := drainUntil(t, q, 3, time.Now().Add(5*time.Second))
	if len(msgs) != 2 {
		t.Fatalf("delivered %q, want d0 and e once each", datas(msgs))
	}
}

// With a DedupWindow, a scheduled message repeating a transaction id
// stored within the window when it is due is dropped, as that push would
// be.
func TestScheduledDedupWindowAtTheMove(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: time.Hour}); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(time.Second)
	scheduleItems(t, q, due, "w", "p")
	if _, err := q.Push(ctxT(t), []queen.Item{{Partition: "p", TransactionID: "w0", Data: []byte("now")}}); err != nil {
		t.Fatal(err)
	}
	msgs, _ := drainUntil(t, q, 2, due.Add(3*time.Second))
	wantData(t, msgs, "now")
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 0 {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// On an encrypted queue the scheduled table holds ciphertext only.
func TestScheduledEncryptedQueue(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = key })
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{Encryption: true}); err != nil {
		t.Fatal(err)
	}
	secret := "the-plaintext-of-a-scheduled-message"
	due := time.Now().Add(1500 * time.Millisecond)
	res, err := q.Push(ctxT(t), []queen.Item{{Key: "k", Headers: map[string]string{"h": "v"}, Data: []byte(secret), DeliverAt: due}})
	if err != nil || res[0].Status != queen.Scheduled {
		t.Fatalf("%+v, %v", res, err)
	}
	var blob []byte
	var flags int
	if err := c.Pool().QueryRow(ctxT(t), "SELECT blob, flags FROM "+pgx.Identifier{c.Schema(), "scheduled_gen"}.Sanitize()).
		Scan(&blob, &flags); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(blob, []byte(secret)) || flags&1 == 0 {
		t.Fatalf("the scheduled row holds the plaintext (flags %d)", flags)
	}
	msgs, _ := drainUntil(t, q, 1, time.Now().Add(30*time.Second))
	if len(msgs) != 1 || string(msgs[0].Data) != secret || msgs[0].Key != "k" || msgs[0].Headers["h"] != "v" {
		t.Fatalf("got %+v", msgs)
	}
}

// A keyed item goes to its key's lane, as when pushed now, and freezes the
// queue's lane count while it waits.
func TestScheduledKeyedLane(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{Lanes: 8}); err != nil {
		t.Fatal(err)
	}
	due := time.Now().Add(time.Second)
	res, err := q.Push(ctxT(t), []queen.Item{{Key: "k", Data: []byte("later"), DeliverAt: due}})
	if err != nil || res[0].Status != queen.Scheduled {
		t.Fatalf("%+v, %v", res, err)
	}
	now, err := q.Push(ctxT(t), []queen.Item{{Key: "k", Data: []byte("now")}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Partition != now[0].Partition {
		t.Fatalf("scheduled to %s, pushed to %s", res[0].Partition, now[0].Partition)
	}
	if err := q.Configure(ctxT(t), queen.QueueOptions{Lanes: 4}); !errors.Is(err, queen.ErrLanesFixed) {
		t.Fatalf("Configure with other lanes: %v, want ErrLanesFixed", err)
	}
	msgs, _ := drainUntil(t, q, 2, time.Now().Add(30*time.Second))
	wantData(t, msgs, "now", "later")
	if msgs[1].Key != "k" || msgs[1].Partition != res[0].Partition {
		t.Fatalf("got %+v", msgs[1])
	}
}

// Bad input fails the call and writes nothing.
func TestScheduleValidation(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	_, err := q.Push(ctxT(t), []queen.Item{
		{Data: []byte("a"), DeliverAt: time.Now().Add(time.Minute)},
		{Data: []byte("b"), DeliverAt: time.Now().Add(queen.MaxDeliverAhead + time.Hour)},
	})
	if !errors.Is(err, queen.ErrTooLarge) {
		t.Fatalf("DeliverAt too far: %v, want ErrTooLarge", err)
	}
	_, err = q.Push(ctxT(t), []queen.Item{
		{Data: []byte("a"), DeliverAt: time.Now().Add(time.Minute)},
		{Partition: "bad\x00", DeliverAt: time.Now().Add(time.Minute)},
	})
	if !errors.Is(err, queen.ErrInvalidName) {
		t.Fatalf("bad partition: %v, want ErrInvalidName", err)
	}
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 0 {
		t.Fatalf("status %+v, %v", st, err)
	}
	tx, err := c.Pool().Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := q.PushTx(ctxT(t), tx, []queen.Item{{DeliverAt: time.Now().Add(time.Minute)}}); err == nil {
		t.Fatal("PushTx with DeliverAt: no error")
	}
}

// A client whose mover only hears of a schedule by NOTIFY (its poll is
// far longer than the test) moves the message once due: the scheduling
// client closed before then.
func TestScheduledNotifiesOtherClients(t *testing.T) {
	const poll = 10 * time.Minute
	a := open(t, queen.SchedulePoll(poll))
	b := open(t, queen.SchedulePoll(poll), func(cfg *queen.Config) { cfg.Schema = a.Schema() })
	// b's mover has looked (at Open) and sleeps for the poll.
	time.Sleep(200 * time.Millisecond)
	due := time.Now().Add(2 * time.Second)
	scheduleItems(t, a.Queue("q"), due, "n", "p")
	time.Sleep(200 * time.Millisecond) // a's notifier sends within its 5ms tick
	if err := a.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	msgs, _ := drainUntil(t, b.Queue("q"), 1, due.Add(30*time.Second))
	wantData(t, msgs, "n0")
}

// Deleting a queue deletes its scheduled messages.
func TestScheduledGoWithTheQueue(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	scheduleItems(t, q, time.Now().Add(30*time.Minute), "g", "p", "p") // in a generation
	scheduleItems(t, q, time.Now().Add(2*time.Hour), "f", "p")         // in scheduled
	if err := q.Delete(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, c, "scheduled") + countRows(t, c, "scheduled_gen"); n != 0 {
		t.Fatalf("%d scheduled rows after the delete", n)
	}
}

// A plaintext message scheduled before its queue was made encrypted is not
// appended (nothing plaintext lands in an encrypted queue): it is held,
// counted by Status, until cancelled; the mover does not spin on it.
func TestScheduledHeldWhenQueueBecameEncrypted(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = bytes.Repeat([]byte{1}, 32) })
	q := c.Queue("q")
	due := time.Now().Add(time.Second)
	scheduleItems(t, q, due, "h", "p")
	if err := q.Configure(ctxT(t), queen.QueueOptions{Encryption: true}); err != nil {
		t.Fatal(err)
	}
	if msgs, _ := drainUntil(t, q, 1, due.Add(2*time.Second)); len(msgs) != 0 {
		t.Fatalf("delivered %q", datas(msgs))
	}
	var held bool
	if err := c.Pool().QueryRow(ctxT(t), "SELECT held FROM "+pgx.Identifier{c.Schema(), "scheduled"}.Sanitize()).
		Scan(&held); err != nil || !held {
		t.Fatalf("held %v, %v", held, err)
	}
	if st, err := q.Status(ctxT(t)); err != nil || st.Scheduled != 1 {
		t.Fatalf("status %+v, %v", st, err)
	}
	if n, err := q.CancelScheduled(ctxT(t), []string{"h0"}); err != nil || n != 1 {
		t.Fatalf("cancel: %d, %v", n, err)
	}
}

// During an outage a scheduled item fails, saying it is not spooled; an
// item for now in the same call is spooled as usual.
func TestScheduleDuringOutageFails(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	cl := pgtest.NewCluster(t, pgcluster.Options{})
	c := open(t, func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema, cfg.StatementTimeout = cl.URL, "outage", 2*time.Second
	})
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("before")})
	if err := cl.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	res, _, err := pushTimed(t, q, time.Minute,
		queen.Item{Data: []byte("now")},
		queen.Item{Data: []byte("later"), DeliverAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != queen.Buffered {
		t.Fatalf("item for now: %+v, want Buffered", res[0])
	}
	if res[1].Status != queen.Failed || res[1].Err == nil || !strings.Contains(res[1].Err.Error(), "not spooled") {
		t.Fatalf("scheduled item: %+v, want Failed, not spooled", res[1])
	}
}

// move_scheduled's answer drives the mover: a move its limits cut says the
// next row is due already (so the mover goes again at once), rows of a
// queue being deleted are left for the cascade and reported due (looked at
// again soon), and once everything due is moved the answer is the next
// future due time.
func TestMoveScheduledNextDue(t *testing.T) {
	skipOnLayout(t, "a lock shape: it locks a queue row by hand (FOR UPDATE of a reference table, on every node), which the mover waits for there instead of skipping it")
	ctx := ctxT(t)
	c := open(t)
	schema := c.Schema()
	far := time.Now().Add(time.Hour)
	scheduleItems(t, c.Queue("a"), far, "a", "p", "p", "p")
	scheduleItems(t, c.Queue("b"), far, "b", "p")
	scheduleItems(t, c.Queue("a"), far.Add(time.Hour), "z", "p")
	if err := c.Close(ctx); err != nil { // no mover of its own from here
		t.Fatal(err)
	}
	pool := pgtest.Pool(t)
	unmoved(t, pool, schema)
	// Both tables: those due within the hour are in a generation, the one
	// due in two hours in scheduled.
	for _, tbl := range []string{"scheduled", "scheduled_gen"} {
		if _, err := pool.Exec(ctx, "UPDATE "+pgx.Identifier{schema, tbl}.Sanitize()+
			" SET due_at = now() - interval '1 second' WHERE due_at < now() + interval '90 minutes'"); err != nil {
			t.Fatal(err)
		}
	}
	move := func(limit int) (moved int32, nextIn int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, "SELECT moved, next_in_ms FROM "+pgx.Identifier{schema, "move_scheduled"}.Sanitize()+"($1, 16 << 20)", limit).
			Scan(&moved, &nextIn); err != nil {
			t.Fatal(err)
		}
		return moved, nextIn
	}
	if moved, next := move(2); moved != 2 || next > 0 {
		t.Fatalf("limit 2 of 4 due: moved %d, next in %d ms; want 2 and a due row (<= 0)", moved, next)
	}
	// A delete of queue b in flight holds its row FOR UPDATE.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{schema, "queues"}.Sanitize()+" WHERE name = 'b' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	if moved, next := move(10); moved != 1 || next > 0 {
		t.Fatalf("queue b locked: moved %d, next in %d ms; want a's last one and b's still due (<= 0)", moved, next)
	}
	if moved, next := move(10); moved != 0 || next > 0 {
		t.Fatalf("only b due, locked: moved %d, next in %d ms; want 0 and due (<= 0)", moved, next)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if moved, next := move(10); moved != 1 || next < 90*60*1000 || next > 121*60*1000 {
		t.Fatalf("b released: moved %d, next in %d ms; want 1 and the row due in two hours", moved, next)
	}
}

// A scheduled item's statement is bounded by Config.StatementTimeout, as
// every statement of the engine is: while the database answers but the
// write waits on a lock (here the schedule's state row, held by another
// transaction; on the Citus layout a reference-table write waiting for a
// node), the item is Failed after about that long and the call's other
// items are stored, rather than the call waiting until its caller's ctx
// ends.
func TestScheduleWaitingOnALockFails(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a statement timeout")
	}
	c := open(t, func(cfg *queen.Config) { cfg.StatementTimeout = 500 * time.Millisecond })
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("before")})
	tx, err := c.Pool().Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctxT(t), "SELECT 1 FROM "+pgx.Identifier{c.Schema(), "scheduled_state"}.Sanitize()+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	var txns []string
	for _, ahead := range []time.Duration{10 * time.Minute, 2 * time.Hour} { // FOR SHARE, FOR NO KEY UPDATE
		txn := "later-" + ahead.String()
		txns = append(txns, txn)
		res, took, err := pushTimed(t, q, 20*time.Second,
			queen.Item{Data: []byte("now")},
			queen.Item{Data: []byte("later"), DeliverAt: time.Now().Add(ahead), TransactionID: txn})
		if err != nil {
			t.Fatalf("%s ahead: %v", ahead, err)
		}
		if res[0].Status != queen.Queued {
			t.Fatalf("%s ahead: item for now: %+v, want Queued", ahead, res[0])
		}
		if res[1].Status != queen.Failed || res[1].Err == nil {
			t.Fatalf("%s ahead: scheduled item: %+v, want Failed", ahead, res[1])
		}
		if took > 5*time.Second {
			t.Errorf("%s ahead: Push took %s with a 500ms StatementTimeout", ahead, took)
		}
	}
	// Failed means not stored: the statements that waited on the lock must
	// not go on to commit once it is released.
	if err := tx.Rollback(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if n, err := q.CancelScheduled(ctxT(t), txns); err != nil || n != 0 {
		t.Fatalf("items reported Failed: %d of %d found scheduled once the lock was released (%v)", n, len(txns), err)
	}
}

// A scheduled item's outcome is what the database did: where its commit
// outlives StatementTimeout (here it waits for a synchronous standby,
// after committing locally, as a commit whose answer is lost does), the
// item is never reported Failed while it is stored. The call asks again,
// by the item's transaction id: Scheduled once the database answers, and
// an error saying the outcome is unknown if it does not.
func TestScheduleCommitOutlivingTimeoutIsNotFailed(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	cl := pgtest.NewCluster(t, pgcluster.Options{})
	c := open(t, func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema, cfg.StatementTimeout = cl.URL, "syncwait", 500*time.Millisecond
		cfg.Maintenance.Interval = -1
	})
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("before")}) // the queue exists
	setStandby := func(names string) {
		t.Helper()
		if _, err := c.Pool().Exec(ctxT(t), "ALTER SYSTEM SET synchronous_standby_names = '"+names+"'"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Pool().Exec(ctxT(t), "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	stored := func(txn string) int {
		t.Helper()
		n, err := q.CancelScheduled(ctxT(t), []string{txn})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The standby never comes: the call cannot tell, and says so.
	setStandby("nobody")
	res, _, err := pushTimed(t, q, 10*time.Second,
		queen.Item{Data: []byte("later"), DeliverAt: time.Now().Add(time.Hour), TransactionID: "w1"})
	setStandby("")
	if err == nil {
		t.Fatalf("commit never answered: %+v, want the call to fail with the outcome unknown", res[0])
	}
	// The history checker recognizes these words (history.ScheduledOutcomeUnknown).
	if !strings.Contains(err.Error(), "whether the scheduled items were stored is unknown") {
		t.Fatalf("commit never answered: %v, want an error saying the outcome is unknown", err)
	}

	// The standby comes back while the call asks again: Scheduled, stored.
	setStandby("nobody")
	type out struct {
		res []queen.PushResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := q.Push(ctxT(t), []queen.Item{{Data: []byte("later"), DeliverAt: time.Now().Add(time.Hour), TransactionID: "w2"}})
		done <- out{res, err}
	}()
	time.Sleep(700 * time.Millisecond) // past the first commit's timeout
	setStandby("")
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.res[0].Status != queen.Scheduled {
		t.Fatalf("%+v, want Scheduled", o.res[0])
	}
	if n := stored("w2"); n != 1 {
		t.Fatalf("reported Scheduled, %d stored", n)
	}
}
