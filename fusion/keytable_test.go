package fusion

import (
	"context"
	"math/rand/v2"
	"testing"
)

// TestKeyTableAgainstMap runs random adds and removes against a map as the
// model: hashes from a small range collide often (equal hashes, and equal
// homes), sequences grow the table and empty it again, and after every step
// each key is found exactly when the model holds it, the table has no gap
// inside a probe run, and its size stays within the bounds that keep its
// memory following its keys.
func TestKeyTableAgainstMap(t *testing.T) {
	for _, hashes := range []int{1, 3, 40, 1 << 30} {
		r := rand.New(rand.NewPCG(uint64(hashes), 7))
		var tab keyTable[idKey, *item]
		model := map[idKey]*keyState[idKey, *item]{}
		var universe []idKey
		for i := range 600 {
			// Multiples of 8: a shard's keys share their hash modulo the
			// number of shards.
			universe = append(universe, idKey{int64(8 * r.IntN(hashes)), string(rune('a' + i%26))})
		}
		check := func(step int) {
			t.Helper()
			if tab.len() != len(model) {
				t.Fatalf("hashes %d step %d: len %d, model %d", hashes, step, tab.len(), len(model))
			}
			for _, k := range universe {
				if got, want := tab.get(k, k.Hash()), model[k]; got != want {
					t.Fatalf("hashes %d step %d: get(%v) = %p, want %p", hashes, step, k, got, want)
				}
			}
			if n := len(tab.slots); n > minKeySlots && 8*tab.len() < n || n != 0 && 2*tab.len() > n {
				t.Fatalf("hashes %d step %d: %d slots for %d keys", hashes, step, n, tab.len())
			}
			// Every entry is reachable from its home: no empty slot
			// between the two.
			mask := uint64(len(tab.slots) - 1)
			for i, s := range tab.slots {
				if s.ks == nil {
					continue
				}
				for j := tab.home(s.hash); j != uint64(i); j = (j + 1) & mask {
					if tab.slots[j].ks == nil {
						t.Fatalf("hashes %d step %d: slot %d unreachable from its home", hashes, step, i)
					}
				}
			}
		}
		for step := range 6000 {
			// Phases: mostly adding, then mostly removing, so the table
			// grows to hundreds of keys and shrinks back.
			addBias := 0.7
			if step/1000%2 == 1 {
				addBias = 0.3
			}
			k := universe[r.IntN(len(universe))]
			if ks, ok := model[k]; ok && r.Float64() > addBias {
				tab.remove(k.Hash(), ks)
				delete(model, k)
			} else if !ok {
				ks := &keyState[idKey, *item]{key: k, hash: k.Hash()}
				tab.add(k.Hash(), ks)
				model[k] = ks
			}
			if step%7 == 0 || tab.len() < 3 {
				check(step)
			}
		}
		for k, ks := range model {
			tab.remove(k.Hash(), ks)
			delete(model, k)
			check(-1)
		}
		if len(tab.slots) != minKeySlots {
			t.Fatalf("hashes %d: %d slots once empty, want %d", hashes, len(tab.slots), minKeySlots)
		}
	}
}

// TestKeyTableRemoveUnknownPanics: forgetting a state the table does not
// hold is a broken invariant, not a no-op.
func TestKeyTableRemoveUnknownPanics(t *testing.T) {
	var tab keyTable[idKey, *item]
	k := idKey{1, "a"}
	tab.add(k.Hash(), &keyState[idKey, *item]{key: k})
	defer func() {
		if recover() == nil {
			t.Fatal("remove of an unknown state did not panic")
		}
	}()
	tab.remove(k.Hash(), &keyState[idKey, *item]{key: k})
}

// TestFreeKeysBounded: a shard keeps the states of forgotten keys for
// reuse, up to maxFreeKeys with their buffers (each at most maxKeptItems),
// and past that up to its maxFree (a bundle's worth per flight) only with
// small buffers; beyond, a forgotten state is dropped. A state taken from
// the free list holds nothing of its previous key.
func TestFreeKeysBounded(t *testing.T) {
	e := New(Config{BundleMax: 256, MaxInFlight: 4, Shards: 1}, func(context.Context, []*Batch[idKey, *item]) error { return nil })
	closeNow(t, e)
	if got := e.shards[0].maxFree; got != 1024 {
		t.Fatalf("maxFree %d, want BundleMax × MaxInFlight = 1024", got)
	}
	s := &shard[idKey, *item]{maxFree: 1024}
	add := func(i int, items int) *keyState[idKey, *item] {
		k := idKey{int64(i), "k"}
		ks := s.newKey(k, k.Hash())
		ks.pending = make([]*item, 0, items)
		ks.runs = make([]run, 0, 1)
		return ks
	}
	var states []*keyState[idKey, *item]
	for i := range 3000 {
		items := 1
		if i%2 == 1 {
			items = 100 // above maxSmallItems
		}
		states = append(states, add(i, items))
	}
	for _, ks := range states {
		s.forget(ks)
	}
	if n := len(s.freeKeys); n != 1024 {
		t.Fatalf("%d free states, want 1024", n)
	}
	for i, ks := range s.freeKeys {
		limit := maxSmallItems
		if i < maxFreeKeys {
			limit = maxKeptItems
		}
		if cap(ks.pending) > limit || cap(ks.runs) > limit {
			t.Fatalf("free state %d keeps buffers of %d and %d, above %d", i, cap(ks.pending), cap(ks.runs), limit)
		}
	}
	// Reuse: a new key finds no trace of the old one.
	k := idKey{-1, "new"}
	ks := s.newKey(k, k.Hash())
	if ks.key != k || ks.batch.Key != k || ks.hash != k.Hash() || ks.batch.Hash != k.Hash() ||
		len(ks.pending) != 0 || len(ks.runs) != 0 || ks.queued || ks.flying {
		t.Fatalf("reused state %+v", ks)
	}
	if s.keys.len() != 1 || s.lookup(idKey{0, "k"}, idKey{0, "k"}.Hash()) != nil {
		t.Fatalf("table holds %d keys, want the new one only", s.keys.len())
	}
}
