package queen_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/queentest/pgcluster"
)

const (
	sqlLinger    = ".pop_linger("
	sqlLingerAck = ".linger_ack("
	sqlTake      = ".push_take("
)

// waitSlots waits until n Consume workers of c linger offering their
// partitions to c's pushes.
func waitSlots(t *testing.T, c *queen.Client, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for queen.LingerSlots(c) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers offer their lingering partitions, want %d", queen.LingerSlots(c), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// lingerRec is a handled message: its data, lease and the Consume call
// (by label) that ran it.
type lingerRec struct {
	data, lease, by string
	attempt         int
}

type lingerLog struct {
	mu   sync.Mutex
	recs []lingerRec
	ch   chan lingerRec
}

func newLingerLog() *lingerLog { return &lingerLog{ch: make(chan lingerRec, 1000)} }

func (l *lingerLog) handler(by string) func(context.Context, *queen.Message) error {
	return func(_ context.Context, m *queen.Message) error {
		r := lingerRec{string(m.Data), m.LeaseID, by, m.Attempt}
		l.mu.Lock()
		l.recs = append(l.recs, r)
		l.mu.Unlock()
		l.ch <- r
		return nil
	}
}

func (l *lingerLog) all() []lingerRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]lingerRec(nil), l.recs...)
}

// next waits for the next handled message.
func (l *lingerLog) next(t *testing.T, within time.Duration) lingerRec {
	t.Helper()
	select {
	case r := <-l.ch:
		return r
	case <-time.After(within):
		t.Fatalf("no message handled within %s (handled so far: %+v)", within, l.all())
		return lingerRec{}
	}
}

// nothing checks that no message is handled for d.
func (l *lingerLog) nothing(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case r := <-l.ch:
		t.Fatalf("handled %+v, want nothing yet", r)
	case <-time.After(d):
	}
}

// startConsume runs Consume on q until the returned stop is called, which
// returns Consume's error.
func startConsume(t *testing.T, q *queen.Queue, o queen.ConsumeOptions, fn func(context.Context, *queen.Message) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { done <- q.Consume(ctx, o, fn) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// lingerStatus is q's group "" on partition p.
func lingerStatus(t *testing.T, q *queen.Queue, p string) queen.GroupStatus {
	t.Helper()
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ps := range st.Partitions {
		if ps.Name != p {
			continue
		}
		for _, g := range ps.Groups {
			if g.Group == "" {
				return g
			}
		}
	}
	t.Fatalf("no cursor of group \"\" on partition %s", p)
	return queen.GroupStatus{}
}

// waitCount waits until tr has recorded n statements containing fn since
// mark.
func waitCount(t *testing.T, tr *goroutineTracer, mark int, fn string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(tr.since(mark, fn)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d statements %s after 30s, want %d", len(tr.since(mark, fn)), fn, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A message pushed by this client to a partition whose lease lingers here
// is taken under that lease in the push's own transaction (push_take) and
// handed to the worker, and its ack keeps the lease (linger_ack): no
// pop_linger, no claim (pop_v2) and no other settle per message, and every
// message on its first attempt, exactly once, in order, under the lease of
// the first.
func TestConsumeLingerOneClaimPerMessage(t *testing.T) {
	skipOnLayout(t, "it counts the push hand-off (push_take), off there by design")
	c, tr := tracedClient(t, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	start := tr.mark() // after Open, whose function layer names them all
	l := newLingerLog()
	stop := startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	first := l.next(t, 30*time.Second)
	waitCount(t, tr, start, sqlLingerAck, 1)
	// The first claim took all it asked for, so the fetch loop claims once
	// more at the next occasion, the push of m1: counted from m2 on.
	push(t, q, queen.Item{Partition: "p", Data: []byte("m1")})
	l.next(t, 10*time.Second)
	waitCount(t, tr, start, sqlLingerAck, 2)
	mark := tr.mark()
	const n = 5
	for i := 2; i < n+2; i++ {
		waitSlots(t, c, 1)
		push(t, q, queen.Item{Partition: "p", Data: fmt.Appendf(nil, "m%d", i)})
		r := l.next(t, 10*time.Second)
		if want := fmt.Sprintf("m%d", i); r.data != want || r.lease != first.lease || r.attempt != 1 {
			t.Fatalf("handled %+v, want %s under lease %s, attempt 1", r, want, first.lease)
		}
		waitCount(t, tr, mark, sqlLingerAck, i-1)
	}
	l.nothing(t, 200*time.Millisecond)
	var got []string
	for _, r := range l.all() {
		got = append(got, r.data)
	}
	if want := seq("m", 0, n+2); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("handled %v, want %v", got, want)
	}
	counts := map[string]int{}
	for _, fn := range []string{sqlPop, sqlLinger, sqlTake, sqlLingerAck, sqlSettle, sqlAck} {
		counts[fn] = len(tr.since(mark, fn))
	}
	if counts[sqlPop] != 0 || counts[sqlLinger] != 0 || counts[sqlTake] != n || counts[sqlLingerAck] != n ||
		counts[sqlSettle] != 0 || counts[sqlAck] != 0 {
		tr.mu.Lock()
		for k := mark; k < len(tr.sql); k++ {
			t.Logf("statement %d: %.80s", k, strings.Join(strings.Fields(tr.sql[k]), " "))
		}
		tr.mu.Unlock()
		t.Fatalf("statements for %d messages: %v; want %d push_take and %d linger_ack, nothing else", n, counts, n, n)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Stopping let the lease go at once.
	if g := lingerStatus(t, q, "p"); g.Leased || g.Committed != n+1 {
		t.Fatalf("after Consume returned: %+v; want no lease, committed %d", g, n+1)
	}
}

// A push to a partition on which a worker of the same client lingers is,
// on the pushing goroutine, one round trip: the push statement and
// push_take in one pipeline (one implicit transaction, one commit), and no
// other statement; nothing of it runs on another goroutine. This is the
// send call of the end-to-end latency at a low rate.
func TestPushTakeOneRoundTripOnCallersGoroutine(t *testing.T) {
	skipOnLayout(t, "push_take takes nothing there by design: the lingering worker takes by pop_linger")
	c, tr := tracedClient(t, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	l.next(t, 30*time.Second)
	me := goid()
	for i := 1; i <= 5; i++ {
		waitSlots(t, c, 1)
		mark := tr.mark()
		push(t, q, queen.Item{Partition: "p", Data: fmt.Appendf(nil, "m%d", i)})
		end := tr.mark()
		if r := l.next(t, 10*time.Second); r.data != fmt.Sprintf("m%d", i) {
			t.Fatalf("handled %+v, want m%d", r, i)
		}
		tr.mu.Lock()
		var mine []string
		var batches []int
		takes := 0
		for k := mark; k < end; k++ {
			if strings.Contains(tr.sql[k], sqlTake) {
				takes++
			}
			if tr.ids[k] == me {
				mine = append(mine, strings.Join(strings.Fields(tr.sql[k]), " "))
				batches = append(batches, tr.batch[k])
			}
		}
		tr.mu.Unlock()
		if len(mine) != 2 || !strings.Contains(mine[0], "segments") || !strings.Contains(mine[1], sqlTake) ||
			batches[0] == 0 || batches[0] != batches[1] || takes != 1 {
			t.Fatalf("push %d: statements on the pushing goroutine %.80q in batches %v, push_take %d in all; "+
				"want the push statement and push_take in one batch, nothing else", i, mine, batches, takes)
		}
	}
}

// A lingering lease takes what another client pushes (a NOTIFY without
// partition hints), and what a transaction pushes, promptly and under the
// same lease.
func TestConsumeLingerTakesOtherPushes(t *testing.T) {
	c := open(t, manual, queen.PopRescan(time.Hour))
	other := open(t, manual, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	first := l.next(t, 30*time.Second)
	time.Sleep(100 * time.Millisecond) // the ack and the linger
	push(t, other.Queue("q"), queen.Item{Partition: "p", Data: []byte("m1")})
	if r := l.next(t, 10*time.Second); r.data != "m1" || r.lease != first.lease {
		t.Fatalf("handled %+v, want m1 under lease %s", r, first.lease)
	}
	time.Sleep(100 * time.Millisecond)
	ctx := ctxT(t)
	tx, err := c.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.PushTx(ctx, tx, []queen.Item{{Partition: "p", Data: []byte("m2")}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := l.next(t, 10*time.Second); r.data != "m2" || r.lease != first.lease {
		t.Fatalf("handled %+v, want m2 under lease %s", r, first.lease)
	}
}

// While one Consume of a group keeps a lingering lease, a second one of
// the group gets none of the partition's messages; once the first stops
// (its lease let go within Close's ctx), the second takes them at once.
func TestConsumeLingerHoldsAgainstSecondConsumer(t *testing.T) {
	c := open(t, manual, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	stopA := startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	if r := l.next(t, 30*time.Second); r.by != "a" {
		t.Fatalf("handled %+v, want by a", r)
	}
	time.Sleep(100 * time.Millisecond)
	other := open(t, manual, queen.PopRescan(time.Hour), func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	startConsume(t, other.Queue("q"), queen.ConsumeOptions{}, l.handler("b"))
	for i := 1; i <= 5; i++ {
		push(t, q, queen.Item{Partition: "p", Data: fmt.Appendf(nil, "m%d", i)})
		if r := l.next(t, 10*time.Second); r.by != "a" || r.data != fmt.Sprintf("m%d", i) {
			t.Fatalf("handled %+v, want m%d by a, which holds the partition", r, i)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := stopA(); err != nil {
		t.Fatal(err)
	}
	if g := lingerStatus(t, q, "p"); g.Leased {
		t.Fatalf("after the first Consume returned: %+v; want its lease let go", g)
	}
	push(t, q, queen.Item{Partition: "p", Data: []byte("m6")})
	if r := l.next(t, 10*time.Second); r.by != "b" || r.data != "m6" {
		t.Fatalf("handled %+v, want m6 by b", r)
	}
}

// Client.Close lets a lingering lease go before it returns.
func TestConsumeLingerCloseLetsGo(t *testing.T) {
	c := open(t, manual, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	stop := startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	l.next(t, 30*time.Second)
	time.Sleep(100 * time.Millisecond)
	if g := lingerStatus(t, q, "p"); !g.Leased || g.Committed != 0 {
		t.Fatalf("lingering: %+v; want the lease kept, committed 0", g)
	}
	if err := c.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != queen.ErrClosed {
		t.Fatalf("Consume = %v, want ErrClosed", err)
	}
	viewer := open(t, manual, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	if g := lingerStatus(t, viewer.Queue("q"), "p"); g.Leased {
		t.Fatalf("after Close: %+v; want no lease", g)
	}
}

// A lease lingers at most until half of it is left: then it is let go
// (no renewal while idle), and another consumer of the group may claim.
func TestConsumeLingerEndsAtHalfLease(t *testing.T) {
	c := open(t, manual, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{LeaseTime: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	l.next(t, 30*time.Second)
	time.Sleep(100 * time.Millisecond)
	if g := lingerStatus(t, q, "p"); !g.Leased {
		t.Fatalf("lingering: %+v; want the lease kept", g)
	}
	deadline := time.Now().Add(1900 * time.Millisecond) // before the lease's own end
	for lingerStatus(t, q, "p").Leased {
		if time.Now().After(deadline) {
			t.Fatal("the lingering lease was not let go at half its time")
		}
		time.Sleep(20 * time.Millisecond)
	}
	push(t, q, queen.Item{Partition: "p", Data: []byte("m1")})
	if r := l.next(t, 10*time.Second); r.data != "m1" {
		t.Fatalf("handled %+v, want m1", r)
	}
}

// Pausing the group ends a linger at the next push: nothing is delivered
// while paused, the lease is let go, and Resume delivers.
func TestConsumeLingerPause(t *testing.T) {
	c := open(t, manual, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	l.next(t, 30*time.Second)
	time.Sleep(100 * time.Millisecond)
	if err := q.Pause(ctxT(t), ""); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Partition: "p", Data: []byte("m1")})
	l.nothing(t, 500*time.Millisecond)
	if g := lingerStatus(t, q, "p"); g.Leased {
		t.Fatalf("paused, after a push: %+v; want the lease let go", g)
	}
	if err := q.Resume(ctxT(t), ""); err != nil {
		t.Fatal(err)
	}
	if r := l.next(t, 10*time.Second); r.data != "m1" {
		t.Fatalf("handled %+v, want m1", r)
	}
}

// With one worker, a push to another partition while one lingers is
// handled promptly: the linger keeps no other partition waiting.
func TestConsumeLingerOtherPartition(t *testing.T) {
	c := open(t, manual, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("p0")})
	l := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{Concurrency: 1}, l.handler("a"))
	l.next(t, 30*time.Second)
	time.Sleep(100 * time.Millisecond)
	for i := range 3 {
		push(t, q, queen.Item{Partition: "r", Data: fmt.Appendf(nil, "r%d", i)})
		if r := l.next(t, 10*time.Second); r.data != fmt.Sprintf("r%d", i) {
			t.Fatalf("handled %+v, want r%d", r, i)
		}
		push(t, q, queen.Item{Partition: "p", Data: fmt.Appendf(nil, "p%d", i+1)})
		if r := l.next(t, 10*time.Second); r.data != fmt.Sprintf("p%d", i+1) {
			t.Fatalf("handled %+v, want p%d", r, i+1)
		}
	}
}

// Retention that deletes what a lingering cursor consumed does not stop
// it: what is pushed after is taken under the lease, nothing skipped.
func TestConsumeLingerRetention(t *testing.T) {
	c := open(t, manual, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{CompletedRetention: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	first := l.next(t, 30*time.Second)
	for i := 1; i <= 3; i++ {
		push(t, q, queen.Item{Partition: "p", Data: fmt.Appendf(nil, "m%d", i)})
		l.next(t, 10*time.Second)
	}
	time.Sleep(100 * time.Millisecond)
	maintain(t, c)
	if g := lingerStatus(t, q, "p"); !g.Leased {
		t.Fatalf("after retention: %+v; want the lease still lingering", g)
	}
	for i := 4; i <= 6; i++ {
		push(t, q, queen.Item{Partition: "p", Data: fmt.Appendf(nil, "m%d", i)})
		if r := l.next(t, 10*time.Second); r.data != fmt.Sprintf("m%d", i) || r.lease != first.lease {
			t.Fatalf("handled %+v, want m%d under lease %s", r, i, first.lease)
		}
	}
	var got []string
	for _, r := range l.all() {
		got = append(got, r.data)
	}
	if want := seq("m", 0, 7); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("handled %v, want %v", got, want)
	}
}

// A server crash while a lease lingers loses at most pop_linger's
// asynchronous commits: the message whose claim was lost is delivered
// again at once (linger_ack lets the lease go), never lost, and the
// partition is not stranded until the lease expires (5 minutes here).
func TestConsumeLingerServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	cl := pgtest.NewCluster(t, pgcluster.Options{})
	c := open(t, manual, queen.PopRescan(time.Hour), func(cfg *queen.Config) {
		cfg.DatabaseURL, cfg.Schema, cfg.StatementTimeout = cl.URL, "linger", 5*time.Second
	})
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	held := make(chan struct{})
	var holding sync.Once
	release := make(chan struct{})
	fn := l.handler("a")
	startConsume(t, q, queen.ConsumeOptions{}, func(ctx context.Context, m *queen.Message) error {
		if string(m.Data) == "m1" {
			// Crash the server while m1, claimed under the lingering
			// lease, is in hand and unacked.
			holding.Do(func() { close(held) })
			<-release
		}
		return fn(ctx, m)
	})
	l.next(t, 30*time.Second)
	time.Sleep(100 * time.Millisecond)
	push(t, q, queen.Item{Partition: "p", Data: []byte("m1")})
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("m1 not delivered")
	}
	if err := cl.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	close(release)
	// m1, handled, perhaps again; then what follows, promptly.
	for i := 2; i <= 4; i++ {
		push(t, q, queen.Item{Partition: "p", Data: fmt.Appendf(nil, "m%d", i)})
		want := fmt.Sprintf("m%d", i)
		for {
			r := l.next(t, 20*time.Second)
			if r.data == want {
				break
			}
			if r.data != "m1" {
				t.Fatalf("handled %+v while waiting for %s", r, want)
			}
		}
	}
	t.Logf("handled: %+v", l.all())
	first := map[string]bool{}
	var order []string
	for _, r := range l.all() {
		if !first[r.data] {
			first[r.data] = true
			order = append(order, r.data)
		}
	}
	if want := seq("m", 0, 5); strings.Join(order, ",") != strings.Join(want, ",") {
		t.Fatalf("handled %v (first deliveries), want %v", order, want)
	}
}
