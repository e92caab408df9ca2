package stmt

import (
	"context"
	"time"

	"github.com/gofrs/uuid/v5"
)

// QueueRef names a queue: its tenant and its name.
type QueueRef struct {
	Tenant uuid.UUID
	Name   string
}

// StatusRow is one row of Status: a partition of the queue, with one
// group's cursor and lease there (Group nil: the queue has no group).
type StatusRow struct {
	Partition   string
	LastOffset  int64 // the newest offset; -1 when nothing was pushed
	LogStart    int64 // the oldest retained offset
	LastWriteAt time.Time
	Group       *string
	// Committed is the group's cursor (where its first pop would start,
	// for a group that never met the partition).
	Committed *int64
	// BatchEnd, Owner and LeaseExpires are the group's lease (the last
	// offset it covers, the holder, its end); nil without a cursor row.
	BatchEnd     *int64
	Owner        *string
	LeaseExpires *time.Time
	Attempts     int32 // failures charged at the cursor
	// Lag is the retained messages after Committed not settled out of
	// order; HeadAt when the first of them was pushed.
	Lag    *int64
	HeadAt *time.Time
	Now    time.Time // the server's clock
	// Settled counts the offsets settled out of order above the cursor.
	Settled *int32
	Paused  bool
	// RetryAt is when the failed message at the cursor may be delivered
	// again (RetryBackoff), while that is in the future; else nil, and
	// always nil from a previous release's statement.
	RetryAt *time.Time
}

// Status runs c.Status for queue on q (c.StatusRouted when routed, on
// the Citus layout): its rows, by partition name then group.
func Status(ctx context.Context, c *Consume, q Querier, queue QueueRef, routed bool) ([]StatusRow, error) {
	sql := c.Status
	if routed && c.StatusRouted != "" {
		sql = c.StatusRouted
	}
	rows, err := q.Query(ctx, sql, queue.Tenant, queue.Name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []StatusRow
	for rows.Next() {
		var r StatusRow
		var attempts *int32
		dest := []any{&r.Partition, &r.LastOffset, &r.LogStart, &r.LastWriteAt, &r.Group, &r.Committed, &r.BatchEnd,
			&r.Owner, &r.LeaseExpires, &attempts, &r.Lag, &r.HeadAt, &r.Now, &r.Settled, &r.Paused, &r.RetryAt}
		// Columns are only appended to: a previous release's statement
		// fills a prefix.
		if err := rows.Scan(dest[:min(len(dest), len(rows.FieldDescriptions()))]...); err != nil {
			return nil, err
		}
		if attempts != nil {
			r.Attempts = *attempts
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// PeekParams is the input of Peek.
type PeekParams struct {
	Queue QueueRef
	// Partition restricts the read to the partition of that name; nil:
	// every partition.
	Partition *string
	// From is the first offset read in each partition (a partition's
	// oldest retained one when that is later); Limit the most messages
	// the segments returned cover.
	From  int64
	Limit int
}

// PeekRow is one row of Peek: a segment holding offsets at or after From.
type PeekRow struct {
	PartitionID   int64
	PartitionName string
	Base, End     int64 // the segment's offsets (inclusive)
	// First is the first offset to read in it: the greatest of Base, From
	// and the partition's oldest retained offset.
	First     int64
	CreatedAt time.Time
	Blob      []byte // the segment as stored (internal/segment)
}

// Peek runs c.Peek for in on q and calls each for every row, by partition
// name (byte order) then offset, with a row it may keep no reference to
// (the row is reused). An error from each, or a false more, ends Peek.
func Peek(ctx context.Context, c *Consume, q Querier, in PeekParams, each func(r *PeekRow) (more bool, err error)) error {
	rows, err := q.Query(ctx, c.Peek, in.Queue.Tenant, in.Queue.Name, in.Partition, in.From, in.Limit)
	if err != nil {
		return err
	}
	defer rows.Close()
	var r PeekRow
	for rows.Next() {
		if err := rows.Scan(&r.PartitionID, &r.PartitionName, &r.Base, &r.End, &r.First, &r.CreatedAt, &r.Blob); err != nil {
			return err
		}
		more, err := each(&r)
		if err != nil {
			return err
		}
		if !more {
			break
		}
	}
	return rows.Err()
}

// QueuesRow is one row of Queues: a queue of the tenant with its options
// and counts (repeated on each of its rows), and one group (Group nil: the
// queue has none).
type QueuesRow struct {
	Name   string
	Tenant uuid.UUID
	// The queue's options as stored; durations in milliseconds.
	LeaseMs            int64
	RetryLimit         int32 // 0: none
	DeadLetter         bool
	DedupWindowMs      int64
	Encryption         bool
	DelayedMs          int64
	WindowBufferMs     int64
	RetentionMs        int64
	CompletedRetention int64 // ms
	FailurePolicy      string
	Lanes              int32
	Partitions         int64
	// Depth is the messages still to be read (per partition, by the group
	// furthest behind; with no group, every retained message), Oldest when
	// the oldest of them was pushed.
	Depth  int64
	Oldest *time.Time
	// Pushed is the messages ever appended, DeadLetters how many dead
	// letters the queue holds and LastDeadLetter the highest id (0: none).
	Pushed      int64
	DeadLetters int64
	Group       *string
	// Lag is the group's unread messages summed over the partitions,
	// Head when the oldest of them was pushed.
	Lag            *int64
	Head           *time.Time
	Paused         bool
	Now            time.Time // the server's clock
	LastDeadLetter int64
	// DeadLetterRetentionMs is the queue's dead-letter retention (0:
	// none). A previous release's statement (see Use) has no such column:
	// it stays 0.
	DeadLetterRetentionMs int64
	// RetryBackoffMinMs and RetryBackoffMaxMs are the queue's retry
	// backoff (both 0: none). A previous release's statement has no such
	// columns: they stay 0.
	RetryBackoffMinMs int64
	RetryBackoffMaxMs int64
}

// Queues runs c.Queues for tenant on q (c.QueuesRouted when routed, on the
// Citus layout): every queue of the tenant, by name then group.
func Queues(ctx context.Context, c *Consume, q Querier, tenant uuid.UUID, routed bool) ([]QueuesRow, error) {
	sql := c.Queues
	if routed && c.QueuesRouted != "" {
		sql = c.QueuesRouted
	}
	rows, err := q.Query(ctx, sql, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []QueuesRow
	for rows.Next() {
		var r QueuesRow
		dest := []any{&r.Name, &r.Tenant, &r.LeaseMs, &r.RetryLimit, &r.DeadLetter, &r.DedupWindowMs, &r.Encryption,
			&r.DelayedMs, &r.WindowBufferMs, &r.RetentionMs, &r.CompletedRetention, &r.FailurePolicy, &r.Lanes,
			&r.Partitions, &r.Depth, &r.Oldest, &r.Pushed, &r.DeadLetters, &r.Group, &r.Lag, &r.Head, &r.Paused,
			&r.Now, &r.LastDeadLetter, &r.DeadLetterRetentionMs, &r.RetryBackoffMinMs, &r.RetryBackoffMaxMs}
		// Columns are only appended to: a previous release's statement
		// fills a prefix.
		if err := rows.Scan(dest[:min(len(dest), len(rows.FieldDescriptions()))]...); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Pause runs c.Pause on q: it pauses group on queue, creating the queue
// if missing.
func Pause(ctx context.Context, c *Consume, q Querier, queue QueueRef, group string) error {
	rows, err := q.Query(ctx, c.Pause, queue.Tenant, queue.Name, group)
	if err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// Resume runs c.Resume on q: it deletes group's pause on queue and reports
// whether there was one.
func Resume(ctx context.Context, c *Consume, q Querier, queue QueueRef, group string) (bool, error) {
	rows, err := q.Query(ctx, c.Resume, queue.Tenant, queue.Name, group)
	if err != nil {
		return false, err
	}
	n := 0
	for rows.Next() {
		n++
	}
	rows.Close()
	return n > 0, rows.Err()
}

// QueueIDEnc runs c.QueueIDEnc on q: queue's id and whether it is
// encrypted, or pgx.ErrNoRows when it does not exist.
func QueueIDEnc(ctx context.Context, c *Consume, q Querier, queue QueueRef) (id int64, encrypted bool, err error) {
	err = scanPrefix(ctx, q, c.QueueIDEnc, []any{queue.Tenant, queue.Name}, &id, &encrypted)
	return id, encrypted, err
}
