-- Operator actions on a group's offsets: resetting its cursors, deleting
-- the group, releasing a lease.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.
--
-- Each is one call, so one transaction, and takes its locks in the global
-- order (DESIGN.md, "Lock order"): the group's seed lock, the queue row
-- KEY SHARE, the partitions FOR NO KEY UPDATE in ascending id (backlog
-- rows are written only under them; clear_pending and retention steps skip
-- a held partition, pushes wait), then the group's cursor rows in
-- ascending partition id. Errors: SQLSTATE QN002 for a queue, partition or
-- group that does not exist, QN003 for an active group (group_live; without
-- p_force). Nothing is changed then.

-- Whether group p_group is active on queue p_qid: it holds a live lease
-- there, or has a live member (a running Consume, a Pop naming itself),
-- as Kafka refuses to move the offsets of a group with members. The one
-- place that says when a group is active, so the operator actions refuse
-- it. Read after the caller locked the cursor rows it moves, so no claim
-- on them can start or end unseen.
CREATE OR REPLACE FUNCTION {{schema}}.group_live(p_qid bigint, p_group text)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_now  timestamptz := clock_timestamp();
    v_live boolean;
BEGIN
    IF (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        -- Literals: Citus plans no statement over every shard with a
        -- PL/pgSQL parameter in it.
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM {{schema}}.partitions p
                            JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = %L
                            WHERE p.queue_id = %s AND c.batch_end IS NOT NULL AND c.lease_expires_at > %L::timestamptz)',
                       p_group, p_qid, v_now) INTO v_live;
    ELSE
        v_live := EXISTS (SELECT 1 FROM {{schema}}.partitions p
                          JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = p_group
                          WHERE p.queue_id = p_qid AND c.batch_end IS NOT NULL AND c.lease_expires_at > v_now);
    END IF;
    RETURN v_live OR EXISTS (SELECT 1 FROM {{schema}}.group_live_members(p_qid, p_group));
END
$$;

-- The queue id of (p_tenant, p_queue), its row taken KEY SHARE after the
-- group's seed lock (the order a first contact takes them): a Queue.Delete
-- either committed first (QN002) or waits. Raises QN002 for none.
CREATE OR REPLACE FUNCTION {{schema}}.offsets_queue(p_tenant uuid, p_queue text, p_group text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_qid bigint;
BEGIN
    SELECT q.id INTO v_qid FROM {{schema}}.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    IF FOUND THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/seed/' || v_qid || '/' || p_group, 0));
        PERFORM 1 FROM {{schema}}.queues WHERE id = v_qid FOR KEY SHARE;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no queue %', quote_literal(p_queue) USING ERRCODE = 'QN002';
    END IF;
    RETURN v_qid;
END
$$;

-- On the Citus layout (settings.routed), one partition per statement, so
-- that each is routed to its shard: the partitions of queue p_qid named
-- p_parts (NULL: all of them), ascending ids, each locked FOR NO KEY
-- UPDATE in that order, as the set-based forms lock them. QN002 for a
-- name the queue has no partition of. The list of all partitions is read
-- with literals: Citus plans no statement over every shard with a PL/pgSQL
-- parameter in it.
CREATE OR REPLACE FUNCTION {{schema}}.lock_partitions_routed(p_qid bigint, p_queue text, p_parts text[])
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_pids bigint[];
    v_pid  bigint;
    v_name text;
BEGIN
    IF p_parts IS NULL THEN
        EXECUTE format('SELECT coalesce(array_agg(p.id ORDER BY p.id), ''{}'') FROM {{schema}}.partitions p
                        WHERE p.queue_id = %s', p_qid) INTO v_pids;
    ELSE
        v_pids := '{}';
        FOREACH v_name IN ARRAY p_parts LOOP
            v_pid := {{schema}}.partition_of(p_qid, v_name);
            IF v_pid IS NULL THEN
                RAISE EXCEPTION 'queue % has no partition %', quote_literal(p_queue), quote_literal(v_name)
                    USING ERRCODE = 'QN002';
            END IF;
            v_pids := v_pids || v_pid;
        END LOOP;
        SELECT coalesce(array_agg(DISTINCT u.id ORDER BY u.id), '{}') INTO v_pids FROM unnest(v_pids) AS u(id);
    END IF;
    FOREACH v_pid IN ARRAY v_pids LOOP
        PERFORM 1 FROM {{schema}}.partitions p WHERE p.id = v_pid FOR NO KEY UPDATE;
    END LOOP;
    RETURN v_pids;
END
$$;

-- reset_group on the Citus layout: the same checks, locks in the same
-- order and the same writes, one partition per statement (routed to its
-- shard). Its subscription insert and the lease check run as in
-- reset_group. Writes to partitions on several workers: a two-phase
-- commit.
CREATE OR REPLACE FUNCTION {{schema}}.reset_group_routed(p_tenant uuid, p_queue text, p_group text, p_to text,
                                                       p_time timestamptz, p_parts text[], p_offs bigint[],
                                                       p_force boolean)
RETURNS TABLE (partition_name text, before bigint, after bigint, created boolean, lease_ended boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid     bigint;
    v_mode    text;
    v_since   timestamptz;
    v_from    timestamptz;
    v_pids    bigint[];
    v_pid     bigint;
    v_created bigint[] := '{}';
    v_now     timestamptz;
    v_p       record;
    v_c       record;
    v_after   bigint;
    v_name    text;
    v_names   text[] := '{}';
    v_before  bigint[] := '{}';
    v_afters  bigint[] := '{}';
    v_new     boolean[] := '{}';
    v_ended   boolean[] := '{}';
BEGIN
    v_qid := {{schema}}.offsets_queue(p_tenant, p_queue, p_group);
    IF p_parts IS NOT NULL THEN
        FOREACH v_name IN ARRAY p_parts LOOP
            IF {{schema}}.partition_of(v_qid, v_name) IS NULL THEN
                RAISE EXCEPTION 'queue % has no partition %', quote_literal(p_queue), quote_literal(v_name)
                    USING ERRCODE = 'QN002';
            END IF;
        END LOOP;
    END IF;
    SELECT s.mode, s.created_at, s.from_time INTO v_mode, v_since, v_from
    FROM {{schema}}.subscriptions s WHERE s.queue_id = v_qid AND s.group_name = p_group;
    IF NOT FOUND THEN
        v_mode := CASE WHEN p_group = '' OR p_to IN ('earliest', 'offsets') THEN 'all'
                       WHEN p_to = 'latest' THEN 'new' ELSE 'from' END;
        PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/contact/' || v_qid, 0));
        v_since := clock_timestamp();
        v_from := CASE WHEN v_mode = 'from' THEN p_time END;
        INSERT INTO {{schema}}.subscriptions (queue_id, group_name, mode, from_time, created_at, seed_after)
        VALUES (v_qid, p_group, v_mode, v_from, v_since,
                CASE WHEN p_parts IS NULL OR v_mode = 'new' THEN NULL ELSE '' END)
        ON CONFLICT DO NOTHING;
        SELECT s.mode, s.created_at, s.from_time INTO v_mode, v_since, v_from
        FROM {{schema}}.subscriptions s WHERE s.queue_id = v_qid AND s.group_name = p_group;
    END IF;
    v_pids := {{schema}}.lock_partitions_routed(v_qid, p_queue, p_parts);
    IF cardinality(v_pids) = 0 THEN
        RETURN;
    END IF;
    -- Cursors first, where they would start, then every one locked.
    FOREACH v_pid IN ARRAY v_pids LOOP
        SELECT p.log_start, p.created_at INTO v_p FROM {{schema}}.partitions p WHERE p.id = v_pid;
        PERFORM 1 FROM {{schema}}.consumers c WHERE c.partition_id = v_pid AND c.group_name = p_group;
        IF NOT FOUND THEN
            INSERT INTO {{schema}}.consumers (partition_id, group_name, committed)
            VALUES (v_pid, p_group, {{schema}}.seed_offset_routed(v_pid, v_p.log_start, v_p.created_at, v_mode,
                                                                  v_since, v_from))
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                v_created := v_created || v_pid;
            END IF;
        END IF;
    END LOOP;
    FOREACH v_pid IN ARRAY v_pids LOOP
        PERFORM 1 FROM {{schema}}.consumers c WHERE c.partition_id = v_pid AND c.group_name = p_group FOR UPDATE;
    END LOOP;
    IF NOT p_force AND {{schema}}.group_live(v_qid, p_group) THEN
        RAISE EXCEPTION 'group % holds a live lease on queue %', quote_literal(p_group), quote_literal(p_queue) USING ERRCODE = 'QN003';
    END IF;
    v_now := clock_timestamp();
    FOREACH v_pid IN ARRAY v_pids LOOP
        SELECT p.name, p.log_start, p.last_offset, p.pending INTO v_p FROM {{schema}}.partitions p WHERE p.id = v_pid;
        SELECT c.committed, (c.batch_end IS NOT NULL AND c.lease_expires_at > v_now) AS live INTO v_c
        FROM {{schema}}.consumers c WHERE c.partition_id = v_pid AND c.group_name = p_group;
        IF p_to = 'time' THEN
            SELECT s.end_offset INTO v_after FROM {{schema}}.segments s
            WHERE s.partition_id = v_pid AND s.created_at < p_time
            ORDER BY s.base_offset DESC LIMIT 1;
            v_after := greatest(v_p.log_start - 1, coalesce(v_after, v_p.log_start - 1));
        ELSE
            v_after := CASE p_to
                WHEN 'earliest' THEN v_p.log_start - 1
                WHEN 'latest' THEN v_p.last_offset
                ELSE least(greatest(p_offs[array_position(p_parts, v_p.name)] - 1, v_p.log_start - 1), v_p.last_offset)
            END;
        END IF;
        UPDATE {{schema}}.consumers c
        SET committed = v_after, settled = NULL, fail_offs = NULL, fail_counts = NULL, attempts = 0,
            retry_at = NULL, wait_offs = NULL, wait_at = NULL, held_offs = NULL, idle_until = NULL, idle_seen = NULL, deliveries = 0,
            (batch_end, lease_id, lease_owner, lease_expires_at)
                = (SELECT * FROM {{schema}}.lease_after(true, c.batch_end, c.lease_id, c.lease_owner,
                                                       c.lease_expires_at)),
            updated_at = v_now
        WHERE c.partition_id = v_pid AND c.group_name = p_group;
        v_names := v_names || v_p.name;
        v_before := v_before || v_c.committed;
        v_afters := v_afters || v_after;
        v_new := v_new || (v_pid = ANY (v_created));
        v_ended := v_ended || v_c.live;
        -- Behind now: into the group's backlog unless in the shared ready set.
        IF NOT v_p.pending AND v_p.last_offset >= v_p.log_start AND v_after < v_p.last_offset THEN
            INSERT INTO {{schema}}.backlog (queue_id, group_name, partition_id) VALUES (v_qid, p_group, v_pid)
            ON CONFLICT DO NOTHING;
        END IF;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_names, v_before, v_afters, v_new, v_ended) AS r ORDER BY 1;
END
$$;

-- delete_group on the Citus layout: the same locks in the same order and
-- the same deletes, one partition per statement. Writes to partitions on
-- several workers: a two-phase commit.
CREATE OR REPLACE FUNCTION {{schema}}.delete_group_routed(p_tenant uuid, p_queue text, p_group text, p_force boolean,
                                                        OUT cursors integer, OUT leases integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_qid  bigint;
    v_pids bigint[];
    v_pid  bigint;
    v_now  timestamptz;
    v_live boolean;
BEGIN
    -- One connection per worker: the reference-table deletes after the
    -- multi-shard one are refused after a parallel operation.
    PERFORM set_config('citus.multi_shard_modify_mode', 'sequential', true);
    v_qid := {{schema}}.offsets_queue(p_tenant, p_queue, p_group);
    v_pids := {{schema}}.lock_partitions_routed(v_qid, p_queue, NULL);
    FOREACH v_pid IN ARRAY v_pids LOOP
        PERFORM 1 FROM {{schema}}.consumers c WHERE c.partition_id = v_pid AND c.group_name = p_group FOR UPDATE;
    END LOOP;
    IF NOT p_force AND {{schema}}.group_live(v_qid, p_group) THEN
        RAISE EXCEPTION 'group % holds a live lease on queue %', quote_literal(p_group), quote_literal(p_queue) USING ERRCODE = 'QN003';
    END IF;
    cursors := 0;
    leases := 0;
    v_now := clock_timestamp();
    FOREACH v_pid IN ARRAY v_pids LOOP
        DELETE FROM {{schema}}.consumers c WHERE c.partition_id = v_pid AND c.group_name = p_group
        RETURNING (c.batch_end IS NOT NULL AND c.lease_expires_at > v_now) INTO v_live;
        IF FOUND THEN
            cursors := cursors + 1;
            leases := leases + v_live::integer;
        END IF;
    END LOOP;
    -- Every backlog row of the group, as delete_group deletes them (one of
    -- a partition created since the list was read too). Literals: Citus
    -- plans no statement over every shard with a PL/pgSQL parameter in it.
    EXECUTE format('DELETE FROM {{schema}}.backlog b WHERE b.queue_id = %s AND b.group_name = %L', v_qid, p_group);
    DELETE FROM {{schema}}.subscriptions s WHERE s.queue_id = v_qid AND s.group_name = p_group;
    IF NOT FOUND THEN
        DELETE FROM {{schema}}.paused_groups g WHERE g.queue_id = v_qid AND g.group_name = p_group;
        IF NOT FOUND AND cursors = 0 THEN
            RAISE EXCEPTION 'queue % has no group %', quote_literal(p_queue), quote_literal(p_group) USING ERRCODE = 'QN002';
        END IF;
    ELSE
        DELETE FROM {{schema}}.paused_groups g WHERE g.queue_id = v_qid AND g.group_name = p_group;
    END IF;
END
$$;

-- Moves group p_group's cursors on queue (p_tenant, p_queue): on the
-- partitions named in p_parts, or every partition when NULL. p_to:
-- 'earliest' (the next delivery is the oldest retained message),
-- 'latest' (nothing now present), 'time' (the first message stored at or
-- after p_time: created_at is monotone in offset order), 'offsets' (the
-- next delivery is p_offs[i] on p_parts[i], clamped to what is retained:
-- below the log start it is the log start, past the head it is the head's
-- next offset). A moved cursor loses its out-of-order settled offsets,
-- failure counts, retry wait, delivery count and lease. A partition the
-- group has no cursor on gets one; a group not subscribed is subscribed
-- ('new' for latest, 'from' p_time for time, else 'all'; queue mode is
-- always 'all'), its first contact done. With a live lease of the group on
-- the queue it raises QN003, unless p_force: then the moved cursors' leases
-- end (their holders' settles find them lost) and nothing is charged.
-- One row per moved cursor: its committed offset before and after, whether
-- the reset created it, whether it ended a live lease.
CREATE OR REPLACE FUNCTION {{schema}}.reset_group(p_tenant uuid, p_queue text, p_group text, p_to text,
                                                p_time timestamptz, p_parts text[], p_offs bigint[], p_force boolean)
RETURNS TABLE (partition_name text, before bigint, after bigint, created boolean, lease_ended boolean)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_qid     bigint;
    v_mode    text;
    v_bad     text;
    v_pids    bigint[];
    v_created bigint[];
    v_now     timestamptz;
BEGIN
    IF p_to NOT IN ('earliest', 'latest', 'time', 'offsets') OR (p_to = 'time' AND p_time IS NULL)
       OR (p_to = 'offsets' AND (p_parts IS NULL OR cardinality(p_parts) IS DISTINCT FROM cardinality(p_offs))) THEN
        RAISE EXCEPTION 'reset_group: bad target %', quote_literal(p_to) USING ERRCODE = '22023';
    END IF;
    IF (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        RETURN QUERY SELECT * FROM {{schema}}.reset_group_routed(p_tenant, p_queue, p_group, p_to, p_time, p_parts,
                                                                 p_offs, p_force);
        RETURN;
    END IF;
    v_qid := {{schema}}.offsets_queue(p_tenant, p_queue, p_group);
    IF p_parts IS NOT NULL THEN
        SELECT u.n INTO v_bad FROM unnest(p_parts) AS u(n)
        WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.partitions p WHERE p.queue_id = v_qid AND p.name = u.n)
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'queue % has no partition %', quote_literal(p_queue), quote_literal(v_bad) USING ERRCODE = 'QN002';
        END IF;
    END IF;
    PERFORM 1 FROM {{schema}}.subscriptions s WHERE s.queue_id = v_qid AND s.group_name = p_group;
    IF NOT FOUND THEN
        v_mode := CASE WHEN p_group = '' OR p_to IN ('earliest', 'offsets') THEN 'all'
                       WHEN p_to = 'latest' THEN 'new' ELSE 'from' END;
        -- As a first contact (seed_consumers): no ready flag is cleared
        -- and no completed retention runs uncounting the group meanwhile.
        PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/contact/' || v_qid, 0));
        -- With every partition seeded below, nothing is left to mark.
        INSERT INTO {{schema}}.subscriptions (queue_id, group_name, mode, from_time, created_at, seed_after)
        VALUES (v_qid, p_group, v_mode, CASE WHEN v_mode = 'from' THEN p_time END, clock_timestamp(),
                CASE WHEN p_parts IS NULL OR v_mode = 'new' THEN NULL ELSE '' END)
        ON CONFLICT DO NOTHING;
    END IF;
    SELECT array_agg(x.id ORDER BY x.id) INTO v_pids
    FROM (SELECT p.id FROM {{schema}}.partitions p
          WHERE p.queue_id = v_qid AND (p_parts IS NULL OR p.name = ANY (p_parts))
          ORDER BY p.id FOR NO KEY UPDATE) x;
    IF v_pids IS NULL THEN
        RETURN;
    END IF;
    -- Cursors first, where they would start, then every one locked: a
    -- cursor a pop seeds meanwhile is waited for, so its lease is seen.
    WITH ins AS (
        INSERT INTO {{schema}}.consumers (partition_id, group_name, committed)
        SELECT p.id, p_group, {{schema}}.seed_offset(p.id, p.log_start, p.created_at, s.mode, s.created_at, s.from_time)
        FROM {{schema}}.partitions p
        JOIN {{schema}}.subscriptions s ON s.queue_id = v_qid AND s.group_name = p_group
        WHERE p.id = ANY (v_pids)
          AND NOT EXISTS (SELECT 1 FROM {{schema}}.consumers c
                          WHERE c.partition_id = p.id AND c.group_name = p_group OFFSET 0)
        ORDER BY p.id
        ON CONFLICT DO NOTHING
        RETURNING partition_id)
    SELECT array_agg(ins.partition_id) INTO v_created FROM ins;
    PERFORM 1 FROM {{schema}}.consumers c
    WHERE c.partition_id = ANY (v_pids) AND c.group_name = p_group
    ORDER BY c.partition_id FOR UPDATE;
    IF NOT p_force AND {{schema}}.group_live(v_qid, p_group) THEN
        RAISE EXCEPTION 'group % holds a live lease on queue %', quote_literal(p_group), quote_literal(p_queue) USING ERRCODE = 'QN003';
    END IF;
    v_now := clock_timestamp();
    RETURN QUERY
    WITH t AS (
        SELECT p.id, p.name, c.committed AS before,
               (c.batch_end IS NOT NULL AND c.lease_expires_at > v_now) AS live,
               CASE p_to
                   WHEN 'earliest' THEN p.log_start - 1
                   WHEN 'latest' THEN p.last_offset
                   WHEN 'time' THEN greatest(p.log_start - 1, coalesce(
                       (SELECT s.end_offset FROM {{schema}}.segments s
                        WHERE s.partition_id = p.id AND s.created_at < p_time
                        ORDER BY s.base_offset DESC LIMIT 1), p.log_start - 1))
                   ELSE least(greatest(o.off - 1, p.log_start - 1), p.last_offset)
               END AS after
        FROM {{schema}}.partitions p
        JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = p_group
        LEFT JOIN unnest(p_parts, p_offs) AS o(name, off) ON o.name = p.name
        WHERE p.id = ANY (v_pids)
    ), u AS (
        UPDATE {{schema}}.consumers c
        SET committed = t.after, settled = NULL, fail_offs = NULL, fail_counts = NULL, attempts = 0,
            retry_at = NULL, wait_offs = NULL, wait_at = NULL, held_offs = NULL, idle_until = NULL, idle_seen = NULL, deliveries = 0,
            (batch_end, lease_id, lease_owner, lease_expires_at)
                = (SELECT * FROM {{schema}}.lease_after(true, c.batch_end, c.lease_id, c.lease_owner,
                                                       c.lease_expires_at)),
            updated_at = v_now
        FROM t
        WHERE c.partition_id = t.id AND c.group_name = p_group
        RETURNING t.name, t.before, t.after, t.id, t.live)
    SELECT u.name, u.before, u.after, coalesce(u.id = ANY (v_created), false), u.live FROM u ORDER BY u.name;
    -- Behind now: into the group's backlog unless in the shared ready set
    -- (clear_pending gives it one when it clears the flag, seeing this).
    INSERT INTO {{schema}}.backlog (queue_id, group_name, partition_id)
    SELECT v_qid, p_group, p.id
    FROM {{schema}}.partitions p
    JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = p_group
    WHERE p.id = ANY (v_pids) AND NOT p.pending AND p.last_offset >= p.log_start AND c.committed < p.last_offset
    ORDER BY p.id
    ON CONFLICT DO NOTHING;
END
$$;

-- Deletes group p_group of queue (p_tenant, p_queue): its cursors, backlog
-- rows, subscription and pause. Raises QN002 when the group has none of
-- them, QN003 with a live lease unless p_force (the leases end with the
-- cursors: a holder's settle finds no cursor, a lost lease). Completed
-- retention no longer counts the group. Returns the cursors deleted and
-- how many of them held a live lease.
CREATE OR REPLACE FUNCTION {{schema}}.delete_group(p_tenant uuid, p_queue text, p_group text, p_force boolean,
                                                 OUT cursors integer, OUT leases integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_qid  bigint;
    v_pids bigint[];
BEGIN
    IF (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        SELECT * INTO cursors, leases FROM {{schema}}.delete_group_routed(p_tenant, p_queue, p_group, p_force);
        RETURN;
    END IF;
    v_qid := {{schema}}.offsets_queue(p_tenant, p_queue, p_group);
    SELECT array_agg(x.id ORDER BY x.id) INTO v_pids
    FROM (SELECT p.id FROM {{schema}}.partitions p WHERE p.queue_id = v_qid ORDER BY p.id FOR NO KEY UPDATE) x;
    PERFORM 1 FROM {{schema}}.consumers c
    WHERE c.partition_id = ANY (v_pids) AND c.group_name = p_group
    ORDER BY c.partition_id FOR UPDATE;
    IF NOT p_force AND {{schema}}.group_live(v_qid, p_group) THEN
        RAISE EXCEPTION 'group % holds a live lease on queue %', quote_literal(p_group), quote_literal(p_queue) USING ERRCODE = 'QN003';
    END IF;
    WITH d AS (
        DELETE FROM {{schema}}.consumers c
        WHERE c.partition_id = ANY (v_pids) AND c.group_name = p_group
        RETURNING (c.batch_end IS NOT NULL AND c.lease_expires_at > clock_timestamp()) AS live)
    SELECT count(*), count(*) FILTER (WHERE d.live) INTO cursors, leases FROM d;
    DELETE FROM {{schema}}.backlog b WHERE b.queue_id = v_qid AND b.group_name = p_group;
    DELETE FROM {{schema}}.subscriptions s WHERE s.queue_id = v_qid AND s.group_name = p_group;
    IF NOT FOUND THEN
        DELETE FROM {{schema}}.paused_groups g WHERE g.queue_id = v_qid AND g.group_name = p_group;
        IF NOT FOUND AND cursors = 0 THEN
            RAISE EXCEPTION 'queue % has no group %', quote_literal(p_queue), quote_literal(p_group) USING ERRCODE = 'QN002';
        END IF;
    ELSE
        DELETE FROM {{schema}}.paused_groups g WHERE g.queue_id = v_qid AND g.group_name = p_group;
    END IF;
END
$$;

-- Ends group p_group's live lease on partition p_partition of queue
-- (p_tenant, p_queue) now: its messages go to the next claim, uncharged
-- (the delivery is taken back, as an interrupt does), and the holder's
-- settles and renewals find the lease lost. The partition stays in the
-- group's part of the ready set (the group is behind there). Whether there
-- was a live lease; QN002 for no such queue or partition.
CREATE OR REPLACE FUNCTION {{schema}}.release_lease(p_tenant uuid, p_queue text, p_group text, p_partition text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_qid bigint;
    v_pid bigint;
    v_now timestamptz;
BEGIN
    SELECT q.id INTO v_qid FROM {{schema}}.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    -- By derived id (one shard on the Citus layout), not a join by name.
    v_pid := {{schema}}.partition_of(v_qid, p_partition);
    IF v_pid IS NULL THEN
        RAISE EXCEPTION 'queue % has no partition %', quote_literal(p_queue), quote_literal(p_partition) USING ERRCODE = 'QN002';
    END IF;
    -- A variable, not clock_timestamp() in the UPDATE: Citus refuses
    -- volatile functions in DML on a distributed table.
    v_now := clock_timestamp();
    UPDATE {{schema}}.consumers c
    SET (batch_end, lease_id, lease_owner, lease_expires_at)
            = (SELECT * FROM {{schema}}.lease_after(true, c.batch_end, c.lease_id, c.lease_owner, c.lease_expires_at)),
        deliveries = greatest(c.deliveries - 1, 0), updated_at = v_now
    WHERE c.partition_id = v_pid AND c.group_name = p_group
      AND c.batch_end IS NOT NULL AND c.lease_expires_at > v_now;
    RETURN FOUND;
END
$$;
