// Package alloc is the client side of queen's offset allocator: it sends one
// bundle of segments to the push_bundle function as typed parallel arrays and
// returns one verdict per segment in input order, and it fetches the segment
// covering an offset to resolve a duplicate's original message id.
//
// It promises one verdict per segment, in input order, from one round trip in
// the caller's querier (its transaction, if it is one), and that a segment with
// any verdict but Queued wrote nothing. Order within a partition is the input
// order of its segments. It does not retry, spool, deduplicate within a segment
// (dedup does that before) or encrypt: the segment's bytes are stored as given.
//
// It is a building block of the queen package with no stability promise
// before v1.
package alloc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Segment flags, sent per segment.
const (
	// FlagEncrypted marks a segment whose payloads are all encrypted; an
	// encrypted queue rejects a segment without it.
	FlagEncrypted int32 = 1 << 0
	// FlagKeyed marks a segment holding a message with an ordering key:
	// storing it fixes its queue's lane count.
	FlagKeyed int32 = 1 << 1
)

// Status is a segment's verdict.
type Status int16

const (
	// Queued: the segment was stored at BaseOffset.
	Queued Status = 0
	// Duplicate: some frames repeat stored messages; nothing was written.
	Duplicate Status = 1
	// EncryptionRequired: the queue is encrypted and the segment is not;
	// nothing was written.
	EncryptionRequired Status = 2
	// LanesChanged: the segment's keyed messages were routed with a lane
	// count (Segment.Lanes) that is not the queue's; nothing was written.
	LanesChanged Status = 3
	// NeedsBundle: PushSegment did not take the segment (its partition
	// does not exist, or it is its queue's first keyed segment); nothing
	// was written. Send it with Push.
	NeedsBundle Status = 4
)

// Segment is one partition's contribution to a bundle.
type Segment struct {
	Tenant    uuid.UUID
	Queue     string
	Partition string
	Count     int32
	Hashes    []byte // 16 bytes per frame, frame order
	Blob      []byte
	Flags     int32
	// Lanes is the lane count the segment's keyed messages were routed to
	// lanes with; 0 when none was. -1 when they disagree (always rejected).
	Lanes int32
}

// Verdict is the database's answer for one Segment.
type Verdict struct {
	Status      Status
	PartitionID int64
	BaseOffset  int64
	CreatedAt   time.Time
	// For Duplicate: incoming frame indexes and the offsets of the stored
	// messages they repeat, pairwise.
	DupIdx []int32
	DupOff []int64
}

// ErrBadResult means the database's answer could not be matched to the
// bundle; every segment of it must be treated as failed.
var ErrBadResult = errors.New("alloc: unexpected push_bundle result")

// Querier is what a bundle runs on: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Bundle holds the parallel arrays of one call; reuse it across calls to
// avoid reallocating them.
type Bundle struct {
	// Known tells the database every partition of the bundle exists, so it
	// skips the provisioning check. A wrong claim fails the call with
	// SQLSTATE QN001 and writes nothing; retry with Known false.
	Known bool

	queues     []string
	partitions []string
	counts     []int32
	hashes     [][]byte
	// verified fills push_bundle's p_verified with -1 (no offset known
	// duplicate-free) for every segment. Nothing sets it any more; the
	// parameter stays because the previous release's statements call
	// push_bundle with it.
	verified []int64
	blobs    [][]byte
	tenants  [][16]byte
	flags    []int32
	lanes    []int32
	anyLanes bool // some segment has Lanes != 0; else the array is sent as NULL

	// buf and params are the encoded arguments of the binary path (see
	// pushRaw), kept across calls.
	buf    []byte
	params [10][]byte
	// wire is the write buffer lent to the connection's frontend for the
	// call's protocol messages (see lend), kept across calls.
	wire []byte
}

// Reset empties b, keeping its capacity. It drops references to blobs.
func (b *Bundle) Reset() {
	clear(b.hashes)
	clear(b.blobs)
	b.queues, b.partitions, b.counts = b.queues[:0], b.partitions[:0], b.counts[:0]
	b.hashes, b.verified, b.blobs = b.hashes[:0], b.verified[:0], b.blobs[:0]
	b.tenants, b.flags, b.lanes, b.anyLanes = b.tenants[:0], b.flags[:0], b.lanes[:0], false
	b.Known = false
}

// Add appends a segment.
func (b *Bundle) Add(s *Segment) {
	b.queues = append(b.queues, s.Queue)
	b.partitions = append(b.partitions, s.Partition)
	b.counts = append(b.counts, s.Count)
	b.hashes = append(b.hashes, s.Hashes)
	b.verified = append(b.verified, -1)
	b.blobs = append(b.blobs, s.Blob)
	b.tenants = append(b.tenants, [16]byte(s.Tenant))
	b.flags = append(b.flags, s.Flags)
	b.lanes = append(b.lanes, s.Lanes)
	b.anyLanes = b.anyLanes || s.Lanes != 0
}

// Len is the number of segments.
func (b *Bundle) Len() int { return len(b.queues) }

// Push runs the bundle statement (sql, from internal/stmt) and fills out with
// one verdict per segment in input order. Any error means nothing of the
// bundle may be assumed committed unless the caller's own transaction commits.
func (b *Bundle) Push(ctx context.Context, q Querier, sql string, out []Verdict) ([]Verdict, error) {
	n := b.Len()
	out = out[:0]
	if n == 0 {
		return out, nil
	}
	if c := rawConn(q); c != nil {
		if out, raw, err := b.pushRaw(ctx, c, sql, b.anyLanes, out); raw {
			return out, err
		}
	}
	// NULL costs a bundle without keyed lanes nothing to encode.
	var lanes []int32
	if b.anyLanes {
		lanes = b.lanes
	}
	rows, err := q.Query(ctx, sql, b.queues, b.partitions, b.counts, b.hashes, b.verified, b.blobs, b.tenants, b.flags, b.Known, lanes)
	if err != nil {
		return out, err
	}
	return scanVerdicts(rows, n, out)
}

// PushSegment runs the single-segment statement (sql, internal/stmt's
// PushSegment) for a bundle of exactly one segment, cheaper than Push for
// an isolated push. The verdict may be NeedsBundle: then nothing was
// written, and the bundle goes through Push.
func (b *Bundle) PushSegment(ctx context.Context, q Querier, sql string, out []Verdict) ([]Verdict, error) {
	rows, err := b.single(ctx, q, sql, "PushSegment")
	if err != nil {
		return out[:0], err
	}
	return scanVerdicts(rows, 1, out[:0])
}

// single runs sql, which takes PushSegment's parameters, for a bundle of
// exactly one segment.
func (b *Bundle) single(ctx context.Context, q Querier, sql, name string) (pgx.Rows, error) {
	if b.Len() != 1 {
		return nil, fmt.Errorf("%w: %s with %d segments", ErrBadResult, name, b.Len())
	}
	return q.Query(ctx, sql, b.tenants[0], b.queues[0], b.partitions[0], b.counts[0], b.hashes[0], b.blobs[0], b.flags[0], b.lanes[0])
}

// AppendSegment runs internal/stmt's AppendSegment (sql) for a bundle of
// exactly one segment to a queue without a dedup window, to the partition
// whose id a verdict gave as pid: PushSegment's work without a function
// call or a lookup by name. When the statement did not apply (pid is not
// that partition's id among its checks) it returns the verdict
// NeedsBundle; nothing was written.
func (b *Bundle) AppendSegment(ctx context.Context, q Querier, sql string, pid int64, out []Verdict) ([]Verdict, error) {
	out = out[:0]
	if b.Len() != 1 {
		return out, fmt.Errorf("%w: AppendSegment with %d segments", ErrBadResult, b.Len())
	}
	rows, err := q.Query(ctx, sql, b.tenants[0], b.queues[0], b.partitions[0], b.counts[0], b.hashes[0], b.blobs[0], b.flags[0], b.lanes[0], pid)
	if err != nil {
		return out, err
	}
	out, err = scanRows(rows, out)
	switch {
	case err != nil:
		return out, err
	case len(out) == 0:
		return append(out, Verdict{Status: NeedsBundle}), nil
	case len(out) > 1 || out[0].Status != Queued:
		return out[:0], fmt.Errorf("%w: AppendSegment answered %d rows, status %d", ErrBadResult, len(out), out[0].Status)
	}
	return out, nil
}

// scanVerdicts reads n push_result rows in input order into out.
func scanVerdicts(rows pgx.Rows, n int, out []Verdict) ([]Verdict, error) {
	out, err := scanRows(rows, out)
	if err == nil && len(out) != n {
		err = fmt.Errorf("%w: %d results for %d segments", ErrBadResult, len(out), n)
	}
	return out, err
}

// scanRows reads push_result rows, which must come in input order, into out.
func scanRows(rows pgx.Rows, out []Verdict) ([]Verdict, error) {
	defer rows.Close()
	fast := binaryVerdicts(rows.FieldDescriptions())
	var (
		m   *pgtype.Map
		loc *time.Location
	)
	if c := rows.Conn(); c != nil && fast {
		m = c.TypeMap()
		loc = scanLocation(m)
	}
	for rows.Next() {
		var (
			ord int32
			v   Verdict
			ok  bool
		)
		if m != nil {
			ord, v, ok = decodeVerdict(rows.RawValues(), loc, m)
		}
		if !ok {
			var err error
			if ord, v, err = scanVerdict(rows); err != nil {
				return out, err
			}
		}
		var err error
		if out, err = checkVerdict(out, ord, v); err != nil {
			return out, err
		}
	}
	return out, rows.Err()
}

// checkVerdict appends v, the result ord, to out if it is the next in input
// order and well formed.
func checkVerdict(out []Verdict, ord int32, v Verdict) ([]Verdict, error) {
	if int(ord) != len(out)+1 {
		return out, fmt.Errorf("%w: result %d out of order", ErrBadResult, ord)
	}
	if v.Status == Duplicate && (len(v.DupIdx) == 0 || len(v.DupIdx) != len(v.DupOff)) {
		return out, fmt.Errorf("%w: duplicate without aligned offsets", ErrBadResult)
	}
	return append(out, v), nil
}

// scanVerdict scans the current push_result row with pgx.
func scanVerdict(rows pgx.Rows) (int32, Verdict, error) {
	var (
		ord     int32
		v       Verdict
		pid     *int64 // NULL when NeedsBundle
		base    *int64
		created *time.Time
	)
	if err := rows.Scan(&ord, &v.Status, &pid, &base, &created, &v.DupIdx, &v.DupOff); err != nil {
		return 0, v, fmt.Errorf("%w: %w", ErrBadResult, err)
	}
	if pid != nil {
		v.PartitionID = *pid
	}
	if base != nil {
		v.BaseOffset = *base
	}
	if created != nil {
		v.CreatedAt = *created
	}
	return ord, v, nil
}

// verdictOIDs are push_result's column types: int4, int2, int8, int8,
// timestamptz, int4[], int8[].
var verdictOIDs = [7]uint32{23, 21, 20, 20, 1184, 1007, 1016}

// binaryVerdicts reports whether rows with these fields come in the binary
// format with push_result's column types, so decodeVerdict can read them
// without pgx's scan plans and their allocations (a bundle answers a row per
// segment).
func binaryVerdicts(fds []pgconn.FieldDescription) bool {
	if len(fds) != len(verdictOIDs) {
		return false
	}
	for i, fd := range fds {
		if fd.Format != pgtype.BinaryFormatCode || fd.DataTypeOID != verdictOIDs[i] {
			return false
		}
	}
	return true
}

// scanLocation is the location pgx gives timestamptz values scanned with m
// (nil: local).
func scanLocation(m *pgtype.Map) *time.Location {
	if t, ok := m.TypeForOID(pgtype.TimestamptzOID); ok {
		if tc, ok := t.Codec.(*pgtype.TimestamptzCodec); ok {
			return tc.ScanLocation
		}
	}
	return nil
}

// int8Col reads a binary int8 column; NULL is 0.
func int8Col(c []byte) (int64, bool) {
	switch {
	case c == nil:
		return 0, true
	case len(c) == 8:
		return int64(binary.BigEndian.Uint64(c)), true
	}
	return 0, false
}

// y2kUnixMicros is PostgreSQL's epoch, 2000-01-01 UTC, in Unix microseconds.
const y2kUnixMicros = 946_684_800 * 1_000_000

// decodeVerdict reads a push_result row in the binary format; m scans the
// duplicate offsets (the rare path). ok is false for anything unexpected.
func decodeVerdict(raw [][]byte, loc *time.Location, m *pgtype.Map) (ord int32, v Verdict, ok bool) {
	if len(raw) != len(verdictOIDs) || len(raw[0]) != 4 || len(raw[1]) != 2 {
		return 0, v, false
	}
	ord = int32(binary.BigEndian.Uint32(raw[0]))
	v.Status = Status(int16(binary.BigEndian.Uint16(raw[1])))
	var pidOK, baseOK bool
	v.PartitionID, pidOK = int8Col(raw[2])
	v.BaseOffset, baseOK = int8Col(raw[3])
	if !pidOK || !baseOK {
		return 0, v, false
	}
	if c := raw[4]; c != nil {
		if len(c) != 8 {
			return 0, v, false
		}
		us := int64(binary.BigEndian.Uint64(c))
		if us == math.MaxInt64 || us == math.MinInt64 { // ±infinity
			return 0, v, false
		}
		v.CreatedAt = time.UnixMicro(y2kUnixMicros + us)
		if loc != nil {
			v.CreatedAt = v.CreatedAt.In(loc)
		}
	}
	if raw[5] != nil || raw[6] != nil {
		if v.DupIdx, v.DupOff, ok = scanDups(m, raw[5], raw[6]); !ok {
			return 0, v, false
		}
	}
	return ord, v, true
}

// scanDups scans a duplicate's binary dup_idx and dup_off with m.
func scanDups(m *pgtype.Map, idxCol, offCol []byte) (idx []int32, off []int64, ok bool) {
	if m.Scan(verdictOIDs[5], pgtype.BinaryFormatCode, idxCol, &idx) != nil ||
		m.Scan(verdictOIDs[6], pgtype.BinaryFormatCode, offCol, &off) != nil {
		return nil, nil, false
	}
	return idx, off, true
}

// CoveringSegment is a stored segment found by SegmentAt.
type CoveringSegment struct {
	BaseOffset int64
	EndOffset  int64
	CreatedAt  time.Time
	Blob       []byte
}

// SegmentAt fetches the segment covering offset off of partition pid. found
// is false when retention already removed it. This is the rare duplicate
// path; it runs whatever statement sql is (internal/stmt's SegmentAt).
func SegmentAt(ctx context.Context, q Querier, sql string, pid, off int64) (seg CoveringSegment, found bool, err error) {
	rows, err := q.Query(ctx, sql, pid, off)
	if err != nil {
		return seg, false, err
	}
	defer rows.Close()
	if rows.Next() {
		if err := rows.Scan(&seg.BaseOffset, &seg.EndOffset, &seg.CreatedAt, &seg.Blob); err != nil {
			return seg, false, err
		}
		found = true
	}
	return seg, found, rows.Err()
}
