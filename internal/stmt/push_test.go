package stmt_test

import (
	"os"
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen/alloc"
	"github.com/e03140bc/queen/internal/frame"
	"github.com/e03140bc/queen/internal/segment"
	"github.com/e03140bc/queen/internal/stmt"
)

// PushBundle, PushSegment and AppendSegment each store one segment at the
// partition's next offset; AppendSegment leaves a queue with a dedup window
// to the bundle; with the previous release's statements, which lack it,
// AppendSegment runs PushSegment; SegmentAt finds what they stored.
func TestPushStatements(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := stmt.New(schema)
	restore, err := stmt.Use(os.DirFS("testdata/v5"))
	if err != nil {
		t.Fatal(err)
	}
	prev := stmt.New(schema)
	restore()
	tbl := func(n string) string { return pgx.Identifier{schema, n}.Sanitize() }
	tenant := uuid.Must(uuid.NewV4())
	if _, err := pool.Exec(ctx, "INSERT INTO "+tbl("queues")+" (tenant, name, dedup_window_ms) VALUES ($1, 'q', 0), ($1, 'dedup', 60000)", tenant); err != nil {
		t.Fatal(err)
	}
	var b alloc.Bundle
	var out []alloc.Verdict
	// push sends one segment of one message to partition p of queue
	// through run (b.Known: the partition exists, as it does from the
	// bundle's push on).
	push := func(what, queue string, known bool, run func() ([]alloc.Verdict, error)) alloc.Verdict {
		t.Helper()
		f := frame.Frame{ID: uuid.Must(uuid.NewV4()), TransactionID: what, Payload: []byte(what)}
		b.Reset()
		b.Known = known
		b.Add(&alloc.Segment{Tenant: tenant, Queue: queue, Partition: "p", Count: 1, Hashes: make([]byte, 16), Blob: segment.Single(&f)})
		out, err = run()
		if err != nil || len(out) != 1 {
			t.Fatalf("%s: %+v, %v", what, out, err)
		}
		return out[0]
	}
	bundle := func() ([]alloc.Verdict, error) { return stmt.PushBundle(ctx, s, pool, &b, out) }
	v := push("bundle", "q", false, bundle)
	if v.Status != alloc.Queued || v.BaseOffset != 0 {
		t.Fatalf("bundle: %+v", v)
	}
	pid := v.PartitionID
	v = push("bundle", "dedup", false, bundle)
	if v.Status != alloc.Queued {
		t.Fatalf("bundle to dedup: %+v", v)
	}
	dpid := v.PartitionID
	for i, c := range []struct {
		what string
		run  func() ([]alloc.Verdict, error)
	}{
		{"segment", func() ([]alloc.Verdict, error) { return stmt.PushSegment(ctx, s, pool, &b, out) }},
		{"append", func() ([]alloc.Verdict, error) { return stmt.AppendSegment(ctx, s, pool, &b, pid, out) }},
		{"previous append", func() ([]alloc.Verdict, error) { return stmt.AppendSegment(ctx, prev, pool, &b, pid, out) }},
	} {
		if v := push(c.what, "q", true, c.run); v.Status != alloc.Queued || v.PartitionID != pid || v.BaseOffset != int64(i+1) {
			t.Fatalf("%s: %+v", c.what, v)
		}
	}
	if v := push("append", "dedup", true, func() ([]alloc.Verdict, error) {
		return stmt.AppendSegment(ctx, s, pool, &b, dpid, out)
	}); v.Status != alloc.NeedsBundle {
		t.Fatalf("append to a queue with a dedup window: %+v", v)
	}
	seg, found, err := stmt.SegmentAt(ctx, s, pool, pid, 3)
	if err != nil || !found || seg.BaseOffset != 3 || seg.EndOffset != 3 {
		t.Fatalf("segment at 3: %+v, %v, %v", seg, found, err)
	}
	var got frame.Frame
	raw, err := segment.Decompress(nil, seg.Blob)
	if err == nil {
		got, err = frame.At(raw, 0)
	}
	if err != nil || got.TransactionID != "previous append" {
		t.Fatalf("segment at 3 holds %+v, %v", got, err)
	}
	if _, found, err := stmt.SegmentAt(ctx, s, pool, pid, 4); err != nil || found {
		t.Fatalf("segment at 4: %v, %v", found, err)
	}
}
