package fusion

import "math/bits"

// keyTable is a shard's index of its keys' states by the keys' hashes: open
// addressing with linear probing and backward-shift deletion, so it holds no
// tombstones. A shard adds a key with its first arrival and removes it once
// its flush returned with nothing pending, which under a load spread over
// many partitions is once per one-message segment: a Go map, which keeps
// tombstones (a missing key's lookup, every new key's, then probes past
// them) and never shrinks, spent several times this table's work there.
//
// Keys whose hashes collide take a slot each and are told apart by ==. The
// table grows at half full and shrinks at an eighth, so its memory follows
// the keys it holds. Only its shard's goroutine touches it.
type keyTable[K Keyer, T comparable] struct {
	slots []keySlot[K, T] // len a power of two, or 0 before the first add
	n     int             // slots in use
	shift uint8           // 64 - log2(len(slots))
}

type keySlot[K Keyer, T comparable] struct {
	hash uint64
	ks   *keyState[K, T] // nil: empty
}

// minKeySlots is the smallest table, and the size it starts at.
const minKeySlots = 64

// home is the slot where h's probe starts. Fibonacci hashing takes the top
// bits of h times 2^64/φ: a shard's keys share their hash modulo the number
// of shards (that is how they came to it), so h's low bits alone would
// crowd them into a fraction of the slots.
func (t *keyTable[K, T]) home(h uint64) uint64 {
	return (h * 0x9e3779b97f4a7c15) >> t.shift
}

// len is the number of keys held.
func (t *keyTable[K, T]) len() int { return t.n }

// get is the state of key k, whose hash is h, or nil.
func (t *keyTable[K, T]) get(k K, h uint64) *keyState[K, T] {
	if t.n == 0 {
		return nil
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(h); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.ks == nil {
			return nil
		}
		if s.hash == h && s.ks.key == k {
			return s.ks
		}
	}
}

// add inserts ks, whose key the table does not hold, under hash h.
func (t *keyTable[K, T]) add(h uint64, ks *keyState[K, T]) {
	if 2*(t.n+1) > len(t.slots) {
		t.resize(max(minKeySlots, 2*len(t.slots)))
	}
	t.put(h, ks)
	t.n++
}

func (t *keyTable[K, T]) put(h uint64, ks *keyState[K, T]) {
	mask := uint64(len(t.slots) - 1)
	i := t.home(h)
	for t.slots[i].ks != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = keySlot[K, T]{hash: h, ks: ks}
}

// remove takes ks, held under hash h, out of the table. It panics if the
// table does not hold ks: the shard's bookkeeping would be broken.
func (t *keyTable[K, T]) remove(h uint64, ks *keyState[K, T]) {
	mask := uint64(len(t.slots) - 1)
	i := t.home(h)
	for t.slots[i].ks != ks {
		if t.slots[i].ks == nil {
			panic("fusion: forgetting a key the shard does not hold")
		}
		i = (i + 1) & mask
	}
	// Backward shift: move up each later entry of the run that may live
	// at the hole (its home is not cyclically within (hole, j]), so every
	// entry stays reachable from its home without a tombstone.
	hole := i
	for j := (i + 1) & mask; t.slots[j].ks != nil; j = (j + 1) & mask {
		if (j-t.home(t.slots[j].hash))&mask >= (j-hole)&mask {
			t.slots[hole] = t.slots[j]
			hole = j
		}
	}
	t.slots[hole] = keySlot[K, T]{}
	t.n--
	if len(t.slots) > minKeySlots && 8*t.n < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

// resize rebuilds the table with size slots, a power of two above 2n.
func (t *keyTable[K, T]) resize(size int) {
	old := t.slots
	t.slots = make([]keySlot[K, T], size)
	t.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	for _, s := range old {
		if s.ks != nil {
			t.put(s.hash, s.ks)
		}
	}
}
