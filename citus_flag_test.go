package queen_test

import (
	"context"
	"testing"
	"time"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// A client opened without Config.Citus on a schema another client
// distributed (a tool, a dashboard, a service whose config missed the
// flag) runs the layout's statements all the same: Status, Queues, Push,
// Pop and Ack work, and the schema stays distributed.
func testDistributedOpenWithoutFlag(t *testing.T, url string) {
	_, _, schema := openCitus(t, url, true)
	ctx := ctxT(t)
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := queen.Open(octx, queen.Config{DatabaseURL: url, Schema: schema, Logger: pgtest.Logger(t), SpoolDir: t.TempDir()})
	if err != nil {
		t.Fatalf("Open without Config.Citus: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	q := c.Queue("noflag")
	var items []queen.Item
	for i := range 8 {
		items = append(items, queen.Item{Partition: "p" + string(rune('a'+i)), Data: []byte{byte(i)}})
	}
	for _, r := range push(t, q, items...) {
		if r.Status != queen.Queued {
			t.Fatalf("push: %+v", r)
		}
	}
	// A pop of several partitions takes one worker's there: pop to the
	// first empty pop.
	got := map[string]bool{}
	for range 20 {
		msgs := pop(t, q, queen.PopOptions{Group: "g", Batch: 8})
		if len(msgs) == 0 {
			break
		}
		for _, m := range msgs {
			if got[m.Partition] {
				t.Fatalf("%s delivered twice", m.Partition)
			}
			got[m.Partition] = true
			if err := m.Ack(ctx); err != nil {
				t.Fatalf("ack %s/%d: %v", m.Partition, m.Offset, err)
			}
		}
	}
	if len(got) != len(items) {
		t.Errorf("popped %d partitions, want %d", len(got), len(items))
	}
	st, err := q.Status(ctx)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if len(st.Partitions) != len(items) {
		t.Errorf("Status: %d partitions, want %d", len(st.Partitions), len(items))
	}
	if _, err := c.Queues(ctx); err != nil {
		t.Fatalf("Queues: %v", err)
	}
}
