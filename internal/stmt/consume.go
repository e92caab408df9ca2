package stmt

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// Consume is the consumption side's statements, rendered for one schema.
type Consume struct {
	// Pop claims and leases: $1 tenant, $2 queue, $3 group, $4 partition
	// (NULL = any), $5 hinted partitions, $6 batch (in all), $7 partitions,
	// $8 lease ms (<= 0: the queue's), $9 auto-ack, $10 lease owner, $11
	// subscription mode, $12 subscription time, $13 batch per partition. One
	// row per delivered segment, with the failures a re-enqueued segment's
	// message carries and, on a partition's first row, the cursor's
	// out-of-order settled offsets and failure entries.
	Pop string
	// PopDeadLetter dead-letters messages a pop claimed but cannot decode:
	// $1 partition id, $2 group, $3 lease (NULL: auto-acked), $4 the
	// lease's new last offset (NULL: unchanged), then per message $5
	// offsets, $6 ids, $7 transaction ids, $8 flags, $9 payloads, $10
	// created at, $11 reasons, $12 keys. One boolean: false if the lease is
	// lost.
	PopDeadLetter string
	// Settle applies acks, failures, retries and dead letters, one result
	// per input in input order; see settle() in migration 003.
	Settle string
	// SettleKeyed applies out-of-order settlements of per-key parallel
	// Consume, one row per message outcome: $1 partition ids, $2 groups, $3
	// leases, $4 offsets, $5 actions, $6 release, $7 reasons, then the
	// dead-letter snapshot $8 ids, $9 transaction ids, $10 flags, $11
	// payloads, $12 created at. One result per row, in row order; see
	// settle_keyed() in migration 003.
	SettleKeyed string
	// AckMany commits pure acks set-based: $1 partition ids, $2 groups,
	// $3 leases, $4 offsets; at most one per (partition, group).
	AckMany string
	// Extend renews a live lease: $1 partition id, $2 group, $3 lease id,
	// $4 milliseconds from now. No row means the lease is lost.
	Extend string
	// Status lists every partition of ($1 tenant, $2 queue) with each
	// group's cursor and lease and whether the group is paused; a partition
	// without groups has NULL group columns.
	Status string
	// DeadLetters pages the dead letters of ($1 tenant, $2 queue) by id:
	// $3 groups (NULL = all), $4 partition (NULL = all), $5 since, $6
	// until, $7 after id, $8 limit.
	DeadLetters string
	// Peek reads segments without a lease or a cursor: ($1 tenant, $2
	// queue), $3 partition (NULL = all), $4 the first offset, $5 the most
	// messages. One row per segment holding offsets at or after $4, by
	// partition name (byte order) then offset, until $5 messages are
	// covered.
	Peek string
	// Pause pauses ($1 tenant, $2 queue, $3 group), creating the queue if
	// missing; Resume deletes the pause and returns a row if there was one.
	Pause  string
	Resume string
	// RequeueCandidates pages dead letters like DeadLetters ($1..$8) for a
	// requeue: id, transaction id, and, only when ($9) the queue is
	// encrypted and the dead letter is not, what sealing it needs.
	RequeueCandidates string
	// QueueIDEnc reads ($1 tenant, $2 name)'s id and encryption flag.
	QueueIDEnc string
	// Requeue requeues dead letters: $1 queue id, $2 ids, $3 hashes, $4
	// replacement payloads, $5 replacement flags; see
	// requeue_dead_letters() in migration 003.
	Requeue string
	// Queues lists every queue of tenant $1 with its options, partition
	// count, depth and oldest unconsumed message, one row per group (NULL
	// group columns for a queue without groups), ordered by queue and group.
	Queues string
}

// NewConsume renders the consumption statements for schema, which must
// already be validated.
func NewConsume(schema string) *Consume {
	r := strings.NewReplacer("{{s}}", pgx.Identifier{schema}.Sanitize())
	c := &Consume{}
	c.Pop = r.Replace(`SELECT partition_id, partition_name, lease_id, lease_expires_at, lease_ms, first_offset, last_offset,
    deliveries, delivered_max, base_offset, end_offset, created_at, blob, failures, settled, fail_offs, fail_counts
FROM {{s}}.pop($1::uuid, $2::text, $3::text, $4::text, $5::text[], $6::int4, $7::int4, $8::int8, $9::bool,
    $10::text, $11::text, $12::timestamptz, $13::int4)`)
	c.PopDeadLetter = r.Replace(`SELECT {{s}}.pop_dead_letter($1::int8, $2::text, $3::uuid, $4::int8, $5::int8[], $6::uuid[],
    $7::text[], $8::int4[], $9::bytea[], $10::timestamptz[], $11::text[], $12::text[], $13::bytea[])`)
	c.AckMany = r.Replace(`SELECT ord, status, committed FROM {{s}}.ack_many($1::int8[], $2::text[], $3::uuid[], $4::int8[])`)
	c.Settle = r.Replace(`SELECT ord, status, committed
FROM {{s}}.settle($1::int8[], $2::text[], $3::uuid[], $4::int8[], $5::int2[], $6::int8[], $7::bool[], $8::text[],
    $9::uuid[], $10::text[], $11::int4[], $12::bytea[], $13::timestamptz[], $14::text[], $15::bytea[])`)
	c.SettleKeyed = r.Replace(`SELECT ord, status, committed
FROM {{s}}.settle_keyed($1::int8[], $2::text[], $3::uuid[], $4::int8[], $5::int2[], $6::bool[], $7::text[],
    $8::uuid[], $9::text[], $10::int4[], $11::bytea[], $12::timestamptz[], $13::text[], $14::bytea[])`)
	c.Extend = r.Replace(`UPDATE {{s}}.consumers
SET lease_expires_at = clock_timestamp() + $4::int8 * interval '1 millisecond'
WHERE partition_id = $1 AND group_name = $2 AND lease_id = $3 AND lease_expires_at > clock_timestamp()
RETURNING lease_expires_at`)
	// A subscribed group has a cursor row on a partition only once one of
	// its pops met it; until then its position is where that row would
	// start (seed_offset).
	c.Status = r.Replace(`SELECT p.name, p.last_offset, p.log_start, p.last_write_at,
    sub.group_name, k.committed, c.batch_end, c.lease_owner, c.lease_expires_at, coalesce(c.attempts, 0),
    (SELECT s.created_at FROM {{s}}.segments s
     WHERE s.partition_id = p.id AND s.base_offset <= greatest(k.committed + 1, p.log_start)
     ORDER BY s.base_offset DESC LIMIT 1) AS head_created_at,
    now(), cardinality(c.settled),
    EXISTS (SELECT 1 FROM {{s}}.paused_groups pg WHERE pg.queue_id = q.id AND pg.group_name = sub.group_name)
FROM {{s}}.queues q
JOIN {{s}}.partitions p ON p.queue_id = q.id
LEFT JOIN {{s}}.subscriptions sub ON sub.queue_id = q.id
LEFT JOIN {{s}}.consumers c ON c.partition_id = p.id AND c.group_name = sub.group_name
LEFT JOIN LATERAL (SELECT coalesce(c.committed, {{s}}.seed_offset(p.id, p.log_start, p.created_at, sub.mode,
                                                                  sub.created_at, sub.from_time)) AS committed) k
    ON sub.group_name IS NOT NULL
WHERE q.tenant = $1 AND q.name = $2
ORDER BY p.name, sub.group_name`)
	c.DeadLetters = r.Replace(`SELECT d.id, d.partition_name, d.group_name, d.msg_offset, d.message_id, d.transaction_id,
    d.flags, d.payload, d.message_created_at, d.attempts, d.reason, d.created_at, coalesce(d.message_key, ''),
    d.message_headers
FROM {{s}}.dead_letters d
JOIN {{s}}.queues q ON q.id = d.queue_id
WHERE q.tenant = $1 AND q.name = $2
  AND ($3::text[] IS NULL OR d.group_name = ANY ($3::text[]))
  AND ($4::text IS NULL OR d.partition_name = $4::text)
  AND ($5::timestamptz IS NULL OR d.created_at >= $5::timestamptz)
  AND ($6::timestamptz IS NULL OR d.created_at < $6::timestamptz)
  AND d.id > $7
ORDER BY d.id
LIMIT $8`)
	// The lower bound on base_offset (the segment holding the first offset
	// wanted) lets the primary key skip the partition's older segments.
	c.Peek = r.Replace(`WITH segs AS (
    SELECT p.id AS pid, p.name, s.base_offset, s.end_offset,
        s.end_offset - greatest(s.base_offset, $4::int8, p.log_start) + 1 AS n
    FROM {{s}}.queues q
    JOIN {{s}}.partitions p ON p.queue_id = q.id
    JOIN {{s}}.segments s ON s.partition_id = p.id
    WHERE q.tenant = $1 AND q.name = $2 AND ($3::text IS NULL OR p.name = $3::text)
      AND s.end_offset >= greatest($4::int8, p.log_start)
      AND s.base_offset >= coalesce((SELECT max(f.base_offset) FROM {{s}}.segments f
                                     WHERE f.partition_id = p.id AND f.base_offset <= greatest($4::int8, p.log_start)), 0)
    ORDER BY p.name COLLATE "C", s.base_offset
    LIMIT $5
), w AS (
    SELECT segs.*, sum(n) OVER (ORDER BY name COLLATE "C", base_offset) - n AS before FROM segs
)
SELECT w.pid, w.name, w.base_offset, w.end_offset, greatest(w.base_offset, $4::int8, p.log_start), s.created_at, s.blob
FROM w
JOIN {{s}}.partitions p ON p.id = w.pid
JOIN {{s}}.segments s ON s.partition_id = w.pid AND s.base_offset = w.base_offset
WHERE w.before < $5
ORDER BY w.name COLLATE "C", w.base_offset`)
	c.Pause = r.Replace(`SELECT {{s}}.pause_group($1::uuid, $2::text, $3::text)`)
	c.Resume = r.Replace(`DELETE FROM {{s}}.paused_groups pg USING {{s}}.queues q
WHERE q.tenant = $1 AND q.name = $2 AND pg.queue_id = q.id AND pg.group_name = $3
RETURNING 1`)
	c.QueueIDEnc = r.Replace(`SELECT id, encryption FROM {{s}}.queues WHERE tenant = $1 AND name = $2`)
	c.RequeueCandidates = r.Replace(`SELECT d.id, d.transaction_id, (d.flags & 1) = 0 AND $9::bool,
    CASE WHEN (d.flags & 1) = 0 AND $9::bool THEN d.payload END, d.partition_name, d.message_id,
    coalesce(d.message_key, ''), d.message_headers, d.flags
FROM {{s}}.dead_letters d
JOIN {{s}}.queues q ON q.id = d.queue_id
WHERE q.tenant = $1 AND q.name = $2
  AND ($3::text[] IS NULL OR d.group_name = ANY ($3::text[]))
  AND ($4::text IS NULL OR d.partition_name = $4::text)
  AND ($5::timestamptz IS NULL OR d.created_at >= $5::timestamptz)
  AND ($6::timestamptz IS NULL OR d.created_at < $6::timestamptz)
  AND d.id > $7
ORDER BY d.id
LIMIT $8`)
	c.Requeue = r.Replace(`SELECT part_name, requeued
FROM {{s}}.requeue_dead_letters($1::int8, $2::int8[], $3::bytea[], $4::bytea[], $5::int4[])`)
	// Per (partition, group) as Status counts it, then per group (lag
	// summed, the oldest unconsumed message) and per queue (per partition
	// the group furthest behind, summed; with no group, every retained
	// message).
	c.Queues = r.Replace(`WITH q AS (
    SELECT * FROM {{s}}.queues WHERE tenant = $1
), pg AS (
    SELECT p.queue_id, p.id AS pid, sub.group_name, greatest(p.last_offset - k.committed, 0) AS lag,
        CASE WHEN p.last_offset > k.committed THEN
            (SELECT s.created_at FROM {{s}}.segments s
             WHERE s.partition_id = p.id AND s.base_offset <= greatest(k.committed + 1, p.log_start)
             ORDER BY s.base_offset DESC LIMIT 1) END AS head
    FROM q
    JOIN {{s}}.partitions p ON p.queue_id = q.id
    JOIN {{s}}.subscriptions sub ON sub.queue_id = q.id
    LEFT JOIN {{s}}.consumers c ON c.partition_id = p.id AND c.group_name = sub.group_name
    CROSS JOIN LATERAL (SELECT coalesce(c.committed, {{s}}.seed_offset(p.id, p.log_start, p.created_at, sub.mode,
                                                                       sub.created_at, sub.from_time)) AS committed) k
), g AS (
    SELECT sub.queue_id, sub.group_name, coalesce(sum(x.lag), 0)::bigint AS lag, min(x.head) AS head
    FROM {{s}}.subscriptions sub
    JOIN q ON q.id = sub.queue_id
    LEFT JOIN pg x ON x.queue_id = sub.queue_id AND x.group_name = sub.group_name
    GROUP BY sub.queue_id, sub.group_name
    UNION ALL
    SELECT pz.queue_id, pz.group_name, 0, NULL
    FROM {{s}}.paused_groups pz JOIN q ON q.id = pz.queue_id
    WHERE NOT EXISTS (SELECT 1 FROM {{s}}.subscriptions sub
                      WHERE sub.queue_id = pz.queue_id AND sub.group_name = pz.group_name)
), pd AS (
    SELECT y.queue_id, sum(y.lag)::bigint AS depth, min(y.head) AS oldest
    FROM (SELECT x.queue_id, x.pid, max(x.lag) AS lag, min(x.head) AS head FROM pg x GROUP BY x.queue_id, x.pid) y
    GROUP BY y.queue_id
), pc AS (
    SELECT p.queue_id, count(*) AS n, sum(greatest(p.last_offset - p.log_start + 1, 0))::bigint AS retained,
        min(fs.created_at) AS oldest
    FROM q JOIN {{s}}.partitions p ON p.queue_id = q.id
    LEFT JOIN LATERAL (SELECT s.created_at FROM {{s}}.segments s WHERE s.partition_id = p.id
                       ORDER BY s.base_offset LIMIT 1) fs ON true
    GROUP BY p.queue_id
)
SELECT q.name, q.tenant, q.lease_time_ms, q.retry_limit, q.dead_letter, q.dedup_window_ms, q.encryption,
    q.delayed_processing_ms, q.window_buffer_ms, q.retention_ms, q.completed_retention_ms, q.failure_policy, q.lanes,
    coalesce(pc.n, 0)::bigint,
    CASE WHEN pd.queue_id IS NOT NULL THEN pd.depth ELSE coalesce(pc.retained, 0) END,
    CASE WHEN pd.queue_id IS NOT NULL THEN pd.oldest ELSE pc.oldest END,
    g.group_name, g.lag, g.head,
    EXISTS (SELECT 1 FROM {{s}}.paused_groups pz WHERE pz.queue_id = q.id AND pz.group_name = g.group_name),
    now()
FROM q
LEFT JOIN pc ON pc.queue_id = q.id
LEFT JOIN pd ON pd.queue_id = q.id
LEFT JOIN g ON g.queue_id = q.id
ORDER BY q.name, g.group_name`)
	return c
}
