package stmt_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/stmt"
)

// Pop claims a pushed message under a lease and fills every column of its
// row; Extend renews that lease and only that one; PopDeadLetter moves the
// claimed message to the dead letters under the lease; then the reading
// and requeueing statements see that dead letter.
func TestConsumeStatements(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s, c := stmt.New(schema), stmt.NewConsume(schema)
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	tenant := uuid.Must(uuid.NewV4())
	if _, err := pool.Exec(ctx, "WITH q AS (INSERT INTO "+tbl("queues")+" (tenant, name) VALUES ($1, 'q') RETURNING id) "+
		"INSERT INTO "+tbl("partitions")+" (id, queue_id, name) SELECT "+tbl("partition_key")+"(id, 'p', 0), id, 'p' FROM q", tenant); err != nil {
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
	// A member's renewal (its owner carries the member id) is its heartbeat.
	exp, err := stmt.Extend(ctx, c, pool, lease, time.Hour, "host/1/x#m1")
	if err != nil || !exp.After(r.LeaseExpires.Add(time.Minute)) {
		t.Fatalf("extend: %v (was %v), %v", exp, *r.LeaseExpires, err)
	}
	other := lease
	other.ID = uuid.Must(uuid.NewV4())
	if _, err := stmt.Extend(ctx, c, pool, other, time.Hour, ""); !errors.Is(err, pgx.ErrNoRows) {
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

	t.Run("reads", func(t *testing.T) { testReads(t, c, pool, schema, tenant, f) })
	t.Run("requeue", func(t *testing.T) { testRequeue(t, c, pool, tenant, f) })
}

// testReads: the queue q of tenant holds one message, f, in partition p,
// dead-lettered by group g; the read statements say so.
func testReads(t *testing.T, c *stmt.Consume, pool *pgxpool.Pool, schema string, tenant uuid.UUID, f frame.Frame) {
	ctx := context.Background()
	ref := stmt.QueueRef{Tenant: tenant, Name: "q"}
	st, err := stmt.Status(ctx, c, pool, ref, false)
	if err != nil || len(st) != 1 || st[0].Partition != "p" || st[0].Group == nil || *st[0].Group != "g" ||
		st[0].Committed == nil || *st[0].Committed != st[0].LastOffset || st[0].Lag == nil || *st[0].Lag != 0 || st[0].Paused {
		t.Fatalf("status: %+v, %v", st, err)
	}
	var peeked []stmt.PeekRow
	if err := stmt.Peek(ctx, c, pool, stmt.PeekParams{Queue: ref, Limit: 10}, func(r *stmt.PeekRow) (bool, error) {
		peeked = append(peeked, *r)
		return true, nil
	}); err != nil || len(peeked) != 1 || peeked[0].PartitionName != "p" || peeked[0].First != peeked[0].Base {
		t.Fatalf("peek: %+v, %v", peeked, err)
	}
	if err := stmt.Pause(ctx, c, pool, ref, "g"); err != nil {
		t.Fatal(err)
	}
	qs, err := stmt.Queues(ctx, c, pool, tenant, false)
	if err != nil || len(qs) != 1 || qs[0].Name != "q" || qs[0].Partitions != 1 || qs[0].Pushed != 1 || qs[0].DeadLetters != 1 ||
		qs[0].Group == nil || *qs[0].Group != "g" || !qs[0].Paused || qs[0].LastDeadLetter == 0 {
		t.Fatalf("queues: %+v, %v", qs, err)
	}
	for _, want := range []bool{true, false} {
		if had, err := stmt.Resume(ctx, c, pool, ref, "g"); err != nil || had != want {
			t.Fatalf("resume: %v, %v; want %v", had, err, want)
		}
	}
	if _, _, err := stmt.QueueIDEnc(ctx, c, pool, stmt.QueueRef{Tenant: tenant, Name: "missing"}); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("QueueIDEnc of a missing queue: %v", err)
	}
	page := stmt.DeadLetterPage{Queue: ref, Limit: 10}
	dls, err := stmt.DeadLetters(ctx, c, pool, page)
	if err != nil || len(dls) != 1 || dls[0].MessageID != f.ID || dls[0].Group != "g" || dls[0].Reason == nil ||
		*dls[0].Reason != "undecodable" || !bytes.Equal(dls[0].Payload, f.Payload) || dls[0].Key != f.Key {
		t.Fatalf("dead letters: %+v, %v", dls, err)
	}
	page.IDs = []int64{}
	if dls, err := stmt.DeadLetters(ctx, c, pool, page); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters of no ids: %+v, %v", dls, err)
	}
	// The previous release's statement takes no ids: it lists them all.
	restore, err := stmt.Use(os.DirFS("testdata/v5"))
	if err != nil {
		t.Fatal(err)
	}
	prev := stmt.NewConsume(schema)
	restore()
	if dls, err := stmt.DeadLetters(ctx, prev, pool, page); err != nil || len(dls) != 1 {
		t.Fatalf("previous release's dead letters of no ids: %+v, %v", dls, err)
	}
}

// testRequeue requeues the dead letter testReads found and leaves none.
func testRequeue(t *testing.T, c *stmt.Consume, pool *pgxpool.Pool, tenant uuid.UUID, f frame.Frame) {
	ctx := context.Background()
	ref := stmt.QueueRef{Tenant: tenant, Name: "q"}
	qid, enc, err := stmt.QueueIDEnc(ctx, c, pool, ref)
	if err != nil || enc {
		t.Fatalf("QueueIDEnc: %d %v, %v", qid, enc, err)
	}
	page := stmt.DeadLetterPage{Queue: ref, Limit: 10}
	cands, err := stmt.RequeueCandidates(ctx, c, pool, page, enc)
	if err != nil || len(cands) != 1 || cands[0].Reseal || cands[0].MessageID != f.ID || cands[0].Partition != "p" {
		t.Fatalf("requeue candidates: %+v, %v", cands, err)
	}
	in := []stmt.RequeueParams{{ID: cands[0].ID, Hash: make([]byte, 16), Segment: segment.Single(&f)}}
	rows, err := stmt.Requeue(ctx, c, pool, qid, in)
	if err != nil || len(rows) != 1 || rows[0].Partition != "p" || rows[0].Requeued != 1 {
		t.Fatalf("requeue: %+v, %v", rows, err)
	}
	if dls, err := stmt.DeadLetters(ctx, c, pool, page); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after the requeue: %+v, %v", dls, err)
	}
}
