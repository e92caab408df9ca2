package stmt_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/stmt"
)

// NotifyAlone delivers its payload, and its transaction commits without
// waiting for the flush of its commit record (synchronous_commit off for
// that transaction only): the session's setting is unchanged after it.
func TestNotifyAloneCommitsAsync(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := stmt.New(schema)
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{s.Channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	defer listener.Exec(context.Background(), "UNLISTEN *") //nolint:errcheck

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
	if err := stmt.NotifyAlone(ctx, s, tx, "in a transaction"); err != nil {
		t.Fatal(err)
	}
	var in string
	if err := tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&in); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if in != "off" {
		t.Errorf("synchronous_commit in NotifyAlone's transaction = %q, want off", in)
	}
	if after := setting(); after != before {
		t.Errorf("synchronous_commit after NotifyAlone's transaction = %q, want the session's %q", after, before)
	}
	if err := stmt.NotifyAlone(ctx, s, conn, "alone"); err != nil {
		t.Fatal(err)
	}
	if after := setting(); after != before {
		t.Errorf("synchronous_commit after NotifyAlone = %q, want the session's %q", after, before)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, want := range []string{"in a transaction", "alone"} {
		n, err := listener.Conn().WaitForNotification(wctx)
		if err != nil {
			t.Fatal(err)
		}
		if n.Payload != want {
			t.Fatalf("notification %q, want %q", n.Payload, want)
		}
	}
}
