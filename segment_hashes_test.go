package queen_test

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/e03140bc/queen"
)

// A pushed segment's hashes live in its own row (migration 017) until
// retention deletes it; those the dedup window (or the hash keep) still
// needs move into a hash row then. These tests age rows by moving their
// created_at back, as the clock would.

// ageSegmentsBy moves every segment's created_at back by d.
func ageSegmentsBy(t *testing.T, c *queen.Client, d time.Duration) {
	t.Helper()
	if onLayout() {
		ageSegmentRows(t, c, d)
		return
	}
	if _, err := c.Pool().Exec(ctxT(t), "UPDATE "+pgx.Identifier{c.Schema(), "segments"}.Sanitize()+
		" SET created_at = created_at - $1::bigint * interval '1 millisecond'", d.Milliseconds()); err != nil {
		t.Fatal(err)
	}
}

// Every push path stores its hashes where a later push within the dedup
// window finds them, also after retention deleted the segment (within
// the window, so its hashes move to a hash row), and also when the window
// was configured only after the push.
func TestDuplicateCaughtAfterRetentionOnEveryPushPath(t *testing.T) {
	const window = time.Hour
	paths := []struct {
		name string
		// The window is configured after the push (the push had none).
		later bool
		push  func(t *testing.T, c *queen.Client, q *queen.Queue, item queen.Item)
	}{
		// An isolated push to a known partition: push_segment with a
		// window, AppendSegment without.
		{"push_segment", false, func(t *testing.T, c *queen.Client, q *queen.Queue, it queen.Item) { push(t, q, it) }},
		{"AppendSegment", true, func(t *testing.T, c *queen.Client, q *queen.Queue, it queen.Item) { push(t, q, it) }},
		// A bundle over two partitions: push_one per segment with a
		// window, the set-based allocator without.
		{"push_bundle window", false, func(t *testing.T, c *queen.Client, q *queen.Queue, it queen.Item) {
			push(t, q, it, queen.Item{Partition: "other", Data: []byte("o")})
		}},
		{"push_bundle set-based", true, func(t *testing.T, c *queen.Client, q *queen.Queue, it queen.Item) {
			push(t, q, it, queen.Item{Partition: "other", Data: []byte("o")})
		}},
		{"PushTx", false, func(t *testing.T, c *queen.Client, q *queen.Queue, it queen.Item) {
			err := pgx.BeginFunc(ctxT(t), c.Pool(), func(tx pgx.Tx) error {
				res, err := q.PushTx(ctxT(t), tx, []queen.Item{it})
				if err == nil && res[0].Status != queen.Queued {
					t.Fatalf("PushTx: %+v", res)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}},
		{"Client.Tx", true, func(t *testing.T, c *queen.Client, q *queen.Queue, it queen.Item) {
			if err := c.Tx(ctxT(t), func(tx *queen.Tx) error {
				tx.Push("q", []queen.Item{it, {Partition: "other", Data: []byte("o")}})
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			c := open(t, manual)
			opts := queen.QueueOptions{DedupWindow: window}
			if p.later {
				opts.DedupWindow = 0
			}
			q := configure(t, c, "q", opts)
			push(t, q, queen.Item{Partition: "p", TransactionID: "warm", Data: []byte("w")}) // p known
			p.push(t, c, q, queen.Item{Partition: "p", TransactionID: "x", Data: []byte("x")})
			// Retention a minute; the segments two minutes old: due, and
			// well inside the window.
			if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: window, Retention: time.Minute}); err != nil {
				t.Fatal(err)
			}
			ageSegmentsBy(t, c, 2*time.Minute)
			if rep := maintain(t, c); rep.SegmentsDeleted == 0 {
				t.Fatal("retention deleted nothing")
			}
			if n := countRows(t, c, "segments"); n != 0 {
				t.Fatalf("%d segments left after retention", n)
			}
			for _, id := range []string{"x", "warm"} {
				if r := push(t, q, queen.Item{Partition: "p", TransactionID: id, Data: []byte("again")})[0]; r.Status != queen.Duplicate {
					t.Fatalf("%s repeated inside its window after retention: %s, want duplicate", id, r.Status)
				}
			}
		})
	}
}

// Retention copies only the hashes still owed: those younger than the
// hash keep, max(dedup window, lease time, HashFloor). Older ones go with
// their segment, as the hash purge would have deleted them. A window
// raised later sees what the keep kept.
func TestRetentionKeepsOnlyTheHashesStillOwed(t *testing.T) {
	for _, floor := range []time.Duration{0, 3 * time.Hour} {
		t.Run("floor "+floor.String(), func(t *testing.T) {
			c := open(t, manual, func(cfg *queen.Config) { cfg.Maintenance.HashFloor = floor })
			q := configure(t, c, "q", queen.QueueOptions{DedupWindow: time.Hour})
			push(t, q, queen.Item{Partition: "p", TransactionID: "old"})
			ageSegmentsBy(t, c, 2*time.Hour) // past the window and the default floor
			push(t, q, queen.Item{Partition: "p", TransactionID: "young"})
			ageSegmentsBy(t, c, 2*time.Minute)
			if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: time.Hour, Retention: time.Minute}); err != nil {
				t.Fatal(err)
			}
			if rep := maintain(t, c); rep.SegmentsDeleted != 2 {
				t.Fatalf("retention deleted %d segments, want 2", rep.SegmentsDeleted)
			}
			want := 1 // young only
			if floor > 2*time.Hour {
				want = 2 // the floor keeps old too
			}
			if n := countRows(t, c, "txns"); n != want {
				t.Fatalf("%d hash rows after retention, want %d", n, want)
			}
			if r := push(t, q, queen.Item{Partition: "p", TransactionID: "young"})[0]; r.Status != queen.Duplicate {
				t.Fatalf("young repeated: %s, want duplicate", r.Status)
			}
			// A window raised past old's age sees it if the keep kept it.
			if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: 4 * time.Hour, Retention: time.Minute}); err != nil {
				t.Fatal(err)
			}
			r := push(t, q, queen.Item{Partition: "p", TransactionID: "old"})[0]
			if wantStatus := map[bool]queen.PushStatus{true: queen.Duplicate, false: queen.Queued}[want == 2]; r.Status != wantStatus {
				t.Fatalf("old repeated under a 4h window: %s, want %s", r.Status, wantStatus)
			}
		})
	}
}

// Rows written before migration 017 (a segment without hashes beside its
// hash row, as release 016's pushes, or an earlier client's AppendSegment
// during a rolling upgrade, leave them) and rows written since, in one
// partition: the probe sees both, and retention keeps the old hash row
// and copies the new hashes without a conflict.
func TestDedupAcrossTheSegmentHashesMigration(t *testing.T) {
	skipOnLayout(t, "its SQL ages segments with timestamptz arithmetic in an UPDATE, which Citus rejects")
	c := open(t, manual)
	q := configure(t, c, "q", queen.QueueOptions{DedupWindow: time.Hour})
	push(t, q, queen.Item{Partition: "p", TransactionID: "before"})
	s := pgx.Identifier{c.Schema()}.Sanitize()
	// The 016 shape: the hashes in a hash row, none in the segment.
	if _, err := c.Pool().Exec(ctxT(t), "WITH s AS (UPDATE "+s+".segments x SET hashes = NULL FROM "+s+
		".segments o WHERE o.partition_id = x.partition_id AND o.base_offset = x.base_offset"+
		" RETURNING o.partition_id, o.base_offset, o.end_offset, o.created_at, o.hashes)"+
		" INSERT INTO "+s+".txns SELECT * FROM s"); err != nil {
		t.Fatal(err)
	}
	push(t, q, queen.Item{Partition: "p", TransactionID: "after"})
	var old, hashed int
	if err := c.Pool().QueryRow(ctxT(t), "SELECT count(*) FILTER (WHERE hashes IS NULL), count(hashes) FROM "+s+
		".segments").Scan(&old, &hashed); err != nil || old != 1 || hashed != 1 {
		t.Fatalf("segments without hashes %d, with %d (%v); want 1 and 1", old, hashed, err)
	}
	check := func(when string) {
		t.Helper()
		for _, id := range []string{"before", "after"} {
			if r := push(t, q, queen.Item{Partition: "p", TransactionID: id})[0]; r.Status != queen.Duplicate {
				t.Fatalf("%s: %s repeated: %s, want duplicate", when, id, r.Status)
			}
		}
	}
	check("both shapes stored")
	if err := q.Configure(ctxT(t), queen.QueueOptions{DedupWindow: time.Hour, Retention: time.Minute}); err != nil {
		t.Fatal(err)
	}
	ageSegmentsBy(t, c, 2*time.Minute)
	if rep := maintain(t, c); rep.SegmentsDeleted != 2 {
		t.Fatalf("retention deleted %d segments, want 2", rep.SegmentsDeleted)
	}
	if n := countRows(t, c, "txns"); n != 2 {
		t.Fatalf("%d hash rows after retention, want 2", n)
	}
	check("after retention")
}

// A FailureSkip copy carries its original's hash, read from the
// original's segment row (requeue_hash).
func TestSkipCopyRepeatsTheHashInItsSegment(t *testing.T) {
	c := open(t, manual)
	ctx := ctxT(t)
	q := configure(t, c, "q", queen.QueueOptions{FailurePolicy: queen.FailureSkip, RetryLimit: 5, DedupWindow: time.Hour})
	push(t, q, queen.Item{Partition: "p", TransactionID: "t1", Data: []byte("m1")})
	m := pop(t, q, queen.PopOptions{Partition: "p"})
	if err := m[0].Fail(ctx, errors.New("x")); err != nil {
		t.Fatal(err)
	}
	s := pgx.Identifier{c.Schema()}.Sanitize()
	var same bool
	var n int
	// The copy waits its backoff in scheduled, or is at the tail already.
	if err := c.Pool().QueryRow(ctx, "SELECT count(*), coalesce(bool_and(c.h = o.hashes AND o.hashes <> '\\x00000000000000000000000000000000'), false)"+
		" FROM (SELECT s.hashes AS h FROM "+s+".segments s WHERE s.base_offset > 0 UNION ALL SELECT w.hash FROM "+s+".scheduled w) c, "+
		s+".segments o WHERE o.base_offset = 0").Scan(&n, &same); err != nil || n != 1 || !same {
		t.Fatalf("copies %d, carrying the original's hash %v (%v); want 1, true", n, same, err)
	}
}
