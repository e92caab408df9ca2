-- Dead letters: listing and requeueing.
-- Statements, one per "-- name: Field" block (the field of stmt.Set or
-- stmt.Consume it fills); {{schema}} is the quoted schema name.

-- name: DeadLetters
SELECT d.id, d.partition_name, d.group_name, d.msg_offset, d.message_id, d.transaction_id,
    d.flags, d.payload, d.message_created_at, d.attempts, d.reason, d.created_at, coalesce(d.message_key, ''),
    d.message_headers
FROM {{schema}}.dead_letters d
JOIN {{schema}}.queues q ON q.id = d.queue_id
WHERE q.tenant = $1 AND q.name = $2
  AND ($3::text[] IS NULL OR d.group_name = ANY ($3::text[]))
  AND ($4::text IS NULL OR d.partition_name = $4::text)
  AND ($5::timestamptz IS NULL OR d.created_at >= $5::timestamptz)
  AND ($6::timestamptz IS NULL OR d.created_at < $6::timestamptz)
  AND d.id > $7
  AND ($9::int8[] IS NULL OR d.id = ANY ($9::int8[]))
ORDER BY d.id
LIMIT $8

-- name: RequeueCandidates
SELECT d.id, d.transaction_id, (d.flags & 1) = 0 AND $9::bool, d.payload, d.partition_name, d.message_id,
    coalesce(d.message_key, ''), d.message_headers, d.flags
FROM {{schema}}.dead_letters d
JOIN {{schema}}.queues q ON q.id = d.queue_id
WHERE q.tenant = $1 AND q.name = $2
  AND ($3::text[] IS NULL OR d.group_name = ANY ($3::text[]))
  AND ($4::text IS NULL OR d.partition_name = $4::text)
  AND ($5::timestamptz IS NULL OR d.created_at >= $5::timestamptz)
  AND ($6::timestamptz IS NULL OR d.created_at < $6::timestamptz)
  AND d.id > $7
  AND ($10::int8[] IS NULL OR d.id = ANY ($10::int8[]))
ORDER BY d.id
LIMIT $8

-- name: Requeue
SELECT part_name, requeued
FROM {{schema}}.requeue_dead_letters_v2($1::int8, $2::int8[], $3::bytea[], $4::bytea[], $5::int4[], $6::bytea[])
