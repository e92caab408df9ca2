-- The console's throughput and lag samples (table samples, migration 012).
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- Takes one sample of every queue into the ring, once per bucket of
-- p_width_ms of the database clock (one clock for every process: their
-- own may disagree), into slot bucket mod p_slots. Returns the rows
-- written; 0 when this bucket was already taken, which costs one
-- single-row probe. The totals come from the partitions, subscriptions
-- and consumers rows: a group's position on a partition it has not reached
-- yet is where its cursor will start (seed_offset, as Queues and Status
-- take it: a probe of the partition's segments only for a group
-- subscribed 'new' or 'from' on a partition older than the subscription,
-- never a scan), its lag is lag_unsettled (as Queues and Status count it).
-- No queue row is locked but those a new ring row's foreign key checks (a
-- queue's first hour only; a rewrite keeps its queue). A queue whose
-- delete commits while that check waits for it fails the statement with a
-- foreign-key error: it is taken again, once the delete is visible,
-- without that queue. A clock that jumps makes a bucket the ring holds
-- already, or skips some: the slot is overwritten all the same, and
-- readers keep only rows inside their window by taken_at.
CREATE OR REPLACE FUNCTION {{schema}}.take_samples(p_width_ms bigint, p_slots integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_bucket bigint;
    v_n      integer;
    v_routed boolean := (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true);
BEGIN
    IF p_width_ms <= 0 OR p_slots <= 0 THEN
        RAISE EXCEPTION 'take_samples: width % ms and % slots must be positive', p_width_ms, p_slots
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_bucket := floor(extract(epoch FROM v_now) * 1000 / p_width_ms)::bigint;
    -- Read first: a bucket taken already costs a read, not an UPDATE of
    -- no row, which on the Citus layout (a reference table) is a
    -- two-phase commit over every node.
    IF (SELECT c.bucket FROM {{schema}}.samples_clock c) = v_bucket THEN
        RETURN 0;
    END IF;
    -- Row-locked: a second pass in the same bucket waits for the first to
    -- commit, then finds the bucket moved and writes nothing.
    UPDATE {{schema}}.samples_clock SET bucket = v_bucket WHERE bucket <> v_bucket;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    FOR i IN 1..3 LOOP
        BEGIN
        IF v_routed THEN
            -- The Citus layout: seed_offset spelled out as joins (Citus
            -- would run the function on the workers, where its statement
            -- over a distributed table fails), no OFFSET 0 (not pushed
            -- down); one multi-shard read, written to a reference table:
            -- a two-phase commit, once a bucket.
            INSERT INTO {{schema}}.samples AS s (queue_id, slot, bucket, taken_at, pushed, groups, consumed, lag)
            SELECT q.id, (v_bucket % p_slots)::smallint, v_bucket, v_now, coalesce(t.pushed, 0),
                   coalesce(g.groups, '{}'), coalesce(g.consumed, '{}'), coalesce(g.lag, '{}')
            FROM {{schema}}.queues q
            LEFT JOIN (SELECT queue_id, sum(last_offset + 1)::bigint AS pushed
                       FROM {{schema}}.partitions GROUP BY queue_id) t ON t.queue_id = q.id
            LEFT JOIN (SELECT x.queue_id,
                              array_agg(x.group_name ORDER BY x.group_name) AS groups,
                              array_agg(x.consumed ORDER BY x.group_name) AS consumed,
                              array_agg(x.lag ORDER BY x.group_name) AS lag
                       FROM (SELECT p.queue_id, sub.group_name, sum(k.committed + 1)::bigint AS consumed,
                                    sum({{schema}}.lag_unsettled(p.last_offset, k.committed, p.log_start, c.settled))::bigint AS lag
                             FROM {{schema}}.subscriptions sub
                             JOIN {{schema}}.partitions p ON p.queue_id = sub.queue_id
                             LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = sub.group_name
                             -- seed_offset spelled out as in the StatusRouted statement.
                             LEFT JOIN LATERAL (SELECT max(z.base_offset) AS b FROM {{schema}}.segments z
                                                WHERE c.committed IS NULL AND sub.mode <> 'all'
                                                  AND p.created_at < sub.created_at AND z.partition_id = p.id
                                                  AND z.created_at < CASE WHEN sub.mode = 'new' THEN sub.created_at
                                                                          ELSE least(sub.from_time, sub.created_at) END) sb ON true
                             LEFT JOIN {{schema}}.segments ss ON ss.partition_id = p.id AND ss.base_offset = sb.b
                             CROSS JOIN LATERAL (SELECT coalesce(c.committed, CASE
                                 WHEN sub.mode = 'all' OR p.created_at >= sub.created_at THEN p.log_start - 1
                                 ELSE greatest(p.log_start - 1, coalesce(ss.end_offset, p.log_start - 1)) END) AS committed) k
                             GROUP BY p.queue_id, sub.group_name) x
                       GROUP BY x.queue_id) g ON g.queue_id = q.id
            ON CONFLICT (queue_id, slot) DO UPDATE
            SET bucket = excluded.bucket, taken_at = excluded.taken_at, pushed = excluded.pushed,
                groups = excluded.groups, consumed = excluded.consumed, lag = excluded.lag;
        ELSE
            INSERT INTO {{schema}}.samples AS s (queue_id, slot, bucket, taken_at, pushed, groups, consumed, lag)
            SELECT q.id, (v_bucket % p_slots)::smallint, v_bucket, v_now, coalesce(t.pushed, 0),
                   coalesce(g.groups, '{}'), coalesce(g.consumed, '{}'), coalesce(g.lag, '{}')
            FROM {{schema}}.queues q
            LEFT JOIN (SELECT queue_id, sum(last_offset + 1)::bigint AS pushed
                       FROM {{schema}}.partitions GROUP BY queue_id) t ON t.queue_id = q.id
            LEFT JOIN (SELECT x.queue_id,
                              array_agg(x.group_name ORDER BY x.group_name) AS groups,
                              array_agg(x.consumed ORDER BY x.group_name) AS consumed,
                              array_agg(x.lag ORDER BY x.group_name) AS lag
                       FROM (SELECT p.queue_id, sub.group_name, sum(k.committed + 1)::bigint AS consumed,
                                    sum({{schema}}.lag_unsettled(p.last_offset, k.committed, p.log_start, c.settled))::bigint AS lag
                             FROM {{schema}}.subscriptions sub
                             JOIN {{schema}}.partitions p ON p.queue_id = sub.queue_id
                             LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = sub.group_name
                             -- OFFSET 0: k.committed stays a column, so lag_unsettled is inlined.
                             CROSS JOIN LATERAL (SELECT coalesce(c.committed,
                                 {{schema}}.seed_offset(p.id, p.log_start, p.created_at, sub.mode, sub.created_at, sub.from_time))
                                 AS committed OFFSET 0) k
                             GROUP BY p.queue_id, sub.group_name) x
                       GROUP BY x.queue_id) g ON g.queue_id = q.id
            ON CONFLICT (queue_id, slot) DO UPDATE
            SET bucket = excluded.bucket, taken_at = excluded.taken_at, pushed = excluded.pushed,
                groups = excluded.groups, consumed = excluded.consumed, lag = excluded.lag;
        END IF;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        RETURN v_n;
        EXCEPTION WHEN foreign_key_violation THEN
            -- Taken again, with a snapshot that sees the delete (each take
            -- is a subtransaction: once a bucket, cheap).
            NULL;
        END;
    END LOOP;
    RETURN 0; -- queues deleted under three takes in a row: this bucket is skipped
END
$$;
