-- Pushing: the calls of the push functions and the wake.
-- Statements, one per "-- name: Field" block (the field of stmt.Set or
-- stmt.Consume it fills); {{schema}} is the quoted schema name.

-- name: PushBundle
SELECT ord, status, partition_id, base_offset, created_at, dup_idx, dup_off
FROM {{schema}}.push_bundle($1::text[], $2::text[], $3::int4[], $4::bytea[], $5::int8[], $6::bytea[], $7::uuid[], $8::int4[], $9::bool, $10::int4[])

-- name: PushSegment
SELECT ord, status, partition_id, base_offset, created_at, dup_idx, dup_off
FROM {{schema}}.push_segment($1::uuid, $2::text, $3::text, $4::int4, $5::bytea, $6::bytea, $7::int4, $8::int4)

-- name: AppendSegment
-- push_one's allocation for a queue without a dedup window, with
-- push_segment's checks, as one statement rather than a function call: a
-- function call in its own transaction costs an isolated push about as
-- much server time again as the writes. Any check failing writes nothing
-- and returns no row. $9 is the partition's id as a verdict gave it to the
-- client: the row is found by its primary key, and its queue and name are
-- checked on it, so a stale or wrong id (the partition purged and created
-- again at another id) finds no row and the client falls back to the
-- bundle. No lookup by name: it cost an index probe per push.
WITH q AS (
    SELECT qq.id FROM {{schema}}.queues qq
    WHERE qq.tenant = $1::uuid AND qq.name = $2::text AND qq.dedup_window_ms = 0
      AND $4::int4 > 0 AND octet_length($5::bytea) = 16 * $4::int4
      AND (NOT qq.encryption OR ($7::int4 & 1) <> 0)
      AND (($7::int4 & 2) = 0 OR qq.keyed)
      AND (coalesce($8::int4, 0) = 0 OR $8::int4 = qq.lanes)
), u AS (
    UPDATE {{schema}}.partitions p SET
        last_offset   = p.last_offset + $4::int4,
        last_write_at = CASE WHEN clock_timestamp() - p.last_write_at > interval '1 second'
                             THEN clock_timestamp() ELSE p.last_write_at END,
        pending       = true
    FROM q
    WHERE p.id = $9::int8 AND p.queue_id = q.id AND p.name = $3::text
    RETURNING p.id, p.last_offset, clock_timestamp() AS at
), s AS (
    INSERT INTO {{schema}}.segments (partition_id, base_offset, end_offset, created_at, blob, failures, hashes)
    SELECT u.id, u.last_offset - $4::int4 + 1, u.last_offset, u.at, $6::bytea, 0, $5::bytea FROM u
)
SELECT 1, 0::int2, u.id, u.last_offset - $4::int4 + 1, u.at, NULL::int4[], NULL::int8[] FROM u

-- name: MarkKeyed
-- Marks queues ($2 names of tenant $1) keyed, in a transaction of its own,
-- ahead of a keyed push inside a caller's transaction: that push then
-- finds them keyed and locks no queue row, which it would hold to its
-- commit. A row another transaction has locked is skipped, never waited
-- for (the push marks it itself). Returns the names keyed now.
WITH l AS (
    SELECT qq.id FROM {{schema}}.queues qq
    WHERE qq.tenant = $1::uuid AND qq.name = ANY ($2::text[]) AND NOT qq.keyed
    ORDER BY qq.id
    FOR NO KEY UPDATE SKIP LOCKED
), u AS (
    UPDATE {{schema}}.queues qq SET keyed = true FROM l WHERE qq.id = l.id RETURNING qq.name
)
SELECT u.name FROM u
UNION ALL
SELECT qq.name FROM {{schema}}.queues qq
WHERE qq.tenant = $1::uuid AND qq.name = ANY ($2::text[]) AND qq.keyed

-- name: SegmentAt
SELECT base_offset, end_offset, created_at, blob FROM {{schema}}.segment_at($1, $2)

-- name: Notify
SELECT pg_notify($1, $2)

-- name: NotifyAlone
SELECT pg_notify($1, $2), set_config('synchronous_commit', 'off', true)
