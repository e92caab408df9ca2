package segment

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// jsonish returns n bytes of repetitive but not constant JSON-like text.
func jsonish(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	var b []byte
	for len(b) < n {
		b = fmt.Appendf(b, `{"orderId":"ord-%08d","customer":%d,"amount":%d.%02d,"currency":"EUR"}`,
			r.IntN(1e8), r.IntN(5000), r.IntN(1000), r.IntN(100))
	}
	return b[:n]
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 9))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	cases := []struct {
		name  string
		raw   []byte
		codec byte
	}{
		{"nil", nil, CodecRaw},
		{"empty", []byte{}, CodecRaw},
		{"tiny", []byte("abc"), CodecRaw},
		{"just below threshold", bytes.Repeat([]byte("a"), MinCompress-1), CodecRaw},
		{"at threshold", bytes.Repeat([]byte("a"), MinCompress), CodecZstd},
		{"json 4 KiB", jsonish(1, 4<<10), CodecZstd},
		{"json just below SmallBlock", jsonish(5, SmallBlock-1), CodecZstd},
		{"json at SmallBlock", jsonish(6, SmallBlock), CodecZstd},
		{"json 1 MiB", jsonish(2, 1<<20), CodecZstd},
		{"json 3 MiB", jsonish(3, 3<<20), CodecZstd},
		{"random 4 KiB", randomBytes(4, 4<<10), CodecRaw},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prefix := []byte("keep")
			blob := Compress(bytes.Clone(prefix), c.raw)
			if !bytes.HasPrefix(blob, prefix) {
				t.Fatal("Compress clobbered dst")
			}
			blob = blob[len(prefix):]
			if blob[0] != c.codec {
				t.Fatalf("codec %d, want %d", blob[0], c.codec)
			}
			if c.codec == CodecZstd && len(blob) >= len(c.raw)+1 {
				t.Fatalf("zstd chosen but %d >= %d", len(blob), len(c.raw)+1)
			}
			if c.codec == CodecRaw && len(blob) != len(c.raw)+1 {
				t.Fatalf("raw blob is %d bytes for %d", len(blob), len(c.raw))
			}
			out, err := Decompress(bytes.Clone(prefix), blob)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(out, prefix) || !bytes.Equal(out[len(prefix):], c.raw) {
				t.Fatal("round trip mismatch")
			}
		})
	}
}

func TestOversizeStoredRaw(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates over 128 MiB")
	}
	raw := make([]byte, MaxDecompressed+1)
	blob := Compress(nil, raw)
	if blob[0] != CodecRaw {
		t.Fatalf("codec %d for an input over MaxDecompressed", blob[0])
	}
	out, err := Decompress(nil, blob)
	if err != nil || len(out) != len(raw) {
		t.Fatalf("len %d, err %v", len(out), err)
	}
}

func zstdBlob(t testing.TB, raw []byte, stream bool) []byte {
	t.Helper()
	var body bytes.Buffer
	e, err := zstd.NewWriter(&body, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if stream {
		// A streamed frame does not declare its size, so the cap must be
		// enforced while decoding rather than from the header.
		if _, err := e.Write(raw); err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		return append([]byte{CodecZstd}, body.Bytes()...)
	}
	defer e.Close()
	return e.EncodeAll(raw, []byte{CodecZstd})
}

func TestDecompressSizeCap(t *testing.T) {
	if testing.Short() {
		t.Skip("decodes 64 MiB")
	}
	big := make([]byte, MaxDecompressed+1)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			blob := zstdBlob(t, big, stream)
			if len(blob) > 1<<20 {
				t.Fatalf("bomb is not small: %d bytes", len(blob))
			}
			out, err := Decompress(nil, blob)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if out != nil {
				t.Fatal("dst changed on error")
			}
		})
	}
	// Exactly at the cap is fine.
	out, err := Decompress(nil, zstdBlob(t, big[:MaxDecompressed], true))
	if err != nil || len(out) != MaxDecompressed {
		t.Fatalf("at cap: len %d, err %v", len(out), err)
	}
}

func TestDecompressCorrupt(t *testing.T) {
	good := Compress(nil, jsonish(5, 8<<10))
	if good[0] != CodecZstd {
		t.Fatal("fixture not compressed")
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0xff
	badSum := bytes.Clone(good)
	badSum[len(badSum)-1] ^= 0x01
	cases := map[string][]byte{
		"empty":            {},
		"unknown codec 2":  {2, 1, 2, 3},
		"unknown codec ff": {0xff},
		"zstd no body":     {CodecZstd},
		"zstd garbage":     {CodecZstd, 1, 2, 3, 4, 5, 6, 7, 8},
		"truncated":        good[:len(good)-10],
		"flipped byte":     flipped,
		"bad checksum":     badSum,
		"trailing garbage": append(bytes.Clone(good), 1, 2, 3),
	}
	for name, blob := range cases {
		t.Run(name, func(t *testing.T) {
			dst := []byte("dst")
			out, err := Decompress(dst, blob)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
			if !bytes.Equal(out, []byte("dst")) {
				t.Fatalf("dst = %q on error", out)
			}
		})
	}
}

func TestConcurrentNoLeak(t *testing.T) {
	defer goleak.VerifyNone(t)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			raw := jsonish(uint64(g), 64<<10)
			var blob, out []byte
			for range 20 {
				blob = Compress(blob[:0], raw)
				var err error
				out, err = Decompress(out[:0], blob)
				if err != nil || !bytes.Equal(out, raw) {
					t.Errorf("goroutine %d: round trip failed: %v", g, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func FuzzDecompress(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{CodecRaw})
	f.Add([]byte{CodecRaw, 1, 2, 3})
	f.Add([]byte{7, 1})
	f.Add([]byte{CodecZstd})
	good := Compress(nil, jsonish(6, 2<<10))
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add(zstdBlob(f, jsonish(7, 300), true))
	f.Fuzz(func(t *testing.T, blob []byte) {
		dst := []byte("dst")
		out, err := Decompress(dst, blob)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			if !bytes.Equal(out, []byte("dst")) {
				t.Fatalf("dst changed on error")
			}
			return
		}
		if !bytes.HasPrefix(out, []byte("dst")) {
			t.Fatal("dst prefix lost")
		}
		if blob[0] == CodecRaw && !bytes.Equal(out[3:], blob[1:]) {
			t.Fatal("raw body altered")
		}
		if len(out)-3 > MaxDecompressed {
			t.Fatalf("decompressed %d bytes, over the cap", len(out)-3)
		}
	})
}

func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte{})
	f.Add(jsonish(8, 127))
	f.Add(jsonish(9, 1000))
	f.Add(randomBytes(10, 500))
	f.Fuzz(func(t *testing.T, raw []byte) {
		blob := Compress(nil, raw)
		if len(blob) > len(raw)+1 {
			t.Fatalf("blob %d bytes for %d raw", len(blob), len(raw))
		}
		out, err := Decompress(nil, blob)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, raw) {
			t.Fatal("round trip mismatch")
		}
	})
}

// StoresRaw says which sizes Compress stores raw whatever the frames are,
// which the push path relies on to pack such a blob itself.
func TestStoresRawIsCompressChoice(t *testing.T) {
	for _, n := range []int{0, 1, 200, MinCompress - 1, MinCompress, 4 << 10, SmallBlock, SmallBlock + 1} {
		raw := bytes.Repeat([]byte{'a'}, n) // compresses well if compressed at all
		blob := Compress(nil, raw)
		if got := blob[0] == CodecRaw; got != StoresRaw(n) {
			t.Fatalf("%d bytes: stored raw %v, StoresRaw %v", n, got, StoresRaw(n))
		}
	}
	if !StoresRaw(MaxDecompressed + 1) {
		t.Fatal("StoresRaw(MaxDecompressed+1) = false; Compress stores it raw")
	}
}
