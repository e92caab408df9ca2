-- Maintenance: the due work, its steps, lag and the maintenance flag.
-- Statements, one per "-- name: Field" block (the field of stmt.Set or
-- stmt.Consume it fills); {{schema}} is the quoted schema name.

-- name: MaintenanceWindow
SELECT id FROM {{schema}}.partitions WHERE id > $1 ORDER BY id LIMIT $2

-- name: MaintenanceDue
-- Retention is due when the oldest segment is, by retention_due with the
-- groups left open (retention_step then applies them).
SELECT p.id,
    coalesce({{schema}}.retention_due(fs.created_at, NULL, q.retention_ms, q.completed_retention_ms, clock_timestamp(),
                                      true, NULL, NULL), false),
    coalesce(ft.created_at < clock_timestamp()
        - greatest(q.dedup_window_ms, q.lease_time_ms, $2) * interval '1 millisecond', false),
    greatest(q.dedup_window_ms, q.lease_time_ms, $2),
    $3 > 0 AND fs.created_at IS NULL AND p.last_write_at < clock_timestamp() - $3 * interval '1 millisecond'
FROM {{schema}}.partitions p JOIN {{schema}}.queues q ON q.id = p.queue_id
LEFT JOIN LATERAL (SELECT s.created_at FROM {{schema}}.segments s WHERE s.partition_id = p.id
                   ORDER BY s.base_offset LIMIT 1) fs ON true
LEFT JOIN LATERAL (SELECT t.created_at FROM {{schema}}.txns t WHERE t.partition_id = p.id
                   ORDER BY t.base_offset LIMIT 1) ft ON true
WHERE p.id = ANY ($1::int8[])

-- name: RetentionStep
SELECT {{schema}}.retention_step_v2($1, $2, $3)

-- name: PurgeTxnsStep
SELECT {{schema}}.purge_txns_step($1, $2, $3)

-- name: PurgePartition
SELECT {{schema}}.purge_partition($1, $2)

-- name: DeadLetterRetentionStep
-- The dead letters past their queue's dead_letter_retention_ms, at most $1
-- (see dead_letter_retention_step).
SELECT {{schema}}.dead_letter_retention_step($1::int4)

-- name: ExpireMembers
-- The rows of members not seen within $1 ms, at most $2.
SELECT {{schema}}.expire_members($1::int8, $2::int4)

-- name: LagByGroup
SELECT tenant, queue, group_name, sum(lag_messages)::bigint, coalesce(max(lag_seconds), 0)::float8
FROM {{schema}}.consumer_lag GROUP BY tenant, queue, group_name

-- name: LagByGroupRouted
-- LagByGroup on the Citus layout: the consumer_lag view's rows with
-- lag_head spelled out as joins (Citus would run the function on the
-- workers, where its statement over a distributed table fails), as max()
-- then a join by key (a correlated LIMIT is not pushed down); one
-- multi-shard read, grouped on the coordinator.
WITH r AS MATERIALIZED (
    SELECT q.tenant, q.name AS queue, c.group_name,
        {{schema}}.lag_messages(p.last_offset, c.committed, p.log_start) AS lag_messages, hs.created_at AS head
    FROM {{schema}}.consumers c
    JOIN {{schema}}.partitions p ON p.id = c.partition_id
    JOIN {{schema}}.queues q ON q.id = p.queue_id
    LEFT JOIN LATERAL (SELECT max(s.base_offset) AS b FROM {{schema}}.segments s
                       WHERE s.partition_id = p.id AND s.base_offset <= greatest(c.committed + 1, p.log_start)) hb ON true
    LEFT JOIN {{schema}}.segments hs ON hs.partition_id = p.id AND hs.base_offset = hb.b
)
SELECT tenant, queue, group_name, sum(lag_messages)::bigint,
    coalesce(max(CASE WHEN lag_messages > 0 THEN extract(epoch FROM clock_timestamp() - head) ELSE 0 END), 0)::float8
FROM r GROUP BY tenant, queue, group_name

-- name: DeadLetterCounts
-- Every queue, 0 for one without dead letters (through
-- dead_letters_queue_id_idx).
SELECT q.tenant, q.name, (SELECT count(*) FROM {{schema}}.dead_letters d WHERE d.queue_id = q.id)::int8
FROM {{schema}}.queues q

-- name: GetMaintenance
SELECT maintenance FROM {{schema}}.settings

-- name: SetMaintenance
UPDATE {{schema}}.settings SET maintenance = $1, updated_at = now()

-- name: TakeSamples
-- The samples ring's row of every queue for the current bucket of $1 ms,
-- $2 slots (see take_samples); 0 when already taken.
SELECT {{schema}}.take_samples($1::int8, $2::int4)

-- name: Samples
-- Queue ($1 tenant, $2 name)'s samples taken within the last $3 ms of the
-- database clock, oldest first, each with that clock's now; one row of
-- NULLs and the now when there are none. A row from before the clock
-- jumped back is left out until it is overwritten.
SELECT s.taken_at, s.pushed, s.groups, s.consumed, s.lag, n.now
FROM (SELECT clock_timestamp() AS now) n
LEFT JOIN ({{schema}}.queues q JOIN {{schema}}.samples s ON s.queue_id = q.id)
    ON q.tenant = $1 AND q.name = $2
   AND s.taken_at > n.now - $3 * interval '1 millisecond' AND s.taken_at <= n.now
ORDER BY s.taken_at
