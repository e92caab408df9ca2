package queen_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/e03140bc/queen"
)

// One segment of a push_bundle call made by hand: queue and partition,
// message count, frame flags (1: encrypted), the lane count its keys were
// routed with (0: none), and its hash blob (nil: fresh, 16 bytes a message).
type bseg struct {
	q, p   string
	count  int32
	flags  int32
	lanes  int32
	hashes []byte
}

// One push_result row, every column.
type bres struct {
	ord     int32
	status  int16
	pid     int64
	base    *int64
	created *time.Time
	dupIdx  []int32
	dupOff  []int64
}

func (b bres) String() string {
	s := fmt.Sprintf("ord %d status %d partition %d", b.ord, b.status, b.pid)
	if b.base != nil {
		s += fmt.Sprintf(" base %d", *b.base)
	}
	if b.created != nil {
		s += fmt.Sprintf(" at %v", *b.created)
	}
	if b.dupIdx != nil || b.dupOff != nil {
		s += fmt.Sprintf(" dup %v %v", b.dupIdx, b.dupOff)
	}
	return s
}

// A stored segment, as the test expects it.
type bstored struct {
	q, p      string
	base, end int64
	blob      []byte
	hashes    []byte
	call      int // which bundle wrote it: its created_at is that call's
}

// bundleCall runs push_bundle over segs as the client would send them
// (tenant zero, blobs "<call>:<index>"), returns its rows in the order the
// function returned them, and the blob and hashes each segment carried.
func bundleCall(t *testing.T, c *queen.Client, call int, known bool, lanes bool, segs []bseg) ([]bres, [][]byte, [][]byte, error) {
	t.Helper()
	n := len(segs)
	qs, ps := make([]string, n), make([]string, n)
	counts, flags, ls := make([]int32, n), make([]int32, n), make([]int32, n)
	hs, bs := make([][]byte, n), make([][]byte, n)
	verified := make([]int64, n)
	for i, s := range segs {
		qs[i], ps[i], counts[i], flags[i], ls[i] = s.q, s.p, s.count, s.flags, s.lanes
		hs[i] = s.hashes
		if hs[i] == nil {
			for k := range s.count {
				hs[i] = append(hs[i], []byte(fmt.Sprintf("h%05d-%04d-%04d", call, i, k))...)
			}
		}
		bs[i] = []byte(fmt.Sprintf("%d:%d", call, i))
		verified[i] = -1
	}
	var lanesArg any
	if lanes {
		lanesArg = ls
	}
	rows, err := c.Pool().Query(ctxT(t), `SELECT ord, status, partition_id, base_offset, created_at, dup_idx, dup_off
		FROM `+pgx.Identifier{c.Schema()}.Sanitize()+`.push_bundle($1::text[], $2::text[], $3::int[], $4::bytea[],
			$5::bigint[], $6::bytea[], array_fill('00000000-0000-0000-0000-000000000000'::uuid, ARRAY[$7::int]),
			$8::int[], $9, $10::int[])`, qs, ps, counts, hs, verified, bs, n, flags, known, lanesArg)
	if err != nil {
		return nil, nil, nil, err
	}
	res, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (bres, error) {
		var b bres
		err := r.Scan(&b.ord, &b.status, &b.pid, &b.base, &b.created, &b.dupIdx, &b.dupOff)
		return b, err
	})
	return res, bs, hs, err
}

// bundleChecker runs bundles and holds what the schema must store after
// them.
type bundleChecker struct {
	t      *testing.T
	c      *queen.Client
	call   int
	stored []bstored
	times  map[int]time.Time // per call, the time its written segments carry
}

// run calls push_bundle and checks every row: one per segment, in input
// order (ord 1..n), each with want's status and offset (-1: none), the
// partition's id, and the call's one time on every segment written; a
// duplicate names dup's frame indexes and offsets. Written segments are
// remembered for check.
func (b *bundleChecker) run(known, lanes bool, segs []bseg, want []int64, status []int16, dup map[int][2][]int64) {
	t := b.t
	t.Helper()
	b.call++
	res, blobs, hashes, err := bundleCall(t, b.c, b.call, known, lanes, segs)
	if err != nil {
		t.Fatalf("call %d: %v", b.call, err)
	}
	if len(res) != len(segs) {
		t.Fatalf("call %d: %d rows for %d segments", b.call, len(res), len(segs))
	}
	for i, r := range res {
		s := segs[i]
		st := int16(0)
		if status != nil {
			st = status[i]
		}
		ids := partitionIDs(t, b.c, s.q, s.p)
		if r.ord != int32(i+1) || r.status != st || len(ids) != 1 || r.pid != ids[0] {
			t.Fatalf("call %d row %d (%s/%s): ord %d status %d partition %d; want ord %d status %d partition %v",
				b.call, i, s.q, s.p, r.ord, r.status, r.pid, i+1, st, ids)
		}
		switch {
		case st == 0:
			if r.base == nil || *r.base != want[i] || r.created == nil || r.dupIdx != nil || r.dupOff != nil {
				t.Fatalf("call %d row %d (%s/%s): %v, want queued at %d", b.call, i, s.q, s.p, r, want[i])
			}
			if at, ok := b.times[b.call]; !ok {
				b.times[b.call] = *r.created
			} else if !at.Equal(*r.created) {
				t.Fatalf("call %d row %d: created at %v, another segment of the call at %v", b.call, i, *r.created, at)
			}
			b.stored = append(b.stored, bstored{q: s.q, p: s.p, base: want[i], end: want[i] + int64(s.count) - 1,
				blob: blobs[i], hashes: hashes[i], call: b.call})
		case st == 1:
			d := dup[i]
			if r.base != nil || r.created != nil || fmt.Sprint(r.dupIdx) != fmt.Sprint(d[0]) || fmt.Sprint(r.dupOff) != fmt.Sprint(d[1]) {
				t.Fatalf("call %d row %d (%s/%s): %v, want duplicate %v", b.call, i, s.q, s.p, r, d)
			}
		default:
			if r.base != nil || r.created != nil || r.dupIdx != nil || r.dupOff != nil {
				t.Fatalf("call %d row %d (%s/%s): %v, want status %d with nothing else", b.call, i, s.q, s.p, r, st)
			}
		}
	}
	b.check()
}

// check compares every stored segment of the schema with the ones the
// calls wrote, and each partition's last offset with its last segment's.
func (b *bundleChecker) check() {
	t := b.t
	t.Helper()
	s := b.c.Schema()
	rows, err := b.c.Pool().Query(ctxT(t), `SELECT qq.name, p.name, sg.base_offset, sg.end_offset, sg.created_at,
			sg.blob, sg.hashes, sg.failures, p.last_offset, p.pending
		FROM `+pgx.Identifier{s, "segments"}.Sanitize()+` sg
		JOIN `+pgx.Identifier{s, "partitions"}.Sanitize()+` p ON p.id = sg.partition_id
		JOIN `+pgx.Identifier{s, "queues"}.Sanitize()+` qq ON qq.id = p.queue_id
		ORDER BY qq.name, p.name, sg.base_offset`)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		q, p         string
		base, end    int64
		at           time.Time
		blob, hashes []byte
		failures     int32
		last         int64
		pending      bool
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (got, error) {
		var g got
		err := r.Scan(&g.q, &g.p, &g.base, &g.end, &g.at, &g.blob, &g.hashes, &g.failures, &g.last, &g.pending)
		return g, err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bstored{}
	for _, w := range b.stored {
		want[fmt.Sprintf("%s/%s@%d", w.q, w.p, w.base)] = w
	}
	lastSeg := map[string]int64{}
	for _, g := range all {
		k := fmt.Sprintf("%s/%s@%d", g.q, g.p, g.base)
		w, ok := want[k]
		if !ok {
			t.Fatalf("segment %s..%d stored, none was written there", k, g.end)
		}
		delete(want, k)
		if g.end != w.end || !bytes.Equal(g.blob, w.blob) || !bytes.Equal(g.hashes, w.hashes) || g.failures != 0 ||
			!g.at.Equal(b.times[w.call]) || !g.pending {
			t.Fatalf("segment %s: ends %d, blob %q, hashes %q, failures %d, at %v, pending %v; want ends %d, blob %q, hashes %q, at %v",
				k, g.end, g.blob, g.hashes, g.failures, g.at, g.pending, w.end, w.blob, w.hashes, b.times[w.call])
		}
		pk := g.q + "/" + g.p
		if g.base != lastSeg[pk] {
			t.Fatalf("partition %s: segment at %d after one ending at %d", pk, g.base, lastSeg[pk]-1)
		}
		lastSeg[pk] = g.end + 1
		if g.last < g.end {
			t.Fatalf("partition %s: last offset %d below its segment's end %d", pk, g.last, g.end)
		}
	}
	for k := range want {
		t.Fatalf("segment %s written, not stored", k)
	}
	rows, err = b.c.Pool().Query(ctxT(t), `SELECT qq.name || '/' || p.name, p.last_offset
		FROM `+pgx.Identifier{s, "partitions"}.Sanitize()+` p
		JOIN `+pgx.Identifier{s, "queues"}.Sanitize()+` qq ON qq.id = p.queue_id`)
	if err != nil {
		t.Fatal(err)
	}
	lasts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		P    string
		Last int64
	}])
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lasts {
		if l.Last != lastSeg[l.P]-1 {
			t.Fatalf("partition %s: last offset %d, its segments end at %d", l.P, l.Last, lastSeg[l.P]-1)
		}
	}
}

// Bundles of the lifecycle's shape (one queue, no dedup window, no
// encryption, no lanes) that mix partitions the call creates, partitions
// that exist and a partition listed more than once (Client.Tx): every
// verdict's status, partition and offset, one time for the call, and the
// segments stored with their blobs and hashes, each partition's offsets
// consecutive (a partition's listings in input order) and its last offset
// its last segment's end. Partitions are named so their ids do not sort in
// input order.
func TestBundleShapesOfOneQueue(t *testing.T) {
	skipOnLayout(t, "checks push_bundle's PostgreSQL form; push_routed has its own")
	c := open(t)
	configure(t, c, "q", queen.QueueOptions{})
	b := &bundleChecker{t: t, c: c, times: map[int]time.Time{}}
	seg := func(p string, n int32) bseg { return bseg{q: "q", p: p, count: n} }

	// All new, b twice.
	b.run(false, false, []bseg{seg("a", 2), seg("b", 1), seg("c", 1), seg("b", 3)}, []int64{0, 0, 0, 1}, nil, nil)
	// New ones (n1 three times, n2) among known ones (a twice), unknown to
	// the client.
	b.run(false, false, []bseg{seg("n1", 1), seg("a", 1), seg("b", 2), seg("n1", 3), seg("a", 1), seg("n2", 1),
		seg("c", 1), seg("n1", 1)}, []int64{0, 2, 4, 1, 3, 0, 1, 4}, nil, nil)
	// Known to the client, with a lanes array of zeros.
	b.run(true, true, []bseg{seg("c", 1), seg("n2", 2), seg("c", 1), seg("a", 1), seg("n1", 1)},
		[]int64{2, 1, 3, 4, 5}, nil, nil)
	// One segment, new and then known.
	b.run(false, false, []bseg{seg("solo", 3)}, []int64{0}, nil, nil)
	b.run(true, false, []bseg{seg("solo", 1)}, []int64{3}, nil, nil)
	// One partition only, listed three times; then a new one twice.
	b.run(true, false, []bseg{seg("b", 1), seg("b", 1), seg("b", 2)}, []int64{6, 7, 8}, nil, nil)
	b.run(false, false, []bseg{seg("m", 1), seg("m", 1)}, []int64{0, 1}, nil, nil)
	// Each partition once: all new, then all known (unknown to the client
	// and known to it, with a lanes array of zeros).
	b.run(false, false, []bseg{seg("x1", 1), seg("x2", 2), seg("x3", 1)}, []int64{0, 0, 0}, nil, nil)
	b.run(false, false, []bseg{seg("x2", 1), seg("a", 1), seg("x1", 3), seg("c", 1), seg("b", 2)},
		[]int64{2, 5, 1, 4, 10}, nil, nil)
	b.run(true, true, []bseg{seg("b", 1), seg("x3", 1), seg("solo", 2), seg("m", 1)}, []int64{12, 1, 4, 2}, nil, nil)
	// The lifecycle's bundle: 250 partitions, new, then known (to the
	// client or not).
	var life []bseg
	for i := range 250 {
		life = append(life, seg(fmt.Sprintf("v%d", (i*7)%250), 1))
	}
	b.run(false, false, life, make([]int64, 250), nil, nil)
	for k, known := range []bool{true, false} {
		want := make([]int64, 250)
		for i := range want {
			want[i] = int64(k + 1)
		}
		b.run(known, false, life, want, nil, nil)
	}
	// More segments than the lifecycle's 250: 150 new partitions, each
	// listed twice, in an order their ids do not follow; then the same
	// bundle, known.
	var segs []bseg
	var want []int64
	for i := range 300 {
		p := fmt.Sprintf("w%d", (i*7)%150)
		segs = append(segs, seg(p, 1))
		want = append(want, int64(i/150))
	}
	b.run(false, false, segs, want, nil, nil)
	for i := range want {
		want[i] += 2
	}
	b.run(true, false, segs, want, nil, nil)
}

// A bundle with segments push_bundle cannot allocate as one set — a queue
// with a dedup window (push_one: a duplicate, and a new message), an
// encrypted queue (a plaintext segment refused, an encrypted one queued), a
// queue whose lane count the client routed with wrongly (refused) and
// rightly (queued) — beside segments of a plain queue, new and known ones
// and one listed twice: every verdict, and what is stored.
func TestBundleShapesMixed(t *testing.T) {
	skipOnLayout(t, "checks push_bundle's PostgreSQL form; push_routed has its own")
	c := open(t)
	configure(t, c, "q", queen.QueueOptions{})
	configure(t, c, "w", queen.QueueOptions{DedupWindow: time.Hour})
	configure(t, c, "e", queen.QueueOptions{})
	configure(t, c, "l", queen.QueueOptions{})
	if _, err := c.Pool().Exec(ctxT(t), `UPDATE `+pgx.Identifier{c.Schema(), "queues"}.Sanitize()+`
		SET encryption = (name = 'e'), lanes = CASE WHEN name = 'l' THEN 4 ELSE lanes END`); err != nil {
		t.Fatal(err)
	}
	b := &bundleChecker{t: t, c: c, times: map[int]time.Time{}}
	dupHash := []byte("dup-hash-0000000")
	b.run(false, true, []bseg{{q: "q", p: "a", count: 1}, {q: "w", p: "x", count: 1, hashes: dupHash},
		{q: "e", p: "y", count: 1, flags: 1}, {q: "l", p: "z", count: 1, lanes: 4}}, []int64{0, 0, 0, 0}, nil, nil)

	// Unknown to the client: q/new and w/new are created by the call.
	segs := []bseg{
		{q: "q", p: "a", count: 1},
		{q: "w", p: "x", count: 2, hashes: append([]byte("fresh-hash-00000"), dupHash...)}, // duplicate: frame 1 of offset 0
		{q: "e", p: "y", count: 1},           // plaintext to an encrypted queue
		{q: "q", p: "b", count: 2},           // new
		{q: "l", p: "z", count: 1, lanes: 8}, // stale lane count
		{q: "e", p: "y", count: 1, flags: 1},
		{q: "w", p: "x", count: 1},
		{q: "l", p: "z", count: 1, lanes: 4},
		{q: "q", p: "a", count: 1},
		{q: "w", p: "new", count: 1},
		{q: "q", p: "b", count: 1},
	}
	b.run(false, true, segs, []int64{1, -1, -1, 0, -1, 1, 1, 1, 2, 0, 2}, []int16{0, 1, 2, 0, 3, 0, 0, 0, 0, 0, 0},
		map[int][2][]int64{1: {{1}, {0}}})
	// The same shapes, known to the client.
	b.run(true, true, segs[2:], []int64{-1, 3, -1, 2, 2, 2, 3, 1, 5}, []int16{2, 0, 3, 0, 0, 0, 0, 0, 0}, nil)
	// Only segments the set-based allocator takes, one of them of the
	// encrypted queue, another with the lane count of its queue.
	b.run(true, true, []bseg{{q: "e", p: "y", count: 1, flags: 1}, {q: "q", p: "a", count: 2},
		{q: "l", p: "z", count: 1, lanes: 4}, {q: "q", p: "a", count: 1}}, []int64{3, 4, 3, 6}, nil, nil)
	// Each partition once, all known, then all new; then new partitions of
	// a plain queue and of the windowed one.
	b.run(true, true, []bseg{{q: "e", p: "y", count: 1, flags: 1}, {q: "q", p: "a", count: 1},
		{q: "l", p: "z", count: 1, lanes: 4}, {q: "q", p: "b", count: 2}}, []int64{4, 7, 4, 6}, nil, nil)
	b.run(false, true, []bseg{{q: "q", p: "new1", count: 1}, {q: "e", p: "new2", count: 1, flags: 1},
		{q: "l", p: "new3", count: 2, lanes: 4}}, []int64{0, 0, 0}, nil, nil)
	b.run(false, true, []bseg{{q: "q", p: "new4", count: 1}, {q: "w", p: "new5", count: 1}}, []int64{0, 0}, nil, nil)
	// Keyed segments (flag 2) to new partitions: created by add_partitions,
	// unallocated, then allocated as known ones; then known.
	keyed := []bseg{{q: "l", p: "lane-1", count: 1, flags: 2, lanes: 4}, {q: "l", p: "lane-2", count: 2, flags: 2, lanes: 4}}
	b.run(false, true, keyed, []int64{0, 0}, nil, nil)
	b.run(true, true, keyed, []int64{1, 2}, nil, nil)
	// Each partition once, all known, beside one segment the set-based
	// allocator must not take: a duplicate in the windowed queue, a
	// plaintext one to the encrypted queue, a stale lane count.
	b.run(true, true, []bseg{{q: "q", p: "a", count: 1}, {q: "w", p: "x", count: 1, hashes: dupHash}},
		[]int64{8, -1}, []int16{0, 1}, map[int][2][]int64{1: {{0}, {0}}})
	b.run(false, true, []bseg{{q: "q", p: "a", count: 1}, {q: "e", p: "y", count: 1}}, []int64{9, -1}, []int16{0, 2}, nil)
	b.run(true, true, []bseg{{q: "l", p: "z", count: 1, lanes: 8}, {q: "q", p: "b", count: 1}}, []int64{-1, 8}, []int16{3, 0}, nil)
}

// Bundles push_bundle refuses whole, whatever their shape: a hash blob of
// the wrong length or a count of zero (an error, nothing written), and a
// partition the client called known that does not exist (QN001).
func TestBundleShapesRefused(t *testing.T) {
	skipOnLayout(t, "checks push_bundle's PostgreSQL form; push_routed has its own")
	c := open(t)
	configure(t, c, "q", queen.QueueOptions{})
	b := &bundleChecker{t: t, c: c, times: map[int]time.Time{}}
	b.run(false, false, []bseg{{q: "q", p: "a", count: 1}, {q: "q", p: "b", count: 1}}, []int64{0, 0}, nil, nil)
	for _, known := range []bool{false, true} {
		for _, bad := range []bseg{{q: "q", p: "b", count: 2, hashes: []byte("sixteen-bytes-00")},
			{q: "q", p: "b", count: 0, hashes: []byte{}}} {
			_, _, _, err := bundleCall(t, c, 100, known, false, []bseg{{q: "q", p: "a", count: 1}, bad})
			if err == nil || !strings.Contains(err.Error(), "hash blob is") {
				t.Fatalf("known %v, count %d with %d bytes of hashes: %v, want the stride error", known, bad.count, len(bad.hashes), err)
			}
		}
	}
	_, _, _, err := bundleCall(t, c, 101, true, false, []bseg{{q: "q", p: "a", count: 1}, {q: "q", p: "gone", count: 1}})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "QN001" {
		t.Fatalf("a known partition that does not exist: %v, want QN001", err)
	}
	b.check()
}

// A bundle of known partitions whose rows another transaction updated and
// holds when the bundle comes: the bundle waits for the rows, then writes
// them as that transaction left them (the row versions it locked are the
// newest) — every segment queued at the next offset, every partition's
// last offset moved, and a later bundle appends after them. Twice: a row
// rewritten as it was, and one a consumer marked not pending.
func TestBundleRowsUpdatedWhileItWaits(t *testing.T) {
	skipOnLayout(t, "checks push_bundle's PostgreSQL form; push_routed has its own")
	c := open(t)
	configure(t, c, "q", queen.QueueOptions{})
	b := &bundleChecker{t: t, c: c, times: map[int]time.Time{}}
	seg := func(p string) bseg { return bseg{q: "q", p: p, count: 1} }
	segs := []bseg{seg("c"), seg("a"), seg("b"), seg("d")}
	b.run(false, false, segs, []int64{0, 0, 0, 0}, nil, nil)
	parts := pgx.Identifier{c.Schema(), "partitions"}.Sanitize()
	for round, set := range []string{"last_write_at = last_write_at", "pending = false"} {
		tx, err := c.Pool().Begin(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		// Two of the four rows, each rewritten (a new row version), held.
		if tag, err := tx.Exec(ctxT(t), `UPDATE `+parts+` SET `+set+` WHERE name IN ('a', 'd')`); err != nil || tag.RowsAffected() != 2 {
			_ = tx.Rollback(ctxT(t))
			t.Fatalf("round %d: update: %v, %v", round, tag, err)
		}
		type out struct {
			res    []bres
			blobs  [][]byte
			hashes [][]byte
			err    error
		}
		done := make(chan out, 1)
		call := b.call + 1
		go func() {
			var o out
			o.res, o.blobs, o.hashes, o.err = bundleCall(t, c, call, true, false, segs)
			done <- o
		}()
		select {
		case o := <-done:
			_ = tx.Rollback(ctxT(t))
			t.Fatalf("round %d: the bundle did not wait for the rows another transaction holds: %v %v", round, o.res, o.err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := tx.Commit(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		o := <-done
		if o.err != nil {
			t.Fatalf("round %d: the bundle after the other transaction committed: %v", round, o.err)
		}
		b.call = call
		want := int64(round + 1)
		if len(o.res) != len(segs) {
			t.Fatalf("round %d: %d rows for %d segments", round, len(o.res), len(segs))
		}
		for i, r := range o.res {
			if r.ord != int32(i+1) || r.status != 0 || r.base == nil || *r.base != want || r.created == nil {
				t.Fatalf("round %d row %d: %v, want queued at %d", round, i, r, want)
			}
			b.times[call] = *r.created
			b.stored = append(b.stored, bstored{q: "q", p: segs[i].p, base: want, end: want,
				blob: o.blobs[i], hashes: o.hashes[i], call: call})
		}
		b.check()
	}
	// And a later bundle appends after both.
	b.run(true, false, segs, []int64{3, 3, 3, 3}, nil, nil)
}
