package queen_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// pushKeyed pushes one message per key to partition, in order, with data
// "<key>:<index>".
func pushKeyed(t testing.TB, q *queen.Queue, partition string, keys ...string) {
	t.Helper()
	items := make([]queen.Item, len(keys))
	for i, k := range keys {
		items[i] = queen.Item{Partition: partition, Key: k, Data: fmt.Appendf(nil, "%s:%d", k, i)}
	}
	push(t, q, items...)
}

// keyLog is what handlers record: per key, the running count and the
// starts and successful ends in order.
type keyLog struct {
	mu      sync.Mutex
	running map[string]int
	starts  map[string][]int64
	done    map[int64]int // successful ends per offset
	overlap []string
}

func newKeyLog() *keyLog {
	return &keyLog{running: map[string]int{}, starts: map[string][]int64{}, done: map[int64]int{}}
}

// start records a handler start; it reports a key running twice and a
// start before every earlier offset of its key was handled successfully.
func (l *keyLog) start(m *queen.Message, keyOffsets map[string][]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running[m.Key]++
	if l.running[m.Key] > 1 {
		l.overlap = append(l.overlap, fmt.Sprintf("key %q: two handlers at once (offset %d)", m.Key, m.Offset))
	}
	for _, o := range keyOffsets[m.Key] {
		if o >= m.Offset {
			break
		}
		if l.done[o] == 0 {
			l.overlap = append(l.overlap, fmt.Sprintf("key %q: offset %d started before offset %d was handled", m.Key, m.Offset, o))
		}
	}
	l.starts[m.Key] = append(l.starts[m.Key], m.Offset)
}

func (l *keyLog) end(m *queen.Message, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running[m.Key]--
	if ok {
		l.done[m.Offset]++
	}
}

func (l *keyLog) check(t testing.TB) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.overlap) > 0 {
		t.Fatalf("per-key order or exclusion broken: %v", l.overlap)
	}
}

func (l *keyLog) handled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done)
}

// The sanity check of parallelism and order: with KeyConcurrency 3 the
// first handler of key a waits until handlers of b and c have started (in
// strict partition order it would wait forever), every key's messages run
// one at a time in offset order, everything is handled once, and the
// cursor ends at the last offset with nothing stored above it.
func TestConsumeKeyConcurrencyRunsKeysInParallel(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	var keys []string
	for i := range 60 {
		keys = append(keys, []string{"a", "b", "c", ""}[i%4])
	}
	pushKeyed(t, q, "p", keys...)
	keyOffsets := map[string][]int64{}
	for i, k := range keys {
		keyOffsets[k] = append(keyOffsets[k], int64(i))
	}
	log := newKeyLog()
	bStarted, cStarted := make(chan struct{}), make(chan struct{})
	var once sync.Map
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 60}, KeyConcurrency: 3},
		func(ctx context.Context, m *queen.Message) error {
			log.start(m, keyOffsets)
			defer log.end(m, true)
			switch m.Key {
			case "b", "c":
				if _, loaded := once.LoadOrStore(m.Key, true); !loaded {
					close(map[string]chan struct{}{"b": bStarted, "c": cStarted}[m.Key])
				}
			case "a":
				if m.Offset == 0 {
					for _, ch := range []chan struct{}{bStarted, cStarted} {
						select {
						case <-ch:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
				}
			}
			return nil
		}, func() bool { return log.handled() >= len(keys) })
	if err != nil {
		t.Fatal(err)
	}
	log.check(t)
	for k, offs := range keyOffsets {
		if got := log.starts[k]; !slices.Equal(got, offs) {
			t.Fatalf("key %q handled %v, want %v", k, got, offs)
		}
	}
	waitFor(t, 10*time.Second, "the batch's settlement", func() bool {
		g := status(t, q).Partitions[0].Groups[0]
		return g.Committed == int64(len(keys)-1) && g.Settled == 0 && !g.Leased
	})
}

func status(t testing.TB, q *queen.Queue) queen.QueueStatus {
	t.Helper()
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A failing message pauses its key only: the key's later messages are not
// started in that batch while the other key's go on (Status shows one key
// paused and one in flight meanwhile); the failed message comes back with
// Attempt 2 before its key's later messages, and the other key's settled
// messages are not delivered again.
func TestConsumeKeyFailurePausesOnlyItsKey(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 5})
	keys := []string{"a", "b", "a", "b", "b", "a", "b"}
	pushKeyed(t, q, "p", keys...)
	keyOffsets := map[string][]int64{}
	for i, k := range keys {
		keyOffsets[k] = append(keyOffsets[k], int64(i))
	}
	log := newKeyLog()
	release := make(chan struct{})
	var mu sync.Mutex
	var seen []string // "key@offset#attempt" in start order
	failed := false
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
			func(hctx context.Context, m *queen.Message) error {
				log.start(m, keyOffsets)
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%s@%d#%d", m.Key, m.Offset, m.Attempt))
				first := !failed && m.Offset == 0
				failed = failed || first
				mu.Unlock()
				if first {
					log.end(m, false)
					return errors.New("boom")
				}
				if m.Offset == 1 {
					// Hold key b's first message until the test saw a paused.
					select {
					case <-release:
					case <-hctx.Done():
					}
				}
				log.end(m, true)
				if log.handled() == len(keys) {
					cancel()
				}
				return nil
			})
	}()
	waitFor(t, 10*time.Second, "key a paused while key b runs", func() bool {
		g := status(t, q).Partitions[0].Groups
		return len(g) == 1 && g[0].KeysPaused == 1 && g[0].KeysInFlight == 1
	})
	mu.Lock()
	if want := []string{"a@0#1", "b@1#1"}; !slices.Equal(seen, want) && !slices.Equal(seen, []string{"b@1#1", "a@0#1"}) {
		t.Fatalf("while paused: started %v, want only %v", seen, want)
	}
	mu.Unlock()
	close(release)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Consume did not handle everything")
	}
	log.check(t)
	mu.Lock()
	defer mu.Unlock()
	if got, want := log.starts["a"], []int64{0, 0, 2, 5}; !slices.Equal(got, want) {
		t.Fatalf("key a started %v, want %v (all: %v)", got, want, seen)
	}
	if got, want := log.starts["b"], []int64{1, 3, 4, 6}; !slices.Equal(got, want) {
		t.Fatalf("key b started %v, want %v, each once (all: %v)", got, want, seen)
	}
	if slices.Index(seen, "a@0#2") < slices.Index(seen, "b@6#1") {
		t.Fatalf("the failed message came back before the other key finished its batch, or without Attempt 2: %v", seen)
	}
	g := status(t, q).Partitions[0].Groups[0]
	if g.Committed != 6 || g.Settled != 0 || g.KeysPaused != 0 || g.KeysInFlight != 0 {
		t.Fatalf("after Consume: %+v", g)
	}
}

// RetryLimit holds per message when the failing message is not the head of
// the partition: y@1 fails on every delivery while the head h@0 (another
// key) is still unsettled for its first three deliveries (h fails twice,
// then succeeds after y has failed); y gets exactly RetryLimit (4)
// failures, three of them charged above the cursor, and is dead-lettered
// with Attempts 4; its Attempt grows by one per delivery throughout.
func TestConsumeKeyRetryLimitExactForNonHead(t *testing.T) {
	c := open(t)
	// No backoff: the test pairs each failure of y with one of h.
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 4, DeadLetter: true, RetryBackoff: noBackoff})
	pushKeyed(t, q, "p", "h", "y", "z")
	var mu sync.Mutex
	var hRuns, yRuns []int // Attempt per delivery
	zDone := false
	yFailed := make(chan int, 16) // y's delivery count when it failed
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 3},
			func(hctx context.Context, m *queen.Message) error {
				mu.Lock()
				defer mu.Unlock()
				switch m.Key {
				case "h":
					hRuns = append(hRuns, m.Attempt)
					n := len(hRuns)
					mu.Unlock()
					// The head settles only after y failed in this delivery,
					// so y's failure is charged while y is not the head.
					select {
					case <-yFailed:
					case <-hctx.Done():
					}
					mu.Lock()
					if n <= 2 {
						return errors.New("h not yet")
					}
					return nil
				case "y":
					yRuns = append(yRuns, m.Attempt)
					if len(hRuns) <= 3 && len(yRuns) <= 3 {
						defer func() { yFailed <- len(yRuns) }()
					}
					return errors.New("y always fails")
				default:
					zDone = true
					return nil
				}
			})
	}()
	waitFor(t, 30*time.Second, "y dead-lettered", func() bool { return len(deadLetters(t, q)) == 1 })
	waitFor(t, 10*time.Second, "the cursor past everything", func() bool {
		g := status(t, q).Partitions[0].Groups[0]
		return g.Committed == 2 && !g.Leased
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(yRuns, []int{1, 2, 3, 4}) {
		t.Fatalf("y delivered with Attempts %v, want [1 2 3 4] (exactly RetryLimit failures)", yRuns)
	}
	if !slices.Equal(hRuns, []int{1, 2, 3}) || !zDone {
		t.Fatalf("h delivered with Attempts %v (want [1 2 3]), z done %v", hRuns, zDone)
	}
	dl := deadLetters(t, q)
	if dl[0].Offset != 1 || dl[0].Attempts != 4 {
		t.Fatalf("dead letter %+v, want offset 1 with 4 attempts", dl[0])
	}
}

// Under the skip policy a failed message is re-enqueued at the tail and
// counts as settled: its key goes on in the same batch.
func TestConsumeKeyFailureSkipRequeues(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 5, FailurePolicy: queen.FailureSkip, RetryBackoff: noBackoff})
	pushKeyed(t, q, "p", "a", "a", "b")
	var mu sync.Mutex
	var seen []string
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, fmt.Sprintf("%s@%d#%d", m.Key, m.Offset, m.Attempt))
			if m.Offset == 0 {
				return errors.New("skip me")
			}
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) >= 4 })
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The copy of a@0 is offset 3, on its second attempt; a@1 ran in the
	// first batch, not after the copy.
	if i, j := slices.Index(seen, "a@1#1"), slices.Index(seen, "a@3#2"); i < 0 || j < 0 || i > j {
		t.Fatalf("starts %v: want a@1 in the first batch and a@0's copy at offset 3 with Attempt 2", seen)
	}
}

// keyEvent is one handler start (S) or successful end (E) as recorded by
// the handler itself, in this process or a child's.
type keyEvent struct {
	kind  byte // 'S' or 'E'
	child bool
	part  string
	key   string
	off   int64
	at    int64 // Unix ns
}

// keyChild starts the test binary as a consumer child process in mode
// (see TestKeyConcChild) and returns it with a channel of its events.
func keyChild(t *testing.T, url, schema, mode string) (*exec.Cmd, <-chan keyEvent) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKeyConcChild$")
	// The child is killed, so it cannot remove a directory of its own.
	cmd.Env = append(os.Environ(), "QUEEN_KEYCONC_CHILD="+mode, "QUEEN_FAULT_URL="+url, "QUEEN_FAULT_SCHEMA="+schema,
		"QUEEN_CHILD_SPOOL="+t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ch := make(chan keyEvent, 1024)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var ev keyEvent
			var kind, key string
			if n, _ := fmt.Sscanf(sc.Text(), "EV %s %s %q %d %d", &kind, &ev.part, &key, &ev.off, &ev.at); n == 5 {
				ev.kind, ev.key, ev.child = kind[0], key, true
				ch <- ev
			}
		}
	}()
	return cmd, ch
}

// TestKeyConcChild is the consumer process the per-key tests kill: it
// consumes queue q with KeyConcurrency 3 and LeaseTime 1s and prints every
// handler start and successful end. Mode "crash" blocks forever in every
// handler of key a; mode "churn" takes 1-3 ms per message.
func TestKeyConcChild(t *testing.T) {
	mode := os.Getenv("QUEEN_KEYCONC_CHILD")
	if mode == "" {
		t.Skip("child process of the per-key Consume fault tests")
	}
	ctx := context.Background()
	c, err := queen.Open(ctx, queen.Config{DatabaseURL: os.Getenv("QUEEN_FAULT_URL"), Schema: os.Getenv("QUEEN_FAULT_SCHEMA"), Citus: onLayout(),
		SpoolDir: os.Getenv("QUEEN_CHILD_SPOOL")})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	w := bufio.NewWriter(os.Stdout)
	emit := func(kind string, m *queen.Message) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "EV %s %s %q %d %d\n", kind, m.Partition, m.Key, m.Offset, time.Now().UnixNano())
		w.Flush()
	}
	err = c.Queue("q").Consume(ctx, queen.ConsumeOptions{
		PopOptions: queen.PopOptions{Batch: 20, LeaseTime: time.Second}, Concurrency: 2, KeyConcurrency: 3,
	}, func(_ context.Context, m *queen.Message) error {
		emit("S", m)
		if mode == "crash" && m.Key == "a" {
			select {}
		}
		if mode == "churn" {
			time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond)
		}
		emit("E", m)
		return nil
	})
	t.Fatal(err)
}

// A consumer is SIGKILLed after settling key b's messages out of order
// while key a's head is stuck: the successor (here with KeyConcurrency 1,
// which reads the same state) is delivered only key a's messages, in
// order, on their second attempt, and the cursor then passes everything.
func TestConsumeKeyCrashSkipsSettled(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	c := open(t)
	q := c.Queue("q")
	keys := []string{"a", "b", "b", "b", "b", "b", "a", "b", "b", "b", "a"}
	pushKeyed(t, q, "p", keys...)
	cmd, events := keyChild(t, pgtest.URL(t), c.Schema(), "crash")
	ended := 0
	deadline := time.After(30 * time.Second)
	for ended < 8 {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("child exited")
			}
			if ev.kind == 'E' {
				if ev.key != "b" {
					t.Fatalf("child finished %+v", ev)
				}
				ended++
			}
		case <-deadline:
			t.Fatalf("child handled %d of key b's 8 messages", ended)
		}
	}
	// The checkpoint (at most a second, or the lease renewal) stores them.
	waitFor(t, 10*time.Second, "key b's settlements stored", func() bool {
		g := status(t, q).Partitions[0].Groups[0]
		return g.Settled == 8 && g.Committed == -1
	})
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	var mu sync.Mutex
	var got []string
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 20}},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, fmt.Sprintf("%s@%d#%d", m.Key, m.Offset, m.Attempt))
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= 3 })
	if err != nil {
		t.Fatal(err)
	}
	// All three were in the killed consumer's lease: a redelivery, as today.
	if want := []string{"a@0#2", "a@6#2", "a@10#2"}; !slices.Equal(got, want) {
		t.Fatalf("successor got %v, want %v", got, want)
	}
	waitFor(t, 10*time.Second, "the cursor at the end", func() bool {
		g := status(t, q).Partitions[0].Groups[0]
		return g.Committed == 10 && g.Settled == 0
	})
	if msgs := pop(t, q, queen.PopOptions{Batch: 20}); len(msgs) != 0 {
		t.Fatalf("left over: %v", datas(msgs))
	}
}

// Per-key order and exclusion under churn: three in-process loops run
// short Consume calls (KeyConcurrency 2 to 4) that join and leave, beside
// a child process that is SIGKILLed mid-batch. From the handlers' own
// records: no two handlers of a key overlap (the killed child's open ones
// end at the kill); a message starts only after every earlier message of
// its key was handled; everything is handled; and a message handled by a
// consumer that stopped gracefully is never run again (only the killed
// child's unsaved work may be).
func TestConsumeKeyChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("fault test")
	}
	c := open(t)
	q := c.Queue("q")
	const perPart = 300
	keyOffsets := map[string][]int64{} // "part/key" -> offsets
	kr := rand.New(rand.NewPCG(1, 2))
	for _, p := range []string{"p0", "p1"} {
		var keys []string
		for i := range perPart {
			// Skewed, so a key's next message often waits for its last
			// and other keys overtake it: settlements land out of order.
			k := []string{"k0", "k0", "k0", "k1", "k2", "k3", ""}[kr.IntN(7)]
			keys = append(keys, k)
			keyOffsets[p+"/"+k] = append(keyOffsets[p+"/"+k], int64(i))
		}
		pushKeyed(t, q, p, keys...)
	}
	var mu sync.Mutex
	var evs []keyEvent
	okDone := map[string]bool{} // "part@off" handled successfully
	record := func(ev keyEvent) {
		mu.Lock()
		defer mu.Unlock()
		evs = append(evs, ev)
		if ev.kind == 'E' {
			okDone[fmt.Sprintf("%s@%d", ev.part, ev.off)] = true
		}
	}
	allDone := func() bool { mu.Lock(); defer mu.Unlock(); return len(okDone) == 2*perPart }

	cmd, events := keyChild(t, pgtest.URL(t), c.Schema(), "churn")
	childEnded := 0
	var killAt int64
	for killAt == 0 {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("child exited")
			}
			record(ev)
			if ev.kind == 'E' {
				if childEnded++; childEnded == 40 {
					// Start the in-process consumers, then kill the child
					// mid-batch while they run.
					break
				}
			}
			continue
		case <-time.After(30 * time.Second):
			t.Fatalf("child handled %d", childEnded)
		}
		// On the distributed layout a Consume's join and first claim take
		// 50-150 ms on a loaded machine (a few ms on PostgreSQL): calls of
		// 20-150 ms there mostly end before their first message, and the
		// churn handles a few a second. Longer calls there keep it churning
		// and handling.
		span := time.Millisecond
		if onLayout() {
			span = 10 * time.Millisecond
		}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := range 3 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(w), 7))
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(ctxT(t), time.Duration(20+r.IntN(130))*span)
					err := q.Consume(ctx, queen.ConsumeOptions{
						PopOptions: queen.PopOptions{Batch: 20, LeaseTime: time.Second}, Concurrency: 2, KeyConcurrency: 2 + r.IntN(3),
					}, func(_ context.Context, m *queen.Message) error {
						record(keyEvent{kind: 'S', part: m.Partition, key: m.Key, off: m.Offset, at: time.Now().UnixNano()})
						time.Sleep(time.Duration(2+rand.IntN(5)) * time.Millisecond)
						record(keyEvent{kind: 'E', part: m.Partition, key: m.Key, off: m.Offset, at: time.Now().UnixNano()})
						return nil
					})
					cancel()
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		// Let the child go on a little beside them (unless they finish
		// first), then kill it.
		tick := time.NewTicker(20 * time.Millisecond)
		for n := 0; n < 10 && !allDone(); {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatal("child exited")
				}
				record(ev)
				if ev.kind == 'E' {
					n++
				}
			case <-tick.C:
			}
		}
		tick.Stop()
		_ = cmd.Process.Signal(syscall.SIGKILL)
		for ev := range events { // what it printed before it died
			record(ev)
		}
		_ = cmd.Wait()
		killAt = time.Now().UnixNano()
		waitFor(t, 60*time.Second, "every message handled", allDone)
		close(stop)
		wg.Wait()
	}

	mu.Lock()
	defer mu.Unlock()
	type span struct {
		from, to int64
		child    bool
		off      int64
	}
	spans := map[string][]span{}      // "part/key"
	open := map[string]int{}          // "part/key/off/child" -> index of the open span
	lastOK := map[string]keyEvent{}   // "part@off" -> the last successful end
	starts := map[string][]keyEvent{} // "part@off"
	slices.SortStableFunc(evs, func(a, b keyEvent) int { return cmpInt(a.at, b.at) })
	for _, ev := range evs {
		pk := ev.part + "/" + ev.key
		id := fmt.Sprintf("%s/%d/%v", pk, ev.off, ev.child)
		po := fmt.Sprintf("%s@%d", ev.part, ev.off)
		if ev.kind == 'S' {
			// Per-key order: every earlier message of the key was handled.
			for _, o := range keyOffsets[pk] {
				if o >= ev.off {
					break
				}
				if e, ok := lastOK[fmt.Sprintf("%s@%d", ev.part, o)]; !ok || e.at > ev.at {
					t.Fatalf("%s offset %d started before offset %d of its key was handled", pk, ev.off, o)
				}
			}
			// Settled work is not run again, unless the killed child did it.
			if e, ok := lastOK[po]; ok && !e.child {
				t.Fatalf("%s started again after a consumer that stopped gracefully handled it", po)
			}
			starts[po] = append(starts[po], ev)
			open[id] = len(spans[pk])
			spans[pk] = append(spans[pk], span{from: ev.at, to: -1, child: ev.child, off: ev.off})
			continue
		}
		lastOK[po] = ev
		if i, ok := open[id]; ok {
			spans[pk][i].to = ev.at
			delete(open, id)
		}
	}
	for pk, ss := range spans {
		for i := range ss {
			if ss[i].to < 0 {
				if !ss[i].child {
					t.Fatalf("%s offset %d: a handler in this process never ended", pk, ss[i].off)
				}
				ss[i].to = killAt
			}
		}
		slices.SortFunc(ss, func(a, b span) int { return cmpInt(a.from, b.from) })
		for i := 1; i < len(ss); i++ {
			if ss[i].from < ss[i-1].to {
				t.Fatalf("%s: offsets %d and %d ran at once", pk, ss[i-1].off, ss[i].off)
			}
		}
	}
	reruns := 0
	for _, s := range starts {
		reruns += len(s) - 1
	}
	t.Logf("%d events, %d starts repeated (the killed child's unsaved work)", len(evs), reruns)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// In a handler with KeyConcurrency > 1, Ack and DeadLetter settle the one
// message (not the lease's earlier ones, which another key may still be
// running), and Fail, Retry and AckBatch are refused: a handler fails its
// message by returning the error, so that its key pauses.
func TestConsumeKeySettleFromHandler(t *testing.T) {
	c := open(t)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	pushKeyed(t, q, "p", "a", "b", "c")
	bAcked := make(chan struct{})
	var mu sync.Mutex
	var errs []string
	handled := 0
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 3},
		func(ctx context.Context, m *queen.Message) error {
			switch m.Key {
			case "a":
				// Still running when b's Ack commits: b's must not take a with it.
				<-bAcked
				if g := status(t, q).Partitions[0].Groups[0]; g.Committed != -1 || g.Settled < 1 {
					t.Errorf("after b's Ack: %+v, want the cursor before a and b settled above it", g)
				}
			case "b":
				if err := m.Ack(ctx); err != nil {
					t.Errorf("Ack: %v", err)
				}
				close(bAcked)
			case "c":
				mu.Lock()
				if err := m.Fail(ctx, errors.New("x")); !errors.Is(err, queen.ErrKeyedSettle) {
					errs = append(errs, fmt.Sprintf("Fail = %v, want ErrKeyedSettle", err))
				}
				if err := m.Retry(ctx); !errors.Is(err, queen.ErrKeyedSettle) {
					errs = append(errs, fmt.Sprintf("Retry = %v, want ErrKeyedSettle", err))
				}
				if res, err := q.AckBatch(ctx, []queen.AckRequest{{Message: m}}); err != nil || !errors.Is(res[0], queen.ErrKeyedSettle) {
					errs = append(errs, fmt.Sprintf("AckBatch = %v, %v", res, err))
				}
				mu.Unlock()
				if err := m.DeadLetter(ctx, errors.New("poison")); err != nil {
					t.Errorf("DeadLetter: %v", err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			handled++
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return handled >= 3 })
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if dl := deadLetters(t, q); len(dl) != 1 || dl[0].Offset != 2 {
		t.Fatalf("dead letters %+v, want c's", dl)
	}
	waitFor(t, 10*time.Second, "the cursor at the end", func() bool {
		g := status(t, q).Partitions[0].Groups[0]
		return g.Committed == 2 && g.Settled == 0 && !g.Leased
	})
}

// Stopping hands back what a key had not finished, uncharged, and keeps
// what other keys settled above it: the next pop gets only key a's
// messages, the interrupted head on Attempt 1.
func TestConsumeKeyStopKeepsSettled(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushKeyed(t, q, "p", "a", "b", "b", "b", "a")
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var bDone sync.WaitGroup
	bDone.Add(3)
	go func() { bDone.Wait(); cancel() }()
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
		func(hctx context.Context, m *queen.Message) error {
			if m.Key == "a" {
				<-hctx.Done() // cancelled by the stop
				return hctx.Err()
			}
			bDone.Done()
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if g := status(t, q).Partitions[0].Groups[0]; g.Committed != -1 || g.Settled != 3 || g.Leased {
		t.Fatalf("after the stop: %+v, want key b's three offsets settled above the cursor and no lease", g)
	}
	var got []string
	for _, m := range pop(t, q, queen.PopOptions{Batch: 10}) {
		got = append(got, fmt.Sprintf("%s@%d#%d", m.Key, m.Offset, m.Attempt))
	}
	if want := []string{"a@0#1", "a@4#1"}; !slices.Equal(got, want) {
		t.Fatalf("next pop got %v, want %v", got, want)
	}
}

// With AutoAck the claim already consumed the batch: a stop cannot hand the
// unstarted keys back, so, as without KeyConcurrency, every message claimed
// still reaches the handler (its context cancelled) rather than being lost
// unseen.
func TestConsumeKeyAutoAckStopHandsEveryClaimedMessage(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushKeyed(t, q, "p", "a", "b", "c", "d")
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var mu sync.Mutex
	var seen []string
	var two sync.WaitGroup
	two.Add(2)
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10, AutoAck: true}, KeyConcurrency: 2},
		func(hctx context.Context, m *queen.Message) error {
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s@%d", m.Key, m.Offset))
			n := len(seen)
			mu.Unlock()
			if n <= 2 {
				// The first two keys hold their slots until the stop.
				two.Done()
				two.Wait()
				cancel()
				<-hctx.Done()
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(seen)
	if want := []string{"a@0", "b@1", "c@2", "d@3"}; !slices.Equal(seen, want) {
		t.Fatalf("handled %v, want every auto-acked message of the batch %v", seen, want)
	}
	if got := pop(t, q, queen.PopOptions{Batch: 10}); len(got) != 0 {
		t.Fatalf("auto-acked messages came back: %d", len(got))
	}
}

// The gauges of per-key Consume report, per partition batch in hand, the
// keys running and the keys a failure paused.
func TestConsumeKeyMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	c := open(t, func(c *queen.Config) { c.MeterProvider = mp })
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 5})
	pushKeyed(t, q, "p", "a", "b", "a")
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
			func(hctx context.Context, m *queen.Message) error {
				if m.Key == "a" {
					return errors.New("pause a")
				}
				select {
				case <-release:
				case <-hctx.Done():
				}
				return nil
			})
	}()
	gauge := func(name string) (int64, bool) {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == name {
					for _, dp := range g.DataPoints {
						if v, _ := dp.Attributes.Value("partition"); v.AsString() == "p" {
							return dp.Value, true
						}
					}
				}
			}
		}
		return 0, false
	}
	waitFor(t, 10*time.Second, "one key in flight and one paused", func() bool {
		f, ok1 := gauge("queen.client.keys.in_flight")
		p, ok2 := gauge("queen.client.keys.paused")
		return ok1 && ok2 && f == 1 && p == 1
	})
	close(release)
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if _, ok := gauge("queen.client.keys.in_flight"); ok {
		t.Fatal("the gauge still reports the partition after Consume returned")
	}
}
