package stmt_test

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/stmt"
)

// The queue settings statements create, read, refuse a lane change of a
// keyed queue, and delete; the previous release's QueueMeta leaves Dedup
// alone and its missing MarkKeyed does nothing; the maintenance flag
// round-trips.
func TestSettingsStatements(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := stmt.New(schema)
	ref := stmt.QueueRef{Tenant: uuid.Must(uuid.NewV4()), Name: "q"}
	in := stmt.QueueUpsertParams{Queue: ref, Lease: time.Minute, RetryLimit: 3, DedupWindow: time.Hour, Encryption: true,
		FailurePolicy: "pause", Lanes: 8}
	if ok, err := stmt.QueueUpsert(ctx, s, pool, in); err != nil || !ok {
		t.Fatalf("upsert: %v, %v", ok, err)
	}
	var qid int64
	if err := pool.QueryRow(ctx, "SELECT id FROM "+pgx.Identifier{schema, "queues"}.Sanitize()+" WHERE name = 'q'").Scan(&qid); err != nil {
		t.Fatal(err)
	}
	var m stmt.QueueMetaRow
	if err := stmt.QueueMeta(ctx, s, pool, ref, &m); err != nil || m != (stmt.QueueMetaRow{Encryption: true, Lanes: 8, Dedup: true, ID: qid}) {
		t.Fatalf("meta: %+v, %v; want the queue's id %d", m, err, qid)
	}
	keyed, err := stmt.MarkKeyed(ctx, s, pool, ref.Tenant, []string{"q", "missing"})
	if err != nil || len(keyed) != 1 || keyed[0] != "q" {
		t.Fatalf("mark keyed: %v, %v", keyed, err)
	}
	in.Lanes = 4
	if ok, err := stmt.QueueUpsert(ctx, s, pool, in); err != nil || ok {
		t.Fatalf("upsert of another lane count on a keyed queue: %v, %v", ok, err)
	}

	restore, err := stmt.Use(os.DirFS("testdata/v5"))
	if err != nil {
		t.Fatal(err)
	}
	prev := stmt.New(schema)
	restore()
	m = stmt.QueueMetaRow{Dedup: false}
	if err := stmt.QueueMeta(ctx, prev, pool, ref, &m); err != nil || m != (stmt.QueueMetaRow{Encryption: true, Lanes: 8}) {
		t.Fatalf("previous release's meta: %+v, %v", m, err)
	}
	if keyed, err := stmt.MarkKeyed(ctx, prev, pool, ref.Tenant, []string{"q"}); err != nil || keyed != nil {
		t.Fatalf("previous release's mark keyed: %v, %v", keyed, err)
	}

	if err := stmt.QueueDelete(ctx, s, pool, ref); err != nil {
		t.Fatal(err)
	}
	if err := stmt.QueueMeta(ctx, s, pool, ref, &m); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("meta of a deleted queue: %v", err)
	}
	for _, on := range []bool{true, false} {
		if err := stmt.SetMaintenance(ctx, s, pool, on); err != nil {
			t.Fatal(err)
		}
		if got, err := stmt.GetMaintenance(ctx, s, pool); err != nil || got != on {
			t.Fatalf("maintenance: %v, %v; want %v", got, err, on)
		}
	}
	if err := stmt.Notify(ctx, s, pool, "x"); err != nil {
		t.Fatal(err)
	}
}
