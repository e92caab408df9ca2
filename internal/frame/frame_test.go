package frame

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gofrs/uuid/v5"
)

func testID(b byte) uuid.UUID {
	var id uuid.UUID
	for i := range id {
		id[i] = b + byte(i)
	}
	return id
}

func sampleFrames() []Frame {
	large := make([]byte, 1<<20)
	for i := range large {
		large[i] = byte(i * 7)
	}
	return []Frame{
		{ID: testID(1), TransactionID: "txn-1", Payload: []byte(`{"a":1}`)},
		{ID: testID(2), TransactionID: "txn-2", Payload: []byte{}},
		{ID: testID(3), TransactionID: "txn-3", Payload: nil},
		{ID: testID(4), TransactionID: "", Payload: []byte("no txn")},
		{ID: testID(5), TransactionID: "", Payload: nil},
		{ID: testID(6), Flags: FlagHeaders, TransactionID: "headed", Headers: EncodeHeaders(map[string]string{"traceparent": "00-abc-01", "a": ""}), Payload: []byte("p")},
		{ID: testID(7), Flags: FlagEncrypted, TransactionID: "enc", Payload: []byte{0, 1, 2, 3}},
		{ID: testID(8), Flags: FlagEncrypted | FlagHeaders, TransactionID: "both", Headers: EncodeHeaders(map[string]string{"h": "v"}), Payload: nil},
		// 200 bytes needs a two-byte varint.
		{ID: testID(9), TransactionID: strings.Repeat("x", 200), Payload: []byte("long txn")},
		{ID: testID(10), TransactionID: "ünïcødé", Payload: large},
		{ID: testID(11), Flags: FlagKey, TransactionID: "keyed", Key: "customer-42", Payload: []byte("k")},
		{ID: testID(12), Flags: FlagKey | FlagEncrypted | FlagHeaders, TransactionID: "", Key: "ß", Headers: EncodeHeaders(map[string]string{"ü": "ß", "z": strings.Repeat("v", 300)}), Payload: []byte{9}},
		// 255 bytes needs a two-byte varint.
		{ID: testID(13), Flags: FlagKey, TransactionID: "t", Key: strings.Repeat("k", 255), Payload: nil},
	}
}

func equalFrame(a, b *Frame) bool {
	return a.ID == b.ID && a.Flags == b.Flags && a.TransactionID == b.TransactionID && a.Key == b.Key &&
		bytes.Equal(a.Headers, b.Headers) && bytes.Equal(a.Payload, b.Payload)
}

func TestRoundTripSingle(t *testing.T) {
	for i, want := range sampleFrames() {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			blob := Append(nil, &want)
			if len(blob) != Size(&want) {
				t.Fatalf("len = %d, Size = %d", len(blob), Size(&want))
			}
			got, err := DecodeAll(blob)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || !equalFrame(&got[0], &want) {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestRoundTripConcatenated(t *testing.T) {
	frames := sampleFrames()
	var blob []byte
	for i := range frames {
		blob = Append(blob, &frames[i])
	}
	n, err := Count(blob)
	if err != nil || n != len(frames) {
		t.Fatalf("Count = %d, %v", n, err)
	}
	got, err := DecodeAll(blob)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(frames) {
		t.Fatalf("got %d frames, want %d", len(got), len(frames))
	}
	for k := range frames {
		if !equalFrame(&got[k], &frames[k]) {
			t.Errorf("DecodeAll[%d] mismatch", k)
		}
		f, err := At(blob, k)
		if err != nil {
			t.Fatalf("At(%d): %v", k, err)
		}
		if !equalFrame(&f, &frames[k]) {
			t.Errorf("At(%d) mismatch", k)
		}
	}
	for _, k := range []int{-1, len(frames), len(frames) + 5} {
		if _, err := At(blob, k); !errors.Is(err, ErrNotFound) {
			t.Errorf("At(%d) err = %v, want ErrNotFound", k, err)
		}
	}
	var seen []int
	err = Decode(blob, func(k int, f *Frame) error {
		seen = append(seen, k)
		return nil
	})
	if err != nil || len(seen) != len(frames) || seen[len(seen)-1] != len(frames)-1 {
		t.Fatalf("Decode indices %v, err %v", seen, err)
	}
}

func TestEmptyBlob(t *testing.T) {
	got, err := DecodeAll(nil)
	if err != nil || len(got) != 0 {
		t.Fatalf("DecodeAll(nil) = %v, %v", got, err)
	}
	if _, err := At(nil, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("At(nil, 0) err = %v", err)
	}
}

func TestPayloadCapacityClipped(t *testing.T) {
	a := Frame{ID: testID(1), TransactionID: "a", Payload: []byte("first")}
	b := Frame{ID: testID(2), TransactionID: "b", Payload: []byte("second")}
	blob := Append(Append(nil, &a), &b)
	got, err := DecodeAll(blob)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(got[0].Payload, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"...)
	again, err := At(blob, 1)
	if err != nil || !equalFrame(&again, &b) {
		t.Fatalf("appending to a payload clobbered the next frame: %+v, %v", again, err)
	}
}

func TestAppendNoAlloc(t *testing.T) {
	f := Frame{ID: testID(1), TransactionID: "txn", Headers: EncodeHeaders(map[string]string{"k": "v"}), Payload: make([]byte, 200)}
	buf := make([]byte, 0, Size(&f)+16)
	allocs := testing.AllocsPerRun(100, func() {
		buf = Append(buf[:0], &f)
	})
	if allocs != 0 {
		t.Fatalf("Append allocated %v times", allocs)
	}
}

func TestAppendDropsUnknownFlags(t *testing.T) {
	f := Frame{ID: testID(1), Flags: 0xf8 | FlagHeaders | FlagEncrypted, TransactionID: "t"}
	got, err := DecodeAll(Append(nil, &f))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Flags != FlagEncrypted {
		t.Fatalf("flags = %#x", got[0].Flags)
	}
	if Size(&f) != len(Append(nil, &f)) {
		t.Fatal("Size disagrees with Append for unknown flags")
	}
}

func TestCallbackErrorReturnedUnchanged(t *testing.T) {
	f := Frame{ID: testID(1)}
	blob := Append(Append(nil, &f), &f)
	stop := errors.New("stop")
	calls := 0
	err := Decode(blob, func(int, *Frame) error { calls++; return stop })
	if err != stop || calls != 1 {
		t.Fatalf("err = %v, calls = %d", err, calls)
	}
}

// rawFrame builds a frame by hand so tests can produce malformed bodies.
func rawFrame(body ...[]byte) []byte {
	b := bytes.Join(body, nil)
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func TestCorrupt(t *testing.T) {
	good := Append(nil, &Frame{ID: testID(1), TransactionID: "abc", Headers: EncodeHeaders(map[string]string{"n": "v"}), Payload: []byte("xyz")})
	id := make([]byte, 16)
	cases := map[string][]byte{
		"1 trailing byte":             append(bytes.Clone(good), 0),
		"3 trailing bytes":            append(bytes.Clone(good), 1, 2, 3),
		"truncated body":              good[:len(good)-1],
		"length exceeds blob":         rawFrame([]byte{0}, id, []byte{0})[:10],
		"huge length":                 {0xff, 0xff, 0xff, 0xff, 0},
		"empty body":                  rawFrame(),
		"body without varint":         rawFrame([]byte{0}, id),
		"unknown flag bit 3":          rawFrame([]byte{8}, id, []byte{0}),
		"key flag without key":        rawFrame([]byte{FlagKey}, id, []byte{0}),
		"key flag with empty key":     rawFrame([]byte{FlagKey}, id, []byte{0}, []byte{0}, []byte("p")),
		"non-minimal key varint":      rawFrame([]byte{FlagKey}, id, []byte{0}, []byte{0x81, 0x00}, []byte("k")),
		"key length past end":         rawFrame([]byte{FlagKey}, id, []byte{0}, []byte{5, 'k'}),
		"truncated headers after key": rawFrame([]byte{FlagKey | FlagHeaders}, id, []byte{0}, []byte{1, 'k'}, []byte{1, 1, 'n', 5, 'v'}),
		"headers flag, no headers":    rawFrame([]byte{FlagHeaders}, id, []byte{0}),
		"zero header count":           rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{0}, []byte("p")),
		"header count past end":       rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{2, 1, 'a', 0}),
		"empty header name":           rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{1, 0, 1, 'v'}),
		"header names unsorted":       rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{2, 1, 'b', 0, 1, 'a', 0}),
		"header names repeated":       rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{2, 1, 'a', 0, 1, 'a', 0}),
		"header name with NUL":        rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{1, 2, 'a', 0, 0}),
		"header value not UTF-8":      rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{1, 1, 'a', 1, 0xff}),
		"non-minimal header count":    rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{0x81, 0x00, 1, 'a', 0}),
		"non-minimal header length":   rawFrame([]byte{FlagHeaders}, id, []byte{0}, []byte{1, 0x81, 0x00, 'a', 0}),
		"unknown flag bit 7":          rawFrame([]byte{0x80}, id, []byte{0}),
		"txn length past end":         rawFrame([]byte{0}, id, []byte{5, 'a', 'b'}),
		"non-minimal varint":          rawFrame([]byte{0}, id, []byte{0x80, 0x00}),
		"unterminated varint":         rawFrame([]byte{0}, id, []byte{0x80, 0x80}),
		"overflowing varint":          rawFrame([]byte{0}, id, bytes.Repeat([]byte{0xff}, 10), []byte{1}),
		"good then corrupt prefix":    append(bytes.Clone(good), 9, 0, 0, 0, 1),
	}
	for name, blob := range cases {
		t.Run(name, func(t *testing.T) {
			err := Decode(blob, func(int, *Frame) error { return nil })
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Decode err = %v, want ErrCorrupt", err)
			}
			if _, err := DecodeAll(blob); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("DecodeAll err = %v, want ErrCorrupt", err)
			}
		})
	}
	// At must still reach frames before the damage.
	blob := append(bytes.Clone(good), 1, 2)
	if _, err := At(blob, 0); err != nil {
		t.Fatalf("At(0) before damage: %v", err)
	}
	if _, err := At(blob, 1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("At(1) on damage: %v", err)
	}
}

func TestDecodeRange(t *testing.T) {
	frames := sampleFrames()
	var blob []byte
	for i := range frames {
		blob = Append(blob, &frames[i])
	}
	for _, r := range [][2]int{{0, 0}, {3, 5}, {9, 9}, {8, 100}, {0, 9}, {5, 4}, {20, 30}} {
		var seen []int
		err := DecodeRange(blob, r[0], r[1], func(k int, f *Frame) error {
			if !equalFrame(f, &frames[k]) {
				t.Errorf("range %v: frame %d mismatch", r, k)
			}
			seen = append(seen, k)
			return nil
		})
		if err != nil {
			t.Fatalf("range %v: %v", r, err)
		}
		var want []int
		for k := r[0]; k <= r[1] && k < len(frames); k++ {
			want = append(want, k)
		}
		if fmt.Sprint(seen) != fmt.Sprint(want) {
			t.Fatalf("range %v visited %v, want %v", r, seen, want)
		}
	}
	// Frames before the range are not parsed: a bad body there goes unseen,
	// a bad body inside the range is reported.
	bad := append(rawFrame([]byte{0xff}, make([]byte, 16), []byte{0}), blob...)
	if err := DecodeRange(bad, 1, 2, func(int, *Frame) error { return nil }); err != nil {
		t.Fatalf("skipped frame was parsed: %v", err)
	}
	if err := DecodeRange(bad, 0, 2, func(int, *Frame) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad frame in range: %v", err)
	}
}

// ViewRange yields what DecodeRange does, as slices of the blob each
// clipped to its field: appending to one never writes into the next.
func TestViewRange(t *testing.T) {
	frames := sampleFrames()
	var blob []byte
	for i := range frames {
		blob = Append(blob, &frames[i])
	}
	orig := bytes.Clone(blob)
	n := 0
	err := ViewRange(blob, 0, len(frames), func(k int, v *View) error {
		var f Frame
		v.frame(&f)
		if !equalFrame(&f, &frames[k]) {
			t.Errorf("frame %d: view %+v, want %+v", k, f, frames[k])
		}
		for _, b := range [][]byte{v.TransactionID, v.Key, v.Headers, v.Payload} {
			_ = append(b, 0xee)
		}
		n++
		return nil
	})
	if err != nil || n != len(frames) {
		t.Fatalf("ViewRange: %d frames, %v", n, err)
	}
	if !bytes.Equal(blob, orig) {
		t.Fatal("appending to a view's field wrote into the blob")
	}
}

func FuzzDecode(f *testing.F) {
	frames := sampleFrames()
	var all []byte
	for i := range frames {
		if len(frames[i].Payload) > 1024 {
			continue // keep the corpus small
		}
		one := Append(nil, &frames[i])
		f.Add(one)
		all = append(all, one...)
	}
	f.Add(all)
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0})
	f.Add(rawFrame([]byte{FlagHeaders}, make([]byte, 16), []byte{0}, []byte{1, 1, 'a', 1, 'b'}))
	f.Add(rawFrame([]byte{FlagHeaders}, make([]byte, 16), []byte{0}, []byte{2, 1, 'b', 0, 1, 'a', 0}))
	f.Add(rawFrame([]byte{0}, make([]byte, 16), []byte{0x80, 0x00}))
	f.Add(rawFrame([]byte{FlagKey}, make([]byte, 16), []byte{0}, []byte{0}))
	f.Add(rawFrame([]byte{FlagKey | FlagHeaders}, make([]byte, 16), []byte{1, 't'}, []byte{2, 'k', 'k'}, []byte{2, 1, 'a', 0, 2, 'b', 'c', 1, 'd'}, []byte("pay")))
	f.Fuzz(func(t *testing.T, blob []byte) {
		var re []byte
		n := 0
		err := Decode(blob, func(k int, fr *Frame) error {
			if k != n {
				t.Fatalf("index %d, want %d", k, n)
			}
			n++
			re = Append(re, fr)
			at, err := At(blob, k)
			if err != nil || !equalFrame(&at, fr) {
				t.Fatalf("At(%d) disagrees with Decode: %v", k, err)
			}
			return nil
		})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		// The format has one encoding per frame, so accepted input must re-encode exactly.
		if !bytes.Equal(re, blob) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", blob, re)
		}
		if n > 0 {
			from, to := n/3, n-1-n/3
			seen := from
			if err := DecodeRange(blob, from, to, func(k int, fr *Frame) error {
				at, _ := At(blob, k)
				if k != seen || !equalFrame(&at, fr) {
					t.Fatalf("DecodeRange(%d, %d) gave frame %d at step %d", from, to, k, seen)
				}
				seen++
				return nil
			}); err != nil || seen != max(to+1, from) {
				t.Fatalf("DecodeRange(%d, %d) stopped at %d: %v", from, to, seen, err)
			}
		}
		if c, err := Count(blob); err != nil || c != n {
			t.Fatalf("Count = %d, %v; Decode saw %d", c, err, n)
		}
		if _, err := At(blob, n); !errors.Is(err, ErrNotFound) {
			t.Fatalf("At(%d) past end: %v", n, err)
		}
	})
}

func FuzzRoundTrip(f *testing.F) {
	f.Add(byte(0), []byte("0123456789abcdef"), "txn", "", "", "", "", []byte("payload"))
	f.Add(FlagEncrypted, []byte{}, "", "key", "traceparent", "00-x-01", "b", []byte{})
	f.Fuzz(func(t *testing.T, flags byte, id []byte, txn, key, h1, v1, h2 string, payload []byte) {
		in := Frame{Flags: flags & FlagEncrypted, TransactionID: txn, Key: key, Payload: payload}
		if key != "" {
			in.Flags |= FlagKey
		}
		hs := map[string]string{}
		for k, v := range map[string]string{h1: v1, h2: v1 + v1} {
			if k != "" && ValidHeaderText(k) && ValidHeaderText(v) {
				hs[k] = v
			}
		}
		if in.Headers = EncodeHeaders(hs); len(hs) > 0 {
			in.Flags |= FlagHeaders
		}
		if len(in.Headers) != HeadersSize(hs) {
			t.Fatalf("HeadersSize %d, encoded %d", HeadersSize(hs), len(in.Headers))
		}
		copy(in.ID[:], id)
		blob := Append([]byte("prefix"), &in)[len("prefix"):]
		if len(blob) != Size(&in) {
			t.Fatalf("len %d != Size %d", len(blob), Size(&in))
		}
		out, err := At(blob, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !equalFrame(&in, &out) {
			t.Fatalf("round trip: in %+v out %+v", in, out)
		}
		got, err := DecodeHeaders(out.Headers)
		if err != nil || len(got) != len(hs) {
			t.Fatalf("DecodeHeaders = %v, %v; want %v", got, err, hs)
		}
		for k, v := range hs {
			if got[k] != v {
				t.Fatalf("header %q = %q, want %q", k, got[k], v)
			}
		}
	})
}

func benchFrames(n int) []Frame {
	frames := make([]Frame, n)
	for i := range frames {
		id := testID(byte(i))
		payload := fmt.Appendf(nil, `{"order":%d,"customer":"c-%d","amount":%d.%02d,"currency":"EUR","note":"%s"}`,
			i, i*31%997, i*7%500, i%100, strings.Repeat("z", 100+i%50))
		frames[i] = Frame{ID: id, TransactionID: id.String(), Payload: payload}
	}
	return frames
}

func BenchmarkAppend(b *testing.B) {
	frames := benchFrames(1000)
	size := 0
	for i := range frames {
		size += Size(&frames[i])
	}
	buf := make([]byte, 0, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		buf = buf[:0]
		for i := range frames {
			buf = Append(buf, &frames[i])
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	frames := benchFrames(1000)
	var blob []byte
	for i := range frames {
		blob = Append(blob, &frames[i])
	}
	b.SetBytes(int64(len(blob)))
	b.ReportAllocs()
	for b.Loop() {
		err := Decode(blob, func(int, *Frame) error { return nil })
		if err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAtLast(b *testing.B) {
	frames := benchFrames(1000)
	var blob []byte
	for i := range frames {
		blob = Append(blob, &frames[i])
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := At(blob, len(frames)-1); err != nil {
			b.Fatal(err)
		}
	}
}

// Frames written by the first release (before keys and headers existed,
// when bit 1 was an unused trace flag) decode unchanged: these bytes are
// what its encoder produced for a plain and an encrypted frame.
func TestDecodesFramesOfTheFirstRelease(t *testing.T) {
	blob, err := hex.DecodeString("19000000000102030405060708090a0b0c0d0e0f1002743168656c6c6f" +
		"14000000010102030405060708090a0b0c0d0e0f1000ff00")
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeAll(blob)
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.UUID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	want := []Frame{
		{ID: id, TransactionID: "t1", Payload: []byte("hello")},
		{ID: id, Flags: FlagEncrypted, Payload: []byte{0xff, 0x00}},
	}
	if len(got) != len(want) {
		t.Fatalf("%d frames, want %d", len(got), len(want))
	}
	for i := range want {
		if !equalFrame(&got[i], &want[i]) {
			t.Fatalf("frame %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	// And the current encoder still writes them byte for byte.
	var again []byte
	for i := range want {
		again = Append(again, &want[i])
	}
	if !bytes.Equal(again, blob) {
		t.Fatalf("re-encoded %x, want %x", again, blob)
	}
}

// Validating a frame's headers allocates nothing, and decoding them only
// the map and its strings: a consumer decodes them for every message.
func TestHeadersAllocs(t *testing.T) {
	h := map[string]string{"source": "shop", "trace": "t-1"}
	f := Frame{ID: testID(1), TransactionID: "txn", Headers: EncodeHeaders(h), Payload: []byte("p")}
	plain := f
	plain.Headers = nil
	allocs := func(f *Frame) float64 {
		blob := Append(nil, f)
		return testing.AllocsPerRun(100, func() {
			if err := ViewRange(blob, 0, 0, func(int, *View) error { return nil }); err != nil {
				t.Fatal(err)
			}
		})
	}
	if with, without := allocs(&f), allocs(&plain); with != without {
		t.Errorf("ViewRange of a frame with headers: %v allocations, without: %v", with, without)
	}
	var got map[string]string
	n := testing.AllocsPerRun(100, func() {
		var err error
		if got, err = DecodeHeaders(f.Headers); err != nil {
			t.Fatal(err)
		}
	})
	if fmt.Sprint(got) != fmt.Sprint(h) {
		t.Fatalf("DecodeHeaders = %v, want %v", got, h)
	}
	if want := float64(2 + 2*len(h)); n > want {
		t.Errorf("DecodeHeaders of %d headers: %v allocations, want at most %v (the map and its strings)", len(h), n, want)
	}
}
