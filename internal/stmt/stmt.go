// Package stmt is the one place where queen's SQL statements are written down
// (the functions they call live in sqlschema's migrations). Statements are
// rendered once per schema and then used as constants, so pgx caches their
// prepared forms per connection.
package stmt

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/zeebo/xxh3"
)

// Set is every statement, rendered for one schema.
type Set struct {
	Schema string

	// PushBundle commits one bundle of segments: $1 queues, $2 partitions,
	// $3 counts, $4 hash blobs, $5 verified watermarks, $6 payload blobs,
	// $7 tenants, $8 flags, $9 every partition known to exist, $10 the lane
	// count each segment's keyed messages were routed with (0: none).
	PushBundle string
	// PushSegment commits one segment to a partition known to exist: $1
	// tenant, $2 queue, $3 partition, $4 count, $5 hash blob, $6 payload
	// blob, $7 flags, $8 lane count. One row, PushBundle's columns.
	PushSegment string
	// SegmentAt returns the segment covering ($1 partition id, $2 offset).
	SegmentAt string
	// QueueMeta reads whether ($1 tenant, $2 name) is encrypted and its
	// lane count: the options the push handler needs.
	QueueMeta string
	// QueueUpsert creates or updates a queue's options: $1 tenant, $2 name,
	// $3 lease ms, $4 retry limit, $5 dead letter, $6 dedup window ms, $7
	// encryption, $8 delayed ms, $9 window buffer ms, $10 retention ms, $11
	// completed retention ms, $12 failure policy, $13 lanes. No row: the
	// queue is keyed and $13 is not its lane count (nothing changed).
	QueueUpsert string
	// QueueDelete deletes ($1 tenant, $2 name) with its partitions' data.
	QueueDelete string
	// Notify wakes other processes: $1 payload.
	Notify string
	// Channel is the LISTEN/NOTIFY channel name for this schema.
	Channel string

	// MaintenanceWindow: partition ids after $1, at most $2, in id order.
	MaintenanceWindow string
	// MaintenanceDue: for partitions $1, whether retention and the hash
	// purge have work ($2 the hash floor ms), how long hash rows stay, and
	// whether the partition is empty and unwritten for $3 ms (0: never).
	MaintenanceDue string
	RetentionStep  string // ($1 pid, $2 max segments)
	PurgeTxnsStep  string // ($1 pid, $2 keep ms, $3 max rows)
	PurgePartition string // ($1 pid, $2 idle ms)
	LagByGroup     string
	// GetMaintenance and SetMaintenance read and write the schema-wide
	// maintenance flag ($1 on).
	GetMaintenance string
	SetMaintenance string
	// MaintenanceLockKey is the advisory lock that elects one maintainer.
	MaintenanceLockKey int64
}

// New renders the statements for schema, which must already be validated.
func New(schema string) *Set {
	r := strings.NewReplacer("{{s}}", pgx.Identifier{schema}.Sanitize())
	s := &Set{Schema: schema, Channel: channel(schema)}
	s.PushBundle = r.Replace(`SELECT ord, status, partition_id, base_offset, created_at, dup_idx, dup_off
FROM {{s}}.push_bundle($1::text[], $2::text[], $3::int4[], $4::bytea[], $5::int8[], $6::bytea[], $7::uuid[], $8::int4[], $9::bool, $10::int4[])`)
	s.PushSegment = r.Replace(`SELECT ord, status, partition_id, base_offset, created_at, dup_idx, dup_off
FROM {{s}}.push_segment($1::uuid, $2::text, $3::text, $4::int4, $5::bytea, $6::bytea, $7::int4, $8::int4)`)
	s.SegmentAt = r.Replace(`SELECT base_offset, end_offset, created_at, blob FROM {{s}}.segment_at($1, $2)`)
	s.QueueMeta = r.Replace(`SELECT encryption, lanes FROM {{s}}.queues WHERE tenant = $1 AND name = $2`)
	s.QueueUpsert = r.Replace(`INSERT INTO {{s}}.queues AS q (tenant, name, lease_time_ms, retry_limit, dead_letter,
    dedup_window_ms, encryption, delayed_processing_ms, window_buffer_ms, retention_ms, completed_retention_ms,
    failure_policy, lanes)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT (tenant, name) DO UPDATE SET
    lease_time_ms = EXCLUDED.lease_time_ms, retry_limit = EXCLUDED.retry_limit,
    dead_letter = EXCLUDED.dead_letter, dedup_window_ms = EXCLUDED.dedup_window_ms,
    encryption = EXCLUDED.encryption, delayed_processing_ms = EXCLUDED.delayed_processing_ms,
    window_buffer_ms = EXCLUDED.window_buffer_ms, retention_ms = EXCLUDED.retention_ms,
    completed_retention_ms = EXCLUDED.completed_retention_ms, failure_policy = EXCLUDED.failure_policy,
    lanes = EXCLUDED.lanes, updated_at = now()
WHERE NOT (q.keyed AND q.lanes <> EXCLUDED.lanes)
RETURNING 1`)
	s.QueueDelete = r.Replace(`SELECT {{s}}.delete_queue($1, $2)`)
	s.Notify = `SELECT pg_notify($1, $2)`
	s.MaintenanceWindow = r.Replace(`SELECT id FROM {{s}}.partitions WHERE id > $1 ORDER BY id LIMIT $2`)
	s.MaintenanceDue = r.Replace(`SELECT p.id,
    coalesce((q.retention_ms > 0 OR q.completed_retention_ms > 0) AND fs.created_at < clock_timestamp()
        - least(nullif(q.retention_ms, 0), nullif(q.completed_retention_ms, 0)) * interval '1 millisecond', false),
    coalesce(ft.created_at < clock_timestamp()
        - greatest(q.dedup_window_ms, q.lease_time_ms, $2) * interval '1 millisecond', false),
    greatest(q.dedup_window_ms, q.lease_time_ms, $2),
    $3 > 0 AND fs.created_at IS NULL AND p.last_write_at < clock_timestamp() - $3 * interval '1 millisecond'
FROM {{s}}.partitions p JOIN {{s}}.queues q ON q.id = p.queue_id
LEFT JOIN LATERAL (SELECT s.created_at FROM {{s}}.segments s WHERE s.partition_id = p.id
                   ORDER BY s.base_offset LIMIT 1) fs ON true
LEFT JOIN LATERAL (SELECT t.created_at FROM {{s}}.txns t WHERE t.partition_id = p.id
                   ORDER BY t.base_offset LIMIT 1) ft ON true
WHERE p.id = ANY ($1::int8[])`)
	s.RetentionStep = r.Replace(`SELECT {{s}}.retention_step($1, $2)`)
	s.PurgeTxnsStep = r.Replace(`SELECT {{s}}.purge_txns_step($1, $2, $3)`)
	s.PurgePartition = r.Replace(`SELECT {{s}}.purge_partition($1, $2)`)
	s.LagByGroup = r.Replace(`SELECT tenant, queue, group_name, sum(lag_messages)::bigint, coalesce(max(lag_seconds), 0)::float8
FROM {{s}}.consumer_lag GROUP BY tenant, queue, group_name`)
	s.GetMaintenance = r.Replace(`SELECT maintenance FROM {{s}}.settings`)
	s.SetMaintenance = r.Replace(`UPDATE {{s}}.settings SET maintenance = $1, updated_at = now()`)
	s.MaintenanceLockKey = int64(xxh3.HashString("queen:maintenance:" + schema))
	return s
}

// maxIdentifier is PostgreSQL's identifier limit (NAMEDATALEN - 1): LISTEN
// truncates a longer channel name and pg_notify rejects it.
const maxIdentifier = 63

// channel names the schema's LISTEN/NOTIFY channel: "queen_<schema>", or,
// when that is too long, a prefix of the schema and a hash of all of it.
// A hash collision only costs spurious wakes (a rescan), never a lost one.
func channel(schema string) string {
	if c := "queen_" + schema; len(c) <= maxIdentifier {
		return c
	}
	// 6 + 40 + 1 + 16 = 63 bytes; schema names are ASCII.
	return fmt.Sprintf("queen_%s_%016x", schema[:40], xxh3.HashString(schema))
}
