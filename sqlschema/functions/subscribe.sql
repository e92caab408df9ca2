-- A consumer group's first contact: where its cursors start and the backlog rows that seed it.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.
--
-- Seeding. A group's first contact is bounded work: it records the
-- subscription (and its time) and nothing per partition. Cursor rows are
-- created lazily, by the pops that meet a partition lacking the group's row
-- in their window (seed_consumers with p_pids), at the offset seed_offset
-- gives. What a first contact must still find per partition (a partition
-- out of the ready set, holding messages the new group is to read) goes to
-- the group's backlog by seed_chunk, 1024 partitions of the queue at a
-- time, one step per pop of the group until the queue's partitions are
-- covered (a partition created after the first contact is created pending,
-- so needs no step).

-- Where a new cursor of a group with subscription (p_mode, p_since, p_from)
-- starts on partition p_pid: 'all', or a partition created since the
-- subscription, everything retained; 'new', what was pushed at or after the
-- subscription; 'from', what was pushed at or after the earlier of p_from
-- and the subscription (a from time in the future still gets what is pushed
-- after first contact). created_at is monotone in offset order, so the
-- newest segment before that time ends where the cursor starts.
CREATE OR REPLACE FUNCTION {{schema}}.seed_offset(p_pid bigint, p_log_start bigint, p_created timestamptz,
                                       p_mode text, p_since timestamptz, p_from timestamptz)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_mode = 'all' OR p_created >= p_since THEN p_log_start - 1
        ELSE greatest(p_log_start - 1, coalesce(
            (SELECT s.end_offset FROM {{schema}}.segments s
             WHERE s.partition_id = p_pid
               AND s.created_at < CASE WHEN p_mode = 'new' THEN p_since ELSE least(p_from, p_since) END
             ORDER BY s.base_offset DESC LIMIT 1), p_log_start - 1))
    END
$$;

-- One step of a group's first-contact marking: the next 1024 partitions of
-- the queue by name. Those out of the ready set that the group is behind on
-- are locked in ascending id (the global order; a first contact may wait)
-- and, by a later statement, given a backlog row unless pending by then. The caller holds the group's seed lock.
-- No bitmap scans: the step reads the next 1025 names in index order and
-- stops; a generic plan made before the queue's statistics existed read
-- them with a bitmap scan, which cannot stop early, and sorted every
-- partition of the queue after the step's start.
CREATE OR REPLACE FUNCTION {{schema}}.seed_chunk(p_qid bigint, p_group text)
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v      record;
    v_last text;
    v_n    integer;
    v_ids  bigint[];
BEGIN
    SELECT s.mode, s.from_time, s.created_at, s.seed_after INTO v
    FROM {{schema}}.subscriptions s WHERE s.queue_id = p_qid AND s.group_name = p_group;
    IF NOT FOUND OR v.seed_after IS NULL THEN
        RETURN;
    END IF;
    IF (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        PERFORM {{schema}}.seed_chunk_routed(p_qid, p_group);
        RETURN;
    END IF;
    SELECT count(*), max(c.name),
           array_agg(c.id ORDER BY c.id) FILTER (
               WHERE NOT c.pending AND c.last_offset >= c.log_start AND NOT EXISTS (
                   SELECT 1 FROM {{schema}}.consumers cc WHERE cc.partition_id = c.id AND cc.group_name = p_group OFFSET 0)
                 AND {{schema}}.seed_offset(c.id, c.log_start, c.created_at, v.mode, v.created_at, v.from_time)
                     < c.last_offset)
    INTO v_n, v_last, v_ids
    FROM (SELECT p.id, p.name, p.pending, p.last_offset, p.log_start, p.created_at
          FROM {{schema}}.partitions p
          WHERE p.queue_id = p_qid AND p.name >= v.seed_after
          ORDER BY p.name LIMIT 1025) c;
    IF v_ids IS NOT NULL THEN
        -- Into the group's own backlog, not the shared set: a new group's
        -- first contact does not slow the pops of the others.
        PERFORM 1 FROM {{schema}}.partitions WHERE id = ANY (v_ids) ORDER BY id FOR NO KEY UPDATE;
        INSERT INTO {{schema}}.backlog (queue_id, group_name, partition_id)
        SELECT p_qid, p_group, p.id FROM {{schema}}.partitions p
        WHERE p.id = ANY (v_ids) AND NOT p.pending
        ORDER BY p.id
        ON CONFLICT DO NOTHING;
    END IF;
    -- The step re-reads the name it ended at (>=): one row means done.
    UPDATE {{schema}}.subscriptions SET seed_after = CASE WHEN v_n <= 1 THEN NULL ELSE v_last END
    WHERE queue_id = p_qid AND group_name = p_group;
END
$$;

-- A group's first contact: the subscription, under the queue's contact lock
-- (no pending flag of the queue is cleared until this commits, see
-- clear_pending: a push landing after the subscription time sets the flag
-- and nobody clears it before the group is seen; and no completed retention
-- deletes anything meanwhile, see retention_step), then a first seed_chunk
-- step. Concurrent first pops of the group wait for the one doing it (the
-- group's seed lock), which is bounded work, and then go on as later pops.
-- The subscription time is read after the contact lock: a message created
-- at or after it cannot have been cleared from the ready set unseen.
-- The first contact takes the queue row KEY SHARE before anything else of
-- the queue (the lock order: queues, then partitions): a Queue.Delete
-- holding the row either committed first (false: the pop finds no queue) or
-- waits for this one; the subscription insert never meets the row deleted
-- under its foreign key.
-- With p_pids (not NULL): cursor rows for those partitions that lack one
-- (pop passes its window), in ascending id, without any lock of its own:
-- pops of the group seed concurrently. Each partition row is taken KEY SHARE
-- (which the foreign key check takes anyway) SKIP LOCKED: a partition being
-- deleted (Queue.Delete, the idle-partition purge: FOR UPDATE) gets no
-- cursor, so the insert never waits for a delete and then fails its foreign
-- key, and the pop still never waits on a partition.
CREATE OR REPLACE FUNCTION {{schema}}.seed_consumers(p_qid bigint, p_group text, p_mode text, p_from timestamptz, p_pids bigint[])
RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v record;
BEGIN
    IF p_pids IS NOT NULL AND (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        RETURN {{schema}}.seed_consumers_routed(p_qid, p_group, p_pids);
    ELSIF p_pids IS NOT NULL THEN
        SELECT s.mode, s.from_time, s.created_at INTO v
        FROM {{schema}}.subscriptions s WHERE s.queue_id = p_qid AND s.group_name = p_group;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        INSERT INTO {{schema}}.consumers (partition_id, group_name, committed)
        SELECT p.id, p_group, {{schema}}.seed_offset(p.id, p.log_start, p.created_at, v.mode, v.created_at, v.from_time)
        FROM {{schema}}.partitions p
        -- queue_id + 0: only a filter. As an index condition, a generic plan
        -- cached while the queue was small ANDed a bitmap of every partition
        -- of the queue with the window's.
        WHERE p.id = ANY (p_pids) AND p.queue_id + 0 = p_qid
          -- A keyed probe per partition: OFFSET 0 keeps it a subplan. As an
          -- anti-join, a generic plan cached while the table was empty
          -- read every cursor of the group for every partition.
          AND NOT EXISTS (SELECT 1 FROM {{schema}}.consumers c
                          WHERE c.partition_id = p.id AND c.group_name = p_group OFFSET 0)
        ORDER BY p.id
        FOR KEY SHARE OF p SKIP LOCKED
        ON CONFLICT DO NOTHING;
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/seed/' || p_qid || '/' || p_group, 0));
    IF p_group = '' THEN
        p_mode := 'all';
    END IF;
    PERFORM 1 FROM {{schema}}.subscriptions WHERE queue_id = p_qid AND group_name = p_group;
    IF NOT FOUND THEN
        -- Waits only for clears and completed-retention steps in flight,
        -- which never wait themselves, and for other first contacts of the
        -- queue. Taken before the queue's row: on Citus that row's lock
        -- and the subscription's insert lock the reference tables' shards
        -- on every node in two modes, so two first contacts interleaving
        -- there deadlock (40P01); one at a time, they cannot.
        PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/contact/' || p_qid, 0));
        PERFORM 1 FROM {{schema}}.queues WHERE id = p_qid FOR KEY SHARE;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        INSERT INTO {{schema}}.subscriptions (queue_id, group_name, mode, from_time, created_at, seed_after)
        VALUES (p_qid, p_group, p_mode, p_from, clock_timestamp(), CASE WHEN p_mode = 'new' THEN NULL ELSE '' END)
        ON CONFLICT DO NOTHING;
    END IF;
    PERFORM {{schema}}.seed_chunk(p_qid, p_group);
    RETURN true;
END
$$;

-- The first-contact signature.
CREATE OR REPLACE FUNCTION {{schema}}.seed_consumers(p_qid bigint, p_group text, p_mode text, p_from timestamptz)
RETURNS boolean
LANGUAGE sql AS $$
    SELECT {{schema}}.seed_consumers(p_qid, p_group, p_mode, p_from, NULL::bigint[])
$$;
