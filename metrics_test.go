package queen_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/e03140bc/queen"
)

// The seed's metric names: counters gain _total in Prometheus, so
// queen_batch_items_fired is exported as queen_batch_items_fired_total.
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
	fired, ok := got["queen_batch_items_fired"].(metricdata.Sum[int64])
	if !ok || !fired.IsMonotonic || sumInt(fired) != 3 {
		t.Fatalf("queen_batch_items_fired = %#v, want a monotonic sum of 3", got["queen_batch_items_fired"])
	}
	commits, _ := got["queen_fusion_commits"].(metricdata.Sum[int64])
	segments, _ := got["queen_fusion_segments"].(metricdata.Sum[int64])
	if sumInt(commits) < 1 || sumInt(segments) != 2 {
		t.Fatalf("commits %d, segments %d; want >= 1 and 2", sumInt(commits), sumInt(segments))
	}
	h, ok := got["queen_fusion_items_per_batch"].(metricdata.Histogram[int64])
	if !ok || len(h.DataPoints) == 0 || h.DataPoints[0].Sum != 3 {
		t.Fatalf("queen_fusion_items_per_batch = %#v", got["queen_fusion_items_per_batch"])
	}
}

func sumInt(s metricdata.Sum[int64]) int64 {
	var n int64
	for _, dp := range s.DataPoints {
		n += dp.Value
	}
	return n
}
