-- Pushing: the calls of the push functions and the wake.
-- Statements, one per "-- name: Field" block (the field of stmt.Set or
-- stmt.Consume it fills); {{schema}} is the quoted schema name.

-- name: PushBundle
SELECT ord, status, partition_id, base_offset, created_at, dup_idx, dup_off
FROM {{schema}}.push_bundle($1::text[], $2::text[], $3::int4[], $4::bytea[], $5::int8[], $6::bytea[], $7::uuid[], $8::int4[], $9::bool, $10::int4[])

-- name: PushSegment
SELECT ord, status, partition_id, base_offset, created_at, dup_idx, dup_off
FROM {{schema}}.push_segment($1::uuid, $2::text, $3::text, $4::int4, $5::bytea, $6::bytea, $7::int4, $8::int4)

-- name: SegmentAt
SELECT base_offset, end_offset, created_at, blob FROM {{schema}}.segment_at($1, $2)

-- name: Notify
SELECT pg_notify($1, $2)
