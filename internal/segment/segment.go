// Package segment compresses and decompresses segment blobs: the packed
// frames of one flush (see package frame) as they are stored in a row.
//
// A blob is a one-byte codec header followed by the body:
//
//	0 (CodecRaw)   body is the packed frames verbatim
//	1 (CodecZstd)  body is a single zstd frame (with checksum) of the packed frames
//
// Compress picks raw when the input is shorter than MinCompress (zstd's
// frame overhead would eat any gain), when zstd does not make it smaller, or
// when it is larger than MaxDecompressed (so every blob Compress writes can
// be read back). Decompress refuses zstd bodies that expand past
// MaxDecompressed, so a hostile blob cannot exhaust memory.
//
// zstd runs at SpeedFastest because CPU, not storage, is the limit on the
// 2-core target: the design notes measured about 1.4M msgs/s there against
// about 475k at the default level, for a ratio only a few percent worse
// (BenchmarkCompress compares both). Encoders and decoders live in small
// bounded pools, each with concurrency 1 and used only through
// EncodeAll/DecodeAll, which start no goroutines.
package segment

import (
	"errors"
	"fmt"
	"runtime"
	"slices"

	"github.com/klauspost/compress/zstd"

	"github.com/e03140bc/queen/internal/frame"
)

// Codec header values.
const (
	CodecRaw  byte = 0
	CodecZstd byte = 1
)

const (
	// MinCompress is the raw size below which Compress stores raw. Small
	// segments are what single-item pushes make under light fusion; zstd's
	// per-call setup (about 3 µs) dominates them and saves few bytes
	// (a 1-frame segment compresses 1.4x), so they are not worth it.
	MinCompress = 1024
	// SmallBlock is the raw size below which zstd leaves literals without
	// entropy coding. Building the Huffman and FSE tables is most of the
	// cost of a few-KiB block: a 10-message segment (2.3 KiB) compresses
	// in 0.53 µs a message instead of 0.89, to 0.42 of its size instead of
	// 0.33 (BenchmarkSegmentSizes). The output is ordinary zstd.
	SmallBlock = 16 << 10
	// MaxDecompressed caps the size of a decompressed zstd body (64 MiB).
	// zstd enforces it per frame while decoding and on the total between
	// frames, so a hostile multi-frame blob can make Decompress hold about
	// twice this much before it is rejected; Compress writes one frame.
	MaxDecompressed = 64 << 20
)

// ErrCorrupt is wrapped by every Decompress error.
var ErrCorrupt = errors.New("segment: corrupt blob")

// Level is the zstd level Compress uses.
const Level = zstd.SpeedFastest

// pool keeps up to cap(ch) values forever. sync.Pool would drop them at
// every other GC, and a fresh encoder costs about 70µs and 600 KiB before
// its first block, which is a real tax on a GC-heavy push path.
type pool[T any] struct {
	ch  chan T
	new func() T
}

func newPool[T any](newT func() T) *pool[T] {
	// Encoding is CPU-bound, so more values than procs are rarely busy at once.
	return &pool[T]{ch: make(chan T, runtime.GOMAXPROCS(0)), new: newT}
}

func (p *pool[T]) get() T {
	select {
	case v := <-p.ch:
		return v
	default:
		return p.new()
	}
}

// put drops v when the pool is full; a value used only through
// EncodeAll/DecodeAll owns no goroutines, so the GC reclaims it whole.
func (p *pool[T]) put(v T) {
	select {
	case p.ch <- v:
	default:
	}
}

func newEncoderPool(level zstd.EncoderLevel, opts ...zstd.EOption) *pool[*zstd.Encoder] {
	return newPool(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil, append([]zstd.EOption{
			zstd.WithEncoderLevel(level),
			zstd.WithEncoderConcurrency(1),
			// The history buffer is twice the window: 1 MiB still spans a
			// typical segment but keeps each pooled encoder near 2 MiB, not 8.
			zstd.WithWindowSize(1 << 20),
		}, opts...)...)
		if err != nil {
			// Only reachable with invalid options, which are constants here.
			panic("segment: zstd.NewWriter: " + err.Error())
		}
		return e
	})
}

var (
	encoders      = newEncoderPool(Level)
	smallEncoders = newEncoderPool(Level, zstd.WithNoEntropyCompression(true))
	decoders      = newPool(func() *zstd.Decoder {
		d, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1),
			// Also caps the accepted window size.
			zstd.WithDecoderMaxMemory(MaxDecompressed),
		)
		if err != nil {
			panic("segment: zstd.NewReader: " + err.Error())
		}
		return d
	})
)

// Compress appends the blob for raw (header and body) to dst and returns the
// extended slice. raw must not overlap the spare capacity of dst. It is safe
// for concurrent use, as is Decompress.
func Compress(dst, raw []byte) []byte {
	if len(raw) < SmallBlock {
		return compress(smallEncoders, dst, raw)
	}
	return compress(encoders, dst, raw)
}

// StoresRaw reports whether Compress stores n bytes of packed frames raw,
// whatever they are: then the blob is CodecRaw and the frames, which a
// caller can append to the blob directly instead of packing them elsewhere
// for Compress to copy.
func StoresRaw(n int) bool {
	return n < MinCompress || n > MaxDecompressed
}

func compress(p *pool[*zstd.Encoder], dst, raw []byte) []byte {
	if StoresRaw(len(raw)) {
		return appendRaw(dst, raw)
	}
	start := len(dst)
	dst = append(dst, CodecZstd)
	e := p.get()
	dst = e.EncodeAll(raw, dst)
	p.put(e)
	if len(dst)-start-1 >= len(raw) {
		return appendRaw(dst[:start], raw)
	}
	return dst
}

func appendRaw(dst, raw []byte) []byte {
	return append(AppendRawHeader(dst, len(raw)), raw...)
}

// AppendRawHeader appends the start of a blob stored raw, with room for n
// bytes of packed frames, which the caller appends after it as they are:
// the blob Compress makes of them when StoresRaw(n).
func AppendRawHeader(dst []byte, n int) []byte {
	return append(slices.Grow(dst, 1+n), CodecRaw)
}

// Decompress appends the packed frames stored in blob to dst and returns the
// extended slice; the frames are copied, never aliased to blob. On error it
// returns dst unchanged (contents past len(dst)
// may have been overwritten) and an error wrapping ErrCorrupt.
func Decompress(dst, blob []byte) ([]byte, error) {
	if len(blob) == 0 {
		return dst, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	switch blob[0] {
	case CodecRaw:
		return append(dst, blob[1:]...), nil
	case CodecZstd:
		if len(blob) == 1 {
			// zstd reads no frames as empty output; Compress never writes this.
			return dst, fmt.Errorf("%w: empty zstd body", ErrCorrupt)
		}
		d := decoders.get()
		out, err := d.DecodeAll(blob[1:], dst)
		decoders.put(d)
		if err != nil {
			return dst, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
		}
		return out, nil
	default:
		return dst, fmt.Errorf("%w: unknown codec %d", ErrCorrupt, blob[0])
	}
}

// Single is the raw-codec blob holding f alone: what a re-enqueue appends
// (a failure the skip policy sends to the tail, a requeued dead letter), the
// frame exactly as it was stored. Raw because one frame is below
// MinCompress in the common case, and because the previous release's
// raw_segment builds the same.
func Single(f *frame.Frame) []byte {
	return frame.Append(append(make([]byte, 0, 1+frame.Size(f)), CodecRaw), f)
}
