package fusion

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// idKey is a caller's own key type: a numeric id and a name.
type idKey struct {
	id   int64
	name string
}

// Hash ignores the name, so keys differing only by it collide on purpose.
func (k idKey) Hash() uint64 { return uint64(k.id) }

// TestKeyerKeysByValue: an engine keyed by a caller's own type accumulates
// per key value, not per hash: keys that share a hash (same id, another
// name) get their own batch, every batch carries its key as submitted, and
// each key's items stay in submission order.
func TestKeyerKeysByValue(t *testing.T) {
	type seg struct {
		key  idKey
		seqs []int
	}
	gate := make(chan struct{})
	bundles := make(chan []seg, 4)
	first := true
	e := New(Config{Shards: 1, MaxInFlight: 1}, func(_ context.Context, bundle []*Batch[idKey, *item]) error {
		var got []seg
		for _, b := range bundle {
			s := seg{key: b.Key}
			for _, it := range b.Items {
				s.seqs = append(s.seqs, it.seq)
			}
			got = append(got, s)
		}
		bundles <- got
		if first {
			first = false
			<-gate // hold the first flush so the rest accumulate behind it
		}
		return nil
	})
	t.Cleanup(func() { closeNow(t, e) })

	a, b, c := idKey{1, "a"}, idKey{1, "b"}, idKey{2, "a"}
	submit := func(k idKey, from, n int) {
		t.Helper()
		if err := e.Submit(context.Background(), k, items(0, from, n), nil); err != nil {
			t.Fatal(err)
		}
	}
	submit(a, 0, 1)
	select {
	case got := <-bundles:
		if len(got) != 1 || got[0].key != a || !slices.Equal(got[0].seqs, []int{0}) {
			t.Fatalf("first bundle %+v, want a's item 0 alone", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no flush")
	}
	submit(a, 1, 2)
	submit(b, 0, 1)
	submit(c, 0, 1)
	submit(a, 3, 1)
	// The shard takes arrivals in order; wait until all four are in before
	// letting the held flush return, so they share the next bundle.
	deadline := time.Now().Add(5 * time.Second)
	for len(e.shards[0].in) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("arrivals not absorbed")
		}
		time.Sleep(time.Millisecond)
	}
	close(gate)
	var all []seg
	for len(all) < 3 {
		select {
		case got := <-bundles:
			all = append(all, got...)
		case <-time.After(5 * time.Second):
			t.Fatalf("flushed %+v, want batches for a, b and c", all)
		}
	}
	want := map[idKey][]int{a: {1, 2, 3}, b: {0}, c: {0}}
	if len(all) != len(want) {
		t.Fatalf("flushed %+v, want one batch per key %v", all, want)
	}
	for _, s := range all {
		if w, ok := want[s.key]; !ok || !slices.Equal(s.seqs, w) {
			t.Fatalf("batch %+v, want %v", s, want)
		}
		delete(want, s.key)
	}
}

// TestCollidingKeysChain: a shard finds a key's state by the key's hash,
// keys whose hashes collide in slots next to each other, so forgetting a key
// must leave the others of its hash found wherever it sat among them (first,
// between, last). Many keys on few hashes, flushed one or two at a time in random
// order, inline flushes or not: each key's items reach the flush in
// submission order, no key is in two flushes at once, every batch carries
// its key's hash, and the shard holds no key once everything is done.
func TestCollidingKeysChain(t *testing.T) {
	for _, inline := range []bool{false, true} {
		t.Run(map[bool]string{false: "shard", true: "inline"}[inline], func(t *testing.T) {
			const (
				hashes   = 3
				names    = 5
				perKey   = 60
				submitsN = 4 // submitters per key, each its own stretch of seqs
			)
			var (
				mu     sync.Mutex
				flying = map[idKey]bool{}
				last   = map[idKey]map[int]int{} // key → submitter → last seq
				bad    []string
			)
			failf := func(format string, a ...any) {
				bad = append(bad, fmt.Sprintf(format, a...))
			}
			e := New(Config{Shards: 1, BundleMax: 2, MaxInFlight: 2, Inline: inline, Limiter: fixedLimiter(2)},
				func(_ context.Context, bundle []*Batch[idKey, *item]) error {
					mu.Lock()
					for _, b := range bundle {
						if b.Hash != b.Key.Hash() {
							failf("batch of %v carries hash %d, want %d", b.Key, b.Hash, b.Key.Hash())
						}
						if flying[b.Key] {
							failf("key %v in two flushes at once", b.Key)
						}
						flying[b.Key] = true
						if last[b.Key] == nil {
							last[b.Key] = map[int]int{}
						}
						for _, it := range b.Items {
							if prev, ok := last[b.Key][it.src]; ok && it.seq != prev+1 {
								failf("key %v submitter %d: seq %d after %d", b.Key, it.src, it.seq, prev)
							}
							last[b.Key][it.src] = it.seq
						}
					}
					mu.Unlock()
					time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
					mu.Lock()
					for _, b := range bundle {
						flying[b.Key] = false
						for _, it := range b.Items {
							it.resolved.Add(1)
						}
					}
					mu.Unlock()
					return nil
				})
			var keys []idKey
			for h := range hashes {
				for n := range names {
					keys = append(keys, idKey{int64(h), fmt.Sprintf("n%d", n)})
				}
			}
			var all []*item
			var allMu sync.Mutex
			var wg sync.WaitGroup
			for _, k := range keys {
				for src := range submitsN {
					wg.Go(func() {
						ctx := context.Background()
						for seq := 0; seq < perKey; {
							n := 1 + rand.IntN(3)
							its := items(src, seq, n)
							seq += n
							allMu.Lock()
							all = append(all, its...)
							allMu.Unlock()
							err := e.SubmitWait(ctx, 1, func(yield func(idKey, []*item) bool) { yield(k, its) })
							if err != nil {
								t.Error(err)
								return
							}
						}
					})
				}
			}
			wg.Wait()
			closeNow(t, e)
			mu.Lock()
			defer mu.Unlock()
			for _, b := range bad {
				t.Error(b)
			}
			for _, it := range all {
				if n := it.resolved.Load(); n != 1 {
					t.Fatalf("item %d/%d resolved %d times", it.src, it.seq, n)
				}
			}
			// The shard's goroutine has exited: its state is ours to read.
			if n := e.shards[0].keys.len(); n != 0 {
				t.Errorf("shard holds %d keys after everything was flushed", n)
			}
			if inline && e.Stats().Inline == 0 {
				t.Log("no inline flush happened") // possible, not a failure
			}
		})
	}
}

// TestForgetUnlinksAnywhereInChain drives a shard's key table directly:
// keys of one hash are added and forgotten in several orders, and after each
// step exactly the keys still held are found.
func TestForgetUnlinksAnywhereInChain(t *testing.T) {
	keys := []idKey{{7, "a"}, {7, "b"}, {7, "c"}, {7, "d"}}
	perms := [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {2, 0, 3, 1}}
	for _, order := range perms {
		s := &shard[idKey, *item]{}
		held := map[idKey]*keyState[idKey, *item]{}
		for _, k := range keys {
			held[k] = s.newKey(k, k.Hash())
		}
		check := func() {
			t.Helper()
			for _, k := range keys {
				got := s.lookup(k, k.Hash())
				if want := held[k]; got != want {
					t.Fatalf("order %v: lookup(%v) = %p, want %p", order, k, got, want)
				}
			}
		}
		check()
		for _, i := range order {
			s.forget(held[keys[i]])
			delete(held, keys[i])
			check()
		}
		if n := s.keys.len(); n != 0 {
			t.Fatalf("order %v: %d keys left", order, n)
		}
		// Forgotten states are reused: a new key must not find an old one.
		k := idKey{7, "e"}
		if ks := s.newKey(k, k.Hash()); ks.key != k || s.lookup(keys[0], keys[0].Hash()) != nil {
			t.Fatalf("order %v: a reused state is found under its old key", order)
		}
	}
}
