package stmt

import (
	"context"
	"time"
)

// SQLSTATEs the offsets statements raise (functions/offsets.sql).
const (
	CodeNotFound    = "QN002" // no such queue, partition or group
	CodeGroupActive = "QN003" // the group holds a live lease
)

// ResetParams is the input of ResetGroup.
type ResetParams struct {
	Queue QueueRef
	Group string
	// To is "earliest", "latest", "time" (At) or "offsets" (Offsets,
	// one per Partitions entry: the next offset delivered).
	To string
	At *time.Time
	// Partitions restricts the reset to these partitions; nil: every
	// partition of the queue.
	Partitions []string
	Offsets    []int64
	Force      bool
}

// ResetRow is one cursor ResetGroup moved.
type ResetRow struct {
	Partition     string
	Before, After int64
	Created       bool
	LeaseEnded    bool
}

// ResetGroup runs c.ResetGroup on q, by partition name.
func ResetGroup(ctx context.Context, c *Consume, q Querier, p ResetParams) ([]ResetRow, error) {
	rows, err := q.Query(ctx, c.ResetGroup, p.Queue.Tenant, p.Queue.Name, p.Group, p.To, p.At, p.Partitions,
		p.Offsets, p.Force)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ResetRow
	for rows.Next() {
		var r ResetRow
		if err := rows.Scan(&r.Partition, &r.Before, &r.After, &r.Created, &r.LeaseEnded); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteGroup runs c.DeleteGroup on q: the cursors it deleted and how
// many of them held a live lease.
func DeleteGroup(ctx context.Context, c *Consume, q Querier, queue QueueRef, group string, force bool) (cursors, leases int32, err error) {
	err = scanPrefix(ctx, q, c.DeleteGroup, []any{queue.Tenant, queue.Name, group, force}, &cursors, &leases)
	return cursors, leases, err
}

// ReleaseLease runs c.ReleaseLease on q: whether group had a live lease
// on partition, now ended.
func ReleaseLease(ctx context.Context, c *Consume, q Querier, queue QueueRef, group, partition string) (bool, error) {
	var released bool
	err := scanPrefix(ctx, q, c.ReleaseLease, []any{queue.Tenant, queue.Name, group, partition}, &released)
	return released, err
}
