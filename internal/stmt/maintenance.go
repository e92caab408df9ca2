package stmt

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
)

// MaintenanceWindow runs s.MaintenanceWindow on q: the ids of at most
// limit partitions after id after, in id order.
func MaintenanceWindow(ctx context.Context, s *Set, q Querier, after int64, limit int) ([]int64, error) {
	rows, err := q.Query(ctx, s.MaintenanceWindow, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// MaintenanceDueParams is the input of MaintenanceDue.
type MaintenanceDueParams struct {
	Partitions []int64 // partition ids
	// HashFloor is the least time hash rows stay (sent in whole
	// milliseconds), whatever the queue's dedup window and lease time.
	HashFloor time.Duration
	// Idle is how long an empty partition goes unwritten before it is
	// purged (sent in whole milliseconds); <= 0: never.
	Idle time.Duration
}

// MaintenanceDueRow is one row of MaintenanceDue: one of its partitions.
type MaintenanceDueRow struct {
	Partition int64
	Retention bool // retention has segments to delete (RetentionStep)
	Hashes    bool // the hash purge has rows to delete (PurgeTxnsStep)
	// HashKeep is how long the partition's hash rows stay.
	HashKeep time.Duration
	Idle     bool // empty and unwritten for Idle (PurgePartition)
}

// MaintenanceDue runs s.MaintenanceDue for in on q: what is due on each
// partition.
func MaintenanceDue(ctx context.Context, s *Set, q Querier, in MaintenanceDueParams) ([]MaintenanceDueRow, error) {
	rows, err := q.Query(ctx, s.MaintenanceDue, in.Partitions, in.HashFloor.Milliseconds(), max(in.Idle.Milliseconds(), 0))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []MaintenanceDueRow
	for rows.Next() {
		var r MaintenanceDueRow
		var keepMs int64
		if err := rows.Scan(&r.Partition, &r.Retention, &r.Hashes, &keepMs, &r.Idle); err != nil {
			return nil, err
		}
		r.HashKeep = time.Duration(keepMs) * time.Millisecond
		out = append(out, r)
	}
	return out, rows.Err()
}

// RetentionStep runs s.RetentionStep on q: it deletes at most maxSegments
// expired segments of partition pid and returns how many it deleted. The
// hashes of those younger than hashKeep (MaintenanceDueRow.HashKeep; sent
// in whole milliseconds) are kept in hash rows.
func RetentionStep(ctx context.Context, s *Set, q Querier, pid int64, maxSegments int, hashKeep time.Duration) (int, error) {
	var n int
	err := scanPrefix(ctx, q, s.RetentionStep, []any{pid, maxSegments, hashKeep.Milliseconds()}, &n)
	return n, err
}

// PurgeTxnsStep runs s.PurgeTxnsStep on q: it deletes at most maxRows hash
// rows of partition pid older than keep (sent in whole milliseconds) and
// returns how many it deleted.
func PurgeTxnsStep(ctx context.Context, s *Set, q Querier, pid int64, keep time.Duration, maxRows int) (int, error) {
	var n int
	err := scanPrefix(ctx, q, s.PurgeTxnsStep, []any{pid, keep.Milliseconds(), maxRows}, &n)
	return n, err
}

// PurgePartition runs s.PurgePartition on q: it forgets partition pid if
// it is still empty and unwritten for idle (sent in whole milliseconds),
// and reports whether it did.
func PurgePartition(ctx context.Context, s *Set, q Querier, pid int64, idle time.Duration) (bool, error) {
	var gone bool
	err := scanPrefix(ctx, q, s.PurgePartition, []any{pid, idle.Milliseconds()}, &gone)
	return gone, err
}

// DeadLetterRetentionStep runs s.DeadLetterRetentionStep on q: it deletes
// at most maxRows dead letters older than their queue's dead-letter
// retention and returns how many it deleted. A previous release has no
// such statement (see Use) and deletes none: 0.
func DeadLetterRetentionStep(ctx context.Context, s *Set, q Querier, maxRows int) (int, error) {
	if s.DeadLetterRetentionStep == "" {
		return 0, nil
	}
	var n int
	err := scanPrefix(ctx, q, s.DeadLetterRetentionStep, []any{maxRows}, &n)
	return n, err
}

// LagRow is one row of LagByGroup: a consumer group's lag on one queue.
type LagRow struct {
	Tenant   uuid.UUID
	Queue    string
	Group    string
	Messages int64   // behind, summed over the partitions
	Seconds  float64 // the age of the oldest unconsumed message
}

// LagByGroup runs s.LagByGroup on q (s.LagByGroupRouted when routed, on
// the Citus layout).
func LagByGroup(ctx context.Context, s *Set, q Querier, routed bool) ([]LagRow, error) {
	sql := s.LagByGroup
	if routed && s.LagByGroupRouted != "" {
		sql = s.LagByGroupRouted
	}
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []LagRow
	for rows.Next() {
		var r LagRow
		if err := rows.Scan(&r.Tenant, &r.Queue, &r.Group, &r.Messages, &r.Seconds); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeadLetterCountRow is one row of DeadLetterCounts: a queue and how many
// dead letters it holds.
type DeadLetterCountRow struct {
	Tenant      uuid.UUID
	Queue       string
	DeadLetters int64
}

// DeadLetterCounts runs s.DeadLetterCounts on q: every queue of the
// schema, with 0 for one without dead letters. A previous release has no
// such statement (see Use): no rows.
func DeadLetterCounts(ctx context.Context, s *Set, q Querier) ([]DeadLetterCountRow, error) {
	if s.DeadLetterCounts == "" {
		return nil, nil
	}
	rows, err := q.Query(ctx, s.DeadLetterCounts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []DeadLetterCountRow
	for rows.Next() {
		var r DeadLetterCountRow
		if err := rows.Scan(&r.Tenant, &r.Queue, &r.DeadLetters); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// TakeSamples runs s.TakeSamples on q: every queue's row of the samples
// ring for the current bucket of width (whole milliseconds) of the
// database clock, slots buckets to the ring. It returns the rows written,
// 0 when the bucket was taken already. A previous release has no such
// statement (see Use): 0.
func TakeSamples(ctx context.Context, s *Set, q Querier, width time.Duration, slots int) (int, error) {
	if s.TakeSamples == "" {
		return 0, nil
	}
	var n int
	err := scanPrefix(ctx, q, s.TakeSamples, []any{width.Milliseconds(), slots}, &n)
	return n, err
}

// SampleRow is one row of Samples: a queue's running totals at one time.
type SampleRow struct {
	At     time.Time
	Pushed int64
	// Groups, Consumed and Lag are parallel, by group name.
	Groups   []string
	Consumed []int64
	Lag      []int64
}

// Samples runs s.Samples on q: the samples of queue ref taken within the
// last within of the database clock, oldest first, and that clock's now.
// A previous release has no such statement (see Use): none, and the
// zero time.
func Samples(ctx context.Context, s *Set, q Querier, ref QueueRef, within time.Duration) ([]SampleRow, time.Time, error) {
	if s.Samples == "" {
		return nil, time.Time{}, nil
	}
	rows, err := q.Query(ctx, s.Samples, ref.Tenant, ref.Name, within.Milliseconds())
	if err != nil {
		return nil, time.Time{}, err
	}
	defer rows.Close()
	var out []SampleRow
	var now time.Time
	for rows.Next() {
		var at *time.Time
		var r SampleRow
		var pushed *int64
		if err := rows.Scan(&at, &pushed, &r.Groups, &r.Consumed, &r.Lag, &now); err != nil {
			return nil, time.Time{}, err
		}
		if at == nil {
			continue // none: the row only carries now
		}
		r.At, r.Pushed = *at, *pushed
		if len(r.Consumed) != len(r.Groups) || len(r.Lag) != len(r.Groups) {
			return nil, time.Time{}, fmt.Errorf("sample at %v: %d groups, %d consumed, %d lag", r.At, len(r.Groups), len(r.Consumed), len(r.Lag))
		}
		out = append(out, r)
	}
	return out, now, rows.Err()
}
