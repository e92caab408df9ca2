-- Dead letters: listing, requeueing and discarding.
-- Statements, one per "-- name: Field" block (the field of stmt.Set or
-- stmt.Consume it fills); {{schema}} is the quoted schema name.

-- name: DeadLetters
SELECT d.id, d.partition_name, d.group_name, d.msg_offset, d.message_id, d.transaction_id,
    d.flags, d.payload, d.message_created_at, d.attempts, d.reason, d.created_at, coalesce(d.message_key, ''),
    d.message_headers
FROM {{schema}}.dead_letters_page($1::uuid, $2::text, $3::text[], $4::text, $5::timestamptz, $6::timestamptz,
    $7::int8, $8::int4, $9::int8[]) d
WHERE $10::int8 IS NULL OR d.id <= $10::int8
ORDER BY d.id

-- name: RequeueCandidates
SELECT d.id, d.transaction_id, (d.flags & 1) = 0 AND $9::bool, d.payload, d.partition_name, d.message_id,
    coalesce(d.message_key, ''), d.message_headers, d.flags
FROM {{schema}}.dead_letters_page($1::uuid, $2::text, $3::text[], $4::text, $5::timestamptz, $6::timestamptz,
    $7::int8, $8::int4, $10::int8[]) d
WHERE $11::int8 IS NULL OR d.id <= $11::int8
ORDER BY d.id

-- name: Requeue
SELECT part_name, requeued
FROM {{schema}}.requeue_dead_letters_v2($1::int8, $2::int8[], $3::bytea[], $4::bytea[], $5::int4[], $6::bytea[])

-- name: DiscardDeadLetters
-- One call: the page is deleted whole or not at all.
SELECT {{schema}}.discard_dead_letters($1::uuid, $2::text, $3::text[], $4::text, $5::timestamptz, $6::timestamptz,
    $7::int8, $8::int4, $9::int8[], $10::int8)
