-- Maintenance steps, queue deletion and the consumer_lag view.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- Whether a segment created at p_created, ending at offset p_end, is due
-- under its queue's retention at p_now: older than p_ret_ms (consumed or
-- not), or older than p_done_ms and needed by no group (p_groups: there is
-- a group at all; p_committed: the slowest cursor on the partition, NULL
-- none; p_keep_from: what a group without a cursor there still needs, from
-- that creation time on, NULL none). 0 turns either retention off. The one
-- place retention is decided: head_trim asks it per row (per segment for
-- retention_step, per hash row with a retention time only for
-- purge_txns_step), and the maintenance pass asks it of a partition's
-- oldest segment with the groups left open (true, NULL, NULL) to tell
-- whether a step could delete anything.
CREATE OR REPLACE FUNCTION {{schema}}.retention_due(p_created timestamptz, p_end bigint, p_ret_ms bigint,
                                                  p_done_ms bigint, p_now timestamptz, p_groups boolean,
                                                  p_committed bigint, p_keep_from timestamptz)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT (p_ret_ms > 0 AND p_created < p_now - p_ret_ms * interval '1 millisecond')
        OR (p_done_ms > 0 AND p_groups
            AND p_created < p_now - p_done_ms * interval '1 millisecond'
            AND (p_committed IS NULL OR p_end <= p_committed)
            AND (p_keep_from IS NULL OR p_created < p_keep_from))
$$;

-- Deletes the due prefix of partition p_pid's segments (p_txns false) or
-- hash rows (p_txns true), at most p_max rows, moves the partition's start
-- marker (log_start, txns_start) past the last row deleted and returns the
-- number deleted. Segments deleted take their hashes (migration 017) with
-- them, but for those still owed to the dedup window: the hashes of a
-- segment created at or after p_now - p_keep_ms (all of them when
-- p_keep_ms is NULL) are copied into a hash row first, in the same
-- transaction, which purge_txns_step deletes once it is older than its
-- keep. A hash the purge would keep is thus never lost with its segment,
-- and one it would delete may go with it (the purge is what forgets). A
-- row is due by retention_due of its created_at and end_offset with the
-- other arguments; created_at is monotone in offset order, so what is due
-- is a prefix, and a due row after a kept one stays. The caller holds the
-- partition row, so no row is added below the cut between reading and
-- deleting, and no dedup probe runs between the copy and the delete. The
-- one head trim of retention_step_v2 and purge_txns_step, without dynamic SQL (planned on every call): a generic
-- plan of the cut reads only the table asked for, a custom plan drops the
-- other one when planned.
CREATE OR REPLACE FUNCTION {{schema}}.head_trim(p_pid bigint, p_txns boolean, p_max integer,
                                              p_ret_ms bigint, p_done_ms bigint, p_now timestamptz,
                                              p_groups boolean, p_committed bigint, p_keep_from timestamptz,
                                              p_keep_ms bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_end bigint;
    v_n   integer;
BEGIN
    -- The last offset of the due prefix among the first p_max rows. The
    -- filters sit outside the UNION ALL so that it is flattened: each table
    -- is then a primary-key range scan, merged in offset order, and the
    -- one not asked for is skipped by a one-time filter.
    SELECT max(h.end_offset) INTO v_end
    FROM (SELECT r.end_offset,
                 bool_and({{schema}}.retention_due(r.created_at, r.end_offset, p_ret_ms, p_done_ms, p_now,
                                                   p_groups, p_committed, p_keep_from))
                     OVER (ORDER BY r.base_offset) AS due
          FROM (SELECT false AS txns, s.partition_id, s.base_offset, s.end_offset, s.created_at
                FROM {{schema}}.segments s
                UNION ALL
                SELECT true, t.partition_id, t.base_offset, t.end_offset, t.created_at
                FROM {{schema}}.txns t) r
          WHERE r.txns = p_txns AND r.partition_id = p_pid
          ORDER BY r.base_offset
          LIMIT p_max) h
    WHERE h.due;
    IF v_end IS NULL THEN
        RETURN 0;
    END IF;
    IF p_txns THEN
        DELETE FROM {{schema}}.txns WHERE partition_id = p_pid AND base_offset <= v_end;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        UPDATE {{schema}}.partitions SET txns_start = v_end + 1 WHERE id = p_pid;
    ELSE
        INSERT INTO {{schema}}.txns (partition_id, base_offset, end_offset, created_at, hashes)
        SELECT s.partition_id, s.base_offset, s.end_offset, s.created_at, s.hashes
        FROM {{schema}}.segments s
        WHERE s.partition_id = p_pid AND s.base_offset <= v_end AND s.hashes IS NOT NULL
          AND (p_keep_ms IS NULL OR s.created_at >= p_now - p_keep_ms * interval '1 millisecond');
        DELETE FROM {{schema}}.segments WHERE partition_id = p_pid AND base_offset <= v_end;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        UPDATE {{schema}}.partitions SET log_start = v_end + 1 WHERE id = p_pid;
    END IF;
    RETURN v_n;
END
$$;

-- head_trim as the function layer before migration 017 called it, kept so
-- that no caller reaches a body that deletes hashes still owed: it copies
-- every hash of the segments it deletes.
CREATE OR REPLACE FUNCTION {{schema}}.head_trim(p_pid bigint, p_txns boolean, p_max integer,
                                              p_ret_ms bigint, p_done_ms bigint, p_now timestamptz,
                                              p_groups boolean, p_committed bigint, p_keep_from timestamptz)
RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {{schema}}.head_trim(p_pid, p_txns, p_max, p_ret_ms, p_done_ms, p_now, p_groups, p_committed,
                                p_keep_from, NULL::bigint);
END
$$;

-- Deletes up to p_max whole segments from the head of partition p_pid that
-- are due under the queue's rules: older than retention (consumed or not),
-- or older than completed retention and not needed by any group.
-- created_at is monotone in offset order, so what is due is a prefix.
-- Returns the number of segments deleted.
--
-- The groups are those with a cursor row on the partition and those
-- subscribed to the queue (queue mode '' included) that have none here yet:
-- a partition created after a group's first contact is seeded on its next
-- pop that sees it. A group with a row needs what is above its cursor. A
-- group without one needs what its seeding would deliver: everything when
-- it subscribes to all or the partition is younger than its subscription
-- (then it is read from its start); else the segments created at or after
-- its subscription (SubscribeNew) or its from time (SubscribeFrom). A group
-- pins retention from the commit of its first contact on. Both kinds are
-- read from one snapshot: every group committed by then is counted once.
-- That snapshot follows the queue's contact lock, taken shared: a first
-- contact (which holds it exclusively until it commits) is either in it or
-- waits for this step, so none commits between the decision and the delete
-- (its seeding would see the head it was owed deleted). A first contact in
-- progress leaves only plain retention to this step. With no group at all,
-- nothing has been consumed and nothing is due.
--
-- p_keep_ms is what the maintenance pass keeps hash rows for (its
-- MaintenanceDue: max(dedup window, lease time, HashFloor)); the hashes of
-- deleted segments younger than that, or than the queue's window or lease
-- time as read here, are copied into hash rows (head_trim). NULL copies
-- every one.
CREATE OR REPLACE FUNCTION {{schema}}.retention_step_v2(p_pid bigint, p_max integer, p_keep_ms bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_win       bigint;
    v_lease     bigint;
    v_qid       bigint;
    v_ret       bigint;
    v_done_ret  bigint;
    v_created   timestamptz;
    v_committed bigint;
    v_groups    boolean;
    v_keep_from timestamptz;
    v_now       timestamptz := clock_timestamp();
BEGIN
    SELECT q.id, q.retention_ms, q.completed_retention_ms, p.created_at, q.dedup_window_ms, q.lease_time_ms
    INTO v_qid, v_ret, v_done_ret, v_created, v_win, v_lease
    FROM {{schema}}.partitions p JOIN {{schema}}.queues q ON q.id = p.queue_id
    WHERE p.id = p_pid
    FOR NO KEY UPDATE OF p SKIP LOCKED; -- a push holds it: next pass
    IF NOT FOUND OR (v_ret <= 0 AND v_done_ret <= 0) THEN
        RETURN 0;
    END IF;
    IF v_done_ret > 0
       AND NOT pg_try_advisory_xact_lock_shared(hashtextextended('queen/{{schema_name}}/contact/' || v_qid, 0)) THEN
        v_done_ret := 0; -- never waits: a first contact is in progress
        IF v_ret <= 0 THEN
            RETURN 0;
        END IF;
    END IF;
    IF v_done_ret > 0 THEN
        -- The slowest cursor here and the oldest message some group
        -- without a cursor here needs (NULL: none does), in one statement:
        -- one snapshot. Read apart, a group whose first cursor row here
        -- commits between the reads would be counted by neither.
        SELECT min(g.committed), count(*) > 0, min(g.keep_from)
        INTO v_committed, v_groups, v_keep_from
        FROM (SELECT c.committed, NULL::timestamptz AS keep_from
              FROM {{schema}}.consumers c WHERE c.partition_id = p_pid
              UNION ALL
              SELECT NULL, CASE WHEN s.mode = 'all' OR v_created >= s.created_at THEN '-infinity'::timestamptz
                                WHEN s.mode = 'new' THEN s.created_at
                                ELSE least(coalesce(s.from_time, '-infinity'), s.created_at) END
              FROM {{schema}}.subscriptions s
              WHERE s.queue_id = v_qid
                AND NOT EXISTS (SELECT 1 FROM {{schema}}.consumers c
                                WHERE c.partition_id = p_pid AND c.group_name = s.group_name)) g;
    END IF;
    RETURN {{schema}}.head_trim(p_pid, false, p_max, v_ret, v_done_ret, v_now, v_groups, v_committed, v_keep_from,
                                CASE WHEN p_keep_ms IS NOT NULL THEN greatest(p_keep_ms, v_win, v_lease) END);
END
$$;

-- retention_step_v2 for the previous release's maintenance, which does not
-- pass its hash keep: every hash of a deleted segment is copied.
CREATE OR REPLACE FUNCTION {{schema}}.retention_step(p_pid bigint, p_max integer)
RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {{schema}}.retention_step_v2(p_pid, p_max, NULL);
END
$$;

-- Deletes up to p_max hash rows from the head of partition p_pid older than
-- p_keep_ms (the caller passes max(dedup window, floor)); the hash sidecar
-- thereby stays O(rate x window) whatever the backlog. Returns the number
-- of rows deleted.
CREATE OR REPLACE FUNCTION {{schema}}.purge_txns_step(p_pid bigint, p_keep_ms bigint, p_max integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    -- retention_due reads a retention of 0 as off, and a keep of 0 or less
    -- has always kept nothing: a retention of 1 ms, judged that much later,
    -- is the same cut-off (created_at < now - p_keep_ms).
    v_ret bigint := greatest(p_keep_ms, 1);
BEGIN
    PERFORM 1 FROM {{schema}}.partitions WHERE id = p_pid FOR NO KEY UPDATE SKIP LOCKED; -- busy: next pass
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    RETURN {{schema}}.head_trim(p_pid, true, p_max, v_ret, 0,
                                clock_timestamp() + (v_ret - p_keep_ms) * interval '1 millisecond', false, NULL, NULL,
                                NULL);
END
$$;

-- Forgets partition p_pid if it has been idle for p_idle_ms, holds no
-- message, no lease and no hash row inside its queue's dedup window (the
-- partition's hash rows go with it: a producer retrying a transaction id
-- still inside the window must stay a duplicate). Its offsets start again
-- at 0 if it is pushed to later. Returns whether it was deleted. Skips a
-- partition someone holds.
CREATE OR REPLACE FUNCTION {{schema}}.purge_partition(p_pid bigint, p_idle_ms bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {{schema}}.partitions p
    WHERE p.id = p_pid
      AND p.last_write_at < clock_timestamp() - p_idle_ms * interval '1 millisecond'
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- A statement of its own: its snapshot follows the lock, so it sees
    -- everything a push committed before it.
    IF EXISTS (SELECT 1 FROM {{schema}}.segments s WHERE s.partition_id = p_pid)
       OR EXISTS (SELECT 1 FROM {{schema}}.consumers c WHERE c.partition_id = p_pid
                  AND c.lease_expires_at > clock_timestamp())
       -- created_at is monotone in offset order: the newest hash row decides.
       OR (SELECT t.created_at FROM {{schema}}.txns t WHERE t.partition_id = p_pid
           ORDER BY t.base_offset DESC LIMIT 1)
          > clock_timestamp() - (SELECT q.dedup_window_ms FROM {{schema}}.queues q
                                 JOIN {{schema}}.partitions p ON p.queue_id = q.id
                                 WHERE p.id = p_pid) * interval '1 millisecond' THEN
        RETURN false;
    END IF;
    DELETE FROM {{schema}}.txns WHERE partition_id = p_pid;
    DELETE FROM {{schema}}.partitions WHERE id = p_pid;  -- consumers cascade
    RETURN true;
END
$$;

-- Deletes queue (p_tenant, p_name) with everything stored for it; returns
-- whether it existed. The leaf rows (segments, hash rows) have no foreign
-- key, so they are deleted explicitly, and only once nothing can add more:
-- the queue row is locked first (FOR UPDATE conflicts with the key-share
-- lock a new partition's foreign key check takes, so no push creates a
-- partition of it meanwhile, and pushes that did have committed), then its
-- partitions in ascending id (the global order; a push or re-enqueue
-- holding one commits first, and any that locks one later finds it gone
-- and re-provisions a new queue). Each statement's snapshot follows those
-- locks, so every committed row is seen.
CREATE OR REPLACE FUNCTION {{schema}}.delete_queue(p_tenant uuid, p_name text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_qid  bigint;
    v_pid  bigint;
    v_pids bigint[];
    v_routed boolean := (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true);
BEGIN
    IF v_routed THEN
        -- On the Citus layout the queue row's lock is the coordinator's
        -- copy only: a push creating a partition on a worker, whose foreign
        -- key check locks that worker's copy, would not wait for it, and
        -- its segments would outlive the cascade. push_routed holds the
        -- queue's advisory lock shared until it commits: taken here
        -- exclusively first (before any row of the queue, as pushes take
        -- it), then the row.
        SELECT id INTO v_qid FROM {{schema}}.queues WHERE tenant = p_tenant AND name = p_name;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/queue/' || v_qid, 0));
        SELECT id INTO v_qid FROM {{schema}}.queues WHERE id = v_qid FOR UPDATE;
    ELSE
        SELECT id INTO v_qid FROM {{schema}}.queues
        WHERE tenant = p_tenant AND name = p_name
        FOR UPDATE;
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_routed THEN
        -- The Citus layout locks no rows of several shards in one
        -- statement: each partition is locked, and its leaf rows deleted,
        -- by its id (routed to its shard), in the same ascending order.
        -- Literals: Citus plans no statement over every shard with a
        -- PL/pgSQL parameter in it. No partition can be added meanwhile
        -- (the queue's advisory lock is held), so the list read first is
        -- complete.
        -- One connection per worker (sequential mode): the queue row's
        -- delete cascades to shards this transaction has read already,
        -- which Citus refuses after a parallel read of them.
        PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
        EXECUTE format('SELECT coalesce(array_agg(p.id ORDER BY p.id), ''{}'') FROM {{schema}}.partitions p
                        WHERE p.queue_id = %s', v_qid) INTO v_pids;
        FOREACH v_pid IN ARRAY v_pids LOOP
            PERFORM 1 FROM {{schema}}.partitions p WHERE p.id = v_pid FOR UPDATE;
        END LOOP;
        FOREACH v_pid IN ARRAY v_pids LOOP
            DELETE FROM {{schema}}.segments WHERE partition_id = v_pid;
            DELETE FROM {{schema}}.txns WHERE partition_id = v_pid;
        END LOOP;
        -- members is a plain table of the coordinator here, without the
        -- foreign key that cascades on PostgreSQL.
        DELETE FROM {{schema}}.members WHERE queue_id = v_qid;
    ELSE
        SELECT coalesce(array_agg(l.id), '{}') INTO v_pids
        FROM (SELECT p.id FROM {{schema}}.partitions p WHERE p.queue_id = v_qid
              ORDER BY p.id FOR UPDATE) l;
        DELETE FROM {{schema}}.segments WHERE partition_id = ANY (v_pids);
        DELETE FROM {{schema}}.txns WHERE partition_id = ANY (v_pids);
    END IF;
    -- Partitions, cursors, backlog rows, subscriptions and dead letters
    -- cascade (on the Citus layout, on every worker: a two-phase commit).
    DELETE FROM {{schema}}.queues WHERE id = v_qid;
    RETURN true;
END
$$;

-- The messages a cursor at p_committed has not read in a partition whose
-- newest offset is p_last_offset and oldest retained one p_log_start: what
-- retention deleted unread is gone, not lag. The one definition of lag:
-- the consumer_lag view, Queue.Status and Queues all count with it.
CREATE OR REPLACE FUNCTION {{schema}}.lag_messages(p_last_offset bigint, p_committed bigint, p_log_start bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(p_last_offset - greatest(p_committed, p_log_start - 1), 0)
$$;

-- Lag as Queue.Status, Queues and the samples ring count it: lag_messages
-- less the offsets settled out of order above the cursor (p_settled, the
-- cursor's settled array, sorted; NULL none) in that range: those are
-- skipped, never read. width_bucket counts the entries up to a bound in a
-- sorted array without a subquery, so the planner can inline the function
-- (called per row instead, it made the samples' statement over 8,000
-- partitions ten times slower). It does so only when the arguments used
-- twice (p_committed, p_log_start) are plain columns or cheap: callers
-- pass a computed cursor through a subquery with OFFSET 0.
CREATE OR REPLACE FUNCTION {{schema}}.lag_unsettled(p_last_offset bigint, p_committed bigint, p_log_start bigint,
                                                  p_settled bigint[])
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT {{schema}}.lag_messages(p_last_offset, p_committed, p_log_start)
        - CASE WHEN cardinality(p_settled) > 0 AND p_last_offset > greatest(p_committed, p_log_start - 1)
               THEN width_bucket(p_last_offset, p_settled) - width_bucket(greatest(p_committed, p_log_start - 1), p_settled)
               ELSE 0 END
$$;

-- When the oldest message a cursor at p_committed has not read was
-- appended: the created_at of the segment holding the first retained
-- offset above the cursor. Meaningful only with lag_messages above 0.
CREATE OR REPLACE FUNCTION {{schema}}.lag_head(p_pid bigint, p_committed bigint, p_log_start bigint)
RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT s.created_at FROM {{schema}}.segments s
    WHERE s.partition_id = p_pid AND s.base_offset <= greatest(p_committed + 1, p_log_start)
    ORDER BY s.base_offset DESC LIMIT 1
$$;

-- Consumer lag per (queue, partition, group), for operators: messages and
-- seconds behind (age of the oldest unconsumed message). lag_head is
-- spelled out as max() then a join by key, one form for both layouts: on
-- Citus a call of lag_head runs on the workers, where its own read of
-- segments fails ("cannot execute a distributed query from a query on a
-- shard"), and a correlated LIMIT is not pushed down; the join is, whole.
CREATE OR REPLACE VIEW {{schema}}.consumer_lag AS
SELECT q.tenant,
       q.name AS queue,
       p.name AS partition,
       c.group_name,
       p.last_offset,
       c.committed,
       {{schema}}.lag_messages(p.last_offset, c.committed, p.log_start) AS lag_messages,
       CASE WHEN {{schema}}.lag_messages(p.last_offset, c.committed, p.log_start) > 0 THEN
           extract(epoch FROM clock_timestamp() - hs.created_at)
       ELSE 0 END AS lag_seconds,
       c.lease_owner,
       c.lease_expires_at
FROM {{schema}}.consumers c
JOIN {{schema}}.partitions p ON p.id = c.partition_id
JOIN {{schema}}.queues q ON q.id = p.queue_id
LEFT JOIN LATERAL (SELECT max(s.base_offset) AS b FROM {{schema}}.segments s
                   WHERE s.partition_id = p.id AND s.base_offset <= greatest(c.committed + 1, p.log_start)) hb ON true
LEFT JOIN {{schema}}.segments hs ON hs.partition_id = p.id AND hs.base_offset = hb.b;
