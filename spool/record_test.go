package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/gofrs/uuid/v5"
)

func sampleRecords() []Record {
	return []Record{
		{Queue: "q", Partition: "Default", TransactionID: "t", Payload: []byte("{}")},
		{
			Tenant:        uuid.Must(uuid.NewV4()),
			Queue:         "orders",
			Partition:     "customer-42",
			TransactionID: "0195b6f4-7d3a-7c1e-9a51-4f0b2f6f9c10",
			MessageID:     uuid.Must(uuid.NewV7()),
			TraceID:       [16]byte{1, 2, 3},
			Flags:         1,
			Payload:       bytes.Repeat([]byte("x"), 300),
		},
		{Queue: string(make([]byte, 200)), Partition: "p", TransactionID: string(bytes.Repeat([]byte("t"), 1024))},
		{Queue: "q", Partition: "lane-7", TransactionID: "t", Key: "customer-42", Lanes: 64, Payload: []byte("k")},
		{Queue: "q", Partition: "p", TransactionID: "t", Key: string(bytes.Repeat([]byte("k"), 255)), TraceID: [16]byte{9}},
		{Queue: "q", Partition: "lane-1", Lanes: 1 << 31},
		{Queue: "q", Partition: "p", Key: "k", Lanes: 2, Headers: []byte{1, 1, 'a', 1, 'b'}, Payload: []byte("h")},
		{Queue: "q", Partition: "p", Headers: bytes.Repeat([]byte("h"), 300)},
	}
}

// sameRecord compares records treating a nil and an empty payload alike.
func sameRecord(a, b Record) bool {
	return a.Tenant == b.Tenant && a.Queue == b.Queue && a.Partition == b.Partition &&
		a.TransactionID == b.TransactionID && a.MessageID == b.MessageID && a.Key == b.Key && a.Lanes == b.Lanes &&
		bytes.Equal(a.Headers, b.Headers) &&
		a.TraceID == b.TraceID && a.Flags == b.Flags && bytes.Equal(a.Payload, b.Payload)
}

func TestRecordRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		enc := appendRecord(nil, &r)
		if len(enc) != recordHeaderSize+bodySize(&r) {
			t.Fatalf("encoded %d bytes, bodySize says %d", len(enc), recordHeaderSize+bodySize(&r))
		}
		got, n, err := decodeRecord(enc)
		if err != nil || n != len(enc) {
			t.Fatalf("decode: n=%d err=%v", n, err)
		}
		if !sameRecord(got, r) {
			t.Fatalf("round trip: got %+v want %+v", got, r)
		}
		// Every proper prefix is short, never a record.
		for cut := range len(enc) {
			if _, _, err := decodeRecord(enc[:cut]); !errors.Is(err, errShort) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("prefix %d: err %v", cut, err)
			} else if err == nil {
				t.Fatalf("prefix %d decoded", cut)
			}
		}
		// Every single-byte flip is detected.
		for i := range enc {
			bad := bytes.Clone(enc)
			bad[i] ^= 0x40
			if _, _, err := decodeRecord(bad); err == nil {
				t.Fatalf("flip at %d not detected", i)
			}
		}
	}
}

// fixHeader makes body a checksummed record, so the fuzzer reaches the body
// parser instead of stopping at the CRC.
func fixHeader(body []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(body)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(body, crcTable))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
	return append(b, body...)
}

func FuzzDecodeRecord(f *testing.F) {
	var stream []byte
	for _, r := range sampleRecords() {
		enc := appendRecord(nil, &r)
		stream = append(stream, enc...)
		f.Add(enc)
		f.Add(enc[recordHeaderSize:])
		f.Add(enc[:len(enc)-1])
	}
	f.Add(stream)
	f.Add([]byte{})
	f.Add(make([]byte, 64))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, in := range [][]byte{data, fixHeader(data)} {
			for b := in; len(b) > 0; {
				r, n, err := decodeRecord(b)
				if err != nil {
					if !errors.Is(err, ErrCorrupt) {
						t.Fatalf("error %v does not wrap ErrCorrupt", err)
					}
					break
				}
				if n < recordHeaderSize+minBody || n > len(b) {
					t.Fatalf("consumed %d of %d", n, len(b))
				}
				// Canonical: re-encoding gives the same bytes back.
				if enc := appendRecord(nil, &r); !bytes.Equal(enc, b[:n]) {
					t.Fatalf("re-encoding differs:\n got %x\nwant %x", enc, b[:n])
				}
				b = b[n:]
			}
		}
		if got := parseAck(data); got < 0 {
			t.Fatalf("negative ack offset %d", got)
		}
	})
}

func FuzzRecordRoundTrip(f *testing.F) {
	f.Add([]byte("tenant..........."), "q", "p", "txn", "", uint32(0), []byte("mid............."), []byte{}, byte(0), []byte("payload"))
	f.Add([]byte{}, "", "", "", "key", uint32(64), []byte{}, []byte("trace"), byte(255), []byte{})
	f.Fuzz(func(t *testing.T, tenant []byte, q, p, txn, key string, lanes uint32, mid, trace []byte, flags byte, payload []byte) {
		// The headers reuse the trace bytes: the spool does not interpret them.
		hdrs := trace
		var r Record
		copy(r.Tenant[:], tenant)
		copy(r.MessageID[:], mid)
		copy(r.TraceID[:], trace)
		r.Queue, r.Partition, r.TransactionID, r.Flags, r.Payload = q, p, txn, flags, payload
		r.Key, r.Lanes, r.Headers = key, lanes, hdrs
		enc := appendRecord(nil, &r)
		got, n, err := decodeRecord(enc)
		if err != nil || n != len(enc) || !sameRecord(got, r) {
			t.Fatalf("round trip: n=%d/%d err=%v got %+v want %+v", n, len(enc), err, got, r)
		}
	})
}

// FuzzScan puts arbitrary bytes after a file header and checks that the
// Open-time scanner and the replay reader agree on the valid prefix, and
// that a fault is reported exactly when the prefix is not the whole file.
func FuzzScan(f *testing.F) {
	var stream []byte
	for _, r := range sampleRecords() {
		stream = appendRecord(stream, &r)
	}
	f.Add(stream)
	f.Add(stream[:len(stream)-3])
	f.Add(append(bytes.Clone(stream), make([]byte, 100)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		file := bytes.NewReader(append(fileHeader[:], data...))
		size := int64(file.Len())
		sc, err := scan(file, size, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		if (sc.fault == nil) != (sc.end == size) || sc.end < fileHeaderSize || sc.end > size {
			t.Fatalf("scan: %+v", sc)
		}
		var n int64
		for off := int64(fileHeaderSize); off < sc.end; {
			recs, ends, err := readChunk(file, off, sc.end, 3, 100)
			if err != nil || len(recs) == 0 {
				t.Fatalf("readChunk at %d: %d records, %v", off, len(recs), err)
			}
			n += int64(len(recs))
			off = ends[len(ends)-1]
		}
		if n != sc.records {
			t.Fatalf("readChunk found %d records, scan %d", n, sc.records)
		}
	})
}

func TestParseAck(t *testing.T) {
	var b []byte
	for _, off := range []int64{8, 500, 1234} {
		b = appendAckEntry(b, off)
	}
	if got := parseAck(b); got != 1234 {
		t.Fatalf("got %d", got)
	}
	// A torn last entry falls back to the previous one.
	for cut := len(b) - ackEntrySize + 1; cut < len(b); cut++ {
		if got := parseAck(b[:cut]); got != 500 {
			t.Fatalf("cut %d: got %d", cut, got)
		}
	}
	bad := bytes.Clone(b)
	bad[len(bad)-1] ^= 1
	if got := parseAck(bad); got != 500 {
		t.Fatalf("bad crc: got %d", got)
	}
}
