-- Queues: settings, pause and resume, listing, status and peeking.
-- Statements, one per "-- name: Field" block (the field of stmt.Set or
-- stmt.Consume it fills); {{schema}} is the quoted schema name.

-- name: QueueMeta
SELECT encryption, lanes, dedup_window_ms > 0, id FROM {{schema}}.queues WHERE tenant = $1 AND name = $2

-- name: QueueUpsert
INSERT INTO {{schema}}.queues AS q (tenant, name, lease_time_ms, retry_limit, dead_letter,
    dedup_window_ms, encryption, delayed_processing_ms, window_buffer_ms, retention_ms, completed_retention_ms,
    failure_policy, lanes, dead_letter_retention_ms, retry_backoff_min_ms, retry_backoff_max_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (tenant, name) DO UPDATE SET
    lease_time_ms = EXCLUDED.lease_time_ms, retry_limit = EXCLUDED.retry_limit,
    dead_letter = EXCLUDED.dead_letter, dedup_window_ms = EXCLUDED.dedup_window_ms,
    encryption = EXCLUDED.encryption, delayed_processing_ms = EXCLUDED.delayed_processing_ms,
    window_buffer_ms = EXCLUDED.window_buffer_ms, retention_ms = EXCLUDED.retention_ms,
    completed_retention_ms = EXCLUDED.completed_retention_ms, failure_policy = EXCLUDED.failure_policy,
    lanes = EXCLUDED.lanes, dead_letter_retention_ms = EXCLUDED.dead_letter_retention_ms,
    retry_backoff_min_ms = EXCLUDED.retry_backoff_min_ms, retry_backoff_max_ms = EXCLUDED.retry_backoff_max_ms,
    -- The column default, now(): Citus refuses a function call here.
    updated_at = EXCLUDED.updated_at
WHERE NOT (q.keyed AND q.lanes <> EXCLUDED.lanes)
RETURNING 1

-- name: QueueDelete
SELECT {{schema}}.delete_queue($1, $2)

-- name: QueueIDEnc
SELECT id, encryption FROM {{schema}}.queues WHERE tenant = $1 AND name = $2

-- name: Pause
SELECT {{schema}}.pause_group($1::uuid, $2::text, $3::text)

-- name: Resume
DELETE FROM {{schema}}.paused_groups pg USING {{schema}}.queues q
WHERE q.tenant = $1 AND q.name = $2 AND pg.queue_id = q.id AND pg.group_name = $3
RETURNING 1

-- name: Queues
-- Per (partition, group) as Status counts it, then per group (lag
-- summed, the oldest unconsumed message) and per queue (per partition
-- the group furthest behind, summed; with no group, every retained
-- message), with the messages ever appended and the dead letters (how
-- many, the highest id).
WITH q AS (
    SELECT * FROM {{schema}}.queues WHERE tenant = $1
), pg AS (
    SELECT p.queue_id, p.id AS pid, sub.group_name, l.lag,
        CASE WHEN l.lag > 0 THEN {{schema}}.lag_head(p.id, k.committed, p.log_start) END AS head
    FROM q
    JOIN {{schema}}.partitions p ON p.queue_id = q.id
    JOIN {{schema}}.subscriptions sub ON sub.queue_id = q.id
    LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = sub.group_name
    -- OFFSET 0: k.committed stays a column, so lag_unsettled is inlined.
    CROSS JOIN LATERAL (SELECT coalesce(c.committed, {{schema}}.seed_offset(p.id, p.log_start, p.created_at, sub.mode,
                                                                       sub.created_at, sub.from_time)) AS committed
                        OFFSET 0) k
    CROSS JOIN LATERAL (SELECT {{schema}}.lag_unsettled(p.last_offset, k.committed, p.log_start, c.settled) AS lag) l
), g AS (
    SELECT sub.queue_id, sub.group_name, coalesce(sum(x.lag), 0)::bigint AS lag, min(x.head) AS head
    FROM {{schema}}.subscriptions sub
    JOIN q ON q.id = sub.queue_id
    LEFT JOIN pg x ON x.queue_id = sub.queue_id AND x.group_name = sub.group_name
    GROUP BY sub.queue_id, sub.group_name
    UNION ALL
    SELECT pz.queue_id, pz.group_name, 0, NULL
    FROM {{schema}}.paused_groups pz JOIN q ON q.id = pz.queue_id
    WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.subscriptions sub
                      WHERE sub.queue_id = pz.queue_id AND sub.group_name = pz.group_name)
), pd AS (
    SELECT y.queue_id, sum(y.lag)::bigint AS depth, min(y.head) AS oldest
    FROM (SELECT x.queue_id, x.pid, max(x.lag) AS lag, min(x.head) AS head FROM pg x GROUP BY x.queue_id, x.pid) y
    GROUP BY y.queue_id
), pc AS (
    SELECT p.queue_id, count(*) AS n, sum(greatest(p.last_offset - p.log_start + 1, 0))::bigint AS retained,
        min(fs.created_at) AS oldest, sum(p.last_offset + 1)::bigint AS pushed
    FROM q JOIN {{schema}}.partitions p ON p.queue_id = q.id
    LEFT JOIN LATERAL (SELECT s.created_at FROM {{schema}}.segments s WHERE s.partition_id = p.id
                       ORDER BY s.base_offset LIMIT 1) fs ON true
    GROUP BY p.queue_id
), dl AS (
    SELECT d.queue_id, count(*) AS n, max(d.id) AS last
    FROM q JOIN {{schema}}.dead_letters d ON d.queue_id = q.id
    GROUP BY d.queue_id
)
SELECT q.name, q.tenant, q.lease_time_ms, q.retry_limit, q.dead_letter, q.dedup_window_ms, q.encryption,
    q.delayed_processing_ms, q.window_buffer_ms, q.retention_ms, q.completed_retention_ms, q.failure_policy, q.lanes,
    coalesce(pc.n, 0)::bigint,
    CASE WHEN pd.queue_id IS NOT NULL THEN pd.depth ELSE coalesce(pc.retained, 0) END,
    CASE WHEN pd.queue_id IS NOT NULL THEN pd.oldest ELSE pc.oldest END,
    coalesce(pc.pushed, 0)::bigint, coalesce(dl.n, 0)::bigint,
    g.group_name, g.lag, g.head,
    EXISTS (SELECT 1 FROM {{schema}}.paused_groups pz WHERE pz.queue_id = q.id AND pz.group_name = g.group_name),
    now(), coalesce(dl.last, 0)::bigint, q.dead_letter_retention_ms, q.retry_backoff_min_ms, q.retry_backoff_max_ms
FROM q
LEFT JOIN pc ON pc.queue_id = q.id
LEFT JOIN pd ON pd.queue_id = q.id
LEFT JOIN dl ON dl.queue_id = q.id
LEFT JOIN g ON g.queue_id = q.id
ORDER BY q.name, g.group_name

-- name: QueuesRouted
-- Queues on the Citus layout: the per (partition, group) rows and the per
-- partition counts are each one multi-shard read pushed down whole (as in
-- StatusRouted: seed_offset, lag_head and the oldest segment spelled out
-- as max() or min() and a join by key), materialized; the rest is read
-- on the coordinator.
WITH q AS (
    SELECT * FROM {{schema}}.queues WHERE tenant = $1
), pg AS MATERIALIZED (
    SELECT p.queue_id, p.id AS pid, sub.group_name, l.lag, CASE WHEN l.lag > 0 THEN hs.created_at END AS head
    FROM {{schema}}.queues q0
    JOIN {{schema}}.partitions p ON p.queue_id = q0.id
    JOIN {{schema}}.subscriptions sub ON sub.queue_id = q0.id
    LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = sub.group_name
    -- seed_offset's segment: the newest created before the group's start.
    LEFT JOIN LATERAL (SELECT max(s.base_offset) AS b FROM {{schema}}.segments s
                       WHERE c.committed IS NULL AND sub.mode <> 'all' AND p.created_at < sub.created_at
                         AND s.partition_id = p.id
                         AND s.created_at < CASE WHEN sub.mode = 'new' THEN sub.created_at
                                                 ELSE least(sub.from_time, sub.created_at) END) sb ON true
    LEFT JOIN {{schema}}.segments ss ON ss.partition_id = p.id AND ss.base_offset = sb.b
    CROSS JOIN LATERAL (SELECT coalesce(c.committed, CASE
                           WHEN sub.mode = 'all' OR p.created_at >= sub.created_at THEN p.log_start - 1
                           ELSE greatest(p.log_start - 1, coalesce(ss.end_offset, p.log_start - 1)) END) AS committed) k
    CROSS JOIN LATERAL (SELECT {{schema}}.lag_unsettled(p.last_offset, k.committed, p.log_start, c.settled) AS lag) l
    -- lag_head's segment: the one holding the first retained offset above the cursor.
    LEFT JOIN LATERAL (SELECT max(s.base_offset) AS b FROM {{schema}}.segments s
                       WHERE s.partition_id = p.id AND s.base_offset <= greatest(k.committed + 1, p.log_start)) hb ON true
    LEFT JOIN {{schema}}.segments hs ON hs.partition_id = p.id AND hs.base_offset = hb.b
    WHERE q0.tenant = $1
), g AS (
    SELECT sub.queue_id, sub.group_name, coalesce(sum(x.lag), 0)::bigint AS lag, min(x.head) AS head
    FROM {{schema}}.subscriptions sub
    JOIN q ON q.id = sub.queue_id
    LEFT JOIN pg x ON x.queue_id = sub.queue_id AND x.group_name = sub.group_name
    GROUP BY sub.queue_id, sub.group_name
    UNION ALL
    SELECT pz.queue_id, pz.group_name, 0, NULL
    FROM {{schema}}.paused_groups pz JOIN q ON q.id = pz.queue_id
    WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.subscriptions sub
                      WHERE sub.queue_id = pz.queue_id AND sub.group_name = pz.group_name)
), pd AS (
    SELECT y.queue_id, sum(y.lag)::bigint AS depth, min(y.head) AS oldest
    FROM (SELECT x.queue_id, x.pid, max(x.lag) AS lag, min(x.head) AS head FROM pg x GROUP BY x.queue_id, x.pid) y
    GROUP BY y.queue_id
), pc AS MATERIALIZED (
    SELECT p.queue_id, count(*) AS n, sum(greatest(p.last_offset - p.log_start + 1, 0))::bigint AS retained,
        min(fs.created_at) AS oldest, sum(p.last_offset + 1)::bigint AS pushed
    FROM {{schema}}.queues q0 JOIN {{schema}}.partitions p ON p.queue_id = q0.id
    LEFT JOIN LATERAL (SELECT min(s.base_offset) AS b FROM {{schema}}.segments s WHERE s.partition_id = p.id) fb ON true
    LEFT JOIN {{schema}}.segments fs ON fs.partition_id = p.id AND fs.base_offset = fb.b
    WHERE q0.tenant = $1
    GROUP BY p.queue_id
), dl AS (
    SELECT d.queue_id, count(*) AS n, max(d.id) AS last
    FROM q JOIN {{schema}}.dead_letters d ON d.queue_id = q.id
    GROUP BY d.queue_id
)
SELECT q.name, q.tenant, q.lease_time_ms, q.retry_limit, q.dead_letter, q.dedup_window_ms, q.encryption,
    q.delayed_processing_ms, q.window_buffer_ms, q.retention_ms, q.completed_retention_ms, q.failure_policy, q.lanes,
    coalesce(pc.n, 0)::bigint,
    CASE WHEN pd.queue_id IS NOT NULL THEN pd.depth ELSE coalesce(pc.retained, 0) END,
    CASE WHEN pd.queue_id IS NOT NULL THEN pd.oldest ELSE pc.oldest END,
    coalesce(pc.pushed, 0)::bigint, coalesce(dl.n, 0)::bigint,
    g.group_name, g.lag, g.head,
    EXISTS (SELECT 1 FROM {{schema}}.paused_groups pz WHERE pz.queue_id = q.id AND pz.group_name = g.group_name),
    now(), coalesce(dl.last, 0)::bigint, q.dead_letter_retention_ms, q.retry_backoff_min_ms, q.retry_backoff_max_ms
FROM q
LEFT JOIN pc ON pc.queue_id = q.id
LEFT JOIN pd ON pd.queue_id = q.id
LEFT JOIN dl ON dl.queue_id = q.id
LEFT JOIN g ON g.queue_id = q.id
ORDER BY q.name, g.group_name

-- name: Status
-- A subscribed group has a cursor row on a partition only once one of
-- its pops met it; until then its position is where that row would
-- start (seed_offset). Lag is lag_unsettled: the consumer_lag view's
-- (lag_messages, lag_head) less the offsets settled out of order above
-- the cursor in that range: those are skipped, never read.
SELECT p.name, p.last_offset, p.log_start, p.last_write_at,
    sub.group_name, k.committed, c.batch_end, c.lease_owner, c.lease_expires_at, coalesce(c.attempts, 0),
    {{schema}}.lag_unsettled(p.last_offset, k.committed, p.log_start, c.settled),
    {{schema}}.lag_head(p.id, k.committed, p.log_start) AS head_created_at,
    now(), cardinality(c.settled),
    EXISTS (SELECT 1 FROM {{schema}}.paused_groups pg WHERE pg.queue_id = q.id AND pg.group_name = sub.group_name),
    -- The next attempt's time while a failed message waits (RetryBackoff):
    -- the cursor's, or under per-key Consume the earliest of its keys'.
    CASE WHEN c.retry_at > now() THEN c.retry_at
         WHEN c.wait_offs IS NOT NULL THEN
             (SELECT min(u.t) FROM unnest({{schema}}.waits_live_at(c.wait_offs, c.wait_at, c.committed, c.settled,
                                                                 now())) AS u(t)) END
FROM {{schema}}.queues q
JOIN {{schema}}.partitions p ON p.queue_id = q.id
LEFT JOIN {{schema}}.subscriptions sub ON sub.queue_id = q.id
LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = sub.group_name
-- OFFSET 0: k.committed stays a column, so lag_unsettled is inlined.
LEFT JOIN LATERAL (SELECT coalesce(c.committed, {{schema}}.seed_offset(p.id, p.log_start, p.created_at, sub.mode,
                                                                  sub.created_at, sub.from_time)) AS committed
                   OFFSET 0) k
    ON sub.group_name IS NOT NULL
WHERE q.tenant = $1 AND q.name = $2
ORDER BY p.name, sub.group_name

-- name: StatusRouted
-- Status on the Citus layout: one multi-shard read, pushed down to every
-- shard whole (partitions, consumers and segments co-located, queues and
-- subscriptions reference tables), then the per-row arithmetic on the
-- coordinator. seed_offset and lag_head are spelled out as joins: Citus
-- would run those functions on the workers, where their statements over
-- distributed tables fail; and as max() then a join by key, since a
-- correlated LIMIT is not pushed down.
WITH r AS MATERIALIZED (
    SELECT p.name, p.last_offset, p.log_start, p.last_write_at, sub.group_name, k.committed, c.batch_end,
        c.lease_owner, c.lease_expires_at, c.attempts, c.settled, c.retry_at, c.wait_offs, c.wait_at,
        c.committed AS cursor, hs.created_at AS head_created_at,
        EXISTS (SELECT 1 FROM {{schema}}.paused_groups pg WHERE pg.queue_id = q.id AND pg.group_name = sub.group_name)
            AS paused
    FROM {{schema}}.queues q
    JOIN {{schema}}.partitions p ON p.queue_id = q.id
    LEFT JOIN {{schema}}.subscriptions sub ON sub.queue_id = q.id
    LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = sub.group_name
    -- seed_offset's segment: the newest created before the group's start.
    LEFT JOIN LATERAL (SELECT max(s.base_offset) AS b FROM {{schema}}.segments s
                       WHERE c.committed IS NULL AND sub.mode <> 'all' AND p.created_at < sub.created_at
                         AND s.partition_id = p.id
                         AND s.created_at < CASE WHEN sub.mode = 'new' THEN sub.created_at
                                                 ELSE least(sub.from_time, sub.created_at) END) sb ON true
    LEFT JOIN {{schema}}.segments ss ON ss.partition_id = p.id AND ss.base_offset = sb.b
    LEFT JOIN LATERAL (SELECT coalesce(c.committed, CASE
                           WHEN sub.mode = 'all' OR p.created_at >= sub.created_at THEN p.log_start - 1
                           ELSE greatest(p.log_start - 1, coalesce(ss.end_offset, p.log_start - 1)) END) AS committed) k
        ON sub.group_name IS NOT NULL
    -- lag_head's segment: the one holding the first retained offset above the cursor.
    LEFT JOIN LATERAL (SELECT max(s.base_offset) AS b FROM {{schema}}.segments s
                       WHERE s.partition_id = p.id AND s.base_offset <= greatest(k.committed + 1, p.log_start)) hb ON true
    LEFT JOIN {{schema}}.segments hs ON hs.partition_id = p.id AND hs.base_offset = hb.b
    WHERE q.tenant = $1 AND q.name = $2
)
SELECT r.name, r.last_offset, r.log_start, r.last_write_at,
    r.group_name, r.committed, r.batch_end, r.lease_owner, r.lease_expires_at, coalesce(r.attempts, 0),
    {{schema}}.lag_unsettled(r.last_offset, r.committed, r.log_start, r.settled),
    r.head_created_at, now(), cardinality(r.settled), r.paused,
    CASE WHEN r.retry_at > now() THEN r.retry_at
         WHEN r.wait_offs IS NOT NULL THEN
             (SELECT min(u.t) FROM unnest({{schema}}.waits_live_at(r.wait_offs, r.wait_at, r.cursor, r.settled,
                                                                 now())) AS u(t)) END
FROM r
ORDER BY r.name, r.group_name

-- name: Peek
-- The lower bound on base_offset (the segment holding the first offset
-- wanted) lets the primary key skip the partition's older segments.
WITH segs AS (
    SELECT p.id AS pid, p.name, s.base_offset, s.end_offset,
        s.end_offset - greatest(s.base_offset, $4::int8, p.log_start) + 1 AS n
    FROM {{schema}}.queues q
    JOIN {{schema}}.partitions p ON p.queue_id = q.id
    JOIN {{schema}}.segments s ON s.partition_id = p.id
    WHERE q.tenant = $1 AND q.name = $2 AND ($3::text IS NULL OR p.name = $3::text)
      AND s.end_offset >= greatest($4::int8, p.log_start)
      AND s.base_offset >= coalesce((SELECT max(f.base_offset) FROM {{schema}}.segments f
                                     WHERE f.partition_id = p.id AND f.base_offset <= greatest($4::int8, p.log_start)), 0)
    ORDER BY p.name COLLATE "C", s.base_offset
    LIMIT $5
), w AS (
    SELECT segs.*, sum(n) OVER (ORDER BY name COLLATE "C", base_offset) - n AS before FROM segs
)
SELECT w.pid, w.name, w.base_offset, w.end_offset, greatest(w.base_offset, $4::int8, p.log_start), s.created_at, s.blob
FROM w
JOIN {{schema}}.partitions p ON p.id = w.pid
JOIN {{schema}}.segments s ON s.partition_id = w.pid AND s.base_offset = w.base_offset
WHERE w.before < $5
ORDER BY w.name COLLATE "C", w.base_offset
