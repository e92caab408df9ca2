package queen_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// randomPayload is n incompressible bytes (zstd's window is 1 MiB, so items
// sharing it stay incompressible in a segment too).
func randomPayload(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// segmentStats reads how many messages the queue's segments hold and the
// largest blob.
func segmentStats(t testing.TB, c *queen.Client) (segments, messages, maxBlob int64) {
	t.Helper()
	err := c.Pool().QueryRow(context.Background(), "SELECT count(*), coalesce(sum(end_offset - base_offset + 1), 0), coalesce(max(octet_length(blob)), 0) FROM "+
		pgx.Identifier{c.Schema(), "segments"}.Sanitize()).Scan(&segments, &messages, &maxBlob)
	if err != nil {
		t.Fatal(err)
	}
	return segments, messages, maxBlob
}

// A push whose frames are over PostgreSQL's 1 GiB message limit is split
// over several push_bundle calls instead of failing whole (and being
// spooled, where its replay would fail the same way). 68 messages of
// MaxPayloadSize in one partition: 1.06 GiB.
func TestPushOverMessageLimitIsSplit(t *testing.T) {
	if testing.Short() {
		t.Skip("pushes 1 GiB")
	}
	if raceEnabled {
		// About 2 GB resident under the race detector, against 0.5 GB
		// without; TestPushSplitAtBound covers the same path with a lower
		// bound.
		t.Skip("pushes 1 GiB; run without -race")
	}
	c := open(t)
	payload := randomPayload(t, queen.MaxPayloadSize)
	items := make([]queen.Item, 68)
	for i := range items {
		items[i].Data = payload
	}
	res, err := c.Queue("big").Push(ctxT(t), items)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != queen.Queued || r.Offset != int64(i) {
			t.Fatalf("item %d: %s at offset %d (%v), want Queued at %d", i, r.Status, r.Offset, r.Err, i)
		}
	}
	segs, msgs, maxBlob := segmentStats(t, c)
	t.Logf("%d messages in %d segments, the largest blob %d bytes", msgs, segs, maxBlob)
	if msgs != int64(len(items)) || maxBlob > 128<<20 {
		t.Fatalf("stored %d messages, largest blob %d bytes", msgs, maxBlob)
	}
}

// With the bound lowered, a Push to many partitions is committed in
// bundles within it: a partition's items that do not fit wait for its next
// flush, in order.
func TestPushSplitAtBound(t *testing.T) {
	const bound = 4 << 20
	c := open(t, queen.MaxBundleBytes(bound), func(cfg *queen.Config) { cfg.Fusion.Shards = 1 })
	payload := randomPayload(t, 1<<20)
	var items []queen.Item
	for p := range 8 {
		for range 5 {
			items = append(items, queen.Item{Partition: fmt.Sprintf("p%02d", p), Data: payload})
		}
	}
	res := push(t, c.Queue("q"), items...)
	for i, r := range res {
		if r.Status != queen.Queued || r.Offset != int64(i%5) {
			t.Fatalf("item %d: %s at offset %d, want Queued at %d", i, r.Status, r.Offset, i%5)
		}
	}
	segs, msgs, maxBlob := segmentStats(t, c)
	if msgs != int64(len(items)) || maxBlob > bound || segs < int64(len(items)/4) {
		t.Fatalf("%d messages in %d segments, the largest blob %d bytes; want %d within %d", msgs, segs, maxBlob, len(items), bound)
	}
}

// bundleTracer records the blob bytes of every push_bundle call.
type bundleTracer struct {
	mu    sync.Mutex
	sizes []int
}

func (b *bundleTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(d.SQL, "push_bundle") {
		return ctx
	}
	n := 0
	for _, a := range d.Args {
		if blobs, ok := a.([][]byte); ok {
			for _, bl := range blobs {
				n += len(bl)
			}
		}
	}
	b.mu.Lock()
	b.sizes = append(b.sizes, n)
	b.mu.Unlock()
	return ctx
}

func (*bundleTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A bundle of many partitions whose frames would exceed the bound is sent
// as several push_bundle calls, each within it, in one transaction.
func TestPushTxBundleSplitAtBound(t *testing.T) {
	const bound = 4 << 20
	c := open(t, queen.MaxBundleBytes(bound))
	ctx := ctxT(t)
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	tracer := &bundleTracer{}
	cfg.Tracer = tracer
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	payload := randomPayload(t, 1<<20)
	var items []queen.Item
	for p := range 16 {
		for range 2 {
			items = append(items, queen.Item{Partition: fmt.Sprintf("p%02d", p), Data: payload})
		}
	}
	res, err := c.Queue("q").PushTx(ctx, tx, items)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Status != queen.Queued || r.Offset != int64(i%2) {
			t.Fatalf("item %d: %s at offset %d, want Queued at %d", i, r.Status, r.Offset, i%2)
		}
	}
	tracer.mu.Lock()
	defer tracer.mu.Unlock()
	total := 0
	for _, n := range tracer.sizes {
		if n > bound {
			t.Fatalf("a push_bundle call carried %d blob bytes, bound %d (calls: %v)", n, bound, tracer.sizes)
		}
		total += n
	}
	if total < len(items)<<20 {
		t.Fatalf("push_bundle calls carried %d bytes in all, want the %d items' payloads", total, len(items))
	}
	if _, msgs, _ := segmentStats(t, c); msgs != int64(len(items)) {
		t.Fatalf("stored %d messages", msgs)
	}
}
