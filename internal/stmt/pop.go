package stmt

import (
	"context"
	"errors"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// PopParams is the input of Pop: one claim of a queue for a consumer group.
type PopParams struct {
	Tenant uuid.UUID
	Queue  string
	Group  string
	// Partition restricts the claim to the partition of that name; nil:
	// any partition.
	Partition *string
	// Hints are partition names to try before the ready set (a wake named
	// them); nil: none.
	Hints []string
	// Batch is the most messages the claim takes in all, PerPartition the
	// most from any one partition (a fused claim takes one partition for
	// each of several callers, each with its own batch).
	Batch        int
	PerPartition int
	// Partitions is the most partitions the claim takes.
	Partitions int
	// Lease is how long the claim's leases last, sent in whole
	// milliseconds; <= 0: the queue's lease time.
	Lease time.Duration
	// AutoAck commits the cursor past what is claimed: no lease.
	AutoAck bool
	// Owner names the claiming client in the lease (lease_owner).
	Owner string
	// Mode and From are how a group's first contact seeds its cursors:
	// "all", "new" or "from" with From the first push time taken (nil
	// otherwise).
	Mode string
	From *time.Time
	// Keyed claims for per-key Consume (KeyConcurrency > 1, not AutoAck):
	// the rows carry the waits of failed messages (WaitOffsets) instead of
	// the claim ending before the first of them.
	Keyed bool
}

// PopRow is one row of Pop: a delivered segment of a claimed partition.
// The lease columns repeat on every row of a partition.
type PopRow struct {
	PartitionID   int64
	PartitionName string
	// Lease is the claim's lease on the partition and LeaseExpires its
	// end; both nil for an auto-ack. LeaseTime is the lease's length.
	Lease        *uuid.UUID
	LeaseExpires *time.Time
	LeaseTime    time.Duration
	// First and Last are the offsets the claim took on the partition
	// (inclusive), of which this segment holds Base..End.
	First, Last int64
	// Deliveries is how many times the offsets up to DeliveredMax were
	// delivered under a lease, this claim included.
	Deliveries   int32
	DeliveredMax int64
	Base, End    int64
	// CreatedAt is when the segment was pushed; Blob is the segment as
	// stored (internal/segment), nil from PopAhead for a segment the
	// lease's holder was sent before (see SegmentBlob).
	CreatedAt time.Time
	Blob      []byte
	// Failures are the failures a segment the skip policy re-enqueued
	// carries for its message (0 otherwise).
	Failures int32
	// On a partition's first row only: the offsets above the cursor
	// settled out of order (sorted), and the failures charged per offset
	// out of order (FailOffsets[i] failed FailCounts[i] times).
	Settled     []int64
	FailOffsets []int64
	FailCounts  []int32
	// On a keyed claim's first row of a partition: the claimed messages
	// whose retry wait still holds (sorted) and its ends (WaitAt[i] for
	// WaitOffsets[i]).
	WaitOffsets []int64
	WaitAt      []time.Time
}

// PopAheadParams is the input of PopAhead: a claim of the messages after
// a held lease's batch, under that lease, optionally fused with the ack of
// the lease's head batch.
type PopAheadParams struct {
	Lease Lease
	// Through, when >= 0, is acked (the cursor commits through it) in the
	// same statement, before the claim.
	Through int64
	// Max is the most messages claimed.
	Max int
	// LeaseTime is the lease's length from now, sent in whole
	// milliseconds; <= 0: the queue's lease time.
	LeaseTime time.Duration
}

// PopAhead runs c.PopAhead for in on q and calls each for every row, as Pop
// does. No row: nothing was written, the ack included (see pop_ahead() in
// sqlschema/functions/pop.sql for when).
func PopAhead(ctx context.Context, c *Consume, q Querier, in PopAheadParams, each func(*PopRow) error) error {
	rows, err := q.Query(ctx, c.PopAhead, in.Lease.Partition, in.Lease.Group, in.Lease.ID, in.Through, in.Max,
		in.LeaseTime.Milliseconds())
	if err != nil {
		return err
	}
	return scanPopRows(rows, each)
}

// PopLinger runs c.PopLinger: the claim of up to n messages under a
// lingering lease (pop_linger() in sqlschema/functions/pop.sql), which
// commits without waiting for its WAL flush and leaves the lease's end as
// it is. It calls each for every row, as Pop does; over reports a row
// saying the linger is over (the lease let go, or not live). n < 1 lets
// the lease go. leaseTime is the lease's length the rows report (<= 0:
// the queue's lease time).
func PopLinger(ctx context.Context, c *Consume, q Querier, l Lease, n int, leaseTime time.Duration, each func(*PopRow) error) (over bool, err error) {
	rows, err := q.Query(ctx, c.PopLinger, l.Partition, l.Group, l.ID, n, leaseTime.Milliseconds())
	if err != nil {
		return false, err
	}
	err = scanPopRows(rows, func(r *PopRow) error {
		if r.Lease == nil {
			over = true
			return nil
		}
		return each(r)
	})
	return over, err
}

// LingerAck runs c.LingerAck: the ack of a lease's whole batch through ok
// that keeps the lease (linger_ack() in sqlschema/functions/pop.sql).
// status is 0 (applied; logEnd is the partition's last offset), 1 (at or
// below the cursor), 2 (the lease is not live), 3 (applied, the lease let
// go as a settle's ack would) or -1 (declined: nothing written, settle as
// usual). A kept lease ends at most keep from now: leaseEnd is its end
// (zero when not kept).
func LingerAck(ctx context.Context, c *Consume, q Querier, l Lease, ok int64, keep time.Duration) (status int, logEnd int64, leaseEnd time.Time, err error) {
	var end *int64
	var lend *time.Time
	err = scanPrefix(ctx, q, c.LingerAck, []any{l.Partition, l.Group, l.ID, ok, keep.Milliseconds()}, &status, &end, &lend)
	if end != nil {
		logEnd = *end
	}
	if lend != nil {
		leaseEnd = *lend
	}
	return status, logEnd, leaseEnd, err
}

// SegmentBlob runs c.SegmentBlob on q: the stored blob of partition pid's
// segment at base, or pgx.ErrNoRows when there is none (retention took it).
// A claim ahead leaves out the blob of a segment its lease's holder was sent
// before (PopRow.Blob nil); a holder that no longer has it reads it here.
func SegmentBlob(ctx context.Context, c *Consume, q Querier, pid, base int64) ([]byte, error) {
	var blob []byte
	err := scanPrefix(ctx, q, c.SegmentBlob, []any{pid, base}, &blob)
	return blob, err
}

// Pop runs c.Pop for in on q and calls each for every row, in row order,
// with a row it may keep no reference to (the row is reused; the slices
// in it are not). An error from each ends Pop with that error.
func Pop(ctx context.Context, c *Consume, q Querier, in PopParams, each func(*PopRow) error) error {
	hints := in.Hints
	if hints == nil {
		hints = []string{}
	}
	rows, err := q.Query(ctx, c.Pop, prefixArgs(c.Pop, in.Tenant, in.Queue, in.Group, in.Partition, hints, in.Batch,
		in.Partitions, in.Lease.Milliseconds(), in.AutoAck, in.Owner, in.Mode, in.From, in.PerPartition, in.Keyed)...)
	if err != nil {
		return err
	}
	return scanPopRows(rows, each)
}

// scanPopRows calls each for every row of pop_row rows, reusing one PopRow.
func scanPopRows(rows pgx.Rows, each func(*PopRow) error) error {
	defer rows.Close()
	var (
		r       PopRow
		leaseMs int64
	)
	dest := []any{&r.PartitionID, &r.PartitionName, &r.Lease, &r.LeaseExpires, &leaseMs, &r.First, &r.Last,
		&r.Deliveries, &r.DeliveredMax, &r.Base, &r.End, &r.CreatedAt, &r.Blob, &r.Failures,
		&r.Settled, &r.FailOffsets, &r.FailCounts, &r.WaitOffsets, &r.WaitAt}
	// The previous release's statements end before the waits.
	if n := len(rows.FieldDescriptions()); n < len(dest) {
		dest = dest[:n]
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		r.LeaseTime = time.Duration(leaseMs) * time.Millisecond
		if err := each(&r); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// PopDeadLetterParams is the input of PopDeadLetter: messages a claim took
// but cannot decode, in offset order, each dead-lettered with its reason.
type PopDeadLetterParams struct {
	Partition int64 // the partition's id
	Group     string
	// Lease is the claim's lease; nil: the claim auto-acked.
	Lease *uuid.UUID
	// Cut is the lease's new last offset (it ends before a message a
	// later claim must find at its head); nil: unchanged.
	Cut *int64
	// Dead are the messages, as stored (the payload sealed on an
	// encrypted queue).
	Dead []PopDead
}

// PopDead is one message of PopDeadLetterParams.
type PopDead struct {
	Offset int64
	Kept   Kept
	Reason string
}

// PopDeadLetter runs c.PopDeadLetter for in on q. It reports false when
// the lease is lost (the partition is gone, for an auto-ack).
func PopDeadLetter(ctx context.Context, c *Consume, q Querier, in PopDeadLetterParams) (bool, error) {
	n := len(in.Dead)
	var (
		offs     = make([]int64, n)
		ids      = make([]uuid.UUID, n)
		txns     = make([]string, n)
		flags    = make([]int32, n)
		payloads = make([][]byte, n)
		created  = make([]time.Time, n)
		reasons  = make([]string, n)
		keys     = make([]string, n)
		hdrs     = make([][]byte, n)
	)
	for i, d := range in.Dead {
		f := &d.Kept.Frame
		offs[i], ids[i], txns[i], flags[i], payloads[i], created[i] = d.Offset, f.ID, f.TransactionID, int32(f.Flags), f.Payload, d.Kept.CreatedAt
		keys[i], hdrs[i], reasons[i] = f.Key, f.Headers, d.Reason
	}
	var ok bool
	err := scanPrefix(ctx, q, c.PopDeadLetter, []any{in.Partition, in.Group, in.Lease, in.Cut,
		offs, ids, txns, flags, payloads, created, reasons, keys, hdrs}, &ok)
	return ok, err
}

// Extend runs c.Extend on q: it renews lease l to end d from now (sent in
// whole milliseconds, at least one) and returns the new end, or
// pgx.ErrNoRows when the lease is lost. A non-empty member is the lease
// owner of the consumer group member renewing (client '#' member id): the
// renewal is its heartbeat too.
func Extend(ctx context.Context, c *Consume, q Querier, l Lease, d time.Duration, member string) (time.Time, error) {
	var exp time.Time
	var m *string
	if member != "" {
		m = &member
	}
	err := scanPrefix(ctx, q, c.Extend, prefixArgs(c.Extend, l.Partition, l.Group, l.ID, max(d.Milliseconds(), 1), m), &exp)
	return exp, err
}

// TakeQuerier runs one statement of an isolated push (AppendSegment or
// PushSegment, through alloc) and c.PushTake after it in one pipeline: one
// implicit transaction, one round trip, one commit at its Sync. push_take
// never fails (see push_take() in sqlschema/functions/pop.sql), so the push
// commits or fails as it would alone.
type TakeQuerier struct {
	conn *pgx.Conn
	sql  string
	args []any
	br   pgx.BatchResults
}

// NewTakeQuerier is a TakeQuerier on conn whose take is up to n messages
// under lingering lease l, the rows reporting leaseTime (as PopLinger).
func NewTakeQuerier(c *Consume, conn *pgx.Conn, l Lease, n int, leaseTime time.Duration) *TakeQuerier {
	return &TakeQuerier{conn: conn, sql: c.PushTake, args: []any{l.Partition, l.Group, l.ID, n, leaseTime.Milliseconds()}}
}

// Query sends sql (the push) and the take, and returns the push's rows.
// Only its first call sends anything.
func (t *TakeQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.br != nil {
		return nil, errors.New("stmt: TakeQuerier runs one statement")
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue(t.sql, t.args...)
	t.br = t.conn.SendBatch(ctx, b)
	return t.br.Query()
}

// Finish reads the take's rows, calling each for every row as PopLinger
// does, and ends the pipeline. sent is false when Query was never called;
// err is the pipeline's, through its commit: with an error the push's
// outcome is not known, whatever its rows said.
func (t *TakeQuerier) Finish(each func(*PopRow) error) (sent, over bool, err error) {
	if t.br == nil {
		return false, false, nil
	}
	rows, err := t.br.Query()
	if err == nil {
		err = scanPopRows(rows, func(r *PopRow) error {
			if r.Lease == nil {
				over = true
				return nil
			}
			return each(r)
		})
	}
	if cerr := t.br.Close(); err == nil {
		err = cerr
	}
	return true, over, err
}
