package sqlschema_test

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
)

// matchCase is dedup_match's input: stored rows (offsets base..end, their
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

// dedup_match finds what the plain rule finds, by its search and by its
// join, over stored rows end to end in one blob: hashes that straddle two
// stored ones or sit off a row's 16-byte grid, rows shorter or longer than
// their offsets, a hash stored twice, rows out of offset order (hash rows
// and segments), and one hash found in more places than the search keeps.
func TestDedupMatchIsThePlainRule(t *testing.T) {
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
			if err := pool.QueryRow(ctx, "SELECT dup_idx, dup_off FROM "+s+".dedup_match($1, $2, $3, $4, $5, $6, $7, $8)",
				len(c.incoming), slices.Concat(c.incoming...), c.base, c.end, lens, slices.Concat(c.rows...), exact, scanMax).Scan(&idx, &off); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(idx, wantIdx) || !slices.Equal(off, wantOff) {
				t.Fatalf("case %d (exact %v, scan up to %d): got %v %v, want %v %v\nrows %v %v %x\nincoming %x",
					i, exact, scanMax, idx, off, wantIdx, wantOff, c.base, c.end, c.rows, c.incoming)
			}
		}
	}
}
