package queen_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

// noBackoff is the RetryBackoff of tests that fail a message and expect
// it back at once, as before retry backoff.
var noBackoff = queen.RetryBackoff{Disabled: true}

// slack bounds how late a due retry may come on a loaded machine: the
// lower bounds are exact, the upper ones only catch a wait that never ends.
const slack = 10 * time.Second

// retryAt is the group's RetryAt on partition p (zero when it does not
// wait), with its Failures.
func retryAt(t *testing.T, q *queen.Queue, p string) (time.Time, int) {
	t.Helper()
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ps := range st.Partitions {
		if ps.Name == p && len(ps.Groups) > 0 {
			return ps.Groups[0].RetryAt, ps.Groups[0].Failures
		}
	}
	t.Fatalf("no group on partition %s: %+v", p, st)
	return time.Time{}, 0
}

// popUntil pops partition p until it delivers, and returns the message and
// when the pop returned (after the claim that took it).
func popUntil(t *testing.T, q *queen.Queue, p string) (*queen.Message, time.Time) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		msgs := pop(t, q, queen.PopOptions{Partition: p, Wait: 300 * time.Millisecond})
		if len(msgs) > 0 {
			return msgs[0], time.Now()
		}
	}
	t.Fatalf("partition %s: nothing delivered in a minute", p)
	return nil, time.Time{}
}

// A failing message waits its backoff between attempts (never less than
// Min, growing to at most Max), while another partition flows.
func TestRetryBackoffWaitsBetweenAttempts(t *testing.T) {
	c := open(t)
	q := c.Queue("rb")
	const lo, hi = 200 * time.Millisecond, 800 * time.Millisecond
	if err := q.Configure(ctxT(t), queen.QueueOptions{RetryLimit: 4, DeadLetter: true,
		RetryBackoff: queen.RetryBackoff{Min: lo, Max: hi}}); err != nil {
		t.Fatal(err)
	}
	pushN(t, q, "a", "a", 1)
	pushN(t, q, "b", "b", 5)
	var mu sync.Mutex
	var aStart, aEnd, bAt []time.Time
	var attempts []int
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 1}, Concurrency: 1,
		SoftStop: slack /* the last failure is charged, not handed back */},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if m.Partition == "b" {
				bAt = append(bAt, time.Now())
				return nil
			}
			aStart, attempts = append(aStart, time.Now()), append(attempts, m.Attempt)
			defer func() { aEnd = append(aEnd, time.Now()) }()
			return errors.New("downstream down")
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(aStart) == 4 && len(bAt) == 5 })
	if err != nil {
		t.Fatal(err)
	}
	if len(aStart) != 4 || attempts[0] != 1 || attempts[3] != 4 {
		t.Fatalf("partition a: attempts %v, want 1..4", attempts)
	}
	for k := 1; k < 4; k++ {
		gap := aStart[k].Sub(aEnd[k-1])
		top := min(hi, lo<<k) // after the k-th failure
		if gap < lo || gap > top+slack {
			t.Errorf("attempt %d came %s after failure %d, want within [%s, %s] (+ slack)", k+1, gap, k, lo, top)
		}
	}
	flowed := false
	for _, at := range bAt {
		flowed = flowed || (at.After(aEnd[0]) && at.Before(aStart[1]))
	}
	if !flowed {
		t.Errorf("no message of b handled while a waited (%s..%s): b at %v", aEnd[0], aStart[1], bAt)
	}
	dls, err := q.DeadLetters(ctxT(t), queen.DeadLetterQuery{})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters after the 4th failure: %d, %v", len(dls), err)
	}
}

// Every way a message fails under the pause policy records the next
// attempt's time on the cursor, releases the lease, and holds the message
// back until then.
func TestRetryBackoffEveryFailurePath(t *testing.T) {
	c := open(t)
	q := c.Queue("rbp")
	const wait = time.Hour
	if err := q.Configure(ctxT(t), queen.QueueOptions{RetryLimit: 5,
		RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}}); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	paths := map[string]func(m *queen.Message) error{
		"fail":        func(m *queen.Message) error { return m.Fail(ctx, errors.New("boom")) },
		"retry-after": func(m *queen.Message) error { return m.RetryAfter(ctx, 30*time.Minute) },
		"ackbatch": func(m *queen.Message) error {
			errs, err := q.AckBatch(ctx, []queen.AckRequest{{Message: m, Status: queen.AckFail}})
			return errors.Join(err, errs[0])
		},
		"tx-fail": func(m *queen.Message) error {
			return c.Tx(ctx, func(tx *queen.Tx) error { tx.Fail(m, errors.New("boom")); return nil })
		},
	}
	before := time.Now()
	for p, fail := range paths {
		pushN(t, q, p, p, 1)
		m := pop(t, q, queen.PopOptions{Partition: p})
		if len(m) != 1 {
			t.Fatalf("%s: popped %d", p, len(m))
		}
		if err := fail(m[0]); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	// A Consume handler's error, its panic and its timeout.
	for _, p := range []string{"consume-error", "consume-panic", "consume-timeout"} {
		pushN(t, q, p, p, 1)
	}
	var mu sync.Mutex
	handled := 0
	err := consumeUntil(t, q, queen.ConsumeOptions{HandlerTimeout: 200 * time.Millisecond, SoftStop: slack},
		func(ctx context.Context, m *queen.Message) error {
			mu.Lock()
			handled++
			mu.Unlock()
			switch m.Partition {
			case "consume-panic":
				panic("boom")
			case "consume-timeout":
				<-ctx.Done()
				return ctx.Err()
			}
			return errors.New("boom")
		}, func() bool { mu.Lock(); defer mu.Unlock(); return handled == 3 })
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	for _, p := range []string{"fail", "retry-after", "ackbatch", "tx-fail", "consume-error", "consume-panic", "consume-timeout"} {
		want := wait
		if p == "retry-after" {
			want = 30 * time.Minute
		}
		// The Consume settlements may land just after Consume returned.
		deadline := time.Now().Add(slack)
		at, failures := retryAt(t, q, p)
		for at.IsZero() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			at, failures = retryAt(t, q, p)
		}
		if at.Before(before.Add(want)) || at.After(after.Add(want+slack)) || failures != 1 {
			t.Errorf("%s: RetryAt %s (failures %d), want about %s from now with 1 failure", p, at, failures, want)
		}
	}
	if msgs := pop(t, q, queen.PopOptions{Batch: 10, Partitions: 10}); len(msgs) != 0 {
		t.Fatalf("a waiting message was delivered: %s/%d", msgs[0].Partition, msgs[0].Offset)
	}
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Partitions {
		if g := p.Groups[0]; g.Leased {
			t.Errorf("%s: a waiting message holds its lease: %+v", p.Name, g)
		}
	}
}

// The wait is the cursor's: a client closed during it and a new one opened
// get the message back no earlier than RetryAt.
func TestRetryBackoffSurvivesClientRestart(t *testing.T) {
	c1 := open(t)
	q1 := c1.Queue("rbr")
	const wait = 1500 * time.Millisecond
	if err := q1.Configure(ctxT(t), queen.QueueOptions{RetryBackoff: queen.RetryBackoff{Min: wait, Max: wait}}); err != nil {
		t.Fatal(err)
	}
	pushN(t, q1, "p", "m", 1)
	m := pop(t, q1, queen.PopOptions{})
	before := time.Now()
	if err := m[0].Fail(ctxT(t), errors.New("down")); err != nil {
		t.Fatal(err)
	}
	if err := c1.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	c2 := open(t, func(cfg *queen.Config) { cfg.Schema = c1.Schema() })
	q2 := c2.Queue("rbr")
	at, _ := retryAt(t, q2, "p")
	if at.Before(before.Add(wait)) {
		t.Fatalf("RetryAt %s is before the failure + %s (%s)", at, wait, before.Add(wait))
	}
	got, when := popUntil(t, q2, "p")
	if when.Before(at) || got.Attempt != 2 {
		t.Fatalf("redelivered at %s (RetryAt %s), attempt %d", when, at, got.Attempt)
	}
	if at, _ := retryAt(t, q2, "p"); !at.IsZero() {
		t.Fatalf("RetryAt %s still set once redelivered", at)
	}
}

// A handler's RetryAfter overrides the schedule, longer or shorter.
func TestRetryAfterHonoured(t *testing.T) {
	c := open(t)
	q := c.Queue("ra")
	if err := q.Configure(ctxT(t), queen.QueueOptions{RetryBackoff: queen.RetryBackoff{Min: 50 * time.Millisecond,
		Max: 100 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	pushN(t, q, "p", "m", 1)
	const want = 1500 * time.Millisecond
	var mu sync.Mutex
	var starts, ends []time.Time
	throttled := errors.New("429")
	err := consumeUntil(t, q, queen.ConsumeOptions{},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			starts = append(starts, time.Now())
			defer func() { ends = append(ends, time.Now()) }()
			if len(starts) == 1 {
				return queen.RetryAfter(want, throttled)
			}
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return len(starts) == 2 })
	if err != nil {
		t.Fatal(err)
	}
	if gap := starts[1].Sub(ends[0]); gap < want || gap > want+slack {
		t.Fatalf("second attempt %s after RetryAfter(%s)", gap, want)
	}

	// Message.RetryAfter, for Pop users; a delay under the queue's Min
	// is honoured too.
	if err := q.Configure(ctxT(t), queen.QueueOptions{RetryBackoff: queen.RetryBackoff{Min: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	pushN(t, q, "pop", "m", 1)
	m := pop(t, q, queen.PopOptions{Partition: "pop"})
	before := time.Now()
	if err := m[0].RetryAfter(ctxT(t), 800*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	at, failures := retryAt(t, q, "pop")
	if at.Before(before.Add(800*time.Millisecond)) || at.After(time.Now().Add(800*time.Millisecond+slack)) || failures != 1 {
		t.Fatalf("after RetryAfter(800ms): RetryAt %s, failures %d", at, failures)
	}
	got, when := popUntil(t, q, "pop")
	if when.Before(at) || got.Attempt != 2 {
		t.Fatalf("redelivered at %s (RetryAt %s), attempt %d", when, at, got.Attempt)
	}

	// The wrapper keeps the error's text and identity.
	ra := queen.RetryAfter(time.Second, throttled)
	if !errors.Is(ra, throttled) || ra.Error() != "429" {
		t.Fatalf("RetryAfter(1s, 429) = %q, Is %v", ra, errors.Is(ra, throttled))
	}
	if s := queen.RetryAfter(time.Second, nil).Error(); !strings.Contains(s, "1s") {
		t.Fatalf("RetryAfter(1s, nil).Error() = %q", s)
	}
}

// Disabled redelivers a failure at once, as before backoff; a handler's
// RetryAfter still waits. Retry (uncharged) and lease expiry never wait.
// Under the skip policy the failure's copy waits (in the scheduled table,
// counted by Status), not the partition.
func TestRetryBackoffImmediateCases(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)

	off := c.Queue("off")
	if err := off.Configure(ctx, queen.QueueOptions{RetryBackoff: queen.RetryBackoff{Disabled: true}}); err != nil {
		t.Fatal(err)
	}
	pushN(t, off, "p", "m", 1)
	m := pop(t, off, queen.PopOptions{})
	if err := m[0].Fail(ctx, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	if m = pop(t, off, queen.PopOptions{}); len(m) != 1 || m[0].Attempt != 2 {
		t.Fatalf("Disabled: not redelivered at once: %v", m)
	}
	if at, _ := retryAt(t, off, "p"); !at.IsZero() {
		t.Fatalf("Disabled: RetryAt %s", at)
	}
	if err := m[0].RetryAfter(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	if at, _ := retryAt(t, off, "p"); at.Before(time.Now().Add(59 * time.Minute)) {
		t.Fatalf("Disabled: RetryAfter(1h) gave RetryAt %s", at)
	}
	if m = pop(t, off, queen.PopOptions{}); len(m) != 0 {
		t.Fatal("Disabled: RetryAfter(1h) redelivered at once")
	}

	long := queen.QueueOptions{RetryBackoff: queen.RetryBackoff{Min: time.Hour, Max: time.Hour}}
	q := c.Queue("on")
	if err := q.Configure(ctx, long); err != nil {
		t.Fatal(err)
	}
	pushN(t, q, "retry", "m", 1)
	m = pop(t, q, queen.PopOptions{Partition: "retry"})
	if err := m[0].Retry(ctx); err != nil {
		t.Fatal(err)
	}
	if m = pop(t, q, queen.PopOptions{Partition: "retry"}); len(m) != 1 {
		t.Fatal("Retry waited")
	}
	if err := m[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}

	pushN(t, q, "expire", "m", 1)
	pop(t, q, queen.PopOptions{Partition: "expire", LeaseTime: 100 * time.Millisecond})
	got, _ := popUntil(t, q, "expire") // an hour's backoff would time out here
	if at, failures := retryAt(t, q, "expire"); got.Attempt != 2 || failures != 0 || !at.IsZero() {
		t.Fatalf("lease expiry: attempt %d, failures %d, RetryAt %s", got.Attempt, failures, at)
	}

	skip := long
	skip.FailurePolicy = queen.FailureSkip
	s := c.Queue("skip")
	if err := s.Configure(ctx, skip); err != nil {
		t.Fatal(err)
	}
	pushN(t, s, "p", "m", 2)
	m = pop(t, s, queen.PopOptions{})
	if err := m[0].Fail(ctx, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	if m = pop(t, s, queen.PopOptions{Batch: 10}); len(m) != 1 || string(m[0].Data) != "m1" {
		t.Fatalf("skip policy: want only the message behind the failed one, got %q", datas(m))
	}
	ack(t, m[0])
	st, err := s.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.RetriesWaiting != 1 || st.Scheduled != 0 || len(st.Partitions) != 1 || st.Partitions[0].LastOffset != 1 {
		t.Fatalf("skip policy: status %+v, want the copy waiting aside, not yet in its partition", st)
	}
}

// RetryBackoff is validated field by field and stored with the queue.
func TestRetryBackoffOptions(t *testing.T) {
	c := open(t)
	ctx := ctxT(t)
	for _, b := range []struct {
		rb   queen.RetryBackoff
		want string
	}{
		{queen.RetryBackoff{Min: -time.Second}, "RetryBackoff.Min must not be negative"},
		{queen.RetryBackoff{Max: -time.Second}, "RetryBackoff.Max must not be negative"},
		{queen.RetryBackoff{Min: 2 * time.Second, Max: time.Second}, "RetryBackoff.Min 2s is over RetryBackoff.Max 1s"},
		{queen.RetryBackoff{Min: time.Microsecond}, "RetryBackoff.Min 1µs is under the 1ms minimum"},
	} {
		err := c.Queue("v").Configure(ctx, queen.QueueOptions{RetryBackoff: b.rb})
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("Configure(%+v) = %v, want %q", b.rb, err, b.want)
		}
	}
	for name, o := range map[string]queen.RetryBackoff{
		"default":  {},
		"custom":   {Min: 200 * time.Millisecond, Max: 800 * time.Millisecond},
		"min-only": {Min: 10 * time.Minute},
		"disabled": {Disabled: true, Min: time.Second},
	} {
		if err := c.Queue(name).Configure(ctx, queen.QueueOptions{RetryBackoff: o}); err != nil {
			t.Fatal(err)
		}
	}
	pushN(t, c.Queue("pushed"), "p", "m", 1) // created by its first push
	want := map[string]queen.RetryBackoff{
		"default":  {Min: queen.DefaultRetryBackoffMin, Max: queen.DefaultRetryBackoffMax},
		"pushed":   {Min: queen.DefaultRetryBackoffMin, Max: queen.DefaultRetryBackoffMax},
		"custom":   {Min: 200 * time.Millisecond, Max: 800 * time.Millisecond},
		"min-only": {Min: 10 * time.Minute, Max: 10 * time.Minute},
		"disabled": {Disabled: true},
	}
	qs, err := c.Queues(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, qi := range qs {
		if qi.Options.RetryBackoff != want[qi.Name] {
			t.Errorf("%s: stored RetryBackoff %+v, want %+v", qi.Name, qi.Options.RetryBackoff, want[qi.Name])
		}
	}
}
