package stmt_test

import (
	"testing"

	"github.com/gofrs/uuid/v5"

	"github.com/e03140bc/queen/internal/stmt"
)

// PopLinger's transaction commits without waiting for the flush of its
// commit record (synchronous_commit off for that transaction only), also
// when the call finds nothing to take; the session's setting is unchanged
// after it.
func TestPopLingerCommitsAsync(t *testing.T) {
	ctx, pool, schema := migrated(t)
	c := stmt.NewConsume(schema)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	setting := func() string {
		var v string
		if err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := setting()
	if before == "off" {
		t.Fatal("the test cluster's synchronous_commit is off already")
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	// No such cursor: the linger is over, nothing written.
	over, err := stmt.PopLinger(ctx, c, tx, stmt.Lease{Partition: -1, Group: "", ID: uuid.Must(uuid.NewV4())}, 1, 0,
		func(*stmt.PopRow) error { t.Error("a row for no cursor"); return nil })
	if err != nil || !over {
		t.Fatalf("PopLinger on no cursor: over %v, %v; want over", over, err)
	}
	var in string
	if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&in); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if in != "off" {
		t.Errorf("synchronous_commit in PopLinger's transaction = %q, want off", in)
	}
	if after := setting(); after != before {
		t.Errorf("synchronous_commit after PopLinger's transaction = %q, want the session's %q", after, before)
	}
}
