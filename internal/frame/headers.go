package frame

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// ValidHeaderText reports whether s can be a header name (when non-empty)
// or value: UTF-8 without NUL.
func ValidHeaderText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// HeadersSize returns the size EncodeHeaders(h) would have.
func HeadersSize(h map[string]string) int {
	if len(h) == 0 {
		return 0
	}
	n := uvarintLen(uint64(len(h)))
	for k, v := range h {
		n += uvarintLen(uint64(len(k))) + len(k) + uvarintLen(uint64(len(v))) + len(v)
	}
	return n
}

// EncodeHeaders returns the headers field for h: nil when h is empty, else
// the count and the headers in ascending name order. The caller has checked
// every name is non-empty and every name and value is ValidHeaderText.
func EncodeHeaders(h map[string]string) []byte {
	if len(h) == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	b := make([]byte, 0, HeadersSize(h))
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		v := h[k]
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return b
}

// DecodeHeaders decodes a headers field that must span all of b; nil or
// empty b is no headers (a nil map). The error wraps ErrCorrupt.
func DecodeHeaders(b []byte) (map[string]string, error) {
	return DecodeHeadersWith(b, copier{})
}

// Strings makes the strings of decoded headers from bytes that alias the
// input: a decoder that packs them with other strings of its own.
type Strings interface {
	String(p []byte) string
}

type copier struct{}

func (copier) String(p []byte) string { return string(p) }

// DecodeHeadersWith is DecodeHeaders with the names and values made by s.
func DecodeHeadersWith(b []byte, s Strings) (map[string]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var h map[string]string
	n, err := scanHeaders(b, func(count int, k, v []byte) {
		if h == nil {
			h = make(map[string]string, count)
		}
		h[s.String(k)] = s.String(v)
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if n != len(b) {
		return nil, fmt.Errorf("%w: %d bytes after the headers", ErrCorrupt, len(b)-n)
	}
	return h, nil
}

// scanHeaders validates the headers field at the start of b, calling fn (if
// not nil) per header, and returns its length.
func scanHeaders(b []byte, fn func(count int, k, v []byte)) (int, error) {
	count, p, err := uvarintAt(b, 0, "header count", "")
	if err != nil {
		return 0, err
	}
	if count == 0 {
		return 0, errors.New("zero header count with FlagHeaders set")
	}
	// Each header takes at least 3 bytes: bounds the count before use.
	if count > uint64(len(b)-p)/3 {
		return 0, errors.New("header count exceeds frame")
	}
	var prev []byte
	for i := uint64(0); i < count; i++ {
		var k, v []byte
		if k, p, err = bytesAt(b, p, "header name"); err != nil {
			return 0, err
		}
		if v, p, err = bytesAt(b, p, "header value"); err != nil {
			return 0, err
		}
		switch {
		case len(k) == 0:
			return 0, errors.New("empty header name")
		case i > 0 && bytes.Compare(prev, k) >= 0:
			return 0, errors.New("header names not strictly ascending")
		case !utf8.Valid(k) || bytes.IndexByte(k, 0) >= 0:
			return 0, errors.New("header name not UTF-8 without NUL")
		case !utf8.Valid(v) || bytes.IndexByte(v, 0) >= 0:
			return 0, errors.New("header value not UTF-8 without NUL")
		}
		if fn != nil {
			fn(int(count), k, v)
		}
		prev = k
	}
	return p, nil
}

// uvarintAt reads the varint at b[p:]; what and suffix name it in an
// error, joined only then (this runs for every header of every message).
func uvarintAt(b []byte, p int, what, suffix string) (uint64, int, error) {
	x, n := binary.Uvarint(b[p:])
	if n <= 0 {
		return 0, 0, fmt.Errorf("bad %s%s", what, suffix)
	}
	if n != uvarintLen(x) {
		return 0, 0, fmt.Errorf("non-minimal %s%s", what, suffix)
	}
	return x, p + n, nil
}

func bytesAt(b []byte, p int, what string) ([]byte, int, error) {
	l, p, err := uvarintAt(b, p, what, " length")
	if err != nil {
		return nil, 0, err
	}
	if l > uint64(len(b)-p) {
		return nil, 0, fmt.Errorf("%s exceeds frame", what)
	}
	return b[p : p+int(l)], p + int(l), nil
}
