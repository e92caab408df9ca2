package queen_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
	"github.com/e03140bc/queen/internal/pgtest"
)

// FusionConfig.MaxBufferedBytes bounds what pushes waiting for their commit
// hold: with a flush stuck behind a lock, a push that does not fit blocks
// until its context ends, even to a partition that could commit, and goes
// through once the stuck flush commits.
func TestPushBlocksWhileFusionBytesAreFull(t *testing.T) {
	skipOnLayout(t, "its SQL locks partition rows over several shards (FOR UPDATE), which Citus rejects")
	ctx := ctxT(t)
	c := open(t, func(cfg *queen.Config) { cfg.Fusion.MaxBufferedBytes = 1 << 20 })
	q := c.Queue("q")
	push(t, q, queen.Item{Data: []byte("first")})

	blocker, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Close(context.Background())
	tx, err := blocker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "SELECT * FROM "+pgx.Identifier{c.Schema(), "partitions"}.Sanitize()+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}

	big := make([]byte, 600<<10)
	stuck := make(chan error, 1)
	go func() {
		_, err := q.Push(ctx, []queen.Item{{Data: big}})
		stuck <- err
	}()
	waitFor(t, 10*time.Second, "the first push to be buffered", func() bool { return queen.FusionBufferedBytes(c) > 0 })
	// Another partition, which the lock does not hold up.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if res, err := q.Push(short, []queen.Item{{Partition: "other", Data: big}}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("push over the bound: %v, %+v; want it blocked until its context ended", err, res)
	}
	// Room frees once the stuck flush commits.
	after := make(chan error, 1)
	go func() {
		_, err := q.Push(ctx, []queen.Item{{Data: big}})
		after <- err
	}()
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan error{stuck, after} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenRejectsNegativeMaxBufferedBytes(t *testing.T) {
	_, err := queen.Open(ctxT(t), queen.Config{DatabaseURL: "postgres://x", Fusion: queen.FusionConfig{MaxBufferedBytes: -1}})
	if err == nil || !strings.Contains(err.Error(), "MaxBufferedBytes") {
		t.Fatalf("Open: %v, want an error naming MaxBufferedBytes", err)
	}
}
