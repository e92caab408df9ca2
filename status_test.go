package queen_test

import (
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
