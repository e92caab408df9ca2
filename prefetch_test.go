package queen_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/internal/segment"
)

// claimLog records Consume's claims from its Debug log ("queen: consume
// claimed": one line per batch, claims ahead included) and passes every
// record on to next.
type claimLog struct {
	next   slog.Handler
	shared *claimLog // the one that records, for a handler WithAttrs made
	mu     sync.Mutex
	claims []claimRec
	grew   chan struct{} // closed and replaced on each claim
}

type claimRec struct {
	first, last int64
	lease       string
}

func newClaimLog(next slog.Handler) *claimLog {
	return &claimLog{next: next, grew: make(chan struct{})}
}

func (l *claimLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *claimLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "queen: consume claimed" {
		var c claimRec
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "first":
				c.first = a.Value.Int64()
			case "last":
				c.last = a.Value.Int64()
			case "lease":
				c.lease = a.Value.String()
			}
			return true
		})
		rl := l.root()
		rl.mu.Lock()
		rl.claims = append(rl.claims, c)
		close(rl.grew)
		rl.grew = make(chan struct{})
		rl.mu.Unlock()
	}
	if l.next.Enabled(ctx, r.Level) {
		return l.next.Handle(ctx, r)
	}
	return nil
}

func (l *claimLog) WithAttrs(as []slog.Attr) slog.Handler {
	return &claimLog{next: l.next.WithAttrs(as), shared: l.root()}
}

func (l *claimLog) WithGroup(string) slog.Handler { return l }

func (l *claimLog) root() *claimLog {
	if l.shared != nil {
		return l.shared
	}
	return l
}

// all returns the claims so far.
func (l *claimLog) all() []claimRec {
	l = l.root()
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.claims)
}

// waitFor waits up to 10 s for a claim starting at first and returns it.
func (l *claimLog) waitFor(first int64) (claimRec, bool) {
	l = l.root()
	deadline := time.After(10 * time.Second)
	for {
		l.mu.Lock()
		for _, c := range l.claims {
			if c.first == first {
				l.mu.Unlock()
				return c, true
			}
		}
		grew := l.grew
		l.mu.Unlock()
		select {
		case <-grew:
		case <-deadline:
			return claimRec{}, false
		}
	}
}

// openClaimLog opens a client whose Consume claims l records.
func openClaimLog(t *testing.T, mod ...func(*queen.Config)) (*queen.Client, *claimLog) {
	l := newClaimLog(pgtest.Logger(t).Handler())
	return open(t, append([]func(*queen.Config){func(cfg *queen.Config) { cfg.Logger = slog.New(l) }}, mod...)...), l
}

// handledRec is one handler call.
type handledRec struct {
	off     int64
	data    string
	lease   string
	attempt int
}

type handledLog struct {
	mu   sync.Mutex
	recs []handledRec
}

func (h *handledLog) add(m *queen.Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, handledRec{m.Offset, string(m.Data), m.LeaseID, m.Attempt})
}

func (h *handledLog) all() []handledRec {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.recs)
}

func (h *handledLog) datas() []string {
	var out []string
	for _, r := range h.all() {
		out = append(out, r.data)
	}
	return out
}

// seq is prefix0 .. prefix<n-1>, then more.
func seq(prefix string, from, to int, more ...string) []string {
	var out []string
	for i := from; i < to; i++ {
		out = append(out, fmt.Sprintf("%s%d", prefix, i))
	}
	return append(out, more...)
}

// One partition drained by one Consume: the batch after the running one is
// claimed under the same lease while it runs, and each settle claims the
// next, so one lease covers the whole drain; every message is handled once,
// in order, on its first attempt, and the lease ends with the last batch.
func TestConsumeClaimsAheadUnderOneLease(t *testing.T) {
	c, claims := openClaimLog(t)
	q := c.Queue("q")
	pushN(t, q, "p", "m", 50)
	var h handledLog
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}},
		func(_ context.Context, m *queen.Message) error { h.add(m); return nil },
		func() bool { return len(h.all()) >= 50 })
	if err != nil {
		t.Fatal(err)
	}
	recs := h.all()
	if got, want := h.datas(), seq("m", 0, 50); !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
	for _, r := range recs {
		if r.lease != recs[0].lease || r.attempt != 1 {
			t.Fatalf("offset %d handled under lease %s on attempt %d; want every message under %s, attempt 1",
				r.off, r.lease, r.attempt, recs[0].lease)
		}
	}
	cl := claims.all()
	if len(cl) != 5 {
		t.Fatalf("claims %+v, want 5 of 10", cl)
	}
	for i, c := range cl {
		if c.first != int64(10*i) || c.last != int64(10*i+9) || c.lease != recs[0].lease {
			t.Fatalf("claim %d is %+v; want offsets %d..%d under %s", i, c, 10*i, 10*i+9, recs[0].lease)
		}
	}
	st, err := q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if g := st.Partitions[0].Groups[0]; g.Committed != 49 || g.Leased {
		t.Fatalf("after the drain: %+v, want committed 49 and no lease", g)
	}
}

// A failure in a batch whose successor is claimed already: the failed
// message's settle ends the lease over both, so the successor is not
// handled under it; what follows the failure comes as each policy says:
// under pause the failed message again (after its backoff) and then the
// rest in order, under skip the rest and the failed message's copy last,
// with a dead letter the rest.
func TestConsumeFailureDropsBatchClaimedAhead(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts queen.QueueOptions
		want []string
	}{
		{"pause", queen.QueueOptions{RetryLimit: 3, RetryBackoff: queen.RetryBackoff{Min: 200 * time.Millisecond, Max: 200 * time.Millisecond}},
			seq("m", 0, 6, seq("m", 5, 30)...)},
		{"skip", queen.QueueOptions{RetryLimit: 3, FailurePolicy: queen.FailureSkip}, seq("m", 0, 30, "m5")},
		{"deadletter", queen.QueueOptions{RetryLimit: 1, DeadLetter: true}, seq("m", 0, 30)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, claims := openClaimLog(t)
			q := configure(t, c, "q", tc.opts)
			pushN(t, q, "p", "m", 30)
			var h handledLog
			var failedAt time.Time
			var retriedAt time.Time
			var ahead claimRec
			err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}},
				func(_ context.Context, m *queen.Message) error {
					h.add(m)
					if string(m.Data) != "m5" {
						return nil
					}
					if m.Attempt > 1 || m.Offset != 5 {
						retriedAt = time.Now()
						return nil
					}
					var ok bool
					if ahead, ok = claims.waitFor(10); !ok {
						t.Error("the batch after the first was not claimed ahead")
					}
					failedAt = time.Now()
					return errors.New("fail once")
				},
				func() bool { return len(h.all()) >= len(tc.want) })
			if err != nil {
				t.Fatal(err)
			}
			if got := h.datas(); !slices.Equal(got, tc.want) {
				t.Fatalf("handled %v, want %v", got, tc.want)
			}
			first := h.all()[0].lease
			if ahead.lease != first {
				t.Fatalf("claim ahead %+v not under the first batch's lease %s", ahead, first)
			}
			for _, r := range h.all() {
				if r.lease == first && r.off >= 10 {
					t.Fatalf("offset %d handled under the lease its predecessor's failure ended", r.off)
				}
			}
			if tc.name == "pause" && retriedAt.Sub(failedAt) < 150*time.Millisecond {
				t.Fatalf("m5 retried %v after its failure; want its backoff (200ms) first", retriedAt.Sub(failedAt))
			}
			if tc.name == "deadletter" {
				if dl := deadLetters(t, q); len(dl) != 1 || string(dl[0].Data) != "m5" {
					t.Fatalf("dead letters %+v, want m5", dl)
				}
			}
		})
	}
}

// The lease ending while a batch runs with its successor claimed ahead (a
// forced ResetGroup, ReleaseLease, or its expiry): the successor is not
// handled under the ended lease, and the partition is consumed on from
// where the cursor is under a new one.
func TestConsumeLostLeaseDropsBatchClaimedAhead(t *testing.T) {
	for _, how := range []string{"reset", "release", "expired"} {
		t.Run(how, func(t *testing.T) {
			var schema string
			c, claims := openClaimLog(t, func(cfg *queen.Config) { schema = cfg.Schema })
			q := configure(t, c, "q", queen.QueueOptions{LeaseTime: time.Hour})
			pushN(t, q, "p", "m", 30)
			var h handledLog
			var once sync.Once
			err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}},
				func(ctx context.Context, m *queen.Message) error {
					h.add(m)
					if m.Offset != 5 {
						return nil
					}
					once.Do(func() {
						if _, ok := claims.waitFor(10); !ok {
							t.Error("the batch after the first was not claimed ahead")
						}
						var err error
						switch how {
						case "reset":
							_, err = q.ResetGroup(ctx, "", queen.ResetToOffsets(map[string]int64{"p": 5}), queen.ResetOptions{Force: true})
						case "release":
							_, err = q.ReleaseLease(ctx, "", "p")
						case "expired":
							_, err = c.Pool().Exec(ctx, fmt.Sprintf(`UPDATE %q.consumers SET lease_expires_at = now()`, schema))
						}
						if err != nil {
							t.Error(err)
						}
					})
					return nil
				},
				func() bool {
					r := h.all()
					return len(r) > 0 && r[len(r)-1].off == 29
				})
			if err != nil {
				t.Fatal(err)
			}
			recs := h.all()
			first := recs[0].lease
			var after []int64
			for _, r := range recs {
				if r.lease == first {
					if r.off >= 10 {
						t.Fatalf("offset %d handled under the ended lease", r.off)
					}
					continue
				}
				after = append(after, r.off)
			}
			// The ended lease's holder runs on through its batch (its acks
			// refused); the next lease starts where the cursor was left.
			if len(after) == 0 || after[0] > 6 || !slices.IsSorted(after) || after[len(after)-1] != 29 {
				t.Fatalf("handled under later leases %v; want from the cursor (5 or 6) to 29 in order", after)
			}
		})
	}
}

// Consume stopping with the next batch claimed ahead: the batch it finished
// is acked, the one claimed ahead handed back at once, uncharged (another
// client takes it on attempt 1 under a lease of an hour).
func TestConsumeStopHandsBackBatchClaimedAhead(t *testing.T) {
	schema := pgtest.Schema(t)
	l := newClaimLog(pgtest.Logger(t).Handler())
	a := open(t, func(cfg *queen.Config) { cfg.Schema, cfg.Logger = schema, slog.New(l) })
	b := open(t, func(cfg *queen.Config) { cfg.Schema = schema })
	q := configure(t, a, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, q, "p", "m", 30)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var h handledLog
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}},
		func(_ context.Context, m *queen.Message) error {
			h.add(m)
			if m.Offset == 9 {
				if _, ok := l.waitFor(10); !ok {
					t.Error("the batch after the first was not claimed ahead")
				}
				cancel()
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.datas(); !slices.Equal(got, seq("m", 0, 10)) {
		t.Fatalf("handled %v, want m0..m9", got)
	}
	got := pop(t, b.Queue("q"), queen.PopOptions{Batch: 10})
	if fmt.Sprint(datas(got)) != fmt.Sprint(seq("m", 10, 20)) || slices.ContainsFunc(got, func(m *queen.Message) bool { return m.Attempt != 1 }) {
		t.Fatalf("second client popped %q on attempts %v, want m10..m19 on attempt 1", datas(got), attempts(got))
	}
}

// A batch whose handlers run past the lease (renewed meanwhile): the batch
// claimed ahead under that lease is covered by the renewals, so it is
// handled once, on attempt 1, under the same lease, and nobody else could
// take the partition meanwhile.
func TestConsumeRenewalCoversBatchClaimedAhead(t *testing.T) {
	a, b, _ := openPair(t)
	q := configure(t, a, "q", queen.QueueOptions{LeaseTime: 600 * time.Millisecond})
	// Two batches: the second's settle has nothing to claim after it, so
	// only the renewals of the first cover it.
	pushN(t, q, "p", "m", 6)
	var h handledLog
	var stolen []string
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 3}},
		func(ctx context.Context, m *queen.Message) error {
			h.add(m)
			if m.Offset == 1 {
				for range 3 {
					time.Sleep(400 * time.Millisecond)
					if got, err := b.Queue("q").Pop(ctx, queen.PopOptions{Batch: 6}); err != nil || len(got) != 0 {
						stolen = append(stolen, fmt.Sprint(datas(got), err))
					}
				}
			}
			return nil
		},
		func() bool { return len(h.all()) >= 6 })
	if err != nil {
		t.Fatal(err)
	}
	if len(stolen) > 0 {
		t.Fatalf("another client popped %v while the lease was renewed", stolen)
	}
	recs := h.all()
	if got := h.datas(); !slices.Equal(got, seq("m", 0, 6)) {
		t.Fatalf("handled %v, want m0..m5 once each", got)
	}
	for _, r := range recs {
		if r.lease != recs[0].lease || r.attempt != 1 {
			t.Fatalf("offset %d handled under lease %s on attempt %d; want %s, attempt 1", r.off, r.lease, r.attempt, recs[0].lease)
		}
	}
}

// KeyConcurrency above 1 claims nothing ahead: each batch has its own
// lease, as before.
func TestConsumeKeyedClaimsNothingAhead(t *testing.T) {
	c, claims := openClaimLog(t)
	q := c.Queue("q")
	pushN(t, q, "p", "m", 30)
	var h handledLog
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
		func(_ context.Context, m *queen.Message) error { h.add(m); return nil },
		func() bool { return len(h.all()) >= 30 })
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range claims.all() {
		if seen[c.lease] {
			t.Fatalf("claims %+v: two under one lease", claims.all())
		}
		seen[c.lease] = true
	}
}

// A message claimed ahead that does not decode: the lease is cut back
// before it, the messages claimed ahead before it are handled, and the
// next claim finds it at its head and dead-letters it; the rest follows in
// order.
func TestConsumeUndecodableClaimedAhead(t *testing.T) {
	c, claims := openClaimLog(t, withKey(testKey(1)))
	q := configure(t, c, "q", queen.QueueOptions{Encryption: true, LeaseTime: time.Hour})
	for i := range 10 {
		push(t, q, queen.Item{Partition: "p", Data: []byte(fmt.Sprintf("m%d", i))})
	}
	pid, blob := segmentBlob(t, c, queen.DefaultTenant, "q", "p", 7)
	f := onlyFrame(t, blob)
	f.Payload[len(f.Payload)-1] ^= 1
	setSegmentBlob(t, c, pid, 7, segment.Compress(nil, frame.Append(nil, &f)))
	var h handledLog
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 5}},
		func(_ context.Context, m *queen.Message) error { h.add(m); return nil },
		func() bool { return len(h.all()) >= 9 })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.datas(), []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m8", "m9"}; !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
	cl := claims.all()
	if len(cl) < 2 || cl[1].first != 5 || cl[1].lease != cl[0].lease {
		t.Fatalf("claims %+v: want the second (5..) claimed ahead under the first's lease", cl)
	}
	if dl := deadLetters(t, q); len(dl) != 1 || dl[0].Offset != 7 {
		t.Fatalf("dead letters %+v, want offset 7", dl)
	}
}

// A message that cannot be opened in a batch claimed by the fused ack and
// claim (the third batch on), found while that statement already claimed
// the batch after it: the messages before it are handled, the lease is cut
// before it, what was claimed past it is let go, and the next claim
// dead-letters it; the rest follows in order, none handled twice.
func TestConsumeUndecodableClaimedByFusedAck(t *testing.T) {
	for _, bad := range []int64{10, 12, 14} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			c, claims := openClaimLog(t, withKey(testKey(1)))
			q := configure(t, c, "q", queen.QueueOptions{Encryption: true, LeaseTime: time.Hour})
			for i := range 25 {
				push(t, q, queen.Item{Partition: "p", Data: []byte(fmt.Sprintf("m%d", i))})
			}
			pid, blob := segmentBlob(t, c, queen.DefaultTenant, "q", "p", bad)
			f := onlyFrame(t, blob)
			f.Payload[len(f.Payload)-1] ^= 1
			setSegmentBlob(t, c, pid, bad, segment.Compress(nil, frame.Append(nil, &f)))
			var h handledLog
			err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 5}},
				func(_ context.Context, m *queen.Message) error { h.add(m); return nil },
				func() bool { return len(h.all()) >= 24 })
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for i := range int64(25) {
				if i != bad {
					want = append(want, fmt.Sprintf("m%d", i))
				}
			}
			if got := h.datas(); !slices.Equal(got, want) {
				t.Fatalf("handled %v, want %v", got, want)
			}
			// With nothing before it (10), the third batch is not
			// delivered: the next claim starts past the dead letter.
			cl := claims.all()
			if len(cl) < 3 || (bad > 10 && (cl[2].first != 10 || cl[2].lease != cl[0].lease)) ||
				(bad == 10 && (cl[2].first != 11 || cl[2].lease == cl[0].lease)) {
				t.Fatalf("claims %+v: want the third (10..) claimed under the first's lease", cl)
			}
			if dl := deadLetters(t, q); len(dl) != 1 || dl[0].Offset != bad {
				t.Fatalf("dead letters %+v, want offset %d", dl, bad)
			}
		})
	}
}

// While another partition of the queue is ready a partition is not kept:
// two deep partitions and one worker claim nothing ahead (each batch has a
// lease of its own), so they take turns as without claims ahead instead of
// the first being drained whole while the second waits.
func TestConsumeClaimAheadRotatesPartitions(t *testing.T) {
	c, claims := openClaimLog(t)
	q := c.Queue("q")
	pushN(t, q, "a", "a", 60)
	pushN(t, q, "b", "b", 60)
	var h handledLog
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}},
		func(_ context.Context, m *queen.Message) error { h.add(m); return nil },
		func() bool { return len(h.all()) >= 120 })
	if err != nil {
		t.Fatal(err)
	}
	next := map[byte]int{}
	for _, r := range h.all() {
		p := r.data[0]
		if want := fmt.Sprintf("%c%d", p, next[p]); r.data != want {
			t.Fatalf("handled %s, want %s next on its partition", r.data, want)
		}
		next[p]++
	}
	seen := map[string]bool{}
	for _, c := range claims.all() {
		if seen[c.lease] {
			t.Fatalf("claims %+v: a batch claimed ahead under another's lease while the other partition was ready", claims.all())
		}
		seen[c.lease] = true
	}
}

// With Batch 1 (the default) every batch is full, and claiming ahead would
// cost an idle consumer a pop_ahead that finds nothing before each ack:
// such a Consume claims each message on its own, after the ack of the one
// before, all under one lease that lingers over the drained partition
// (pop_linger).
func TestConsumeBatchOneClaimsNothingAhead(t *testing.T) {
	c, claims := openClaimLog(t)
	q := c.Queue("q")
	pushN(t, q, "p", "m", 5)
	var h handledLog
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 1}},
		func(_ context.Context, m *queen.Message) error { h.add(m); return nil },
		func() bool { return len(h.all()) >= 5 })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.datas(), seq("m", 0, 5); !slices.Equal(got, want) {
		t.Fatalf("handled %v, want %v", got, want)
	}
	leases := map[string]bool{}
	for _, r := range h.all() {
		leases[r.lease] = true
	}
	cs := claims.all()
	if len(leases) != 1 || len(cs) != 5 {
		t.Fatalf("%d leases and claims %+v for 5 messages; want a claim each, under one lease", len(leases), cs)
	}
	for _, c := range cs {
		if c.first != c.last {
			t.Fatalf("claims %+v: want one message each", cs)
		}
	}
}
