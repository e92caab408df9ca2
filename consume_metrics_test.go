package queen_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
)

// metered opens a client whose metrics a ManualReader collects.
func metered(t *testing.T, mod ...func(*queen.Config)) (*queen.Client, *sdkmetric.ManualReader) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c := open(t, append(mod, func(c *queen.Config) { c.MeterProvider = mp })...)
	return c, reader
}

// collected is one collection: the data points of every instrument.
type collected map[string]metricdata.Aggregation

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := collected{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m.Data
		}
	}
	return got
}

// matches reports whether set has every key=value of want ("key=" for an
// empty value, "!key" for an absent key).
func matches(set attribute.Set, want []string) bool {
	for _, w := range want {
		if len(w) > 0 && w[0] == '!' {
			if _, ok := set.Value(attribute.Key(w[1:])); ok {
				return false
			}
			continue
		}
		var k, v string
		for i := range len(w) {
			if w[i] == '=' {
				k, v = w[:i], w[i+1:]
				break
			}
		}
		got, ok := set.Value(attribute.Key(k))
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

// sum is the total of the counter name over the points matching want.
func (c collected) sum(t *testing.T, name string, want ...string) int64 {
	t.Helper()
	agg, ok := c[name]
	if !ok {
		return 0
	}
	s, ok := agg.(metricdata.Sum[int64])
	if !ok || !s.IsMonotonic {
		t.Fatalf("%s is %T, want a monotonic int64 sum", name, agg)
	}
	var n int64
	for _, dp := range s.DataPoints {
		if matches(dp.Attributes, want) {
			n += dp.Value
		}
	}
	return n
}

// count is how many values the histogram name recorded over the points
// matching want.
func (c collected) count(t *testing.T, name string, want ...string) uint64 {
	t.Helper()
	agg, ok := c[name]
	if !ok {
		return 0
	}
	h, ok := agg.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is %T, want a float64 histogram", name, agg)
	}
	var n uint64
	for _, dp := range h.DataPoints {
		if matches(dp.Attributes, want) {
			n += dp.Count
		}
	}
	return n
}

const (
	mConsumed = "messaging.client.consumed.messages"
	mProcess  = "messaging.process.duration"
	mSettled  = "queen.client.settled.messages"
	mLost     = "queen.client.lease.lost"
	mDead     = "queen.client.dead_lettered.messages"
)

var destQ = []string{"messaging.system=queen", "messaging.destination.name=q", "messaging.consumer.group.name="}

func with(base []string, more ...string) []string {
	return append(append([]string(nil), base...), more...)
}

// Consume: every handled message is consumed and timed; acks, fails and
// the failure that spends the retry budget (a dead letter) are counted,
// the failures with their error.type.
func TestConsumeMetricsAckFailDeadLetter(t *testing.T) {
	c, reader := metered(t)
	q := configure(t, c, "q", queen.QueueOptions{RetryLimit: 2, DeadLetter: true})
	pushN(t, q, "", "m", 3)
	var mu sync.Mutex
	handled := map[string]int{}
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}},
		func(_ context.Context, m *queen.Message) error {
			mu.Lock()
			defer mu.Unlock()
			handled[string(m.Data)]++
			if string(m.Data) == "m1" {
				return errors.New("poison")
			}
			return nil
		}, func() bool { mu.Lock(); defer mu.Unlock(); return handled["m2"] > 0 })
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(handled) != "map[m0:1 m1:2 m2:1]" {
		t.Fatalf("handled %v", handled)
	}
	got := collect(t, reader)
	if n := got.sum(t, mConsumed, with(destQ, "messaging.operation.name=process")...); n != 4 {
		t.Fatalf("%s = %d, want 4", mConsumed, n)
	}
	if n := got.count(t, mProcess, with(destQ, "messaging.operation.name=process", "!error.type")...); n != 2 {
		t.Fatalf("%s without error.type: %d values, want 2", mProcess, n)
	}
	if n := got.count(t, mProcess, with(destQ, "error.type=*errors.errorString")...); n != 2 {
		t.Fatalf("%s with error.type *errors.errorString: %d values, want 2", mProcess, n)
	}
	settle := with(destQ, "messaging.operation.type=settle")
	for outcome, want := range map[string]int64{"ack": 2, "fail": 2, "retry": 0, "dead_letter": 0, "released": 0} {
		if n := got.sum(t, mSettled, with(settle, "messaging.operation.name="+outcome)...); n != want {
			t.Errorf("%s{%s} = %d, want %d", mSettled, outcome, n, want)
		}
	}
	if n := got.sum(t, mDead, with(destQ, "queen.dead_letter.cause=retry_limit")...); n != 1 {
		t.Fatalf("%s{retry_limit} = %d, want 1", mDead, n)
	}
	if n := got.sum(t, mLost); n != 0 {
		t.Fatalf("%s = %d, want 0", mLost, n)
	}
}

// Pop counts what it returns as consumed (receive); manual Retry,
// DeadLetter and Ack count their outcomes, the dead letter also by cause.
func TestPopMetricsRetryDeadLetterAck(t *testing.T) {
	c, reader := metered(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "a", Data: []byte("a")}, queen.Item{Partition: "b", Data: []byte("b")})
	g := queen.PopOptions{Group: "g", Partition: "a"}
	m := pop(t, q, g)[0]
	if err := m.Retry(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	m = pop(t, q, g)[0]
	if err := m.DeadLetter(ctxT(t), errors.New("bad")); err != nil {
		t.Fatal(err)
	}
	m = pop(t, q, queen.PopOptions{Group: "g", Partition: "b"})[0]
	ack(t, m)
	if err := m.Ack(ctxT(t)); !errors.Is(err, queen.ErrAlreadyAcked) {
		t.Fatalf("second Ack: %v", err)
	}

	got := collect(t, reader)
	dest := []string{"messaging.system=queen", "messaging.destination.name=q", "messaging.consumer.group.name=g"}
	if n := got.sum(t, mConsumed, with(dest, "messaging.operation.name=receive")...); n != 3 {
		t.Fatalf("%s{receive} = %d, want 3", mConsumed, n)
	}
	if n := got.count(t, mProcess); n != 0 {
		t.Fatalf("%s recorded %d values for Pop, want none", mProcess, n)
	}
	for outcome, want := range map[string]int64{"ack": 1, "fail": 0, "retry": 1, "dead_letter": 1, "released": 0} {
		if n := got.sum(t, mSettled, with(dest, "messaging.operation.name="+outcome)...); n != want {
			t.Errorf("%s{%s} = %d, want %d (the refused second Ack not counted)", mSettled, outcome, n, want)
		}
	}
	if n := got.sum(t, mDead, with(dest, "queen.dead_letter.cause=requested")...); n != 1 {
		t.Fatalf("%s{requested} = %d, want 1", mDead, n)
	}
}

// A Consume stopping in a batch hands back the cancelled message and the
// unstarted rest: released, with the handler's error.type.
func TestConsumeMetricsReleased(t *testing.T) {
	c, reader := metered(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, q, "p", "m", 3)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	err := q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 3}}, func(hctx context.Context, m *queen.Message) error {
		cancel()
		<-hctx.Done()
		return hctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	if n := got.sum(t, mSettled, with(destQ, "messaging.operation.name=released")...); n != 3 {
		t.Fatalf("%s{released} = %d, want 3", mSettled, n)
	}
	if n := got.sum(t, mSettled, "messaging.operation.name=fail"); n != 0 {
		t.Fatalf("%s{fail} = %d, want 0: a stop is not a failure", mSettled, n)
	}
	if n := got.count(t, mProcess, "error.type=context.Canceled"); n != 1 {
		t.Fatalf("%s{error.type=context.Canceled} = %d, want 1", mProcess, n)
	}
	if m := pop(t, q, queen.PopOptions{Batch: 3}); len(m) != 3 || m[0].Attempt != 1 {
		t.Fatalf("after the release: %d messages, want 3 at Attempt 1", len(m))
	}
}

// A lease taken over while its batch runs is counted once, and the refused
// ack is not counted.
func TestConsumeMetricsLeaseLost(t *testing.T) {
	skipOnLayout(t, "its SQL steals the lease with gen_random_uuid() in an UPDATE, which Citus rejects")
	var schema string
	c, reader := metered(t, func(cfg *queen.Config) { schema = cfg.Schema })
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: 300 * time.Millisecond})
	pushN(t, q, "p", "m", 3)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	done := make(chan error, 1)
	var handled atomic.Int32
	go func() {
		done <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 3}}, func(hctx context.Context, m *queen.Message) error {
			if handled.Add(1) == 1 {
				// Someone else now holds the partition.
				if _, err := c.Pool().Exec(hctx, fmt.Sprintf(`UPDATE %q.consumers SET lease_id = gen_random_uuid(),
					lease_expires_at = now() + interval '1 hour'`, schema)); err != nil {
					t.Error(err)
				}
			}
			return nil
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for collect(t, reader).sum(t, mLost, destQ...) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no lease loss counted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	if n := got.sum(t, mLost, destQ...); n != 1 {
		t.Fatalf("%s = %d, want 1 (once per batch)", mLost, n)
	}
	if n := got.sum(t, mSettled, "messaging.operation.name=ack"); n != 0 {
		t.Fatalf("%s{ack} = %d, want 0: the settlement was refused", mSettled, n)
	}
}

// Per-key Consume counts each message's outcome as it is written.
func TestConsumeMetricsKeyed(t *testing.T) {
	c, reader := metered(t)
	q := c.Queue("q")
	var items []queen.Item
	for i := range 6 {
		items = append(items, queen.Item{Partition: "p", Key: fmt.Sprint("k", i%3), Data: fmt.Appendf(nil, "m%d", i)})
	}
	push(t, q, items...)
	var handled atomic.Int32
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 3},
		func(context.Context, *queen.Message) error { handled.Add(1); return nil },
		func() bool { return handled.Load() == 6 })
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	if n := got.sum(t, mSettled, with(destQ, "messaging.operation.name=ack")...); n != 6 {
		t.Fatalf("%s{ack} = %d, want 6", mSettled, n)
	}
	if n := got.sum(t, mConsumed, destQ...); n != 6 {
		t.Fatalf("%s = %d, want 6", mConsumed, n)
	}
}

// Client.Tx counts the settlements it carried once it commits, and none
// when it rolls back.
func TestTxMetricsCountOnCommit(t *testing.T) {
	c, reader := metered(t)
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "a"}, queen.Item{Partition: "b"})
	ma := pop(t, q, queen.PopOptions{Partition: "a"})[0]
	mb := pop(t, q, queen.PopOptions{Partition: "b"})[0]
	boom := errors.New("boom")
	if err := c.Tx(ctxT(t), func(tx *queen.Tx) error { tx.Ack(ma); return boom }); !errors.Is(err, boom) {
		t.Fatalf("Tx: %v", err)
	}
	if n := collect(t, reader).sum(t, mSettled); n != 0 {
		t.Fatalf("%s = %d after a rollback, want 0", mSettled, n)
	}
	if err := c.Tx(ctxT(t), func(tx *queen.Tx) error { tx.Ack(ma); tx.Fail(mb, boom); return nil }); err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	if a, f := got.sum(t, mSettled, with(destQ, "messaging.operation.name=ack")...), got.sum(t, mSettled, with(destQ, "messaging.operation.name=fail")...); a != 1 || f != 1 {
		t.Fatalf("%s: ack %d, fail %d; want 1 and 1", mSettled, a, f)
	}
}

// An Ack or ExtendLease refused because another consumer took the lease
// over counts a lease loss each.
func TestPopMetricsLeaseLost(t *testing.T) {
	c, reader := metered(t)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: 50 * time.Millisecond})
	push(t, q, queen.Item{Data: []byte("a")})
	m := pop(t, q, queen.PopOptions{})[0]
	deadline := time.Now().Add(10 * time.Second)
	for len(pop(t, q, queen.PopOptions{LeaseTime: time.Hour})) == 0 { // taken over once m's lease expires
		if time.Now().After(deadline) {
			t.Fatal("the expired lease was not taken over")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := m.Ack(ctxT(t)); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("Ack: %v, want ErrLeaseLost", err)
	}
	if err := m.ExtendLease(ctxT(t), time.Minute); !errors.Is(err, queen.ErrLeaseLost) {
		t.Fatalf("ExtendLease: %v, want ErrLeaseLost", err)
	}
	got := collect(t, reader)
	if n := got.sum(t, mLost, destQ...); n != 2 {
		t.Fatalf("%s = %d, want 2", mLost, n)
	}
	if n := got.sum(t, mSettled); n != 0 {
		t.Fatalf("%s = %d, want 0: the Ack was refused", mSettled, n)
	}
}

// A message a claim cannot decrypt (its ciphertext altered) is
// dead-lettered as undecodable and not counted as consumed.
func TestPopMetricsUndecodable(t *testing.T) {
	c1, reader := metered(t, withKey(testKey(1)))
	q := configure(t, c1, "q", queen.QueueOptions{Encryption: true})
	push(t, q, queen.Item{Data: []byte("x")})
	push(t, q, queen.Item{Data: []byte("ok")})
	pid, blob := segmentBlob(t, c1, queen.DefaultTenant, "q", queen.DefaultPartition, 0)
	f := onlyFrame(t, blob)
	f.Payload[len(f.Payload)-1] ^= 1
	setSegmentBlob(t, c1, pid, 0, segment.Compress(nil, frame.Append(nil, &f)))
	wantData(t, pop(t, q, queen.PopOptions{Batch: 10, AutoAck: true}), "ok")
	got := collect(t, reader)
	if n := got.sum(t, mDead, with(destQ, "queen.dead_letter.cause=undecodable")...); n != 1 {
		t.Fatalf("%s{undecodable} = %d, want 1", mDead, n)
	}
	if n := got.sum(t, mConsumed, destQ...); n != 1 {
		t.Fatalf("%s = %d, want 1", mConsumed, n)
	}
}

// AckBatch counts what it applied: the acks and the failure, not the
// requests it skipped after the failure.
func TestAckBatchMetrics(t *testing.T) {
	c, reader := metered(t)
	q := c.Queue("q")
	pushN(t, q, "p", "m", 3)
	ms := pop(t, q, queen.PopOptions{Batch: 3})
	errs, err := q.AckBatch(ctxT(t), []queen.AckRequest{{Message: ms[0]}, {Message: ms[1], Status: queen.AckFail}, {Message: ms[2]}})
	if err != nil || errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], queen.ErrAckSkipped) {
		t.Fatalf("AckBatch: %v, %v", errs, err)
	}
	got := collect(t, reader)
	if a, f := got.sum(t, mSettled, with(destQ, "messaging.operation.name=ack")...), got.sum(t, mSettled, with(destQ, "messaging.operation.name=fail")...); a != 1 || f != 1 {
		t.Fatalf("%s: ack %d, fail %d; want 1 and 1", mSettled, a, f)
	}
}

// A handler that acks its message itself and returns nil: each message
// counts as acked once, by whichever settlement applied it.
func TestConsumeMetricsHandlerAckCountedOnce(t *testing.T) {
	c, reader := metered(t)
	q := c.Queue("q")
	pushN(t, q, "", "m", 3)
	var handled atomic.Int32
	err := consumeUntil(t, q, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}},
		func(ctx context.Context, m *queen.Message) error {
			defer handled.Add(1)
			if string(m.Data) == "m1" {
				return m.Ack(ctx)
			}
			return nil
		}, func() bool { return handled.Load() == 3 })
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, reader)
	if n := got.sum(t, mSettled, with(with(destQ, "messaging.operation.type=settle"), "messaging.operation.name=ack")...); n != 3 {
		t.Fatalf("%s{ack} = %d for 3 messages, want 3", mSettled, n)
	}
}
