// Package dedup hashes transaction ids and removes duplicates inside a
// single push before anything reaches the database.
//
// Three layers cooperate; this package holds the first two:
//
//   - Layer 1 (Layer1): within one Push call, on the exact
//     (queue, partition, transaction id) triple; the first item wins.
//   - Layer 2 (Leaders): within one flush, i.e. one segment, on the 16-byte
//     Sum of the transaction id; the first frame carrying a hash leads.
//   - Layer 3 lives in SQL and compares the stored Sum bytes against
//     earlier segments.
//
// Sum's byte layout is part of the storage format: SQL compares the bytes,
// so it must never change.
//
// The layers here promise that the first occurrence wins and every later one
// is told which occurrence it repeats, at no database cost. They do not see
// other calls or other flushes (that is layer 3), and a 128-bit hash can in
// principle collide, so two different ids with one Sum count as one in
// layers 2 and 3; layer 1 compares the strings.
//
// It is a building block of queen with no stability promise before v1.
package dedup

import (
	"encoding/binary"
	"sync"

	"github.com/zeebo/xxh3"
)

// Hash is the 128-bit xxh3 hash of a transaction id in canonical
// (big-endian, high half first) byte order.
type Hash [16]byte

// Sum returns the xxh3-128 hash of txn: Hi as big-endian bytes 0..7, then Lo
// as big-endian bytes 8..15. This matches XXH128_canonicalFromHash of the
// reference C library.
func Sum(txn string) Hash {
	u := xxh3.HashString128(txn)
	var h Hash
	binary.BigEndian.PutUint64(h[:8], u.Hi)
	binary.BigEndian.PutUint64(h[8:], u.Lo)
	return h
}

// AppendHash appends the 16 bytes of h to dst.
func AppendHash(dst []byte, h Hash) []byte {
	return append(dst, h[:]...)
}

// The strings are held by reference, so a key costs no allocation and,
// unlike a hash, cannot collide.
type layer1Key struct {
	queue, partition, txn string
}

// layer1Retain bounds the map a Layer1 keeps across Reset: clearing a map
// costs time in proportion to its capacity, so one huge push should not tax
// every later small one.
const layer1Retain = 4096

// Layer1 deduplicates the items of one Push call. The zero value is ready to
// use; it is not safe for concurrent use. It keeps references to the strings
// passed to Check until Reset.
type Layer1 struct {
	seen map[layer1Key]int
}

// Reset forgets every item, keeping the map for reuse unless it grew large.
func (l *Layer1) Reset() {
	if len(l.seen) > layer1Retain {
		l.seen = nil
		return
	}
	clear(l.seen)
}

// Check records item i keyed on queue, partition and txn. The first item
// with a key leads: Check returns (i, false) for it and (its index, true)
// for every later item with the same key. An empty txn is a key like any
// other; callers that allow messages without a transaction id must give
// them a unique one first.
func (l *Layer1) Check(queue, partition, txn string, i int) (leader int, dup bool) {
	k := layer1Key{queue, partition, txn}
	if j, ok := l.seen[k]; ok {
		return j, true
	}
	if l.seen == nil {
		l.seen = make(map[layer1Key]int)
	}
	l.seen[k] = i
	return i, false
}

// Up to about this many hashes a quadratic scan beats a map (measured).
const scanMax = 64

var leaderMaps = sync.Pool{New: func() any { return make(map[Hash]int) }}

// Leaders sets out[k] to the index of the first hash equal to hashes[k]
// (k itself when hashes[k] is new) and returns out, resized to len(hashes).
// out's backing array is reused when large enough.
func Leaders(hashes []Hash, out []int) []int {
	n := len(hashes)
	if cap(out) < n {
		out = make([]int, n)
	}
	out = out[:n]
	if n <= scanMax {
		for k := range hashes {
			out[k] = k
			for j := range k {
				if hashes[j] == hashes[k] {
					out[k] = j
					break
				}
			}
		}
		return out
	}
	m := leaderMaps.Get().(map[Hash]int)
	for k, h := range hashes {
		if j, ok := m[h]; ok {
			out[k] = j
			continue
		}
		m[h] = k
		out[k] = k
	}
	// A huge map would make every later clear slow; let it go instead.
	if len(m) <= 1<<16 {
		clear(m)
		leaderMaps.Put(m)
	}
	return out
}
