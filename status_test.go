package queen_test

import (
	"context"
	"testing"
	"time"

	"github.com/e03140bc/queen"
)

func TestStatus(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	st, err := q.Status(ctxT(t))
	if err != nil || len(st.Partitions) != 0 || st.Queue != "q" {
		t.Fatalf("status of a missing queue = %+v, %v", st, err)
	}
	pushN(t, q, "a", "m", 5)
	pushN(t, q, "b", "m", 2)
	time.Sleep(50 * time.Millisecond)
	msgs := pop(t, q, queen.PopOptions{Partition: "a", Batch: 2})
	ack(t, msgs[0])
	pop(t, q, queen.PopOptions{Group: "g", Partition: "b", AutoAck: true, Batch: 10})

	st, err = q.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Partitions) != 2 || st.Partitions[0].Name != "a" || st.Partitions[1].Name != "b" {
		t.Fatalf("partitions %+v", st.Partitions)
	}
	a, b := st.Partitions[0], st.Partitions[1]
	if a.LastOffset != 4 || b.LastOffset != 1 || a.LogStart != 0 {
		t.Fatalf("offsets a %+v b %+v", a, b)
	}
	// Partition a: queue mode leased through 1, committed 0; group g was
	// seeded on a too (all partitions at first contact) and consumed nothing.
	if len(a.Groups) != 2 || a.Groups[0].Group != "" || a.Groups[1].Group != "g" {
		t.Fatalf("groups of a: %+v", a.Groups)
	}
	qm := a.Groups[0]
	if qm.Committed != 0 || qm.Lag != 4 || qm.LagAge < 50*time.Millisecond || !qm.Leased || qm.LeaseEnd != 1 ||
		qm.LeaseOwner == "" || qm.LeaseExpiresAt.IsZero() {
		t.Fatalf("queue mode on a: %+v", qm)
	}
	if g := a.Groups[1]; g.Committed != -1 || g.Lag != 5 || g.Leased {
		t.Fatalf("group g on a: %+v", g)
	}
	// Partition b: g auto-acked everything; queue mode has it all to do.
	if len(b.Groups) != 2 {
		t.Fatalf("groups of b: %+v", b.Groups)
	}
	if g := b.Groups[1]; g.Committed != 1 || g.Lag != 0 || g.LagAge != 0 || g.Leased {
		t.Fatalf("group g on b: %+v", g)
	}
	if g := b.Groups[0]; g.Committed != -1 || g.Lag != 2 {
		t.Fatalf("queue mode on b: %+v", g)
	}
}

// Offsets that per-key Consume settled above a stalled key's head will be
// skipped, not read: they are not lag. Key a's head stalls while key b's
// three messages settle above the cursor; Status and Queues count only the
// two messages of key a as lag.
func TestStatusLagExcludesSettled(t *testing.T) {
	c := open(t)
	q := c.Queue("q")
	pushKeyed(t, q, "p", "a", "b", "b", "b", "a")
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	release := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- q.Consume(ctx, queen.ConsumeOptions{PopOptions: queen.PopOptions{Batch: 10}, KeyConcurrency: 2},
			func(hctx context.Context, m *queen.Message) error {
				if m.Key == "a" && m.Offset == 0 {
					select {
					case <-release:
					case <-hctx.Done():
						return hctx.Err()
					}
				}
				return nil
			})
	}()
	waitFor(t, 10*time.Second, "key b settled above the stalled head", func() bool {
		gs := status(t, q).Partitions[0].Groups
		return len(gs) == 1 && gs[0].Settled == 3
	})
	g := status(t, q).Partitions[0].Groups[0]
	if g.Committed != -1 || g.Settled != 3 || g.Lag != 2 || g.LagAge <= 0 {
		t.Fatalf("while key a stalls: %+v; want Committed -1, Settled 3, Lag 2 (offsets 0 and 4)", g)
	}
	qs, err := c.Queues(ctxT(t))
	if err != nil || len(qs) != 1 || len(qs[0].Groups) != 1 {
		t.Fatalf("Queues = %+v, %v", qs, err)
	}
	if qi := qs[0]; qi.Depth != 2 || qi.Groups[0].Lag != 2 {
		t.Fatalf("Queues while key a stalls: depth %d, group lag %d; want 2 and 2", qi.Depth, qi.Groups[0].Lag)
	}
	close(release)
	waitFor(t, 10*time.Second, "everything settled", func() bool {
		g := status(t, q).Partitions[0].Groups[0]
		return g.Committed == 4 && g.Settled == 0 && g.Lag == 0
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
