package queen_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// waitForBlockedStatement waits until some backend of the client's database
// waits on a lock with a statement containing what.
func waitForBlockedStatement(t testing.TB, c *queen.Client, what string) {
	t.Helper()
	waitFor(t, 20*time.Second, "a statement blocked on a lock: "+what, func() bool {
		var n int
		if err := c.Pool().QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0",
			what).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
}

// waitForBlockedPush waits until a push statement of any kind (see
// containsBundle) waits for a lock.
func waitForBlockedPush(t testing.TB, c *queen.Client) {
	t.Helper()
	waitFor(t, 20*time.Second, "a push statement blocked on a lock", func() bool {
		rows, err := c.Pool().Query(context.Background(), "SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
		if err != nil {
			t.Fatal(err)
		}
		qs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(qs, containsBundle)
	})
}

// TestCloseReturnsWithinContextDuringReplay: Close gives up at its context
// even while the drain is replaying into a partition that is locked for
// longer than the statement timeout; the record is stored once, by this
// client's background shutdown or by the next client on the directory.
func TestCloseReturnsWithinContextDuringReplay(t *testing.T) {
	dir := t.TempDir()
	cfg := queen.Config{DatabaseURL: pgtest.URL(t), Schema: pgtest.Schema(t), Logger: pgtest.Logger(t), SpoolDir: dir,
		StatementTimeout: 30 * time.Second, Maintenance: queen.MaintenanceConfig{Interval: -1}}
	ignore := goleak.IgnoreCurrent() // after the shared cluster and pool are up
	c, err := queen.Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	q := c.Queue("q")
	push(t, q, queen.Item{Partition: "p", TransactionID: "first"})
	setMaintenance(t, c, true)
	if r := push(t, q, queen.Item{Partition: "p", TransactionID: "spooled"})[0]; r.Status != queen.Buffered {
		t.Fatalf("%+v, want Buffered", r)
	}
	release := lockPartition(t, c, "p")
	setMaintenance(t, c, false)
	waitForBlockedPush(t, c)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	err = c.Close(ctx)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Close took %s with a 1s context (err %v)", took, err)
	}
	t.Logf("Close: %v", err)
	// The replay already handed to PostgreSQL finishes in the background
	// once the lock goes; a second Close waits for that shutdown.
	release()
	if err := c.Close(ctxT(t)); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Close: %v", err) // it reports the first one's result
	}

	again, err := queen.Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the spool to drain", func() bool { return again.SpoolStats().PendingRecords == 0 })
	if got := txnIDs(storedFrames(t, again, "p")); len(got) != 2 || got[0] != "first" || got[1] != "spooled" {
		t.Fatalf("partition p holds %v, want [first spooled]", got)
	}
	if err := again.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, ignore)
}

// TestCloseReturnsWithinContextDuringMaintenance: a maintenance pass stuck
// on a table lock does not hold Close past its context.
func TestCloseReturnsWithinContextDuringMaintenance(t *testing.T) {
	cfg := queen.Config{DatabaseURL: pgtest.URL(t), Schema: pgtest.Schema(t), Logger: pgtest.Logger(t), SpoolDir: t.TempDir(),
		Maintenance: queen.MaintenanceConfig{Interval: 20 * time.Millisecond}}
	ignore := goleak.IgnoreCurrent() // after the shared cluster and pool are up
	c, err := queen.Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	push(t, c.Queue("q"), queen.Item{Partition: "p"})
	conn, err := pgx.Connect(ctxT(t), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctxT(t), "LOCK TABLE "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	// Any of the pass's statements (the window read, or a function that
	// reads partitions, such as take_samples at a new minute): each names
	// the schema.
	waitForBlockedStatement(t, c, c.Schema())

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	closed := make(chan error, 1)
	start := time.Now()
	go func() { closed <- c.Close(ctx) }()
	select {
	case err := <-closed:
		t.Logf("Close after %s: %v", time.Since(start), err)
	case <-time.After(5 * time.Second):
		_ = tx.Rollback(context.Background())
		<-closed
		t.Fatalf("Close still running after 5s with a 1s context")
	}
	_ = tx.Rollback(context.Background())
	conn.Close(context.Background())
	goleak.VerifyNone(t, ignore)
}
