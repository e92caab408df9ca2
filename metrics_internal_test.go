package queen

import (
	"context"
	"testing"

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
			b.ReportAllocs()
			for b.Loop() {
				if err := c.call(msg); err != nil {
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
