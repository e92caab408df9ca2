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
// zstd runs at SpeedFastest: on the target 2-core machine it packs about
// 1.4M msgs/s against about 475k at the default level, and CPU, not storage,
// is the limit. Encoders and decoders are pooled, each with concurrency 1
// and used only through EncodeAll/DecodeAll, which start no goroutines, so
// a pooled value the GC drops leaks nothing.
package segment

import (
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Codec header values.
const (
	CodecRaw  byte = 0
	CodecZstd byte = 1
)

const (
	// MinCompress is the raw size below which Compress stores raw.
	MinCompress = 128
	// MaxDecompressed caps the size of a decompressed zstd body (64 MiB).
	MaxDecompressed = 64 << 20
)

// ErrCorrupt is wrapped by every Decompress error.
var ErrCorrupt = errors.New("segment: corrupt blob")

// Level is the zstd level Compress uses.
const Level = zstd.SpeedFastest

type encoderPool struct {
	level zstd.EncoderLevel
	pool  sync.Pool
}

func (p *encoderPool) get() *zstd.Encoder {
	if e, ok := p.pool.Get().(*zstd.Encoder); ok {
		return e
	}
	e, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(p.level),
		zstd.WithEncoderConcurrency(1),
		// The history buffer is twice the window: 1 MiB still spans a
		// typical segment but keeps each pooled encoder near 2 MiB, not 8.
		zstd.WithWindowSize(1<<20),
	)
	if err != nil {
		// Only reachable with invalid options, which are constants here.
		panic("segment: zstd.NewWriter: " + err.Error())
	}
	return e
}

func (p *encoderPool) put(e *zstd.Encoder) { p.pool.Put(e) }

var (
	encoders = encoderPool{level: Level}
	decoders sync.Pool
)

func getDecoder() *zstd.Decoder {
	if d, ok := decoders.Get().(*zstd.Decoder); ok {
		return d
	}
	d, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		// Also caps the accepted window size.
		zstd.WithDecoderMaxMemory(MaxDecompressed),
	)
	if err != nil {
		panic("segment: zstd.NewReader: " + err.Error())
	}
	return d
}

// Compress appends the blob for raw (header and body) to dst and returns the
// extended slice.
func Compress(dst, raw []byte) []byte {
	return encoders.compress(dst, raw)
}

func (p *encoderPool) compress(dst, raw []byte) []byte {
	if len(raw) < MinCompress || len(raw) > MaxDecompressed {
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
	dst = append(dst, CodecRaw)
	return append(dst, raw...)
}

// Decompress appends the packed frames stored in blob to dst and returns the
// extended slice. On error it returns dst unchanged (contents past len(dst)
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
		d := getDecoder()
		out, err := d.DecodeAll(blob[1:], dst)
		decoders.Put(d)
		if err != nil {
			return dst, fmt.Errorf("%w: zstd: %w", ErrCorrupt, err)
		}
		return out, nil
	default:
		return dst, fmt.Errorf("%w: unknown codec %d", ErrCorrupt, blob[0])
	}
}
