package sqlschema_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// matchCase is the match's input: stored rows (offsets base..end, their
// hash bytes) and the incoming hashes.
type matchCase struct {
	base, end []int64
	rows      [][]byte
	incoming  [][]byte
}

// want is the probe's rule stated plainly: the k-th incoming hash repeats
// stored offset base+j of a row when the row's 16 bytes at 16j are it
// (j up to end-base, and whole); the lowest such offset counts.
func (c matchCase) want() (idx []int32, off []int64) {
	for k, h := range c.incoming {
		best := int64(-1)
		for r, hs := range c.rows {
			for j := int64(0); j <= c.end[r]-c.base[r]; j++ {
				if 16*j+16 <= int64(len(hs)) && bytes.Equal(hs[16*j:16*j+16], h) && (best < 0 || c.base[r]+j < best) {
					best = c.base[r] + j
				}
			}
		}
		if best >= 0 {
			idx, off = append(idx, int32(k)), append(off, best)
		}
	}
	return idx, off
}

// dedup_hits and dedup_offsets find what the plain rule finds, by the
// search and by the join, over stored rows end to end in one blob: hashes that straddle two
// stored ones or sit off a row's 16-byte grid, rows shorter or longer than
// their offsets, a hash stored twice, rows out of offset order (hash rows
// and segments), and one hash found in more places than the search keeps.
func TestDedupHitsAndOffsetsAreThePlainRule(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	rng := rand.New(rand.NewPCG(1, 2))
	hash := func() []byte {
		b := make([]byte, 16)
		for i := range b {
			b[i] = byte(rng.IntN(4)) // few symbols: near misses are common
		}
		return b
	}
	var cases []matchCase
	for n := range 300 {
		var c matchCase
		next := int64(rng.IntN(50))
		for range rng.IntN(6) + 1 {
			cnt := int64(rng.IntN(4) + 1)
			var hs []byte
			for range cnt {
				hs = append(hs, hash()...)
			}
			if n%5 == 0 && rng.IntN(3) == 0 { // a row not 16 bytes an offset
				if rng.IntN(2) == 0 {
					hs = hs[:len(hs)-1-rng.IntN(15)]
				} else {
					hs = append(hs, hash()[:1+rng.IntN(15)]...)
				}
			}
			c.base, c.end, c.rows = append(c.base, next), append(c.end, next+cnt-1), append(c.rows, hs)
			next += cnt + int64(rng.IntN(3)) // gaps: offsets without hashes
		}
		if rng.IntN(3) == 0 { // out of offset order
			i, j := rng.IntN(len(c.rows)), rng.IntN(len(c.rows))
			c.base[i], c.base[j] = c.base[j], c.base[i]
			c.end[i], c.end[j] = c.end[j], c.end[i]
			c.rows[i], c.rows[j] = c.rows[j], c.rows[i]
		}
		blob := slices.Concat(c.rows...)
		for range rng.IntN(8) + 1 {
			switch rng.IntN(4) {
			case 0: // any 16 bytes of the blob: aligned or not
				if len(blob) >= 16 {
					at := rng.IntN(len(blob) - 15)
					c.incoming = append(c.incoming, bytes.Clone(blob[at:at+16]))
					continue
				}
				c.incoming = append(c.incoming, hash())
			case 1: // a stored hash
				r := rng.IntN(len(c.rows))
				if len(c.rows[r]) >= 16 {
					j := rng.IntN(len(c.rows[r]) / 16)
					c.incoming = append(c.incoming, bytes.Clone(c.rows[r][16*j:16*j+16]))
					continue
				}
				c.incoming = append(c.incoming, hash())
			default:
				c.incoming = append(c.incoming, hash())
			}
		}
		cases = append(cases, c)
	}
	// One hash in many places: a run of one byte value across rows, a
	// stored hash of it twice.
	run := bytes.Repeat([]byte{0xaa}, 16)
	cases = append(cases, matchCase{
		base:     []int64{10, 12, 20},
		end:      []int64{11, 13, 20},
		rows:     [][]byte{append(bytes.Repeat([]byte{1}, 24), 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa), append(bytes.Clone(run), run...), run},
		incoming: [][]byte{hash(), run},
	})

	for i, c := range cases {
		exact := true
		var lens []int32
		for r, hs := range c.rows {
			lens = append(lens, int32(len(hs)))
			exact = exact && int64(len(hs)) == 16*(c.end[r]-c.base[r]+1)
		}
		wantIdx, wantOff := c.want()
		for _, scanMax := range []int{0, 1000} {
			var idx []int32
			var off []int64
			if err := pool.QueryRow(ctx, "SELECT o.dup_idx, o.dup_off FROM "+s+".dedup_hits($1, $2, $3, $4, $5) h, "+
				s+".dedup_offsets(h.hit_k, h.hit_p, $6, $7, $8) o",
				len(c.incoming), slices.Concat(c.incoming...), slices.Concat(c.rows...), exact, scanMax, c.base, c.end, lens).Scan(&idx, &off); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(idx, wantIdx) || !slices.Equal(off, wantOff) {
				t.Fatalf("case %d (exact %v, scan up to %d): got %v %v, want %v %v\nrows %v %v %x\nincoming %x",
					i, exact, scanMax, idx, off, wantIdx, wantOff, c.base, c.end, c.rows, c.incoming)
			}
		}
	}
}

// dedup_probe over a partition whose segments retention keeps far past the
// window: it answers by the window alone (a repeat of a message older than
// the window is not a duplicate), and reads about the window's rows, not
// every segment kept.
func TestDedupProbeReadsTheWindowNotTheLog(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	const kept, recent = 3000, 10
	pid := windowPartition(t, ctx, pool, s, kept+recent-1, kept, recent, time.Second)
	hashOf := func(i int) []byte {
		var b []byte
		if err := pool.QueryRow(ctx, "SELECT decode(md5($1::int::text), 'hex')", i).Scan(&b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var idx []int32
	var off []int64
	if err := tx.QueryRow(ctx, "SELECT dup_idx, dup_off FROM "+s+".dedup_probe($1, 3, $2, -1, $3, 0, 60000, now())",
		pid, slices.Concat(hashOf(5), hashOf(kept+3), hashOf(kept-1)), kept+recent-1).Scan(&idx, &off); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(idx, []int32{1}) || !slices.Equal(off, []int64{kept + 3}) {
		t.Fatalf("probe: %v %v, want [1] [%d] (only the recent message is in the window)", idx, off, kept+3)
	}
	var fetched int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables
		WHERE relid = ($1 || '.segments')::regclass`, s).Scan(&fetched); err != nil {
		t.Fatal(err)
	}
	if fetched > 200 {
		t.Fatalf("the probe read %d segment rows for a window of %d (of %d kept)", fetched, recent, kept+recent)
	}
}

// dedup_probe's answer is the plain rule over what it may read: rows past
// the floor (the verified watermark, the hash rows' start), up to the
// head, created within the window, hash rows and segments alike.
func TestDedupProbeIsThePlainRule(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 150 {
		pid := windowPartition(t, ctx, pool, s, 0, 0, 0, 0)
		// Rows in offset order, older first: the first few hash rows, the
		// rest segments; ages fall from minutes to seconds, so the window
		// (a minute) starts somewhere among them.
		var c matchCase
		var ages []time.Duration
		next := int64(0)
		rows := rng.IntN(60) + 1
		txnRows := rng.IntN(rows + 1)
		if rng.IntN(2) == 0 {
			txnRows = 0
		}
		age := time.Duration(rng.IntN(120)+1) * time.Second
		for r := range rows {
			cnt := int64(rng.IntN(3) + 1)
			hs := make([]byte, 16*cnt)
			for i := range hs {
				hs[i] = byte(rng.IntN(256))
			}
			table := "segments (partition_id, base_offset, end_offset, created_at, blob, hashes) VALUES ($1, $2, $3, now() - $4 * interval '1 ms', '\\x00', $5)"
			if r < txnRows {
				table = "txns (partition_id, base_offset, end_offset, created_at, hashes) VALUES ($1, $2, $3, now() - $4 * interval '1 ms', $5)"
			}
			if _, err := pool.Exec(ctx, "INSERT INTO "+s+"."+table, pid, next, next+cnt-1, age.Milliseconds(), hs); err != nil {
				t.Fatal(err)
			}
			c.base, c.end, c.rows = append(c.base, next), append(c.end, next+cnt-1), append(c.rows, hs)
			ages = append(ages, age)
			next += cnt
			age -= time.Duration(rng.IntN(4)) * time.Second
			if age < time.Second {
				age = time.Second
			}
		}
		last := next - 1 - int64(rng.IntN(2)) // a head below the last row: that row is not read
		floor := int64(rng.IntN(int(next)+1)) - 1
		for range rng.IntN(12) + 1 {
			r := rng.IntN(rows)
			for k := range rows { // mostly a row just inside the window
				if rng.IntN(2) == 0 && ages[k] >= 45*time.Second && ages[k] < time.Minute {
					r = k
					break
				}
			}
			j := rng.IntN(len(c.rows[r]) / 16)
			if rng.IntN(4) == 0 {
				h := make([]byte, 16)
				for i := range h {
					h[i] = byte(rng.IntN(256))
				}
				c.incoming = append(c.incoming, h)
				continue
			}
			c.incoming = append(c.incoming, bytes.Clone(c.rows[r][16*j:16*j+16]))
		}
		// The plain rule over the rows the probe may read.
		var may matchCase
		for r := range c.rows {
			// Whole seconds old when inserted: under a minute is in the
			// window the probe sees a moment later.
			if c.end[r] > floor && c.base[r] <= last && ages[r] < time.Minute {
				may.base, may.end, may.rows = append(may.base, c.base[r]), append(may.end, c.end[r]), append(may.rows, c.rows[r])
			}
		}
		may.incoming = c.incoming
		wantIdx, wantOff := may.want()
		var idx []int32
		var off []int64
		if err := pool.QueryRow(ctx, "SELECT dup_idx, dup_off FROM "+s+".dedup_probe($1, $2, $3, $4, $5, 0, 60000, now())",
			pid, len(c.incoming), slices.Concat(c.incoming...), floor, last).Scan(&idx, &off); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(idx, wantIdx) || !slices.Equal(off, wantOff) {
			t.Fatalf("case %d: got %v %v, want %v %v (floor %d, head %d, rows %v..%v aged %v, %d hash rows)",
				n, idx, off, wantIdx, wantOff, floor, last, c.base, c.end, ages, txnRows)
		}
	}
}

// windowPartition makes a queue with a one-minute dedup window and its
// partition "p" with last offset last, and returns the partition's id.
// With kept or recent above zero it also stores one-message segments at
// offsets 0..kept+recent-1, hash of offset i the md5 of i: the first kept
// two hours old, the recent ones a step apart up to now, created_at rising
// with the offset.
func windowPartition(tb testing.TB, ctx context.Context, pool *pgxpool.Pool, s string, last int64, kept, recent int, step time.Duration) int64 {
	tb.Helper()
	var pid int64
	if err := pool.QueryRow(ctx, `WITH q AS (
    INSERT INTO `+s+`.queues (tenant, name, dedup_window_ms) VALUES (gen_random_uuid(), 'q' || gen_random_uuid(), 60000) RETURNING id)
INSERT INTO `+s+`.partitions (id, queue_id, name, last_offset) SELECT `+s+`.partition_key(id, 'p', 0), id, 'p', $1 FROM q RETURNING id`,
		last).Scan(&pid); err != nil {
		tb.Fatal(err)
	}
	if kept+recent == 0 {
		return pid
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+s+`.segments (partition_id, base_offset, end_offset, created_at, blob, hashes)
SELECT $1, i, i, CASE WHEN i < $2::int THEN now() - interval '2 hours' + i * interval '1 ms'
                      ELSE now() - ($2::int + $3::int - i) * $4::bigint * interval '1 ms' END,
       '\x00', decode(md5(i::text), 'hex')
FROM generate_series(0, $2::int + $3::int - 1) i`, pid, kept, recent, step.Milliseconds()); err != nil {
		tb.Fatal(err)
	}
	return pid
}

// dedup_hits refuses incoming hashes that are not 16 bytes each: a
// shorter search would match everywhere (an empty one at every byte).
func TestDedupHitsRefusesShortHashes(t *testing.T) {
	ctx, pool, schema := migrated(t)
	s := pgx.Identifier{schema}.Sanitize()
	for _, c := range []struct {
		n  int
		in []byte
	}{{1, nil}, {1, []byte("short")}, {2, make([]byte, 17)}, {-1, nil}} {
		for _, exact := range []bool{true, false} {
			var k []int32
			err := pool.QueryRow(ctx, "SELECT hit_k FROM "+s+".dedup_hits($1, $2, $3, $4, 16)",
				c.n, c.in, bytes.Repeat([]byte{7}, 64), exact).Scan(&k)
			if err == nil || !strings.Contains(err.Error(), "want 16 each") {
				t.Errorf("%d incoming in %d bytes (exact %v): %v, %v; want the refusal", c.n, len(c.in), exact, k, err)
			}
		}
	}
}
