package stmt_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/stmt"
)

// Pop claims a pushed message under a lease and fills every column of its
// row; Extend renews that lease and only that one; PopDeadLetter moves the
// claimed message to the dead letters under the lease.
func TestPopExtendPopDeadLetter(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s, c := stmt.New(schema), stmt.NewConsume(schema)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	tenant := uuid.Must(uuid.NewV4())
	if _, err := pool.Exec(ctx, "WITH q AS (INSERT INTO "+tbl("queues")+" (tenant, name) VALUES ($1, 'q') RETURNING id) "+
		"INSERT INTO "+tbl("partitions")+" (queue_id, name) SELECT id, 'p' FROM q", tenant); err != nil {
		t.Fatal(err)
	}
	f := frame.Frame{ID: uuid.Must(uuid.NewV4()), TransactionID: "t1", Key: "k", Payload: []byte("hello")}
	if _, err := pool.Exec(ctx, s.PushSegment, tenant, "q", "p", 1, make([]byte, 16), segment.Single(&f), 0, 0); err != nil {
		t.Fatal(err)
	}
	var rows []stmt.PopRow
	err := stmt.Pop(ctx, c, pool, stmt.PopParams{
		Tenant: tenant, Queue: "q", Group: "g", Batch: 10, PerPartition: 10, Partitions: 1,
		Lease: 30 * time.Second, Owner: "test", Mode: "all",
	}, func(r *stmt.PopRow) error {
		rows = append(rows, *r)
		return nil
	})
	if err != nil || len(rows) != 1 {
		t.Fatalf("pop: %d rows, %v", len(rows), err)
	}
	r := rows[0]
	if r.PartitionName != "p" || r.Lease == nil || r.LeaseExpires == nil || r.LeaseTime != 30*time.Second ||
		r.First != r.Base || r.Last != r.End || r.Base != r.End || r.Deliveries != 1 || r.CreatedAt.IsZero() || r.Failures != 0 {
		t.Fatalf("pop row: %+v", r)
	}
	var got frame.Frame
	blob, err := segment.Decompress(nil, r.Blob)
	if err == nil {
		err = frame.Decode(blob, func(_ int, g *frame.Frame) error { got = *g; return nil })
	}
	if err != nil || got.ID != f.ID || !bytes.Equal(got.Payload, f.Payload) {
		t.Fatalf("pop row's blob: %+v, %v", got, err)
	}

	lease := stmt.Lease{Partition: r.PartitionID, Group: "g", ID: *r.Lease}
	exp, err := stmt.Extend(ctx, c, pool, lease, time.Hour)
	if err != nil || !exp.After(r.LeaseExpires.Add(time.Minute)) {
		t.Fatalf("extend: %v (was %v), %v", exp, *r.LeaseExpires, err)
	}
	other := lease
	other.ID = uuid.Must(uuid.NewV4())
	if _, err := stmt.Extend(ctx, c, pool, other, time.Hour); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("extend another lease: %v", err)
	}

	dead := stmt.PopDeadLetterParams{Partition: r.PartitionID, Group: "g", Lease: r.Lease,
		Dead: []stmt.PopDead{{Offset: r.First, Kept: stmt.Kept{Frame: f, CreatedAt: r.CreatedAt}, Reason: "undecodable"}}}
	if ok, err := stmt.PopDeadLetter(ctx, c, pool, dead); err != nil || !ok {
		t.Fatalf("pop dead letter: %v, %v", ok, err)
	}
	var id uuid.UUID
	var reason string
	if err := pool.QueryRow(ctx, "SELECT message_id, reason FROM "+tbl("dead_letters")).Scan(&id, &reason); err != nil ||
		id != f.ID || reason != "undecodable" {
		t.Fatalf("dead letter: %v %q, %v", id, reason, err)
	}
	dead.Lease = &other.ID
	if ok, err := stmt.PopDeadLetter(ctx, c, pool, dead); err != nil || ok {
		t.Fatalf("pop dead letter under another lease: %v, %v", ok, err)
	}
}
