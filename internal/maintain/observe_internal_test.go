package maintain

import (
	"context"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/e03140bc/queen/internal/stmt"
)

// The gauges report a snapshot this process read lately, and nothing once
// it is older than lagStale: a process whose passes another process's win
// must not repeat old numbers beside the fresh ones.
func TestLagGaugesGoSilentWhenStale(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	m := &Maintainer{cfg: Config{Interval: time.Second}}
	if err := m.registerLagMetrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))); err != nil {
		t.Fatal(err)
	}
	points := func() int {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, sm := range rm.ScopeMetrics {
			for _, mt := range sm.Metrics {
				switch d := mt.Data.(type) {
				case metricdata.Gauge[int64]:
					n += len(d.DataPoints)
				case metricdata.Gauge[float64]:
					n += len(d.DataPoints)
				}
			}
		}
		return n
	}
	m.lag = []stmt.LagRow{{Queue: "q", Group: "g", Messages: 5, Seconds: 2}}
	m.dead = []stmt.DeadLetterCountRow{{Queue: "q", DeadLetters: 3}}
	m.lagTaken = time.Now()
	if n := points(); n != 3 {
		t.Fatalf("fresh snapshot: %d points, want 3 (lag, lag age, dead letters)", n)
	}
	m.lagTaken = time.Now().Add(-m.lagStale() - time.Second)
	if n := points(); n != 0 {
		t.Fatalf("stale snapshot: %d points, want none", n)
	}
}
