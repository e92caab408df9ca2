package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/gofrs/uuid/v5"
)

// Record is one spooled push item: everything needed to push it again.
type Record struct {
	Tenant    uuid.UUID
	Queue     string
	Partition string
	// TransactionID is preserved so that replay is idempotent through the
	// queue's deduplication on it.
	TransactionID string
	// MessageID is the id minted at push time. Informational: a replayed
	// message may be stored under a new id.
	MessageID uuid.UUID
	// TraceID is optional; the zero value means none and costs no space.
	// queen leaves it zero: a push's trace context travels in Headers
	// (the propagator's fields), which replay stores with the message.
	TraceID [16]byte
	// Key is the message's ordering key; "" means none and costs no space.
	Key string
	// Headers are the caller's encoded message headers; empty means none
	// and costs no space. The spool does not interpret them.
	Headers []byte
	// Lanes is the caller's lane count the item was routed with; 0 means
	// none and costs no space. The spool does not interpret it.
	Lanes uint32
	// Flags are the caller's frame flags (for example "payload encrypted");
	// the spool stores them without interpreting them.
	Flags byte
	// Payload is stored as is: still encrypted if it was.
	Payload []byte
}

// MaxRecordSize is the largest encoded record body (see the package doc);
// Append rejects a larger record with ErrTooLarge.
const MaxRecordSize = 32 << 20

const (
	recordHeaderSize = 12 // u32 body length, u32 body CRC, u32 header CRC
	fileHeaderSize   = 8
	idSize           = 16

	rflagTrace   byte = 1 << 0
	rflagKey     byte = 1 << 1
	rflagLanes   byte = 1 << 2
	rflagHeaders byte = 1 << 3
	knownRFlags       = rflagTrace | rflagKey | rflagLanes | rflagHeaders

	// rflags, flags, tenant, message id and three empty strings.
	minBody = 2 + 2*idSize + 3
)

// fileHeader opens every data file: magic "QSPL", format version 1, three
// zero bytes.
var fileHeader = [fileHeaderSize]byte{'Q', 'S', 'P', 'L', 1, 0, 0, 0}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrCorrupt is wrapped by every error about bytes that are not a valid
	// record or data file.
	ErrCorrupt = errors.New("spool: corrupt")

	// errShort: the bytes end inside a record. At the end of the newest file
	// that is a torn write; anywhere else it is corruption.
	errShort = fmt.Errorf("%w: record truncated", ErrCorrupt)
	// errHeader: a record header whose own CRC does not match, so its
	// length cannot be trusted.
	errHeader = fmt.Errorf("%w: record header checksum mismatch", ErrCorrupt)
	// errChecksum: a complete record whose body CRC does not match.
	errChecksum = fmt.Errorf("%w: record body checksum mismatch", ErrCorrupt)
)

func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}

// bodySize is the encoded size of r's body (without the record header).
func bodySize(r *Record) int {
	n := 2 + 2*idSize +
		uvarintLen(uint64(len(r.Queue))) + len(r.Queue) +
		uvarintLen(uint64(len(r.Partition))) + len(r.Partition) +
		uvarintLen(uint64(len(r.TransactionID))) + len(r.TransactionID) +
		len(r.Payload)
	if r.TraceID != [16]byte{} {
		n += idSize
	}
	if r.Key != "" {
		n += uvarintLen(uint64(len(r.Key))) + len(r.Key)
	}
	if r.Lanes != 0 {
		n += uvarintLen(uint64(r.Lanes))
	}
	if len(r.Headers) != 0 {
		n += uvarintLen(uint64(len(r.Headers))) + len(r.Headers)
	}
	return n
}

// appendRecord appends the encoding of r to dst. The caller has checked
// bodySize(r) <= MaxRecordSize.
func appendRecord(dst []byte, r *Record) []byte {
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(bodySize(r)))
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0) // CRCs, filled below
	var rflags byte
	if r.TraceID != [16]byte{} {
		rflags |= rflagTrace
	}
	if r.Key != "" {
		rflags |= rflagKey
	}
	if r.Lanes != 0 {
		rflags |= rflagLanes
	}
	if len(r.Headers) != 0 {
		rflags |= rflagHeaders
	}
	dst = append(dst, rflags, r.Flags)
	dst = append(dst, r.Tenant[:]...)
	dst = append(dst, r.MessageID[:]...)
	if rflags&rflagTrace != 0 {
		dst = append(dst, r.TraceID[:]...)
	}
	for _, s := range [...]string{r.Queue, r.Partition, r.TransactionID} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	if rflags&rflagKey != 0 {
		dst = binary.AppendUvarint(dst, uint64(len(r.Key)))
		dst = append(dst, r.Key...)
	}
	if rflags&rflagLanes != 0 {
		dst = binary.AppendUvarint(dst, uint64(r.Lanes))
	}
	if rflags&rflagHeaders != 0 {
		dst = binary.AppendUvarint(dst, uint64(len(r.Headers)))
		dst = append(dst, r.Headers...)
	}
	dst = append(dst, r.Payload...)
	hdr := dst[start : start+recordHeaderSize]
	binary.LittleEndian.PutUint32(hdr[4:], crc32.Checksum(dst[start+recordHeaderSize:], crcTable))
	binary.LittleEndian.PutUint32(hdr[8:], crc32.Checksum(hdr[:8], crcTable))
	return dst
}

// bodyLen validates a record header (its own CRC, then the length range)
// and returns the body length.
func bodyLen(hdr []byte) (int, error) {
	if crc32.Checksum(hdr[:8], crcTable) != binary.LittleEndian.Uint32(hdr[8:]) {
		return 0, errHeader
	}
	n := binary.LittleEndian.Uint32(hdr)
	if n < minBody || n > MaxRecordSize {
		return 0, fmt.Errorf("%w: record body length %d", ErrCorrupt, n)
	}
	return int(n), nil
}

// verify checks the body against the CRC in its (validated) header.
func verify(hdr, body []byte) error {
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(hdr[4:]) {
		return errChecksum
	}
	return nil
}

// parseBody decodes a checksummed body into r, or only validates it when r
// is nil. The encoding is canonical (minimal varints, no unknown flag bits,
// a trace id, key, lane count or headers only when non-zero), so re-encoding a decoded record
// reproduces its bytes. r.Payload aliases body.
func parseBody(body []byte, r *Record) error {
	if len(body) < minBody {
		return fmt.Errorf("%w: body of %d bytes", ErrCorrupt, len(body))
	}
	rflags := body[0]
	if rflags&^knownRFlags != 0 {
		return fmt.Errorf("%w: unknown record flags %#x", ErrCorrupt, rflags)
	}
	p := 2 + 2*idSize
	var trace [16]byte
	if rflags&rflagTrace != 0 {
		if len(body) < p+idSize {
			return fmt.Errorf("%w: trace id truncated", ErrCorrupt)
		}
		copy(trace[:], body[p:])
		if trace == [16]byte{} {
			return fmt.Errorf("%w: zero trace id", ErrCorrupt)
		}
		p += idSize
	}
	var strs [3][]byte
	for i := range strs {
		n, w := binary.Uvarint(body[p:])
		if w <= 0 || w != uvarintLen(n) || n > uint64(len(body)-p-w) {
			return fmt.Errorf("%w: bad string length at body offset %d", ErrCorrupt, p)
		}
		p += w
		strs[i] = body[p : p+int(n)]
		p += int(n)
	}
	var key []byte
	if rflags&rflagKey != 0 {
		n, w := binary.Uvarint(body[p:])
		if w <= 0 || w != uvarintLen(n) || n == 0 || n > uint64(len(body)-p-w) {
			return fmt.Errorf("%w: bad key length at body offset %d", ErrCorrupt, p)
		}
		p += w
		key = body[p : p+int(n)]
		p += int(n)
	}
	var lanes uint64
	if rflags&rflagLanes != 0 {
		var w int
		lanes, w = binary.Uvarint(body[p:])
		if w <= 0 || w != uvarintLen(lanes) || lanes == 0 || lanes > math.MaxUint32 {
			return fmt.Errorf("%w: bad lane count at body offset %d", ErrCorrupt, p)
		}
		p += w
	}
	var hdrs []byte
	if rflags&rflagHeaders != 0 {
		n, w := binary.Uvarint(body[p:])
		if w <= 0 || w != uvarintLen(n) || n == 0 || n > uint64(len(body)-p-w) {
			return fmt.Errorf("%w: bad headers length at body offset %d", ErrCorrupt, p)
		}
		p += w
		hdrs = body[p : p+int(n) : p+int(n)]
		p += int(n)
	}
	if r != nil {
		*r = Record{
			Queue:         string(strs[0]),
			Partition:     string(strs[1]),
			TransactionID: string(strs[2]),
			Key:           string(key),
			Lanes:         uint32(lanes),
			Headers:       hdrs,
			TraceID:       trace,
			Flags:         body[1],
			Payload:       body[p:len(body):len(body)],
		}
		copy(r.Tenant[:], body[2:])
		copy(r.MessageID[:], body[2+idSize:])
	}
	return nil
}

// recordLen returns the total encoded size of the record at the start of b,
// from its header alone, or errShort if b holds less than a header.
func recordLen(b []byte) (int, error) {
	if len(b) < recordHeaderSize {
		return 0, errShort
	}
	n, err := bodyLen(b)
	if err != nil {
		return 0, err
	}
	return recordHeaderSize + n, nil
}

// decodeRecord decodes the record at the start of b and returns it with its
// encoded size. It returns errShort if b ends inside the record, and an
// error wrapping ErrCorrupt for anything else that is not a valid record.
// r.Payload aliases b.
func decodeRecord(b []byte) (r Record, n int, err error) {
	if n, err = recordLen(b); err != nil {
		return Record{}, 0, err
	}
	if len(b) < n {
		return Record{}, 0, errShort
	}
	if err = verify(b[:recordHeaderSize], b[recordHeaderSize:n]); err != nil {
		return Record{}, 0, err
	}
	if err = parseBody(b[recordHeaderSize:n], &r); err != nil {
		return Record{}, 0, err
	}
	return r, n, nil
}
