package stmt

import (
	"context"
	"errors"
	"time"

	"github.com/gofrs/uuid/v5"
)

// errNoStatement is returned by a statement this release added when a
// previous release's statements are in use (see Use).
var errNoStatement = errors.New("stmt: the statements in use do not have this one")

// ScheduleParams is the input of Schedule: one queue's items, aligned by
// index.
type ScheduleParams struct {
	Queue      QueueRef
	Partitions []string
	Due        []time.Time
	// Hashes are the xxh3-128 of the transaction ids, distinct.
	Hashes [][]byte
	IDs    []uuid.UUID
	// Flags and Lanes are push_bundle's per segment (1 encrypted, 2 keyed;
	// the lane count a keyed item was routed with, or 0).
	Flags []int32
	Lanes []int32
	// Blobs are the one-frame raw segments as a push stores them.
	Blobs [][]byte
}

// ScheduleRow is one row of Schedule: an item's verdict (schedule_items'
// status), or, with Ord 0, the whole call's.
type ScheduleRow struct {
	Ord    int32
	Status int32
	DupID  *uuid.UUID
}

// Schedule runs s.Schedule (schedule_items) on q.
func Schedule(ctx context.Context, s *Set, q Querier, p ScheduleParams) ([]ScheduleRow, error) {
	if s.Schedule == "" {
		return nil, errNoStatement
	}
	rows, err := q.Query(ctx, s.Schedule, p.Queue.Tenant, p.Queue.Name, p.Partitions, p.Due, p.Hashes, p.IDs,
		p.Flags, p.Lanes, p.Blobs)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make([]ScheduleRow, 0, len(p.Partitions))
	for rows.Next() {
		var r ScheduleRow
		if err := rows.Scan(&r.Ord, &r.Status, &r.DupID); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// MoveRow is what one MoveScheduled did (see move_scheduled).
type MoveRow struct {
	Moved, Dropped, Held int32
	// WokeTenants, WokeQueues and WokeParts name the partition of each
	// appended message, aligned.
	WokeTenants []uuid.UUID
	WokeQueues  []string
	WokeParts   []string
	// NextIn is the time until the next due message by the database's
	// clock; nil when none is scheduled.
	NextIn *int64
}

// MoveScheduled runs s.MoveScheduled on q: moves up to limit due messages
// and maxBytes of their blobs (the first always).
func MoveScheduled(ctx context.Context, s *Set, q Querier, limit int32, maxBytes int64) (MoveRow, error) {
	var r MoveRow
	if s.MoveScheduled == "" {
		return r, errNoStatement
	}
	err := scanPrefix(ctx, q, s.MoveScheduled, []any{limit, maxBytes}, &r.Moved, &r.Dropped, &r.Held, &r.WokeTenants,
		&r.WokeQueues, &r.WokeParts, &r.NextIn)
	return r, err
}

// CancelScheduled runs s.CancelScheduled on q: deletes the queue's
// scheduled messages with these transaction id hashes, returning how many.
func CancelScheduled(ctx context.Context, s *Set, q Querier, queue QueueRef, hashes [][]byte) (int64, error) {
	if s.CancelScheduled == "" {
		return 0, errNoStatement
	}
	var n int64
	err := scanPrefix(ctx, q, s.CancelScheduled, []any{queue.Tenant, queue.Name, hashes}, &n)
	return n, err
}

// ScheduledStatus runs s.ScheduledStatus on q: how many messages the queue
// has scheduled, the earliest due time (nil with none), and how many
// failed messages' retry copies wait to be appended. With a previous
// release's statements it reports none.
func ScheduledStatus(ctx context.Context, s *Set, q Querier, queue QueueRef) (n int64, due *time.Time, retries int64, err error) {
	if s.ScheduledStatus == "" {
		return 0, nil, 0, nil
	}
	err = scanPrefix(ctx, q, s.ScheduledStatus, []any{queue.Tenant, queue.Name}, &n, &due, &retries)
	return n, due, retries, err
}
