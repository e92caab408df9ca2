package queen_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// The hand-off (push_take): a push of this client to a partition on which
// a worker of this client lingers takes the message under the worker's
// lease in its own transaction and hands it over. These tests race it
// against everything that may end the linger or the push.

// handled waits until l holds every message of want (by data), at least
// once, and checks that none is handled twice and that first deliveries
// come in the order of want (one partition).
func handledOnce(t *testing.T, l *lingerLog, want []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		seen := map[string]bool{}
		for _, r := range l.all() {
			seen[r.data] = true
		}
		missing := 0
		for _, w := range want {
			if !seen[w] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages not handled within %s; handled %+v", missing, len(want), within, l.all())
		}
		time.Sleep(5 * time.Millisecond)
	}
	var got []string
	for _, r := range l.all() {
		got = append(got, r.data)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("handled %v, want each of %v once, in order", got, want)
	}
}

// A push racing the lingering worker's stop (Consume's ctx ending while
// the push holds the worker's slot): the message is handled exactly once,
// in order, by this Consume or the next, and the stop lets the lease go.
func TestConsumeHandOffRacesStop(t *testing.T) {
	skipOnLayout(t, "the push hand-off (push_take) is off there by design")
	var reserved atomic.Int64
	var stopNow atomic.Pointer[func() error]
	c := open(t, manual, queen.PopRescan(time.Hour), queen.TakeHook(func() {
		reserved.Add(1)
		if f := stopNow.Swap(nil); f != nil {
			go func() { _ = (*f)() }()
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
	}))
	q := c.Queue("q")
	l := newLingerLog()
	want := []string{"m0"}
	n := 0 // the last message's number
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	for i := 1; i <= 20; i++ {
		stop := startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
		// Well within lingerKeep (10s): a batch taken and then dropped
		// would come back only when its lease expires.
		handledOnce(t, l, want, 5*time.Second)
		if !waitSlotsFor(c, 1, time.Second) {
			// The last Consume handled the raced message before its stop
			// took effect: this one needs a message to linger after.
			n++
			m := fmt.Sprintf("m%d", n)
			want = append(want, m)
			push(t, q, queen.Item{Partition: "p", Data: []byte(m)})
			handledOnce(t, l, want, 5*time.Second)
			waitSlots(t, c, 1)
		}
		n++
		m := fmt.Sprintf("m%d", n)
		want = append(want, m)
		// The stop comes while the push holds the worker's slot (the
		// hook), or, every third time, on its own.
		if i%3 != 0 {
			stopNow.Store(&stop)
		}
		push(t, q, queen.Item{Partition: "p", Data: []byte(m)})
		stopNow.Store(nil)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if g := lingerStatus(t, q, "p"); g.Leased {
			t.Fatalf("iteration %d: after Consume returned: %+v; want no lease", i, g)
		}
	}
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	handledOnce(t, l, want, 5*time.Second)
	if reserved.Load() < 13 {
		t.Fatalf("%d of 20 pushes took for the lingering worker, want at least the 13 that stop it", reserved.Load())
	}
	t.Logf("%d of 20 pushes reserved the worker", reserved.Load())
}

// A push racing the linger's own end (half of lingerKeep, here half a
// second): the message is taken and handled promptly, exactly once, in
// order, whichever wins.
func TestConsumeHandOffRacesLingerEnd(t *testing.T) {
	skipOnLayout(t, "the push hand-off (push_take) is off there by design")
	var reserved atomic.Int64
	c := open(t, manual, queen.PopRescan(time.Hour), queen.TakeHook(func() {
		reserved.Add(1)
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	}))
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{LeaseTime: time.Second}); err != nil {
		t.Fatal(err)
	}
	l := newLingerLog()
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	want := []string{"m0"}
	for i := 1; i <= 12; i++ {
		handledOnce(t, l, want, 10*time.Second)
		// The linger ends about 500ms after the ack (or at once, when
		// the message before was taken at its very end: linger_ack
		// never moves a lease's end out; then the next is claimed).
		time.Sleep(time.Duration(430+rand.IntN(140)) * time.Millisecond)
		m := fmt.Sprintf("m%d", i)
		want = append(want, m)
		push(t, q, queen.Item{Partition: "p", Data: []byte(m)})
	}
	handledOnce(t, l, want, 10*time.Second)
	t.Logf("%d of 12 pushes reserved the worker", reserved.Load())
}

// Close racing a push that holds the lingering worker's slot: every push
// that returned Queued is handled exactly once (by a later client), in
// order, and Close leaves no lease behind.
func TestConsumeHandOffRacesClose(t *testing.T) {
	skipOnLayout(t, "the push hand-off (push_take) is off there by design")
	first := open(t, manual, queen.PopRescan(time.Hour))
	schema := first.Schema()
	push(t, first.Queue("q"), queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	want := []string{"m0"}
	var maybe []string // pushes that failed: stored or not
	n := 0             // the last message's number
	for i := 1; i <= 8; i++ {
		c := open(t, manual, queen.PopRescan(time.Hour), func(cfg *queen.Config) { cfg.Schema = schema },
			queen.TakeHook(func() { time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) }))
		q := c.Queue("q")
		stop := startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
		handledOnceOf(t, l, want, maybe, 20*time.Second)
		if !waitSlotsFor(c, 1, time.Second) {
			// The last message was handled before the Close (or not
			// stored): this Consume needs one to linger after.
			n++
			m := fmt.Sprintf("m%d", n)
			want = append(want, m)
			push(t, q, queen.Item{Partition: "p", Data: []byte(m)})
			handledOnceOf(t, l, want, maybe, 20*time.Second)
			waitSlots(t, c, 1)
		}
		n++
		m := fmt.Sprintf("m%d", n)
		var wg sync.WaitGroup
		var res []queen.PushResult
		var perr error
		wg.Go(func() {
			res, perr = q.Push(ctxT(t), []queen.Item{{Partition: "p", Data: []byte(m)}})
		})
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		if err := c.Close(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := stop(); err != nil && !errors.Is(err, queen.ErrClosed) {
			t.Fatal(err)
		}
		if perr == nil && res[0].Status == queen.Queued {
			want = append(want, m)
		} else {
			maybe = append(maybe, m)
		}
		if g := lingerStatus(t, first.Queue("q"), "p"); g.Leased {
			t.Fatalf("iteration %d: after Close: %+v; want no lease", i, g)
		}
	}
	startConsume(t, first.Queue("q"), queen.ConsumeOptions{}, l.handler("a"))
	handledOnceOf(t, l, want, maybe, 20*time.Second)
}

// handledOnceOf is handledOnce where the messages of maybe (pushes whose
// outcome is unknown) may be handled too, each at most once, in place.
func handledOnceOf(t *testing.T, l *lingerLog, want, maybe []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		seen := map[string]bool{}
		for _, r := range l.all() {
			seen[r.data] = true
		}
		missing := 0
		for _, w := range want {
			if !seen[w] {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages not handled within %s; handled %+v", missing, len(want), within, l.all())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	var got []string
	count := map[string]int{}
	for _, r := range l.all() {
		got = append(got, r.data)
		count[r.data]++
	}
	for _, g := range got {
		if count[g] > 1 || (!slices.Contains(want, g) && !slices.Contains(maybe, g)) {
			t.Fatalf("handled %v; want each of %v once (and of %v at most once)", got, want, maybe)
		}
	}
	if !slices.IsSortedFunc(got, func(a, b string) int { return msgNum(a) - msgNum(b) }) {
		t.Fatalf("handled %v, want push order", got)
	}
}

func msgNum(s string) int {
	var n int
	fmt.Sscanf(strings.TrimPrefix(s, "m"), "%d", &n)
	return n
}

// A push whose ctx ends while it commits (with its take): pushes that
// returned Queued are handled, each once, in order; a push whose outcome
// is unknown is handled at most once. A take committed but not handed
// over (the push's caller gone) is taken again by pop_linger at once.
func TestConsumeHandOffPushCancelled(t *testing.T) {
	var cancelPush atomic.Pointer[context.CancelFunc]
	c := open(t, manual, queen.PopRescan(time.Hour), queen.TakeHook(func() {
		if f := cancelPush.Load(); f != nil {
			go func() {
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				(*f)()
			}()
		}
	}))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	want := []string{"m0"}
	var maybe []string
	for i := 1; i <= 15; i++ {
		// Well within lingerKeep (10s), which a take committed but not
		// handed over would wait for, were it left to the lease's expiry.
		handledOnceOf(t, l, want, maybe, 3*time.Second)
		// No linger after a message whose push was cancelled before it
		// committed, until the next.
		waitSlotsFor(c, 1, 3*time.Second)
		m := fmt.Sprintf("m%d", i)
		ctx, cancel := context.WithCancel(ctxT(t))
		cancelPush.Store(&cancel)
		res, err := q.Push(ctx, []queen.Item{{Partition: "p", Data: []byte(m)}})
		cancelPush.Store(nil)
		cancel()
		if err == nil && res[0].Status == queen.Queued {
			want = append(want, m)
		} else {
			maybe = append(maybe, m)
		}
	}
	handledOnceOf(t, l, want, maybe, 3*time.Second)
	t.Logf("queued %d, unknown %d", len(want), len(maybe))
}

// An operator's ReleaseLease while a worker lingers: the next push's take
// finds the lease not live, the linger ends, and the message is claimed
// and handled once.
func TestConsumeHandOffLeaseReleased(t *testing.T) {
	skipOnLayout(t, "the push hand-off (push_take) is off there by design")
	c := open(t, manual, queen.PopRescan(time.Hour))
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	l := newLingerLog()
	startConsume(t, q, queen.ConsumeOptions{}, l.handler("a"))
	want := []string{"m0"}
	for i := 1; i <= 3; i++ {
		handledOnce(t, l, want, 10*time.Second)
		waitSlots(t, c, 1)
		if ok, err := q.ReleaseLease(ctxT(t), "", "p"); err != nil || !ok {
			t.Fatalf("ReleaseLease = %v, %v", ok, err)
		}
		m := fmt.Sprintf("m%d", i)
		want = append(want, m)
		push(t, q, queen.Item{Partition: "p", Data: []byte(m)})
	}
	handledOnce(t, l, want, 10*time.Second)
}

// Pushes of this client to several partitions from several goroutines,
// while two Consume calls of one group (this client's and another's)
// claim, settle and linger: no deadlock, nothing lost, and per partition
// first deliveries in push order (redeliveries allowed: at least once).
func TestConsumeHandOffConcurrent(t *testing.T) {
	a := open(t, manual)
	b := open(t, manual, func(cfg *queen.Config) { cfg.Schema = a.Schema() })
	qa, qb := a.Queue("q"), b.Queue("q")
	const parts, per = 4, 40
	for p := range parts {
		push(t, qa, queen.Item{Partition: fmt.Sprintf("p%d", p), Data: []byte("x")})
	}
	var mu sync.Mutex
	seen := map[string][]int{}
	total := atomic.Int64{}
	h := func(_ context.Context, m *queen.Message) error {
		var n int
		if string(m.Data) != "x" {
			fmt.Sscanf(string(m.Data), "%d", &n)
			mu.Lock()
			if !slices.Contains(seen[m.Partition], n) {
				seen[m.Partition] = append(seen[m.Partition], n)
				total.Add(1)
			}
			mu.Unlock()
		}
		if rand.IntN(4) == 0 {
			time.Sleep(time.Millisecond)
		}
		return nil
	}
	startConsume(t, qa, queen.ConsumeOptions{Concurrency: 2}, h)
	startConsume(t, qb, queen.ConsumeOptions{Concurrency: 2}, h)
	var wg sync.WaitGroup
	for p := range parts {
		wg.Go(func() {
			for i := range per {
				if _, err := qa.Push(ctxT(t), []queen.Item{{Partition: fmt.Sprintf("p%d", p), Data: fmt.Appendf(nil, "%d", i)}}); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(60 * time.Second)
	for total.Load() < parts*per {
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("handled %d of %d: %v", total.Load(), parts*per, seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for p, ns := range seen {
		if !slices.IsSorted(ns) {
			t.Fatalf("partition %s: first deliveries %v, want push order", p, ns)
		}
	}
}

// A handed-over message on an encrypted queue, with headers, whose first
// attempt fails: decrypted, its headers kept, and handled again after its
// retry backoff (attempt 2), as via pop_linger; the messages after it wait
// for it. No pop_linger runs: each is handed over.
func TestConsumeHandOffEncryptedHeadersRetry(t *testing.T) {
	skipOnLayout(t, "the push hand-off (push_take) is off there by design")
	c, tr := tracedClient(t, func(cfg *queen.Config) {
		cfg.EncryptionKey = bytes.Repeat([]byte{7}, 32)
	})
	q := c.Queue("q")
	if err := q.Configure(ctxT(t), queen.QueueOptions{Encryption: true, RetryLimit: 5,
		RetryBackoff: queen.RetryBackoff{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Partition: "p", Data: []byte("m0")})
	type rec struct {
		data, hdr string
		attempt   int
	}
	got := make(chan rec, 100)
	var failed atomic.Bool
	startConsume(t, q, queen.ConsumeOptions{}, func(_ context.Context, m *queen.Message) error {
		got <- rec{string(m.Data), m.Headers["h"], m.Attempt}
		if string(m.Data) == "m2" && failed.CompareAndSwap(false, true) {
			return errors.New("first attempt fails")
		}
		return nil
	})
	next := func() rec {
		select {
		case r := <-got:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing handled within 10s")
			return rec{}
		}
	}
	next()
	waitCount(t, tr, 0, sqlLingerAck, 1)
	mark := tr.mark()
	for i := 1; i <= 3; i++ {
		waitSlots(t, c, 1)
		m := fmt.Sprintf("m%d", i)
		push(t, q, queen.Item{Partition: "p", Data: []byte(m), Headers: map[string]string{"h": "v" + m}})
		r := next()
		if r.data != m || r.hdr != "v"+m || r.attempt != 1 {
			t.Fatalf("handled %+v, want %s with header v%s, attempt 1", r, m, m)
		}
		if i == 2 {
			if r := next(); r.data != m || r.hdr != "v"+m || r.attempt != 2 {
				t.Fatalf("handled %+v, want %s again with header v%s, attempt 2", r, m, m)
			}
		}
	}
	if n := len(tr.since(mark, sqlTake)); n < 3 {
		t.Fatalf("%d push_take for 3 pushes, want 3", n)
	}
	// The failure let the lease go (settle); the retry was claimed, and the
	// linger resumed after it: pop_linger only where no worker lingered.
	t.Logf("pop_linger %d, push_take %d", len(tr.since(mark, sqlLinger)), len(tr.since(mark, sqlTake)))
}

// waitSlotsFor waits up to d for n workers of c to offer their lingering
// partitions, and reports whether they did.
func waitSlotsFor(c *queen.Client, n int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for queen.LingerSlots(c) != n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}
