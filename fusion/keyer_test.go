package fusion

import (
	"context"
	"slices"
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
