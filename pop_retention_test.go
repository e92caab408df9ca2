package queen_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// Retention that commits while a pop is claiming must not leave that pop
// holding a lease on messages it did not return: the partition would stall
// until the lease expired. The test parks the pop inside its claim (a
// trigger on the lease write waits on an advisory lock the test holds),
// runs retention over every message of the partition, then lets the pop go
// on.
func TestPopRetentionDuringClaimLeavesNoEmptyLease(t *testing.T) {
	skipOnLayout(t, "its SQL ages segments with timestamptz arithmetic in an UPDATE, which Citus rejects")
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{Retention: time.Hour, LeaseTime: time.Hour})
	s := func(table string) string { return pgx.Identifier{c.Schema(), table}.Sanitize() }
	exec := func(sql string) {
		t.Helper()
		if _, err := c.Pool().Exec(ctxT(t), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	// The group's first contact (which locks the partitions it marks ready)
	// is over before the pop under test.
	if got := pop(t, q, queen.PopOptions{}); len(got) != 0 {
		t.Fatalf("popped %q from an empty queue", datas(got))
	}
	pushN(t, q, "p", "m", 1)
	pushN(t, q, "p", "n", 1)
	exec("UPDATE " + s("segments") + " SET created_at = created_at - interval '2 hours'") // due for retention

	exec("CREATE FUNCTION " + s("hold_claim") + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock_shared(7331, 1);
    PERFORM pg_advisory_unlock_shared(7331, 1);
    RETURN NEW;
END $$`)
	exec("CREATE TRIGGER hold_claim BEFORE UPDATE ON " + s("consumers") + `
FOR EACH ROW WHEN (NEW.lease_id IS NOT NULL AND NEW.lease_id IS DISTINCT FROM OLD.lease_id)
EXECUTE FUNCTION ` + s("hold_claim") + "()")

	holder, err := c.Pool().Acquire(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctxT(t), "SELECT pg_advisory_lock(7331, 1)"); err != nil {
		t.Fatal(err)
	}
	locked := true
	defer func() {
		if locked {
			_, _ = holder.Exec(ctxT(t), "SELECT pg_advisory_unlock(7331, 1)")
		}
	}()

	type result struct {
		msgs []*queen.Message
		err  error
	}
	done := make(chan result, 1)
	go func() {
		msgs, err := q.Pop(ctxT(t), queen.PopOptions{Batch: 10})
		done <- result{msgs, err}
	}()
	// Wait until the pop is parked in its claim.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := c.Pool().QueryRow(ctxT(t), `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND classid = 7331 AND objid = 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pop never reached its lease write")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rep := maintain(t, c); rep.SegmentsDeleted != 2 {
		t.Fatalf("retention deleted %d segments, want 2", rep.SegmentsDeleted)
	}
	if _, err := holder.Exec(ctxT(t), "SELECT pg_advisory_unlock(7331, 1)"); err != nil {
		t.Fatal(err)
	}
	locked = false
	r := <-done
	if r.err != nil {
		t.Fatalf("Pop: %v", r.err)
	}
	exec("DROP TRIGGER hold_claim ON " + s("consumers"))

	if len(r.msgs) == 0 {
		var leased int
		if err := c.Pool().QueryRow(ctxT(t), "SELECT count(*) FROM "+s("consumers")+
			" WHERE lease_expires_at > now()").Scan(&leased); err != nil {
			t.Fatal(err)
		}
		if leased != 0 {
			t.Fatalf("the pop returned nothing but left %d lease(s) behind", leased)
		}
	} else {
		wantData(t, r.msgs, "m0", "n0") // the claim's snapshot, from before retention
		ack(t, r.msgs[len(r.msgs)-1])
	}
	// Either way the partition goes on at once.
	pushN(t, q, "p", "o", 1)
	wantData(t, pop(t, q, queen.PopOptions{Batch: 10}), "o0")
}

// The same guarantee from the other side: segments gone by the time the
// pop reads them (here deleted by hand, leaving log_start behind, as a
// retention committing between the claim's lock and its read looks to the
// pop) yield no lease and no auto-ack.
func TestPopLeavesNoLeaseWhenClaimedSegmentsAreGone(t *testing.T) {
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{LeaseTime: time.Hour})
	pushN(t, q, "p", "m", 2)
	if _, err := c.Pool().Exec(ctxT(t), "DELETE FROM "+pgx.Identifier{c.Schema(), "segments"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	for _, autoAck := range []bool{false, true} {
		if got := pop(t, q, queen.PopOptions{Batch: 10, AutoAck: autoAck}); len(got) != 0 {
			t.Fatalf("popped %q from deleted segments", datas(got))
		}
	}
	var leased, committed int
	if err := c.Pool().QueryRow(ctxT(t), "SELECT count(*) FILTER (WHERE lease_expires_at > now()), max(committed) FROM "+
		pgx.Identifier{c.Schema(), "consumers"}.Sanitize()).Scan(&leased, &committed); err != nil {
		t.Fatal(err)
	}
	if leased != 0 || committed != -1 {
		t.Fatalf("%d lease(s) and the cursor at %d over messages nobody received", leased, committed)
	}
}
