package alloc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The binary path: on a connection in pgx's default exec mode
// (QueryExecModeCacheStatement) without a query tracer, Push encodes
// push_bundle's arguments itself, into a buffer the Bundle keeps, and runs
// its own prepared statement. pgx's builder encodes every argument into a
// buffer it grows by a quarter at a time and shrinks again after each query,
// which allocates about five times the arguments (a bundle's are its frames,
// some 100 KiB) on every call; that garbage was most of what the push path
// allocated. A traced connection keeps pgx's path, so the tracer sees the
// statement and its arguments; so does any other exec mode.

// bundleParamOIDs are push_bundle's parameter types: text[], text[],
// int4[], bytea[], int8[], bytea[], uuid[], int4[], bool, int4[].
var bundleParamOIDs = [10]uint32{1009, 1009, 1007, 1001, 1016, 1001, 2951, 1007, 16, 1007}

// binaryFormats are ten binary format codes, for the parameters and the
// seven result columns.
var binaryFormats = []int16{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}

// maxKeptBuf bounds the encoding buffer a Bundle keeps for its next call.
const maxKeptBuf = 4 << 20

// conner is a querier on one connection: a pool's connection or a
// transaction.
type conner interface{ Conn() *pgx.Conn }

// rawConn is q's connection when the binary path may run on it.
func rawConn(q Querier) *pgx.Conn {
	cq, ok := q.(conner)
	if !ok {
		return nil
	}
	c := cq.Conn()
	if c == nil || c.IsClosed() {
		return nil
	}
	cfg := c.Config()
	if cfg.Tracer != nil || cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil
	}
	return c
}

// pushRaw is Push on c through the binary path. raw is false, and nothing
// was sent, when sql's parameters or columns are not push_bundle's: then
// the caller runs it through pgx.
func (b *Bundle) pushRaw(ctx context.Context, c *pgx.Conn, sql string, lanes bool, out []Verdict) (_ []Verdict, raw bool, err error) {
	sd, err := c.Prepare(ctx, sql, sql) // once per connection; pgx keeps it
	if err != nil {
		return out, true, err
	}
	if len(sd.ParamOIDs) != len(bundleParamOIDs) || len(sd.Fields) != len(verdictOIDs) {
		return out, false, nil
	}
	for i, oid := range sd.ParamOIDs {
		if oid != bundleParamOIDs[i] {
			return out, false, nil
		}
	}
	for i, f := range sd.Fields {
		if f.DataTypeOID != verdictOIDs[i] {
			return out, false, nil
		}
	}
	b.encode(lanes)
	size := len(sql) + 256
	for _, p := range b.params {
		size += 4 + len(p)
	}
	// pgx's write buffer starts each call at 1 KiB and grows by a quarter
	// at a time, and a flush of more than 1 KiB drops it for a new one: a
	// bundle's message (its frames, some 100 KiB) cost a buffer of its
	// size on every call, a third of what the lifecycle load allocated.
	// The frontend borrows the Bundle's buffer instead, sized at once, and
	// is made to give it back before pushRaw returns, whatever happened:
	// a flush replaces a buffer that large by itself, and reclaim covers a
	// message under 1 KiB, which a flush keeps, and a call that failed
	// before its flush. A connection that broke during the call is closed
	// by pgx on a goroutine of its own, which sends Terminate through the
	// frontend, perhaps into the buffer: the Bundle then gives the buffer
	// up, and touches the frontend no more.
	fe := c.PgConn().Frontend()
	fe.Send(lend{b, size})
	defer func() {
		if c.PgConn().IsClosed() {
			b.wire = nil
			return
		}
		fe.Send(reclaim{b})
	}()
	rr := c.PgConn().ExecStatement(ctx, sd, b.params[:], binaryFormats, binaryFormats[:len(verdictOIDs)])
	m := c.TypeMap()
	loc := scanLocation(m)
	for rr.NextRow() {
		if err == nil {
			out, err = appendVerdict(out, rr.Values(), loc, m)
		}
	}
	if _, cerr := rr.Close(); cerr != nil {
		err = cerr
		var pgErr *pgconn.PgError
		if errors.As(cerr, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "0A000") {
			// The statement is gone (DISCARD ALL) or its result type
			// changed: prepare it again next time, as pgx does its own.
			_ = c.Deallocate(ctx, sql)
		}
	}
	b.params = [10][]byte{}
	if cap(b.buf) > maxKeptBuf {
		b.buf = nil
	}
	if cap(b.wire) > maxKeptBuf {
		b.wire = nil
	}
	if err == nil && len(out) != b.Len() {
		err = fmt.Errorf("%w: %d results for %d segments", ErrBadResult, len(out), b.Len())
	}
	return out, true, err
}

// appendVerdict decodes one binary push_result row and appends it to out.
func appendVerdict(out []Verdict, raw [][]byte, loc *time.Location, m *pgtype.Map) ([]Verdict, error) {
	ord, v, ok := decodeVerdict(raw, loc, m)
	if !ok {
		return out, fmt.Errorf("%w: undecodable row", ErrBadResult)
	}
	return checkVerdict(out, ord, v)
}

// encode writes the bundle's arguments into b.buf and points b.params at
// them; lanes false sends the lane counts as NULL.
func (b *Bundle) encode(lanes bool) {
	n := len(b.queues)
	size := 10 * 20 // array headers
	for i := range n {
		size += len(b.queues[i]) + len(b.partitions[i]) + len(b.hashes[i]) + len(b.blobs[i]) + 9*4 + 4 + 8 + 16 + 4 + 4
	}
	buf := b.buf[:0]
	if cap(buf) < size {
		buf = make([]byte, 0, size+size/4)
	}
	var ends [10]int
	buf = appendArray(buf, 25, n, func(buf []byte, i int) []byte { return appendText(buf, b.queues[i]) })
	ends[0] = len(buf)
	buf = appendArray(buf, 25, n, func(buf []byte, i int) []byte { return appendText(buf, b.partitions[i]) })
	ends[1] = len(buf)
	buf = appendArray(buf, 23, n, func(buf []byte, i int) []byte { return appendInt4(buf, b.counts[i]) })
	ends[2] = len(buf)
	buf = appendArray(buf, 17, n, func(buf []byte, i int) []byte { return appendElem(buf, b.hashes[i], false) })
	ends[3] = len(buf)
	buf = appendArray(buf, 20, n, func(buf []byte, i int) []byte {
		return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint32(buf, 8), uint64(b.verified[i]))
	})
	ends[4] = len(buf)
	buf = appendArray(buf, 17, n, func(buf []byte, i int) []byte { return appendElem(buf, b.blobs[i], false) })
	ends[5] = len(buf)
	buf = appendArray(buf, 2950, n, func(buf []byte, i int) []byte { return appendElem(buf, b.tenants[i][:], true) })
	ends[6] = len(buf)
	buf = appendArray(buf, 23, n, func(buf []byte, i int) []byte { return appendInt4(buf, b.flags[i]) })
	ends[7] = len(buf)
	if b.Known {
		buf = append(buf, 1)
	} else {
		buf = append(buf, 0)
	}
	ends[8] = len(buf)
	if lanes {
		buf = appendArray(buf, 23, n, func(buf []byte, i int) []byte { return appendInt4(buf, b.lanes[i]) })
	}
	ends[9] = len(buf)
	start := 0
	for i, end := range ends {
		b.params[i] = buf[start:end:end]
		start = end
	}
	if !lanes {
		b.params[9] = nil // NULL
	}
	b.buf = buf
}

// appendArray appends a one-dimensional binary array of n elements of
// type oid, each written by elem (its length word and bytes). The null
// flag is set when any element is NULL.
func appendArray(buf []byte, oid uint32, n int, elem func([]byte, int) []byte) []byte {
	buf = binary.BigEndian.AppendUint32(buf, 1) // dimensions
	nulls := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint32(buf, oid)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	buf = binary.BigEndian.AppendUint32(buf, 1) // lower bound
	for i := range n {
		buf = elem(buf, i)
	}
	// A NULL element is a length of -1: find one only if some element
	// could be one (bytea, where a nil slice is NULL, as pgx binds it).
	if oid == 17 {
		for i, p := 0, nulls+16; i < n; i++ {
			l := int32(binary.BigEndian.Uint32(buf[p:]))
			if l < 0 {
				binary.BigEndian.PutUint32(buf[nulls:], 1)
				break
			}
			p += 4 + int(l)
		}
	}
	return buf
}

// appendElem appends one element; a nil v is NULL unless notNull.
func appendElem(buf, v []byte, notNull bool) []byte {
	if v == nil && !notNull {
		return binary.BigEndian.AppendUint32(buf, ^uint32(0))
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(v)))
	return append(buf, v...)
}

func appendText(buf []byte, s string) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(s)))
	return append(buf, s...)
}

func appendInt4(buf []byte, v int32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(buf, 4), uint32(v))
}

// lend is a protocol message of no bytes whose encoding moves the frontend's
// pending bytes into the Bundle's wire buffer with room for n more: sent
// first, the frontend writes the messages that follow into that buffer.
type lend struct {
	b *Bundle
	n int
}

func (lend) Frontend()           {}
func (lend) Decode([]byte) error { return nil }
func (l lend) Encode(dst []byte) ([]byte, error) {
	if aliases(dst, l.b.wire) { // not given back: never, see reclaim
		return slices.Grow(dst, l.n), nil
	}
	if cap(l.b.wire) < len(dst)+l.n {
		l.b.wire = make([]byte, 0, len(dst)+l.n)
	}
	l.b.wire = append(l.b.wire[:0], dst...)
	return l.b.wire, nil
}

// reclaim is a protocol message of no bytes whose encoding makes the
// frontend let go of the Bundle's wire buffer if it still holds it (a call
// that failed before its flush): what is pending moves to a buffer of the
// frontend's own, so no later use of the connection writes into the
// Bundle's, which the next call may send on another connection.
type reclaim struct{ b *Bundle }

func (reclaim) Frontend()           {}
func (reclaim) Decode([]byte) error { return nil }
func (r reclaim) Encode(dst []byte) ([]byte, error) {
	if !aliases(dst, r.b.wire) {
		return dst, nil
	}
	return append(make([]byte, 0, max(len(dst), 1024)), dst...), nil
}

// aliases reports whether a and b share their backing array (both are
// slices from index 0 of theirs, as the frontend's and the Bundle's are).
func aliases(a, b []byte) bool {
	return cap(a) > 0 && cap(b) > 0 && &a[:1][0] == &b[:1][0]
}
