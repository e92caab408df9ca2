package queen_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/e03140bc/queen"
)

// The seed's metric names: counters gain _total in Prometheus, so
// queen.push.items is exported as queen.push.items_total.
func TestPushMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	c := open(t, func(c *queen.Config) { c.MeterProvider = mp })
	push(t, c.Queue("q"), queen.Item{}, queen.Item{}, queen.Item{Partition: "b"})

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = m.Data
		}
	}
	fired, ok := got["queen.push.items"].(metricdata.Sum[int64])
	if !ok || !fired.IsMonotonic || sumInt(fired) != 3 {
		t.Fatalf("queen.push.items = %#v, want a monotonic sum of 3", got["queen.push.items"])
	}
	commits, _ := got["queen.push.bundles"].(metricdata.Sum[int64])
	segments, _ := got["queen.push.segments"].(metricdata.Sum[int64])
	if sumInt(commits) < 1 || sumInt(segments) != 2 {
		t.Fatalf("commits %d, segments %d; want >= 1 and 2", sumInt(commits), sumInt(segments))
	}
	h, ok := got["queen.push.bundle.items"].(metricdata.Histogram[int64])
	if !ok || len(h.DataPoints) == 0 || h.DataPoints[0].Sum != 3 {
		t.Fatalf("queen.push.bundle.items = %#v", got["queen.push.bundle.items"])
	}
}

func sumInt(s metricdata.Sum[int64]) int64 {
	var n int64
	for _, dp := range s.DataPoints {
		n += dp.Value
	}
	return n
}
