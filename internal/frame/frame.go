// Package frame encodes and decodes message frames. A segment's payload
// (before compression, see package segment) is a plain concatenation of
// frames with no header, count or padding.
//
// Wire format of one frame:
//
//	u32 little-endian   length of the rest of the frame (bytes after this prefix)
//	u8                  flags: bit0 FlagEncrypted, bit1 FlagHeaders, bit2 FlagKey, other bits zero
//	[16]byte            message id (UUID)
//	uvarint + bytes     transaction id (UTF-8 not enforced)
//	uvarint + bytes     ordering key, present only if FlagKey is set; at least 1 byte
//	headers             present only if FlagHeaders is set (below)
//	bytes               payload: every remaining byte of the frame
//
// The headers field is a uvarint count (at least 1), then per header a
// uvarint-length name and a uvarint-length value. Names are non-empty,
// strictly ascending bytewise (so unique); names and values are UTF-8
// without NUL.
//
// FlagEncrypted means the payload is AES-GCM ciphertext; this package does
// not interpret it. The key and the headers are never encrypted. The varints
// must be minimally encoded, unknown flag bits must be zero, FlagKey is set
// if and only if the key is non-empty and FlagHeaders if and only if there
// is at least one header, so every byte string has at most one decoding and
// re-encoding a decoded frame reproduces its bytes exactly.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/gofrs/uuid/v5"
)

// Flag bits of Frame.Flags.
const (
	FlagEncrypted byte = 1 << 0
	// FlagHeaders is derived from Frame.Headers by Append: set exactly when
	// the encoded headers are non-empty.
	FlagHeaders byte = 1 << 1
	// FlagKey is derived from Frame.Key by Append: set exactly when the key
	// is non-empty.
	FlagKey byte = 1 << 2

	knownFlags = FlagEncrypted | FlagHeaders | FlagKey
)

const (
	prefixSize = 4
	idSize     = 16
	// flags + id + the shortest varint (a zero-length transaction id).
	minBody = 1 + idSize + 1
)

// MaxBody is the largest possible frame body (everything after the length
// prefix), bounded by the u32 prefix.
const MaxBody = math.MaxUint32

var (
	// ErrCorrupt is wrapped by every error about malformed input.
	ErrCorrupt = errors.New("frame: corrupt")
	// ErrNotFound is returned by At when the blob has fewer frames.
	ErrNotFound = errors.New("frame: not found")
)

// Frame is one decoded message. After decoding, Payload aliases the input
// blob and has its capacity clipped, so appending to it never overwrites the
// next frame.
type Frame struct {
	ID            uuid.UUID
	Flags         byte
	TransactionID string
	Key           string // the ordering key; "" for none
	// Headers is the encoded headers field (see EncodeHeaders); nil or
	// empty for none. Append writes it as is: it must be a valid encoding.
	// After decoding it aliases the input blob.
	Headers []byte
	Payload []byte
}

func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}

func bodySize(f *Frame) int {
	n := 1 + idSize + uvarintLen(uint64(len(f.TransactionID))) + len(f.TransactionID) + len(f.Payload)
	if f.Key != "" {
		n += uvarintLen(uint64(len(f.Key))) + len(f.Key)
	}
	return n + len(f.Headers)
}

// Size returns the encoded size of f, including the length prefix.
func Size(f *Frame) int {
	return prefixSize + bodySize(f)
}

// Append appends the encoding of f to dst and returns the extended slice.
// It does not allocate when dst has Size(f) spare capacity. Flag bits other
// than FlagEncrypted are dropped, because decoders reject them; FlagKey is
// set from f.Key and FlagHeaders from f.Headers, whatever f.Flags says.
// It panics if the body would exceed MaxBody, which no realistic message
// reaches and which the u32 prefix cannot express.
func Append(dst []byte, f *Frame) []byte {
	body := bodySize(f)
	if uint64(body) > MaxBody {
		panic(fmt.Sprintf("frame: body of %d bytes exceeds MaxBody", body))
	}
	// One growth instead of one per field.
	dst = slices.Grow(dst, prefixSize+body)
	flags := f.Flags & FlagEncrypted
	if f.Key != "" {
		flags |= FlagKey
	}
	if len(f.Headers) > 0 {
		flags |= FlagHeaders
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(body))
	dst = append(dst, flags)
	dst = append(dst, f.ID[:]...)
	dst = binary.AppendUvarint(dst, uint64(len(f.TransactionID)))
	dst = append(dst, f.TransactionID...)
	if flags&FlagKey != 0 {
		dst = binary.AppendUvarint(dst, uint64(len(f.Key)))
		dst = append(dst, f.Key...)
	}
	dst = append(dst, f.Headers...)
	return append(dst, f.Payload...)
}

func corrupt(k, off int, what string) error {
	return fmt.Errorf("%w: frame %d at offset %d: %s", ErrCorrupt, k, off, what)
}

// next splits the frame starting at blob[off:] and returns its body and the
// offset of the following frame. It checks only the length prefix.
func next(blob []byte, k, off int) (body []byte, end int, err error) {
	rest := len(blob) - off
	if rest < prefixSize {
		return nil, 0, corrupt(k, off, "truncated length prefix")
	}
	n := binary.LittleEndian.Uint32(blob[off:])
	if uint64(n) > uint64(rest-prefixSize) {
		return nil, 0, corrupt(k, off, fmt.Sprintf("length %d exceeds remaining %d bytes", n, rest-prefixSize))
	}
	end = off + prefixSize + int(n)
	return blob[off+prefixSize : end : end], end, nil
}

// View is a decoded frame whose every field aliases the blob it was decoded
// from, the transaction id and the key included: for a caller that copies
// what it keeps where it wants it, without a string allocated per frame.
// Each slice has its capacity clipped.
type View struct {
	ID            uuid.UUID
	Flags         byte
	TransactionID []byte
	Key           []byte // empty for none
	Headers       []byte // the encoded headers field; empty for none
	Payload       []byte
}

// parse decodes one frame body into v; off is for error messages only.
func parse(body []byte, k, off int, v *View) error {
	if len(body) < minBody {
		return corrupt(k, off, "body too short")
	}
	flags := body[0]
	if flags&^knownFlags != 0 {
		return corrupt(k, off, fmt.Sprintf("unknown flags %#02x", flags))
	}
	p := 1
	copy(v.ID[:], body[p:p+idSize])
	p += idSize
	tl, vn := binary.Uvarint(body[p:])
	if vn <= 0 {
		return corrupt(k, off, "bad transaction id length")
	}
	if vn != uvarintLen(tl) {
		return corrupt(k, off, "non-minimal transaction id length")
	}
	p += vn
	if tl > uint64(len(body)-p) {
		return corrupt(k, off, "transaction id exceeds frame")
	}
	v.TransactionID = body[p : p+int(tl) : p+int(tl)]
	p += int(tl)
	v.Key = nil
	if flags&FlagKey != 0 {
		kl, vn := binary.Uvarint(body[p:])
		switch {
		case vn <= 0:
			return corrupt(k, off, "bad key length")
		case vn != uvarintLen(kl):
			return corrupt(k, off, "non-minimal key length")
		case kl == 0:
			// An empty key is written as no key: one encoding each.
			return corrupt(k, off, "empty key with FlagKey set")
		}
		p += vn
		if kl > uint64(len(body)-p) {
			return corrupt(k, off, "key exceeds frame")
		}
		v.Key = body[p : p+int(kl) : p+int(kl)]
		p += int(kl)
	}
	v.Headers = nil
	if flags&FlagHeaders != 0 {
		n, err := scanHeaders(body[p:], nil)
		if err != nil {
			return corrupt(k, off, err.Error())
		}
		v.Headers = body[p : p+n : p+n]
		p += n
	}
	v.Flags = flags
	v.Payload = body[p:]
	return nil
}

// frame converts v to a Frame into f: the strings are copies, the rest
// still aliases the blob.
func (v *View) frame(f *Frame) {
	f.ID, f.Flags, f.TransactionID, f.Key = v.ID, v.Flags, string(v.TransactionID), string(v.Key)
	f.Headers, f.Payload = v.Headers, v.Payload
}

// Decode walks every frame of blob in order, calling fn with its index and
// contents. f is reused between calls, so fn must copy *f to keep it; the
// Payload of the copy still aliases blob. A truncated frame, unknown flags
// or trailing bytes stop the walk with an error wrapping ErrCorrupt; an
// error from fn stops it and is returned unchanged. An empty blob holds
// zero frames.
func Decode(blob []byte, fn func(k int, f *Frame) error) error {
	return DecodeRange(blob, 0, math.MaxInt, fn)
}

// DecodeRange is Decode for frames from through to (0-based, inclusive)
// only: earlier frames are skipped by their length prefixes without being
// parsed, and decoding stops after frame to. A pop of one message from a
// segment of thousands thereby parses one frame.
func DecodeRange(blob []byte, from, to int, fn func(k int, f *Frame) error) error {
	var f Frame
	return ViewRange(blob, from, to, func(k int, v *View) error {
		v.frame(&f)
		return fn(k, &f)
	})
}

// ViewRange is DecodeRange yielding Views: nothing of a frame is copied. v
// is reused between calls.
func ViewRange(blob []byte, from, to int, fn func(k int, v *View) error) error {
	var v View
	for k, off := 0, 0; off < len(blob) && k <= to; k++ {
		body, end, err := next(blob, k, off)
		if err != nil {
			return err
		}
		if k >= from {
			if err := parse(body, k, off, &v); err != nil {
				return err
			}
			if err := fn(k, &v); err != nil {
				return err
			}
		}
		off = end
	}
	return nil
}

// Count returns the number of frames in blob, following only the length
// prefixes; frame bodies are not validated.
func Count(blob []byte) (int, error) {
	k, off := 0, 0
	for off < len(blob) {
		_, end, err := next(blob, k, off)
		if err != nil {
			return k, err
		}
		off = end
		k++
	}
	return k, nil
}

// DecodeAll decodes every frame of blob. Payloads alias blob. On error it
// returns nil and an error wrapping ErrCorrupt.
func DecodeAll(blob []byte) ([]Frame, error) {
	n, err := Count(blob)
	if err != nil {
		return nil, err
	}
	out := make([]Frame, 0, n)
	err = Decode(blob, func(_ int, f *Frame) error {
		out = append(out, *f)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// At returns the k-th frame (0-based) of blob. Earlier frames are skipped by
// their length prefixes without being validated, so a blob that Decode would
// reject can still yield its leading frames. It returns ErrNotFound when k is
// negative or blob has no k-th frame. Payload aliases blob.
func At(blob []byte, k int) (Frame, error) {
	var f Frame
	if k < 0 {
		return f, ErrNotFound
	}
	off := 0
	for i := 0; ; i++ {
		if off == len(blob) {
			return f, ErrNotFound
		}
		body, end, err := next(blob, i, off)
		if err != nil {
			return f, err
		}
		if i == k {
			var v View
			if err := parse(body, i, off, &v); err != nil {
				return Frame{}, err
			}
			v.frame(&f)
			return f, nil
		}
		off = end
	}
}
