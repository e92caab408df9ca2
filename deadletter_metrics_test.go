package queen_test

import (
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/e03140bc/queen"
)

// The maintaining process reports queen.queue.dead_letters: how many dead letters
// each queue holds (0 for one without), with attributes tenant and queue,
// as Queues counts them.
func TestDeadLettersGauge(t *testing.T) {
	c, reader := metered(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{DeadLetter: true})
	configure(t, c, "empty", queen.QueueOptions{DeadLetter: true})
	killAll(t, q, "", "a", 3)
	killAll(t, q, "g", "b", 1)
	maintain(t, c)
	agg, ok := collect(t, reader)["queen.queue.dead_letters"]
	if !ok {
		t.Fatal("no queen.queue.dead_letters gauge")
	}
	g, ok := agg.(metricdata.Gauge[int64])
	if !ok {
		t.Fatalf("queen.queue.dead_letters is %T, want an int64 gauge", agg)
	}
	got := map[string]int64{}
	for _, dp := range g.DataPoints {
		if !matches(dp.Attributes, []string{"tenant=" + c.Tenant().String()}) {
			continue
		}
		queue, _ := dp.Attributes.Value("queue")
		got[queue.AsString()] = dp.Value
	}
	if len(got) != 2 || got["q"] != 4 || got["empty"] != 0 {
		t.Fatalf("queen.queue.dead_letters = %v, want q 4, empty 0", got)
	}
	if qs := mustQueues(t, c); qs[1].Name != "q" || qs[1].DeadLetters != 4 || qs[0].DeadLetters != 0 {
		t.Fatalf("Queues = %+v", qs)
	}
}
