package alloc_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/e03140bc/queen/alloc"
	"github.com/e03140bc/queen/internal/pgtest"
	"github.com/e03140bc/queen/internal/stmt"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func setup(t *testing.T) (context.Context, *pgxpool.Pool, *stmt.Set) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pool, schema := pgtest.Migrated(t)
	return ctx, pool, stmt.New(schema)
}

func seg(queue, part string, n int) *alloc.Segment {
	return &alloc.Segment{Queue: queue, Partition: part, Count: int32(n), Hashes: make([]byte, 16*n),
		Blob: []byte{0}}
}

func TestBundleVerdictsInInputOrder(t *testing.T) {
	ctx, pool, sql := setup(t)
	var b alloc.Bundle
	// Partition ids are assigned in provisioning order (b before a), so the
	// allocator visits them in a different order than the input.
	b.Add(seg("q", "b", 2))
	b.Add(seg("q", "a", 3))
	b.Add(seg("other", "a", 1))
	v, err := b.Push(ctx, pool, sql.PushBundle, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(v) != 3 {
		t.Fatalf("%d verdicts", len(v))
	}
	for i, x := range v {
		if x.Status != alloc.Queued || x.BaseOffset != 0 || x.CreatedAt.IsZero() {
			t.Fatalf("verdict %d: %+v", i, x)
		}
	}
	if v[0].PartitionID == v[1].PartitionID || !v[0].CreatedAt.Equal(v[2].CreatedAt) {
		t.Fatalf("verdicts %+v: want distinct partitions and one bundle timestamp", v)
	}
	b.Reset()
	b.Add(seg("q", "a", 2))
	v, err = b.Push(ctx, pool, sql.PushBundle, v)
	if err != nil || v[0].BaseOffset != 3 {
		t.Fatalf("second segment of q/a: %+v %v; want base 3", v, err)
	}
	s, found, err := alloc.SegmentAt(ctx, pool, sql.SegmentAt, v[0].PartitionID, 4)
	if err != nil || !found || s.BaseOffset != 3 || s.EndOffset != 4 {
		t.Fatalf("SegmentAt(4) = %+v %v %v", s, found, err)
	}
	if _, found, _ := alloc.SegmentAt(ctx, pool, sql.SegmentAt, v[0].PartitionID, 5); found {
		t.Fatal("SegmentAt past the end found a segment")
	}
}

// A hash blob that is not 16 bytes per message fails the whole bundle:
// a stride mismatch would mis-address acks silently.
func TestBundleStrideMismatchFails(t *testing.T) {
	ctx, pool, sql := setup(t)
	var b alloc.Bundle
	b.Add(seg("q", "ok", 1))
	bad := seg("q", "bad", 2)
	bad.Hashes = bad.Hashes[:20]
	b.Add(bad)
	if _, err := b.Push(ctx, pool, sql.PushBundle, nil); err == nil || !strings.Contains(err.Error(), "hash blob") {
		t.Fatalf("err = %v, want the stride guard", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sql.Schema+".segments").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d segments written by a failed bundle (%v)", n, err)
	}
}

// Misaligned arrays are refused by the alignment guard.
func TestBundleAlignmentGuard(t *testing.T) {
	ctx, pool, sql := setup(t)
	_, err := pool.Exec(ctx, sql.PushBundle, []string{"q", "q"}, []string{"a"}, []int32{1}, [][]byte{make([]byte, 16)},
		[]int64{-1}, [][]byte{{0}}, [][16]byte{uuid.Nil}, []int32{0}, false, nil)
	if err == nil || !strings.Contains(err.Error(), "not aligned") {
		t.Fatalf("err = %v, want the alignment guard", err)
	}
	// The lane counts, when sent, are aligned too.
	_, err = pool.Exec(ctx, sql.PushBundle, []string{"q"}, []string{"a"}, []int32{1}, [][]byte{make([]byte, 16)},
		[]int64{-1}, [][]byte{{0}}, [][16]byte{uuid.Nil}, []int32{0}, false, []int32{64, 64})
	if err == nil || !strings.Contains(err.Error(), "not aligned") {
		t.Fatalf("lanes: err = %v, want the alignment guard", err)
	}
}

// A segment routed with a lane count that is not its queue's is refused
// (LanesChanged) and writes nothing; with the queue's count it is stored.
func TestBundleLanesChecked(t *testing.T) {
	ctx, pool, sql := setup(t)
	var b alloc.Bundle
	s := seg("q", "lane-1", 1)
	s.Lanes = 8
	b.Add(s)
	v, err := b.Push(ctx, pool, sql.PushBundle, nil)
	if err != nil || len(v) != 1 || v[0].Status != alloc.LanesChanged {
		t.Fatalf("verdicts %+v, %v; want LanesChanged (the queue has 64 lanes)", v, err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+sql.Schema+".segments").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d segments written by a refused segment (%v)", n, err)
	}
	b.Reset()
	s.Lanes = 64
	b.Add(s)
	if v, err = b.Push(ctx, pool, sql.PushBundle, v); err != nil || v[0].Status != alloc.Queued {
		t.Fatalf("verdicts %+v, %v; want Queued", v, err)
	}
}
