package queen

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
)

// BenchmarkConsumeCall is the per-message instrumentation of Consume: one
// handler call (consumed count, process duration) and its share of a
// settlement count, without tracing. With the no-op provider it must not
// allocate.
func BenchmarkConsumeCall(b *testing.B) {
	for _, p := range []struct {
		name string
		mp   metric.MeterProvider
	}{{"noop", noop.NewMeterProvider()}, {"sdk", sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))}} {
		b.Run(p.name, func(b *testing.B) {
			m, err := newMeters(p.mp)
			if err != nil {
				b.Fatal(err)
			}
			e := &engine{meter: m}
			q := &Queue{c: &Client{e: e}, name: "q"}
			c := newConsumer(context.Background(), q, PopOptions{Group: "g"}, ConsumeOptions{},
				func(context.Context, *Message) error { return nil })
			defer c.done()
			msg := &Message{Queue: "q", Partition: "p", Group: "g"}
			op := settleOp{m: msg, ok: 1, act: actNone}
			var exp atomic.Int64
			exp.Store(math.MaxInt64) // a lease that does not end
			b.ReportAllocs()
			for b.Loop() {
				if err := c.call(c.work, msg, &exp, nil); err != nil {
					b.Fatal(err)
				}
				c.dm.settledOp(context.Background(), &op, 1, 0, stApplied)
			}
		})
	}
}

// The messaging.* instruments are named and united as the semantic
// conventions of the otel module in go.mod define them.
func TestConsumeMetricNamesFollowSemconv(t *testing.T) {
	c, p := messagingconv.ClientConsumedMessages{}, messagingconv.ProcessDuration{}
	if c.Name() != metricConsumed || c.Unit() != "{message}" || p.Name() != metricProcess || p.Unit() != "s" {
		t.Fatalf("semconv: %s (%s), %s (%s); have %s, %s", c.Name(), c.Unit(), p.Name(), p.Unit(), metricConsumed, metricProcess)
	}
}

// A handler never starts once its batch's lease has ended, even when the
// caller's own check passed: a process paused between that check and the
// handler (found by the history checker: a child stopped for 1.2 s started
// a handler 218 ms after its lease ended, while the partition's next holder
// ran one) gets errLeaseEnded instead, and the handler does not run.
func TestCallChecksTheLeaseLast(t *testing.T) {
	m, err := newMeters(noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{meter: m}
	q := &Queue{c: &Client{e: e}, name: "q"}
	ran := 0
	c := newConsumer(context.Background(), q, PopOptions{Group: "g"}, ConsumeOptions{},
		func(context.Context, *Message) error { ran++; return nil })
	defer c.done()
	msg := &Message{Queue: "q", Partition: "p", Group: "g"}
	var exp atomic.Int64
	exp.Store(time.Now().Add(-time.Millisecond).UnixNano())
	if err := c.call(c.work, msg, &exp, nil); !errors.Is(err, errLeaseEnded) || ran != 0 {
		t.Fatalf("lease ended: call returned %v, handler ran %d times; want errLeaseEnded and none", err, ran)
	}
	exp.Store(time.Now().Add(time.Minute).UnixNano())
	if err := c.call(c.work, msg, &exp, nil); err != nil || ran != 1 {
		t.Fatalf("live lease: call returned %v, handler ran %d times", err, ran)
	}
	if err := c.call(c.work, msg, nil, nil); err != nil || ran != 2 { // AutoAck: no lease
		t.Fatalf("no lease: call returned %v, handler ran %d times", err, ran)
	}
}
