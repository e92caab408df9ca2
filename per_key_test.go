package queen_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// openPair returns two clients (two engines, two pools: as two processes
// would be) on one fresh schema, and the schema's name.
func openPair(t *testing.T, mod ...func(*queen.Config)) (*queen.Client, *queen.Client, string) {
	t.Helper()
	schema := pgtest.Schema(t)
	set := func(c *queen.Config) {
		c.Schema = schema
		for _, f := range mod {
			f(c)
		}
	}
	return open(t, set), open(t, set), schema
}

// keyGuard detects two holders of one key at once.
type keyGuard struct {
	mu       sync.Mutex
	in       map[string]int
	overlaps atomic.Int64
	active   atomic.Int64 // handlers running, across keys
	maxAct   atomic.Int64
}

func newKeyGuard() *keyGuard { return &keyGuard{in: map[string]int{}} }

func (g *keyGuard) enter(key string) {
	g.mu.Lock()
	g.in[key]++
	if g.in[key] > 1 {
		g.overlaps.Add(1)
	}
	g.mu.Unlock()
	a := g.active.Add(1)
	for {
		m := g.maxAct.Load()
		if a <= m || g.maxAct.CompareAndSwap(m, a) {
			break
		}
	}
}

func (g *keyGuard) leave(key string) {
	g.active.Add(-1)
	g.mu.Lock()
	g.in[key]--
	g.mu.Unlock()
}

// Mutual exclusion: 8 consumers across two clients process 200 keys x 20
// messages; no key is ever held by two handlers at once, every message is
// handled exactly once, and different keys do run in parallel.
func TestPerKeyMutualExclusion(t *testing.T) {
	const keys = 200
	per := 20
	if onLayout() {
		// A claim there reads the ready set over every shard: some 5 claims
		// a second a client on the loaded VM, 3,300 messages a minute.
		per = 8
	}
	c1, c2, _ := openPair(t)
	q1, q2 := c1.Queue("jobs"), c2.Queue("jobs")
	items := make([]queen.Item, 0, keys*per)
	for i := range per {
		for k := range keys {
			items = append(items, queen.Item{Partition: fmt.Sprintf("k%03d", k), Data: []byte(strconv.Itoa(i))})
		}
	}
	push(t, q1, items...)

	g := newKeyGuard()
	var (
		mu      sync.Mutex
		seen    = map[string]int{}
		total   atomic.Int64
		byCl    [2]atomic.Int64
		done    = make(chan struct{})
		once    sync.Once
		ctx, cn = context.WithTimeout(ctxT(t), 60*time.Second)
	)
	defer cn()
	handler := func(cl int) func(context.Context, *queen.Message) error {
		return func(_ context.Context, m *queen.Message) error {
			g.enter(m.Partition)
			time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
			mu.Lock()
			seen[m.Partition+"/"+string(m.Data)]++
			mu.Unlock()
			g.leave(m.Partition)
			byCl[cl].Add(1)
			if total.Add(1) == int64(keys*per) {
				once.Do(func() { close(done) })
			}
			return nil
		}
	}
	var wg sync.WaitGroup
	for i, q := range []*queen.Queue{q1, q2} {
		wg.Go(func() {
			err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 4, Wait: time.Second},
				Concurrency: 4}, handler(i))
			if err != nil {
				t.Errorf("Consume: %v", err)
			}
		})
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
	// Let in-flight settles land before stopping, so nothing is redelivered
	// and counted twice by a late straggler.
	waitLag(t, q1, 0)
	cn()
	wg.Wait()

	if n := g.overlaps.Load(); n != 0 {
		t.Errorf("%d overlapping handlers on one key", n)
	}
	if len(seen) != keys*per {
		t.Errorf("handled %d distinct messages, want %d", len(seen), keys*per)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("message %s handled %d times", k, n)
		}
	}
	if m := g.maxAct.Load(); m < 4 {
		t.Errorf("at most %d handlers ran at once; want real parallelism across keys (>= 4 of 8)", m)
	}
	if byCl[0].Load() == 0 || byCl[1].Load() == 0 {
		t.Errorf("per client: %d and %d messages; want both clients working", byCl[0].Load(), byCl[1].Load())
	}
	t.Logf("max parallel handlers %d; client split %d/%d", g.maxAct.Load(), byCl[0].Load(), byCl[1].Load())
}

// waitLag waits until the queue-mode group's total lag is at most want.
func waitLag(t *testing.T, q *queen.Queue, want int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := q.Status(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		var lag int64
		for _, p := range st.Partitions {
			for _, g := range p.Groups {
				if g.Group == "" {
					lag += g.Lag
				}
			}
		}
		if lag <= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lag still %d", lag)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// orderLog checks the delivery history of one key: every batch starts at
// the first offset not yet acked and goes on without gaps; a payload is its
// push sequence number, which must equal its offset (push order).
type orderLog struct {
	mu           sync.Mutex
	acked        map[string]int64 // next offset to be acked, per key
	errs         []string
	redeliveries atomic.Int64
}

func (l *orderLog) fail(format string, a ...any) {
	l.mu.Lock()
	if len(l.errs) < 20 {
		l.errs = append(l.errs, fmt.Sprintf(format, a...))
	}
	l.mu.Unlock()
}

// batch checks one partition's messages of one pop against the history.
func (l *orderLog) batch(msgs []*queen.Message) {
	key := msgs[0].Partition
	l.mu.Lock()
	next := l.acked[key]
	l.mu.Unlock()
	if msgs[0].Offset != next {
		l.fail("key %s: batch starts at offset %d, first unacked is %d", key, msgs[0].Offset, next)
	}
	for i, m := range msgs {
		if m.Offset != msgs[0].Offset+int64(i) {
			l.fail("key %s: batch not contiguous: %d at position %d after %d", key, m.Offset, i, msgs[0].Offset)
		}
		if string(m.Data) != strconv.FormatInt(m.Offset, 10) {
			l.fail("key %s: offset %d carries push #%s", key, m.Offset, m.Data)
		}
		if m.Attempt > 1 {
			l.redeliveries.Add(1)
		}
	}
}

// ack records an ack before it is sent: the next holder of the key may pop
// as soon as it commits.
func (l *orderLog) ack(ctx context.Context, m *queen.Message) error {
	l.mu.Lock()
	prev := l.acked[m.Partition]
	l.acked[m.Partition] = m.Offset + 1
	l.mu.Unlock()
	if err := m.Ack(ctx); err != nil {
		l.mu.Lock()
		if l.acked[m.Partition] == m.Offset+1 { // no successor's ack since
			l.acked[m.Partition] = prev
		}
		l.mu.Unlock()
		return err
	}
	return nil
}

// Order under churn, randomized: producers push while workers join, leave and
// die mid-batch (their leases expire). Per key the history must show one
// worker at a time, batches starting exactly at the first unacked message,
// and offsets (push order) in sequence.
func TestPerKeyOrderWithChurnAndDeaths(t *testing.T) {
	const keys, per = 12, 40
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 7))
	c1, c2, _ := openPair(t)
	clients := []*queen.Client{c1, c2}
	// Handling takes at most ~5 ms a batch; the lease leaves room for a
	// starved machine, where a handler that outlived its lease would let a
	// successor in by design.
	lease := 2 * time.Second
	for _, c := range clients {
		configure(t, c, "events", queen.QueueOptions{LeaseTime: lease})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Producers: one per key group, pushing each key's messages in order
	// in small calls, with pauses, while consumption runs.
	var prod sync.WaitGroup
	for p := range 3 {
		prod.Go(func() {
			r := rand.New(rand.NewPCG(uint64(seed), uint64(p)))
			q := clients[p%2].Queue("events")
			next := map[string]int{}
			for {
				var items []queen.Item
				left := false
				for k := p; k < keys; k += 3 {
					key := fmt.Sprintf("key-%02d", k)
					for range r.IntN(4) {
						if next[key] < per {
							items = append(items, queen.Item{Partition: key, Data: []byte(strconv.Itoa(next[key]))})
							next[key]++
						}
					}
					left = left || next[key] < per
				}
				if len(items) == 0 {
					if !left {
						return
					}
					continue
				}
				res, err := q.Push(ctx, items)
				if err != nil {
					t.Errorf("push: %v", err)
					return
				}
				for _, r := range res {
					if r.Status != queen.Queued {
						t.Errorf("push: %s %v", r.Status, r.Err)
						return
					}
				}
				time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
			}
		})
	}

	g := newKeyGuard()
	log := &orderLog{acked: map[string]int64{}}
	var deaths, workers atomic.Int64
	complete := func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		n := 0
		for _, v := range log.acked {
			n += int(v)
		}
		return n == keys*per
	}
	// worker pops and handles until its life ends; it may die holding a
	// lease. dieP 1 dies in the first batch it handles, before its last
	// message.
	worker := func(c *queen.Client, life time.Duration, dieP float64, r *rand.Rand) {
		workers.Add(1)
		q := c.Queue("events")
		end := time.Now().Add(life)
		for time.Now().Before(end) && ctx.Err() == nil {
			msgs, err := q.Pop(ctx, queen.PopOptions{Batch: 1 + r.IntN(6), Partitions: 1 + r.IntN(2), Wait: 50 * time.Millisecond})
			if err != nil {
				if ctx.Err() == nil {
					t.Errorf("pop: %v", err)
				}
				return
			}
			for len(msgs) > 0 {
				k := 1
				for k < len(msgs) && msgs[k].Partition == msgs[0].Partition {
					k++
				}
				part := msgs[:k]
				msgs = msgs[k:]
				key := part[0].Partition
				if time.Until(part[0].LeaseExpiresAt) < lease/3 {
					// Too little of the lease left to finish: a careful
					// worker leaves the batch to expire rather than race
					// its successor.
					continue
				}
				g.enter(key)
				log.batch(part)
				die := r.Float64() < dieP
				n := len(part)
				if dieP == 1 {
					n = r.IntN(len(part))
				} else if die {
					n = r.IntN(len(part) + 1)
				}
				// Handle n messages, then ack through the last one (an ack
				// commits the cursor through it) and, unless dying, end
				// the lease with it.
				for range n {
					time.Sleep(time.Duration(r.IntN(800)) * time.Microsecond)
				}
				g.leave(key)
				if n > 0 {
					if err := log.ack(ctx, part[n-1]); err != nil {
						t.Errorf("ack %s@%d: %v", key, part[n-1].Offset, err)
					}
				}
				if die {
					// Dead: its other partitions' leases are abandoned too
					// and expire; it never comes back.
					deaths.Add(1)
					return
				}
			}
		}
	}
	var wg sync.WaitGroup
	// One death for certain, before anyone else consumes: what a busy
	// machine's scheduling leaves to chance below must not decide whether
	// lease expiry is exercised.
	wg.Go(func() { worker(c1, time.Hour, 1, rand.New(rand.NewPCG(uint64(seed), 99))) })
	for deaths.Load() == 0 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	// Two long-lived workers keep progress; others come and go.
	for i := range 2 {
		wg.Go(func() { worker(clients[i], time.Hour, 0, rand.New(rand.NewPCG(uint64(seed), uint64(100+i)))) })
	}
	for i := 0; ctx.Err() == nil && !complete(); i++ {
		if i < 40 && workers.Load()-deaths.Load() < 8 {
			r := rand.New(rand.NewPCG(uint64(seed), uint64(200+i)))
			life := time.Duration(50+rng.IntN(400)) * time.Millisecond
			wg.Go(func() { worker(clients[i%2], life, 0.3, r) })
		}
		time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
	}
	prod.Wait()
	for !complete() && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	for _, e := range log.errs {
		t.Error(e)
	}
	if n := g.overlaps.Load(); n != 0 {
		t.Errorf("%d overlapping holders of one key", n)
	}
	if !complete() {
		t.Errorf("not every message was acked: %v", log.acked)
	}
	if deaths.Load() == 0 || log.redeliveries.Load() == 0 {
		t.Errorf("deaths %d, redeliveries %d: the test did not exercise lease expiry", deaths.Load(), log.redeliveries.Load())
	}
	t.Logf("workers %d, deaths %d, redelivered messages %d, max parallel %d",
		workers.Load(), deaths.Load(), log.redeliveries.Load(), g.maxAct.Load())
}

// Order under churn with Consume: consumers on two clients join and leave
// (their contexts end at random times) while producers push. Leaving
// consumers ack what they handled and release the rest, so each key's
// handler sequence must be exactly 0, 1, 2, ... with no overlap.
func TestPerKeyOrderConsumeJoinLeave(t *testing.T) {
	const keys, per = 30, 30
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	c1, c2, _ := openPair(t)
	ctx, cancel := context.WithTimeout(ctxT(t), 30*time.Second)
	defer cancel()

	var prod sync.WaitGroup
	prod.Go(func() {
		q := c1.Queue("life")
		for i := range per {
			items := make([]queen.Item, keys)
			for k := range keys {
				items[k] = queen.Item{Partition: fmt.Sprintf("file-%02d", k), Data: []byte(strconv.Itoa(i))}
			}
			if _, err := q.Push(ctx, items); err != nil {
				t.Errorf("push: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	g := newKeyGuard()
	var (
		mu    sync.Mutex
		last  = map[string]int64{}
		bad   []string
		total atomic.Int64
	)
	handler := func(_ context.Context, m *queen.Message) error {
		g.enter(m.Partition)
		defer g.leave(m.Partition)
		mu.Lock()
		prev, ok := last[m.Partition]
		if !ok {
			prev = -1
		}
		if m.Offset != prev+1 || string(m.Data) != strconv.FormatInt(m.Offset, 10) {
			bad = append(bad, fmt.Sprintf("%s: offset %d (push #%s) after %d", m.Partition, m.Offset, m.Data, prev))
		}
		last[m.Partition] = m.Offset
		mu.Unlock()
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		total.Add(1)
		return nil
	}
	var wg sync.WaitGroup
	var joined atomic.Int64
	for i := 0; ctx.Err() == nil && total.Load() < keys*per; i++ {
		if i < 60 {
			life := time.Duration(30+rng.IntN(300)) * time.Millisecond
			if i < 2 {
				life = time.Hour // keep progress
			}
			c := []*queen.Client{c1, c2}[i%2]
			conc := 1 + rng.IntN(3)
			batch := 1 + rng.IntN(5)
			joined.Add(1)
			wg.Go(func() {
				cctx, ccancel := context.WithTimeout(ctx, life)
				defer ccancel()
				err := c.Queue("life").Consume(cctx, queen.ConsumeOptions{
					PopOptions: queen.PopOptions{Batch: batch, Wait: 100 * time.Millisecond}, Concurrency: conc}, handler)
				if err != nil {
					t.Errorf("Consume: %v", err)
				}
			})
		}
		time.Sleep(time.Duration(5+rng.IntN(30)) * time.Millisecond)
	}
	prod.Wait()
	cancel()
	wg.Wait()
	for _, b := range bad {
		t.Error(b)
	}
	if n := g.overlaps.Load(); n != 0 {
		t.Errorf("%d overlapping handlers on one key", n)
	}
	if n := total.Load(); n != keys*per {
		t.Errorf("handled %d messages, want %d", n, keys*per)
	}
	t.Logf("consumers joined %d, max parallel handlers %d", joined.Load(), g.maxAct.Load())
}

// Failure policy pause (the default): a failed message blocks the later
// messages of its key until it is dead-lettered; other keys go on.
func TestFailurePolicyPause(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 3, DeadLetter: true, RetryBackoff: noBackoff})
	pushN(t, q, "k", "m", 3)
	pushN(t, q, "other", "o", 1)
	for attempt := 1; attempt <= 3; attempt++ {
		// Later messages of k come only behind the failing m0.
		msgs := pop(t, q, queen.PopOptions{Partition: "k", Batch: 10})
		wantData(t, msgs, "m0", "m1", "m2")
		if msgs[0].Attempt != attempt {
			t.Fatalf("attempt %d: Message.Attempt = %d", attempt, msgs[0].Attempt)
		}
		if err := msgs[0].Fail(ctxT(t), errors.New("boom")); err != nil {
			t.Fatal(err)
		}
		if attempt == 1 {
			// Other keys are not held up.
			o := pop(t, q, queen.PopOptions{Partition: "other"})
			wantData(t, o, "o0")
			ack(t, o[0])
		}
	}
	// Three failures spend RetryLimit 3: m0 is dead-lettered, k goes on.
	msgs := pop(t, q, queen.PopOptions{Partition: "k", Batch: 10})
	wantData(t, msgs, "m1", "m2")
	dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || string(dls[0].Data) != "m0" || dls[0].Attempts != 3 {
		t.Fatalf("dead letters: %+v", dls)
	}
}

// Failure policy skip: a failed message is re-enqueued at its key's tail
// (same id, transaction id and payload; its failures carried along), later
// messages go on, and at RetryLimit it is dead-lettered.
func TestFailurePolicySkip(t *testing.T) {
	c := open(t, func(cfg *queen.Config) { cfg.EncryptionKey = make([]byte, 32) })
	for _, enc := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypted=%v", enc), func(t *testing.T) {
			name := fmt.Sprintf("skip-%v", enc)
			q := configure(t, c, name, queen.QueueOptions{RetryLimit: 3, DeadLetter: true,
				FailurePolicy: queen.FailureSkip, Encryption: enc, DedupWindow: time.Hour, RetryBackoff: noBackoff})
			longTxn := strings.Repeat("é", 150) + "-a" // 302 bytes: a two-byte varint
			res := push(t, q,
				queen.Item{Partition: "k", TransactionID: longTxn, Data: []byte("a")},
				queen.Item{Partition: "k", TransactionID: "b", Data: []byte("b")},
				queen.Item{Partition: "k", TransactionID: "c", Data: nil})
			a := pop(t, q, queen.PopOptions{Partition: "k"})
			wantData(t, a, "a")
			if err := a[0].Fail(ctxT(t), errors.New("first")); err != nil {
				t.Fatal(err)
			}
			// Later messages go on.
			msgs := pop(t, q, queen.PopOptions{Partition: "k", Batch: 2})
			wantData(t, msgs, "b", "")
			for _, m := range msgs {
				ack(t, m)
			}
			// The failed message is at the tail, carrying its failure.
			msgs = pop(t, q, queen.PopOptions{Partition: "k", Batch: 10})
			wantData(t, msgs, "a")
			m := msgs[0]
			if m.Offset != 3 || m.ID != res[0].MessageID || m.TransactionID != longTxn || m.Attempt != 2 {
				t.Fatalf("re-enqueued: offset %d id %s txn %q attempt %d; want offset 3, id %s, the same txn, attempt 2",
					m.Offset, m.ID, m.TransactionID, m.Attempt, res[0].MessageID)
			}
			// A producer retrying the transaction id while the message lives
			// is still a duplicate of it.
			if r := push(t, q, queen.Item{Partition: "k", TransactionID: longTxn})[0]; r.Status != queen.Duplicate || r.MessageID != res[0].MessageID {
				t.Fatalf("re-push of a re-enqueued message: %+v", r)
			}
			if err := m.Fail(ctxT(t), errors.New("second")); err != nil {
				t.Fatal(err)
			}
			msgs = pop(t, q, queen.PopOptions{Partition: "k", Batch: 10})
			wantData(t, msgs, "a")
			if msgs[0].Offset != 4 || msgs[0].Attempt != 3 {
				t.Fatalf("second re-enqueue: offset %d attempt %d", msgs[0].Offset, msgs[0].Attempt)
			}
			// The third failure spends RetryLimit 3.
			if err := msgs[0].Fail(ctxT(t), errors.New("third")); err != nil {
				t.Fatal(err)
			}
			if msgs := pop(t, q, queen.PopOptions{Partition: "k", Batch: 10}); len(msgs) != 0 {
				t.Fatalf("after the limit: %q", datas(msgs))
			}
			dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
			if err != nil {
				t.Fatal(err)
			}
			if len(dls) != 1 || string(dls[0].Data) != "a" || dls[0].Attempts != 3 || dls[0].Offset != 4 {
				t.Fatalf("dead letters: %+v", dls)
			}
		})
	}
}

// Skip through Consume: a handler failing a message once sees the key's
// later messages first and the failed one again at the end.
func TestFailurePolicySkipConsume(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryBackoff: noBackoff})
	pushN(t, q, "k", "m", 4)
	var mu sync.Mutex
	var order []string
	failed := false
	ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Second)
	defer cancel()
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, Wait: 50 * time.Millisecond}},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, fmt.Sprintf("%s#%d", m.Data, m.Attempt))
			if string(m.Data) == "m1" && !failed {
				failed = true
				return errors.New("transient")
			}
			if len(order) == 5 {
				cancel()
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	// m2 and m3 were in the failed batch, released and redelivered (their
	// Attempt counts that); m1 comes back last, carrying its failure.
	if got := strings.Join(order, " "); got != "m0#1 m1#1 m2#2 m3#2 m1#2" {
		t.Fatalf("handled %s; want m0#1 m1#1 m2#2 m3#2 m1#2", got)
	}
}

func TestFailurePolicyOption(t *testing.T) {
	c := open(t)
	if err := c.Queue("q").Configure(ctxT(t), queen.QueueOptions{FailurePolicy: "drop"}); err == nil {
		t.Fatal("Configure accepted an unknown FailurePolicy")
	}
	// The default is pause: a failed message comes back in place.
	q := configure(t, c, "q", queen.QueueOptions{RetryBackoff: noBackoff})
	pushN(t, q, "", "m", 2)
	m := pop(t, q, queen.PopOptions{})
	if err := m[0].Fail(ctxT(t), nil); err != nil {
		t.Fatal(err)
	}
	wantData(t, pop(t, q, queen.PopOptions{}), "m0")
}

// pendingCount is the size of the ready set of schema's queue.
func pendingCount(t *testing.T, schema string) int {
	t.Helper()
	var n int
	err := pgtest.Pool(t).QueryRow(ctxT(t), "SELECT count(*) FROM "+pgx.Identifier{schema}.Sanitize()+".partitions WHERE pending").Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// backlogCount is the size of group's backlog in schema.
func backlogCount(t *testing.T, schema, group string) int {
	t.Helper()
	var n int
	err := pgtest.Pool(t).QueryRow(ctxT(t), "SELECT count(*) FROM "+pgx.Identifier{schema}.Sanitize()+".backlog WHERE group_name = $1", group).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// the ready set. Partitions are created on first push (in
// the shared set); pops clear drained ones, moving them to the backlog of
// each subscribed group that has not drained them; a group's first contact
// brings back what it has not read.
func TestReadySet(t *testing.T) {
	const keys = 3000
	schema, q := pushedWideQueue(t, keys)
	if n := pendingCount(t, schema); n != keys {
		t.Fatalf("after first pushes: %d pending, want %d", n, keys)
	}
	// Group a drains everything; group b has subscribed but read nothing.
	for _, m := range pop(t, q, queen.PopOptions{Group: "b", Partition: "k00000"}) {
		ack(t, m)
	}
	got := 0
	for {
		msgs := pop(t, q, queen.PopOptions{Group: "a", Batch: 1000, Partitions: 1000, AutoAck: true})
		if len(msgs) == 0 {
			break
		}
		got += len(msgs)
	}
	if got != keys {
		t.Fatalf("group a got %d messages, want %d", got, keys)
	}
	// a's pops took what they drained out of the shared set; what b has not
	// read is in b's own backlog (k00000 is drained by both groups).
	if n := pendingCount(t, schema); n != 0 {
		t.Fatalf("group a drained everything: %d pending, want 0", n)
	}
	if n := backlogCount(t, schema, "b"); n != keys-1 {
		t.Fatalf("group b has not read: %d in its backlog, want %d", n, keys-1)
	}
	for {
		msgs := pop(t, q, queen.PopOptions{Group: "b", Batch: 1000, Partitions: 1000, AutoAck: true})
		if len(msgs) == 0 {
			break
		}
	}
	// Empty pops clear at most 64 each.
	for range keys/64 + 2 {
		pop(t, q, queen.PopOptions{Group: "a"})
	}
	if n := pendingCount(t, schema); n != 0 {
		t.Fatalf("after both groups drained: %d pending, want 0", n)
	}
	if n := backlogCount(t, schema, "b"); n != 0 {
		t.Fatalf("after both groups drained: %d in b's backlog, want 0", n)
	}
	// A few keys get messages: only they are pending, and pops find them.
	for _, k := range []int{7, 1500, 2999} {
		push(t, q, queen.Item{Partition: fmt.Sprintf("k%05d", k), Data: []byte("y")})
	}
	if n := pendingCount(t, schema); n != 3 {
		t.Fatalf("%d pending, want 3", n)
	}
	msgs := pop(t, q, queen.PopOptions{Group: "a", Batch: 10, Partitions: 10})
	if onLayout() {
		// A claim there takes one worker's partitions: a pop per worker.
		for range 2 {
			msgs = append(msgs, pop(t, q, queen.PopOptions{Group: "a", Batch: 10, Partitions: 10})...)
		}
	}
	if len(msgs) != 3 {
		t.Fatalf("group a found %d of the 3 ready keys", len(msgs))
	}
	// A new group subscribing to everything sees every retained message,
	// though the set had been cleared.
	got = 0
	for {
		msgs := pop(t, q, queen.PopOptions{Group: "late", Batch: 1000, Partitions: 1000, AutoAck: true})
		if len(msgs) == 0 {
			break
		}
		got += len(msgs)
	}
	if got != keys+3 {
		t.Fatalf("late group got %d messages, want %d", got, keys+3)
	}
}

// Skip inside Client.Tx, after the Tx's own push to the same key: the
// settle runs after the pushes (it holds that partition's row already) and
// still re-enqueues.
func TestFailurePolicySkipInTx(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryBackoff: noBackoff})
	pushN(t, q, "k", "m", 2)
	m := pop(t, q, queen.PopOptions{Partition: "k"})
	wantData(t, m, "m0")
	err := c.Tx(ctxT(t), func(tx *queen.Tx) error {
		tx.Push("q", []queen.Item{{Partition: "k", Data: []byte("n")}})
		tx.Fail(m[0], errors.New("later"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	msgs := pop(t, q, queen.PopOptions{Partition: "k", Batch: 10})
	wantData(t, msgs, "m1", "n", "m0")
	if msgs[2].Attempt != 2 || msgs[2].Offset != 3 {
		t.Fatalf("re-enqueued m0: offset %d attempt %d", msgs[2].Offset, msgs[2].Attempt)
	}
}

// A caught-up group finds its one ready partition although a stalled
// group's backlog is larger than a pop's window.
func TestReadySetStalledGroup(t *testing.T) {
	const keys = 1200
	c := open(t)
	q := c.Queue("fan")
	items := make([]queen.Item, keys)
	for k := range items {
		items[k] = queen.Item{Partition: fmt.Sprintf("k%05d", k), Data: []byte("x")}
	}
	push(t, q, items...)
	pop(t, q, queen.PopOptions{Group: "stalled", Partition: "k00000", AutoAck: true}) // subscribes, then stalls
	for {
		if msgs := pop(t, q, queen.PopOptions{Group: "live", Batch: 1000, Partitions: 1000, AutoAck: true}); len(msgs) == 0 {
			break
		}
	}
	for i := range 5 {
		key := fmt.Sprintf("k%05d", 200*i+117)
		push(t, q, queen.Item{Partition: key, Data: []byte("y")})
		msgs := pop(t, q, queen.PopOptions{Group: "live"})
		if len(msgs) != 1 || msgs[0].Partition != key {
			t.Fatalf("round %d: live group popped %q from %d messages; want %s's new message", i, datas(msgs), len(msgs), key)
		}
		ack(t, msgs[0])
	}
}

// A group's first contact that has not committed yet (here held open by the
// test) while a push lands and another group consumes it: that group's pop
// must not clear the partition from the ready set, because the new group's
// cursor, once committed, is behind the message. The first contacts that
// start at the tail: SubscribeNew, SubscribeFrom with nothing newer, and
// SubscribeAll on a partition retention emptied.
func TestFirstContactRacingAClearKeepsTheMessageVisible(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		from       *time.Time
	}{
		{"new", "new", nil},
		{"from", "from", func() *time.Time { t := time.Now().Add(time.Hour); return &t }()},
		{"all-emptied", "all", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := open(t, manual)
			ctx := ctxT(t)
			q := configure(t, c, "q", queen.QueueOptions{Retention: time.Hour})
			pushN(t, q, "k", "m", 1)
			wantData(t, pop(t, q, queen.PopOptions{Group: "g1", AutoAck: true}), "m0") // drained: k leaves the set
			if tc.mode == "all" {
				ageSegments(t, c)
				if rep := maintain(t, c); rep.SegmentsDeleted != 1 {
					t.Fatalf("retention deleted %d segments, want 1", rep.SegmentsDeleted)
				}
			}

			tx, err := c.Pool().Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx) //nolint:errcheck // committed below
			s := pgx.Identifier{c.Schema()}.Sanitize()
			var qid int64
			if err := tx.QueryRow(ctx, "SELECT id FROM "+s+".queues WHERE name = 'q'").Scan(&qid); err != nil {
				t.Fatal(err)
			}
			// g2's first contact at the tail, not committed yet.
			var seeded bool
			if err := tx.QueryRow(ctx, "SELECT "+s+".seed_consumers($1, 'g2', $2, $3)", qid, tc.mode, tc.from).Scan(&seeded); err != nil || !seeded {
				t.Fatalf("seed: %v %v", seeded, err)
			}
			pushN(t, q, "k", "n", 1)
			wantData(t, pop(t, q, queen.PopOptions{Group: "g1", AutoAck: true}), "n0")
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			wantData(t, pop(t, q, queen.PopOptions{Group: "g2", Batch: 10}), "n0")
		})
	}
}

// A drained group's stale ready-set entries (consumed, acked, not yet
// cleared) go a window at a time: an empty pop clears what its window holds
// (up to 256; on the Citus layout up to 16, each clear a few round trips to
// a worker there), so finding the last few partitions with messages among
// 100,000 drained ones does not take thousands of pops.
func TestReadySetStaleEntriesClearedAWindowAtATime(t *testing.T) {
	keys, perPop := 3000, 256
	if onLayout() {
		keys, perPop = 480, 16
	}
	schema, q := pushedWideQueue(t, keys)
	// Drain with explicit acks: an ack leaves its partition in the ready set.
	got := 0
	for got < keys {
		msgs := pop(t, q, queen.PopOptions{Batch: 1000, Partitions: 1000})
		if len(msgs) == 0 {
			t.Fatalf("drained %d of %d", got, keys)
		}
		for _, m := range msgs {
			ack(t, m)
		}
		got += len(msgs)
	}
	// Written long ago: nothing keeps them in the set as recently written.
	if _, err := pgtest.Pool(t).Exec(ctxT(t), "UPDATE "+pgx.Identifier{schema}.Sanitize()+
		".partitions SET last_write_at = now() - interval '1 minute'"); err != nil {
		t.Fatal(err)
	}
	before := pendingCount(t, schema)
	pops := keys/perPop + 3
	for range pops {
		if msgs := pop(t, q, queen.PopOptions{}); len(msgs) != 0 {
			t.Fatalf("an empty pop got %d messages", len(msgs))
		}
	}
	if n := pendingCount(t, schema); n != 0 {
		t.Fatalf("%d empty pops left %d of %d stale entries in the ready set", pops, n, before)
	}
}

// pushedWideQueue pushes one message to each of keys partitions of a queue in a
// fresh schema, and returns the schema and the queue.
func pushedWideQueue(t *testing.T, keys int) (string, *queen.Queue) {
	t.Helper()
	schema := pgtest.Schema(t)
	c := open(t, func(cfg *queen.Config) { cfg.Schema = schema })
	q := c.Queue("wide")
	items := make([]queen.Item, keys)
	for k := range items {
		items[k] = queen.Item{Partition: fmt.Sprintf("k%05d", k), Data: []byte("x")}
	}
	push(t, q, items...)
	return schema, q
}
