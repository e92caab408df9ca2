package queen_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
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
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 4, DeadLetter: true})
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
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 5, FailurePolicy: queen.FailureSkip})
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
