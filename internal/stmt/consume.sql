-- Consuming: pop, settle, ack and lease renewal.
-- Statements, one per "-- name: Field" block (the field of stmt.Set or
-- stmt.Consume it fills); {{schema}} is the quoted schema name.

-- name: Pop
SELECT partition_id, partition_name, lease_id, lease_expires_at, lease_ms, first_offset, last_offset,
    deliveries, delivered_max, base_offset, end_offset, created_at, blob, failures, settled, fail_offs, fail_counts,
    wait_offs, wait_at
FROM {{schema}}.pop_v2($1::uuid, $2::text, $3::text, $4::text, $5::text[], $6::int4, $7::int4, $8::int8, $9::bool,
    $10::text, $11::text, $12::timestamptz, $13::int4, $14::bool)

-- name: PopAhead
SELECT partition_id, partition_name, lease_id, lease_expires_at, lease_ms, first_offset, last_offset,
    deliveries, delivered_max, base_offset, end_offset, created_at, blob, failures, settled, fail_offs, fail_counts,
    wait_offs, wait_at
FROM {{schema}}.pop_ahead($1::int8, $2::text, $3::uuid, $4::int8, $5::int4, $6::int8)

-- name: PopLinger
SELECT partition_id, partition_name, lease_id, lease_expires_at, lease_ms, first_offset, last_offset,
    deliveries, delivered_max, base_offset, end_offset, created_at, blob, failures, settled, fail_offs, fail_counts,
    wait_offs, wait_at
FROM {{schema}}.pop_linger($1::int8, $2::text, $3::uuid, $4::int4, $5::int8)

-- name: PushTake
SELECT partition_id, partition_name, lease_id, lease_expires_at, lease_ms, first_offset, last_offset,
    deliveries, delivered_max, base_offset, end_offset, created_at, blob, failures, settled, fail_offs, fail_counts,
    wait_offs, wait_at
FROM {{schema}}.push_take($1::int8, $2::text, $3::uuid, $4::int4, $5::int8)

-- name: LingerAck
SELECT status, log_end, lease_end FROM {{schema}}.linger_ack($1::int8, $2::text, $3::uuid, $4::int8, $5::int8)

-- name: SegmentBlob
SELECT s.blob FROM {{schema}}.segments s WHERE s.partition_id = $1::int8 AND s.base_offset = $2::int8

-- name: PopDeadLetter
SELECT {{schema}}.pop_dead_letter($1::int8, $2::text, $3::uuid, $4::int8, $5::int8[], $6::uuid[],
    $7::text[], $8::int4[], $9::bytea[], $10::timestamptz[], $11::text[], $12::text[], $13::bytea[])

-- name: AckMany
SELECT ord, status, committed FROM {{schema}}.ack_many($1::int8[], $2::text[], $3::uuid[], $4::int8[])

-- name: Settle
SELECT ord, status, committed
FROM {{schema}}.settle_v2($1::int8[], $2::text[], $3::uuid[], $4::int8[], $5::int2[], $6::int8[], $7::bool[], $8::text[],
    $9::uuid[], $10::text[], $11::int4[], $12::bytea[], $13::timestamptz[], $14::text[], $15::bytea[], $16::bytea[],
    $17::int8[])

-- name: SettleKeyed
SELECT ord, status, committed
FROM {{schema}}.settle_keyed_v2($1::int8[], $2::text[], $3::uuid[], $4::int8[], $5::int2[], $6::bool[], $7::text[],
    $8::uuid[], $9::text[], $10::int4[], $11::bytea[], $12::timestamptz[], $13::text[], $14::bytea[], $15::bytea[],
    $16::int8[])

-- name: Extend
-- $5, the lease owner of a member (client '#' member id) or NULL: a
-- renewal is the member's heartbeat too (member_seen, rate-limited). No
-- row: the lease is not live.
SELECT e.lease_end FROM {{schema}}.extend_lease($1::int8, $2::text, $3::uuid, $4::int8, $5::text) AS e(lease_end)
WHERE e.lease_end IS NOT NULL

-- name: MemberBeat
SELECT {{schema}}.member_beat($1::uuid, $2::text, $3::text, $4::text, $5::text, $6::text, $7::int4, $8::timestamptz)

-- name: MemberLeave
DELETE FROM {{schema}}.members m USING {{schema}}.queues q
WHERE q.tenant = $1 AND q.name = $2 AND m.queue_id = q.id AND m.group_name = $3 AND m.member_id = $4

-- name: Members
-- The live members (seen within $3 ms) of the tenant's queues, of queue
-- $2 only unless NULL.
SELECT q.name, m.group_name, m.member_id, m.client, m.host, m.pid, m.started_at, m.last_seen
FROM {{schema}}.queues q
JOIN {{schema}}.members m ON m.queue_id = q.id
WHERE q.tenant = $1 AND ($2::text IS NULL OR q.name = $2::text)
  AND m.last_seen > clock_timestamp() - $3::int8 * interval '1 millisecond'
ORDER BY q.name, m.group_name, m.started_at, m.member_id
