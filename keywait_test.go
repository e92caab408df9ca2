package queen_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// keyAttempt is one handler call a keyed-wait test records.
type keyAttempt struct {
	off        int64
	attempt    int
	start, end time.Time
}

// Under FailurePause with KeyConcurrency, a failing key's attempts follow
// the backoff (at least Min after the failure before, at most Max plus
// slack), RetryAfter replaces the schedule, the key's later messages start
// only once it succeeded, and Attempt counts the deliveries.
func TestKeyRetryBackoffAndRetryAfter(t *testing.T) {
	c := open(t)
	const lo, hi = 200 * time.Millisecond, 400 * time.Millisecond
	const asked = 900 * time.Millisecond
	q := configure(t, c, "kb", queen.QueueOptions{RetryLimit: 10,
		RetryBackoff: queen.RetryBackoff{Min: lo, Max: hi}})
	keys := []string{"a", "b", "a", "b", "b", "a", "b"}
	pushKeyed(t, q, "p", keys...)
	keyOffsets := map[string][]int64{}
	for i, k := range keys {
		keyOffsets[k] = append(keyOffsets[k], int64(i))
	}
	log := newKeyLog()
	var mu sync.Mutex
	var a0 []keyAttempt
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2,
		SoftStop: slack}, func(_ context.Context, m *queen.Message) error {
		log.start(m, keyOffsets)
		if m.Offset != 0 {
			log.end(m, true)
			return nil
		}
		mu.Lock()
		a0 = append(a0, keyAttempt{off: m.Offset, attempt: m.Attempt, start: time.Now()})
		n := len(a0)
		mu.Unlock()
		var err error
		switch n {
		case 1:
			err = queen.RetryAfter(asked, errors.New("come back later"))
		case 2, 3:
			err = errors.New("down")
		}
		mu.Lock()
		a0[n-1].end = time.Now()
		mu.Unlock()
		log.end(m, err == nil)
		return err
	}, func() bool { return log.handled() == len(keys) })
	if err != nil {
		t.Fatal(err)
	}
	log.check(t)
	mu.Lock()
	defer mu.Unlock()
	if len(a0) != 4 {
		t.Fatalf("a@0 handled %d times, want 4", len(a0))
	}
	for i, at := range a0 {
		if at.attempt != i+1 {
			t.Errorf("a@0 call %d: Attempt %d, want %d", i+1, at.attempt, i+1)
		}
	}
	gaps := []time.Duration{a0[1].start.Sub(a0[0].end), a0[2].start.Sub(a0[1].end), a0[3].start.Sub(a0[2].end)}
	if gaps[0] < asked || gaps[0] > asked+slack {
		t.Errorf("after RetryAfter(%s): next attempt %s later", asked, gaps[0])
	}
	for i, g := range gaps[1:] {
		if g < lo || g > hi+slack {
			t.Errorf("after failure %d: next attempt %s later, want within [%s, %s] (+ slack)", i+2, g, lo, hi)
		}
	}
	if got, want := log.starts["a"], []int64{0, 0, 0, 0, 2, 5}; !slices.Equal(got, want) {
		t.Fatalf("key a started %v, want %v", got, want)
	}
	if got, want := log.starts["b"], []int64{1, 3, 4, 6}; !slices.Equal(got, want) {
		t.Fatalf("key b started %v, want %v, each once", got, want)
	}
}

// While key a waits a long backoff, key b's messages of the same lane flow
// for many Batches; a's later messages do not start; Status shows when a
// comes back; the partition is not claimed in a loop meanwhile; Pop on the
// group does not deliver the waiting message. A client closed during the
// wait and a new one opened do not shorten it, and nothing is lost.
func TestKeyWaitLetsOtherKeysFlow(t *testing.T) {
	c := open(t)
	const wait = time.Hour
	q := configure(t, c, "kf", queen.QueueOptions{RetryLimit: 5,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	keys := []string{"a", "a"}
	for range 200 {
		keys = append(keys, "b")
	}
	keys = append(keys, "a")
	pushKeyed(t, q, "p", keys...)
	keyOffsets := map[string][]int64{}
	for i, k := range keys {
		keyOffsets[k] = append(keyOffsets[k], int64(i))
	}
	log := newKeyLog()
	var failedAt time.Time
	var mu sync.Mutex
	consume := func(q *queen.Queue, stop func() bool) {
		t.Helper()
		err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 3,
			SoftStop: slack}, func(_ context.Context, m *queen.Message) error {
			log.start(m, keyOffsets)
			if m.Offset == 0 {
				mu.Lock()
				failedAt = time.Now()
				mu.Unlock()
				log.end(m, false)
				return errors.New("down")
			}
			log.end(m, true)
			return nil
		}, stop)
		if err != nil {
			t.Fatal(err)
		}
	}
	consume(q, func() bool { return log.handled() == 200 })
	log.check(t)
	if got := log.starts["a"]; !slices.Equal(got, []int64{0}) {
		t.Fatalf("key a started %v while a@0 waits, want [0]", got)
	}
	if got := len(log.starts["b"]); got != 200 {
		t.Fatalf("key b started %d times, want each of its 200 messages once", got)
	}
	at, failures := retryAt(t, q, "p")
	mu.Lock()
	fa := failedAt
	mu.Unlock()
	if at.Before(fa.Add(wait-slack)) || failures != 1 {
		t.Fatalf("RetryAt %s (failure at %s, wait %s), Failures %d", at, fa, wait, failures)
	}

	// Parked: a Consume over the waiting lane claims it no more than its
	// rescans do, and handles nothing.
	before := c.Stats().Claims
	ctx, cancel := context.WithTimeout(ctxT(t), time.Second)
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 3},
		func(_ context.Context, m *queen.Message) error {
			t.Errorf("handled %s@%d during the wait", m.Key, m.Offset)
			return nil
		})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Stats().Claims - before; n > 20 {
		t.Errorf("%d claims in a second over a lane with only a waiting key", n)
	}
	// Pop takes nothing before the waiting message.
	if msgs := pop(t, q, queen.PopOptions{Partition: "p", Batch: 100}); len(msgs) != 0 {
		t.Fatalf("Pop delivered %d messages (first %s@%d) while a@0 waits", len(msgs), msgs[0].Key, msgs[0].Offset)
	}

	// A new client after a Close: the wait stands, b's new messages flow.
	if err := c.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	c2 := open(t, func(cfg *queen.Config) { cfg.Schema = c.Schema() })
	q2 := c2.Queue("kf")
	if at2, _ := retryAt(t, q2, "p"); !at2.Equal(at) {
		t.Fatalf("RetryAt %s after reopening, was %s", at2, at)
	}
	push(t, q2, queen.Item{Partition: "p", Key: "b", Data: []byte("b:late")})
	keyOffsets["b"] = append(keyOffsets["b"], int64(len(keys)))
	consume(q2, func() bool { return log.handled() == 201 })
	log.check(t)
	if got := log.starts["a"]; !slices.Equal(got, []int64{0}) {
		t.Fatalf("key a started %v after reopening, want [0]", got)
	}
	g := status(t, q2).Partitions[0].Groups[0]
	if g.Committed != -1 || g.Failures != 1 {
		t.Fatalf("status after b drained: %+v", g)
	}
}

// RetryLimit counts per message under keys with a backoff: the failing
// message is dead-lettered after its last attempt, each attempt at least
// Min after the one before, and its key's next message runs after it.
func TestKeyWaitRetryLimitDeadLetters(t *testing.T) {
	c := open(t)
	const lo = 150 * time.Millisecond
	q := configure(t, c, "kd", queen.QueueOptions{RetryLimit: 3, DeadLetter: true,
		RetryBackoff: queen.RetryBackoff{Min: lo, Max: lo}})
	keys := []string{"a", "b", "a", "b"}
	pushKeyed(t, q, "p", keys...)
	// a@0 is never handled successfully (it is dead-lettered): a@2 is
	// checked against its attempts below.
	keyOffsets := map[string][]int64{"a": {2}, "b": {1, 3}}
	log := newKeyLog()
	var mu sync.Mutex
	var a0 []keyAttempt
	var a2 time.Time
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2,
		SoftStop: slack}, func(_ context.Context, m *queen.Message) error {
		log.start(m, keyOffsets)
		if m.Offset == 2 {
			mu.Lock()
			a2 = time.Now()
			mu.Unlock()
		}
		if m.Offset == 0 {
			mu.Lock()
			a0 = append(a0, keyAttempt{off: 0, attempt: m.Attempt, start: time.Now()})
			a0[len(a0)-1].end = time.Now()
			mu.Unlock()
			log.end(m, false)
			return errors.New("poison")
		}
		log.end(m, true)
		return nil
	}, func() bool { return log.handled() == 3 })
	if err != nil {
		t.Fatal(err)
	}
	log.check(t)
	mu.Lock()
	defer mu.Unlock()
	if len(a0) != 3 || a0[2].attempt != 3 {
		t.Fatalf("a@0 attempts %+v, want 3", a0)
	}
	for i := 1; i < 3; i++ {
		if g := a0[i].start.Sub(a0[i-1].end); g < lo {
			t.Errorf("attempt %d came %s after the failure before, want at least %s", i+1, g, lo)
		}
	}
	if a2.Before(a0[2].end) {
		t.Fatalf("a@2 started at %s, before a@0's last attempt ended (%s)", a2, a0[2].end)
	}
	dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dls) != 1 || dls[0].Offset != 0 || dls[0].Attempts != 3 {
		t.Fatalf("dead letters: %+v, %v", dls, err)
	}
	g := status(t, q).Partitions[0].Groups[0]
	if g.Committed != 3 || !g.RetryAt.IsZero() {
		t.Fatalf("status after the dead letter: %+v", g)
	}
}

// A holder that stops renewing (its handler hung past MaxHold, as a crash)
// loses its lease, and another consumer gets the lane's other keys at once
// after it, uncharged, while the waiting key still waits.
func TestKeyWaitLeaseExpiryRedeliversAtOnce(t *testing.T) {
	c := open(t)
	const wait = time.Hour
	q := configure(t, c, "ke", queen.QueueOptions{RetryLimit: 5, LeaseTime: 500 * time.Millisecond,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	pushKeyed(t, q, "p", "a", "b", "b")
	hang := make(chan struct{})
	var unhang sync.Once
	defer unhang.Do(func() { close(hang) })
	var mu sync.Mutex
	var seen []string
	record := func(m *queen.Message) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s@%d#%d", m.Key, m.Offset, m.Attempt))
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2,
			MaxHold: 300 * time.Millisecond}, func(_ context.Context, m *queen.Message) error {
			record(m)
			switch m.Offset {
			case 0:
				return errors.New("down")
			case 1:
				<-hang // hung, deaf to its context: the lease must run out
			}
			return nil
		})
	}()
	waitFor(t, 10*time.Second, "a@0 failed and b@1 hung", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(seen, "a@0#1") && slices.Contains(seen, "b@1#1")
	})
	start := time.Now()
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
		func(_ context.Context, m *queen.Message) error {
			record(m)
			return nil
		}, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(seen, "b@2#1")
		})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	unhang.Do(func() { close(hang) })
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"b@1#1", "a@0#1", "b@1#1", "b@2#1"}; !slices.Equal(seen, want) &&
		!slices.Equal(seen, []string{"a@0#1", "b@1#1", "b@1#1", "b@2#1"}) {
		t.Fatalf("deliveries %v, want %v (in either order for the first two)", seen, want)
	}
	if took > slack {
		t.Fatalf("the other consumer took %s to get b@1 after the lease ran out", took)
	}
	at, failures := retryAt(t, q, "p")
	if at.IsZero() || failures != 1 {
		t.Fatalf("after the lease expiry: RetryAt %s, Failures %d (want a wait and one failure)", at, failures)
	}
}

// A waiting key that keeps receiving messages does not fill its lane's
// claims: with key a waiting after its first message and 60 more of its
// messages interleaved with 100 of key b, Batch 10, every message of b is
// handled during the wait and none of a's.
func TestKeyWaitBusyKeyDoesNotFillTheLane(t *testing.T) {
	c := open(t)
	const wait = time.Hour
	q := configure(t, c, "kbusy", queen.QueueOptions{RetryLimit: 5,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	keys := []string{"a"}
	for i := range 160 {
		if i%8 < 3 {
			keys = append(keys, "a")
		} else {
			keys = append(keys, "b")
		}
	}
	pushKeyed(t, q, "p", keys...)
	keyOffsets := map[string][]int64{}
	for i, k := range keys {
		keyOffsets[k] = append(keyOffsets[k], int64(i))
	}
	nb := len(keyOffsets["b"])
	log := newKeyLog()
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 3,
		SoftStop: slack}, func(_ context.Context, m *queen.Message) error {
		log.start(m, keyOffsets)
		if m.Key == "a" {
			log.end(m, false)
			return errors.New("down")
		}
		log.end(m, true)
		return nil
	}, func() bool { return log.handled() == nb })
	if err != nil {
		t.Fatal(err)
	}
	log.check(t)
	if got := log.starts["a"]; !slices.Equal(got, []int64{0}) {
		t.Fatalf("key a started %v while a@0 waits, want [0]", got)
	}
	if got := len(log.starts["b"]); got != nb {
		t.Fatalf("key b started %d times, want each of its %d messages once", got, nb)
	}
}

// A cursor that retention passed by more than a claim's reach (10,000
// offsets) still claims what is retained.
func TestClaimPastRetentionBeyondReach(t *testing.T) {
	c := open(t, manual)
	q := configure(t, c, "far", queen.QueueOptions{Retention: time.Hour})
	if got := pop(t, q, queen.PopOptions{}); len(got) != 0 {
		t.Fatalf("popped %d from an empty queue", len(got))
	}
	items := make([]queen.Item, 10_500)
	for i := range items {
		items[i] = queen.Item{Partition: "p", Data: []byte("old")}
	}
	push(t, q, items...)
	first := pop(t, q, queen.PopOptions{Batch: 1})
	if len(first) != 1 {
		t.Fatalf("popped %d, want 1", len(first))
	}
	if err := first[0].Ack(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	ageColumn(t, c, "segments", "created_at", 2*time.Hour)
	if rep := maintain(t, c); rep.SegmentsDeleted == 0 {
		t.Fatalf("retention deleted nothing: %+v", rep)
	}
	push(t, q, queen.Item{Partition: "p", Data: []byte("new")})
	got := pop(t, q, queen.PopOptions{Batch: 10})
	if len(got) != 1 || string(got[0].Data) != "new" {
		t.Fatalf("popped %q, want the message retention left", datas(got))
	}
}

// While key a's head waits a long backoff, a message of another key above
// it that cannot be decoded is dead-lettered at once, as one at the head
// would be, and the keys after it flow: it is not left for the lease to
// run out, nor claimed again and again until a's wait ends.
func TestKeyWaitUndecodableAboveTheHead(t *testing.T) {
	c := open(t)
	const wait = time.Hour
	q := configure(t, c, "ku", queen.QueueOptions{RetryLimit: 5, DeadLetter: true,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}})
	pushKeyed(t, q, "p", "a", "b")                                        // offsets 0 and 1
	push(t, q, queen.Item{Partition: "p", Key: "b", Data: []byte("b:2")}) // offset 2, corrupted below
	push(t, q, queen.Item{Partition: "p", Key: "c", Data: []byte("c:3")}) // offset 3
	s := pgx.Identifier{c.Schema()}.Sanitize()
	if tag, err := c.Pool().Exec(ctxT(t), "UPDATE "+s+`.segments x SET blob = '\x01deadbeef' FROM `+s+
		`.partitions p WHERE p.id = x.partition_id AND p.name = 'p' AND x.base_offset = 2`); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("corrupting the segment: %v, %v", tag, err)
	}
	var mu sync.Mutex
	handled := map[int64]int{}
	before := c.Stats().Claims
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 3, SoftStop: slack},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			handled[m.Offset]++
			if m.Offset == 0 {
				return errors.New("down")
			}
			return nil
		}, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return handled[0] == 1 && handled[1] == 1 && handled[3] == 1
		})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := fmt.Sprint(handled)
	mu.Unlock()
	if got != "map[0:1 1:1 3:1]" {
		t.Fatalf("handled %s, want each of 0, 1 and 3 once", got)
	}
	// The dead letter is written within moments, not after the wait.
	deadline := time.Now().Add(5 * time.Second)
	for {
		dl, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) == 1 && dl[0].Offset == 2 && strings.Contains(dl[0].Reason, "undecodable") {
			break
		}
		if len(dl) > 1 || time.Now().After(deadline) {
			t.Fatalf("dead letters %+v, want offset 2 of p only", dl)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := c.Stats().Claims - before; n > 30 {
		t.Errorf("%d claims for four messages: the undecodable one was claimed in a loop", n)
	}
	if msgs := pop(t, q, queen.PopOptions{Partition: "p", Batch: 100}); len(msgs) != 0 {
		t.Fatalf("Pop delivered %d messages (first %s@%d) while a@0 waits", len(msgs), msgs[0].Key, msgs[0].Offset)
	}
}
