package queen_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/pgtest"
)

// lockPartition holds partition's row lock (as a long push would) until the
// returned function is called.
func lockPartition(t testing.TB, c *queen.Client, partition string) (release func()) {
	t.Helper()
	ctx := ctxT(t)
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// By id, a statement of its own: on the Citus layout a row lock runs
	// on one shard only.
	var id int64
	if err := tx.QueryRow(ctx, "SELECT id FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		" WHERE name = $1", partition).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+
		" WHERE id = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	done := false
	release = func() {
		if done {
			return
		}
		done = true
		_ = tx.Rollback(context.Background())
		_ = conn.Close(context.Background())
	}
	t.Cleanup(release)
	return release
}

// lockTimeout is the StatementTimeout of tests whose drain must fail on a
// partition lockPartition holds. It must also be long enough that no healthy
// push on a loaded machine times out: a push that commits after its timeout
// is reported Buffered and stored again by the replay, which is what a queue
// without a dedup window documents, not what these tests look at.
const lockTimeout = 2 * time.Second

func txnIDs(fs []frame.Frame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.TransactionID
	}
	return out
}

func setMaintenance(t testing.TB, c *queen.Client, on bool) {
	t.Helper()
	if err := c.SetMaintenance(ctxT(t), on); err != nil {
		t.Fatal(err)
	}
}

// TestSpoolReplayStoresEachItemOnce: with no dedup window nothing absorbs a
// second push, so a replay must confirm what it stored per partition. While
// partition x cannot take its spooled record (its row is locked), the
// records spooled after it for partition y are stored once, not on every
// drain pass.
func TestSpoolReplayStoresEachItemOnce(t *testing.T) {
	c := open(t, manual, func(c *queen.Config) { c.StatementTimeout = lockTimeout })
	q := c.Queue("q") // DedupWindow 0
	push(t, q, queen.Item{Partition: "x", TransactionID: "x0"})
	setMaintenance(t, c, true)
	if r := push(t, q, queen.Item{Partition: "x", TransactionID: "x1"})[0]; r.Status != queen.Buffered {
		t.Fatalf("%+v, want Buffered", r)
	}
	var want []string
	for i := range 100 {
		txn := fmt.Sprintf("y%03d", i)
		want = append(want, txn)
		if r := push(t, q, queen.Item{Partition: "y", TransactionID: txn})[0]; r.Status != queen.Buffered {
			t.Fatalf("%+v, want Buffered", r)
		}
	}
	release := lockPartition(t, c, "x")
	setMaintenance(t, c, false)
	waitFor(t, 20*time.Second, "partition y to be replayed", func() bool { return len(storedFrames(t, c, "y")) >= 100 })
	failures := c.SpoolStats().DrainFailures
	waitFor(t, time.Minute, "three more failed drain passes", func() bool { return c.SpoolStats().DrainFailures >= failures+3 })
	if got := txnIDs(storedFrames(t, c, "y")); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partition y holds %d messages, want the 100 spooled ones once each, in order", len(got))
	}
	release()
	waitFor(t, 20*time.Second, "the drain", func() bool { return c.SpoolStats().PendingRecords == 0 })
	if got := txnIDs(storedFrames(t, c, "x")); fmt.Sprint(got) != "[x0 x1]" {
		t.Fatalf("partition x holds %v", got)
	}
	if got := len(storedFrames(t, c, "y")); got != 100 {
		t.Fatalf("partition y holds %d messages after the drain, want 100", got)
	}
}

// TestSpoolPoisonRecordQuarantinedAlone: a spooled record that can never be
// stored (its queue became encrypted and this client has no key) is set
// aside on its own; the records spooled after it, for other queues, are
// stored exactly once.
func TestSpoolPoisonRecordQuarantinedAlone(t *testing.T) {
	keyed := open(t, manual, func(c *queen.Config) { c.EncryptionKey = make([]byte, 32) })
	plain := open(t, manual, func(c *queen.Config) { c.Schema = keyed.Schema() })
	if err := keyed.Queue("e").Configure(ctxT(t), queen.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	setMaintenance(t, keyed, true)
	waitFor(t, 5*time.Second, "maintenance to reach the second client", plain.Maintenance)
	if r := push(t, plain.Queue("e"), queen.Item{Partition: "poison", TransactionID: "bad"})[0]; r.Status != queen.Buffered {
		t.Fatalf("%+v, want Buffered", r)
	}
	for i := range 10 {
		for _, p := range []string{"a", "b"} {
			if r := push(t, plain.Queue("q"), queen.Item{Partition: p, TransactionID: fmt.Sprint(p, i)})[0]; r.Status != queen.Buffered {
				t.Fatalf("%+v, want Buffered", r)
			}
		}
	}
	if err := keyed.Queue("e").Configure(ctxT(t), queen.QueueOptions{Encryption: true}); err != nil {
		t.Fatal(err)
	}
	setMaintenance(t, keyed, false)
	waitFor(t, 30*time.Second, "the spool to empty", func() bool { return plain.SpoolStats().PendingRecords == 0 })
	for _, p := range []string{"a", "b"} {
		if got := len(storedFrames(t, plain, p)); got != 10 {
			t.Fatalf("partition %s holds %d messages, want its 10 spooled ones once each", p, got)
		}
	}
	if got := len(storedFrames(t, plain, "poison")); got != 0 {
		t.Fatalf("the poison record was stored %d times", got)
	}
	if st := plain.SpoolStats(); st.QuarantinedFiles == 0 || st.LastError == nil || !errors.Is(st.LastError, queen.ErrEncryption) {
		t.Fatalf("spool stats %+v: want the poison record quarantined with its cause", st)
	}
}

// TestMaintenancePushToEncryptedQueueWithoutKeyFails: a push that could
// never be replayed is refused at once, not Buffered, even in maintenance
// mode and for a queue the client has not seen before.
func TestMaintenancePushToEncryptedQueueWithoutKeyFails(t *testing.T) {
	keyed := open(t, manual, func(c *queen.Config) { c.EncryptionKey = make([]byte, 32) })
	if err := keyed.Queue("e").Configure(ctxT(t), queen.QueueOptions{Encryption: true}); err != nil {
		t.Fatal(err)
	}
	plain := open(t, manual, func(c *queen.Config) { c.Schema = keyed.Schema() })
	setMaintenance(t, keyed, true)
	waitFor(t, 5*time.Second, "maintenance to reach the second client", plain.Maintenance)
	res, err := plain.Queue("e").Push(ctxT(t), []queen.Item{{Data: []byte("secret")}})
	if !errors.Is(err, queen.ErrEncryption) {
		t.Fatalf("Push = %+v, %v; want ErrEncryption", res, err)
	}
	if n := plain.SpoolStats().PendingRecords; n != 0 {
		t.Fatalf("%d records spooled", n)
	}
}
