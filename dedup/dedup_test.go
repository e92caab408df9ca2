package dedup

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

// Vectors from the reference C library (libxxhash 0.8.1, XXH3_128bits),
// written as high64 then low64 in hex, i.e. XXH128_canonicalFromHash.
var sumVectors = []struct{ in, hex string }{
	{"", "99aa06d3014798d86001c324468d497f"},
	{"hello", "b5e9c1ad071b3e7fc779cfaa5e523818"},
	{"0190b2c4-7d1e-7a3b-8c9d-0123456789ab", "9785cf810e85d07c50c5c2245e0d8759"},
	{strings.Repeat("a", 300), "5e563f2cb28d2005c1d17581d8eb7e21"},
}

func TestSumVectors(t *testing.T) {
	for _, v := range sumVectors {
		h := Sum(v.in)
		if got := hex.EncodeToString(h[:]); got != v.hex {
			t.Errorf("Sum(%.20q) = %s, want %s", v.in, got, v.hex)
		}
	}
}

func TestSumLayoutMatchesXXH3(t *testing.T) {
	for _, s := range []string{"", "x", "txn-42", strings.Repeat("long ", 100)} {
		u := xxh3.HashString128(s)
		h := Sum(s)
		if binary.BigEndian.Uint64(h[:8]) != u.Hi || binary.BigEndian.Uint64(h[8:]) != u.Lo {
			t.Errorf("Sum(%q) = %x, want Hi %016x Lo %016x", s, h, u.Hi, u.Lo)
		}
		if h != Hash(u.Bytes()) {
			t.Errorf("Sum(%q) differs from Uint128.Bytes", s)
		}
	}
}

func TestAppendHash(t *testing.T) {
	h := Sum("hello")
	got := AppendHash([]byte{0xee}, h)
	if len(got) != 17 || got[0] != 0xee || Hash(got[1:]) != h {
		t.Fatalf("AppendHash = %x", got)
	}
}

func TestLayer1FirstWins(t *testing.T) {
	var l Layer1
	items := []struct {
		q, p, txn string
		leader    int
		dup       bool
	}{
		{"q", "p", "a", 0, false},
		{"q", "p", "b", 1, false},
		{"q", "p", "a", 0, true},
		{"q", "p2", "a", 3, false}, // another partition
		{"q2", "p", "a", 4, false}, // another queue
		{"q", "p", "b", 1, true},
		{"q", "p2", "a", 3, true},
		// Separator-free keys: these would collide if concatenated naively.
		{"q", "pa", "", 7, false},
		{"qp", "a", "", 8, false},
		{"q", "p", "", 9, false},
		{"q", "p", "", 9, true},
	}
	for i, it := range items {
		leader, dup := l.Check(it.q, it.p, it.txn, i)
		if leader != it.leader || dup != it.dup {
			t.Errorf("item %d %v: got (%d, %v), want (%d, %v)", i, it, leader, dup, it.leader, it.dup)
		}
	}
	l.Reset()
	if leader, dup := l.Check("q", "p", "a", 42); leader != 42 || dup {
		t.Fatalf("after Reset: (%d, %v)", leader, dup)
	}
}

func TestLayer1ResetDropsLargeMap(t *testing.T) {
	var l Layer1
	for i := range layer1Retain + 1 {
		l.Check("q", "p", fmt.Sprint(i), i)
	}
	l.Reset()
	if l.seen != nil {
		t.Fatal("large map retained")
	}
	if _, dup := l.Check("q", "p", "0", 0); dup {
		t.Fatal("dup after Reset")
	}
}

func TestLayer1NoAllocSteadyState(t *testing.T) {
	var l Layer1
	txns := make([]string, 100)
	for i := range txns {
		txns[i] = fmt.Sprint("txn-", i%60)
	}
	run := func() {
		l.Reset()
		for i, txn := range txns {
			l.Check("queue", "partition", txn, i)
		}
	}
	run()
	if a := testing.AllocsPerRun(50, run); a != 0 {
		t.Fatalf("%v allocations per push", a)
	}
}

func naiveLeaders(hashes []Hash) []int {
	out := make([]int, len(hashes))
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

func TestLeaders(t *testing.T) {
	a, b, c := Sum("a"), Sum("b"), Sum("c")
	got := Leaders([]Hash{a, b, a, c, b, a}, nil)
	want := []int{0, 1, 0, 3, 1, 0}
	if !slices.Equal(got, want) {
		t.Fatalf("Leaders = %v, want %v", got, want)
	}
	if got := Leaders(nil, []int{7, 7}); len(got) != 0 {
		t.Fatalf("Leaders(nil) = %v", got)
	}

	// Both the scan and the map path, against a naive reference.
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, scanMax, scanMax + 1, 100, 1000} {
		hashes := make([]Hash, n)
		for i := range hashes {
			hashes[i] = Sum(fmt.Sprint(r.IntN(n/2 + 1)))
		}
		out := make([]int, 3, n+5) // reused backing array, stale length
		got := Leaders(hashes, out)
		if !slices.Equal(got, naiveLeaders(hashes)) {
			t.Fatalf("n=%d: Leaders = %v, want %v", n, got, naiveLeaders(hashes))
		}
		if &got[0] != &out[:1][0] {
			t.Fatalf("n=%d: out not reused", n)
		}
	}
}

func TestLeadersNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	hashes := make([]Hash, 1000)
	for i := range hashes {
		hashes[i] = Sum(fmt.Sprint(i % 900))
	}
	out := make([]int, len(hashes))
	Leaders(hashes, out)
	// sync.Pool may be emptied by a GC during the run, so allow a little slack.
	if a := testing.AllocsPerRun(100, func() { out = Leaders(hashes, out) }); a > 1 {
		t.Fatalf("%v allocations per call", a)
	}
}

func BenchmarkSum(b *testing.B) {
	txn := "0190b2c4-7d1e-7a3b-8c9d-0123456789ab"
	for b.Loop() {
		_ = Sum(txn)
	}
}

func BenchmarkLayer1(b *testing.B) {
	txns := make([]string, 1000)
	for i := range txns {
		txns[i] = fmt.Sprintf("0190b2c4-7d1e-7a3b-8c9d-%012d", i)
	}
	var l Layer1
	b.ReportAllocs()
	for b.Loop() {
		l.Reset()
		for i, txn := range txns {
			l.Check("orders", "customer-17", txn, i)
		}
	}
	b.ReportMetric(float64(b.N*len(txns))/b.Elapsed().Seconds(), "items/s")
}

func BenchmarkLeaders(b *testing.B) {
	for _, n := range []int{8, scanMax, scanMax + 1, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			hashes := make([]Hash, n)
			for i := range hashes {
				hashes[i] = Sum(fmt.Sprint(i))
			}
			out := make([]int, n)
			b.ReportAllocs()
			for b.Loop() {
				out = Leaders(hashes, out)
			}
		})
	}
}

// FuzzLeaders derives hashes from a small alphabet so duplicates are common
// and checks both code paths against the naive definition.
func FuzzLeaders(f *testing.F) {
	f.Add([]byte("abcabc"))
	f.Add(bytes.Repeat([]byte("abcdefgh"), 20))
	f.Fuzz(func(t *testing.T, in []byte) {
		hashes := make([]Hash, len(in))
		for i, c := range in {
			hashes[i] = Sum(string(rune('a' + c%8)))
		}
		got := Leaders(hashes, nil)
		if want := naiveLeaders(hashes); !slices.Equal(got, want) {
			t.Fatalf("Leaders = %v, want %v", got, want)
		}
	})
}

// FuzzLayer1 checks Check against a map keyed on an unambiguous encoding of
// the triple.
func FuzzLayer1(f *testing.F) {
	f.Add([]byte{0, 1, 2, 0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		parts := []string{"", "a", "b", "ab"}
		var l Layer1
		ref := map[string]int{}
		for i, c := range in {
			q, p, txn := parts[c&3], parts[c>>2&3], parts[c>>4&3]
			key := fmt.Sprintf("%q %q %q", q, p, txn)
			want, wantDup := i, false
			if j, ok := ref[key]; ok {
				want, wantDup = j, true
			} else {
				ref[key] = i
			}
			if got, dup := l.Check(q, p, txn, i); got != want || dup != wantDup {
				t.Fatalf("item %d (%s): got (%d, %v), want (%d, %v)", i, key, got, dup, want, wantDup)
			}
		}
	})
}
