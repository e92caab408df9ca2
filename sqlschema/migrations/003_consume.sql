-- The consumption side: pop (claim + lease + segment read in one round
-- trip), settle (ack / fail / retry / dead-letter for many cursors in one
-- call, so acks can be fused), and the columns they need.
--
-- Lock order (see DESIGN-NOTES): pop locks only consumer rows, with SKIP
-- LOCKED, and never waits; settle locks consumer rows in ascending
-- (partition id, group) and then writes dead_letters (a leaf).

-- deliveries: leases started at committed + 1 since the cursor last moved
-- (Message.Attempt on redelivery). delivered_max: the highest offset ever
-- leased, so a message above it is known to be on its first delivery.
-- attempts (from 001) is the retry budget spent by the message at
-- committed + 1: explicit failures only, never lease expiries.
ALTER TABLE {{schema}}.consumers
    ADD COLUMN deliveries    integer NOT NULL DEFAULT 0,
    ADD COLUMN delivered_max bigint  NOT NULL DEFAULT -1;

CREATE INDEX dead_letters_queue_id_idx ON {{schema}}.dead_letters (queue_id, id);

-- Out-of-order settlement (per-key parallel Consume, KeyConcurrency > 1).
-- committed stays the contiguous settled prefix; what was settled above it
-- is kept here so a later holder skips it: settled, sorted offsets above
-- committed (never committed + 1: the cursor moves past a contiguous run);
-- fail_offs / fail_counts, parallel and sorted, the explicit failures
-- spent by messages above committed + 1 (attempts keeps the head's). Every
-- entry comes from a lease, so lies in (committed, committed + that
-- lease's batch]: at most one Batch (MaxBatch) of entries. NULL when empty,
-- which is all the other paths ever see unless such a consumer ran.
ALTER TABLE {{schema}}.consumers
    ADD COLUMN settled     bigint[],
    ADD COLUMN fail_offs   bigint[],
    ADD COLUMN fail_counts integer[];

-- The cursor once it passes the settled offsets contiguous with p_comm.
CREATE FUNCTION {{schema}}.settled_advance(p_comm bigint, p_settled bigint[])
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_settled IS NULL OR NOT ((p_comm + 1) = ANY (p_settled)) THEN p_comm
        -- sorted and unique: the run is the entries whose rank above p_comm
        -- equals their distance from it
        ELSE (SELECT max(x.o) FROM (SELECT u.o, row_number() OVER (ORDER BY u.o) AS r
                                    FROM unnest(p_settled) AS u(o) WHERE u.o > p_comm) x
              WHERE x.o = p_comm + x.r)
    END
$$;

-- The offsets of p_offs above p_min, in order; NULL when none (the
-- settled set above a cursor, or the failure entries above a new head,
-- whose own count moves to attempts).
CREATE FUNCTION {{schema}}.offsets_above(p_offs bigint[], p_min bigint)
RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_offs IS NULL THEN NULL
        ELSE (SELECT array_agg(u.o ORDER BY u.o) FROM unnest(p_offs) AS u(o) WHERE u.o > p_min)
    END
$$;

-- The failures stored for offset p_off; 0 when none.
CREATE FUNCTION {{schema}}.fail_at(p_offs bigint[], p_counts integer[], p_off bigint)
RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_offs IS NULL THEN 0 ELSE coalesce(p_counts[array_position(p_offs, p_off)], 0) END
$$;

CREATE FUNCTION {{schema}}.fail_counts_above(p_offs bigint[], p_counts integer[], p_head bigint)
RETURNS integer[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_offs IS NULL THEN NULL
        ELSE (SELECT array_agg(u.c ORDER BY u.o) FROM unnest(p_offs, p_counts) AS u(o, c) WHERE u.o > p_head)
    END
$$;

-- Paused consumer groups (Queue.Pause): a pop of a paused (queue, group)
-- claims nothing; leases already held run to their end. Empty unless an
-- operator paused something: pop's check is one index probe that finds
-- nothing (one buffer hit, microseconds).
CREATE TABLE {{schema}}.paused_groups (
    queue_id   bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    group_name text        NOT NULL,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, group_name)
);

-- One row per delivered segment; the lease columns repeat per segment.
CREATE TYPE {{schema}}.pop_row AS (
    partition_id     bigint,
    partition_name   text,
    lease_id         uuid,
    lease_expires_at timestamptz,
    lease_ms         bigint,
    first_offset     bigint,
    last_offset      bigint,
    deliveries       integer,
    delivered_max    bigint,
    base_offset      bigint,
    end_offset       bigint,
    created_at       timestamptz,
    blob             bytea,
    failures         integer,
    -- On a partition's first row only: the cursor's settled offsets and
    -- failure entries (see settled above), for the client to skip and count.
    settled          bigint[],
    fail_offs        bigint[],
    fail_counts      integer[]
);

ALTER TABLE {{schema}}.subscriptions
    -- The partition name the next seed_chunk step starts at (inclusive);
    -- NULL once every partition that existed at first contact is covered.
    ADD COLUMN seed_after text;

-- Where a new cursor of a group with subscription (p_mode, p_since, p_from)
-- starts on partition p_pid: 'all', or a partition created since the
-- subscription, everything retained; 'new', what was pushed at or after the
-- subscription; 'from', what was pushed at or after the earlier of p_from
-- and the subscription (a from time in the future still gets what is pushed
-- after first contact). created_at is monotone in offset order, so the
-- newest segment before that time ends where the cursor starts.
CREATE FUNCTION {{schema}}.seed_offset(p_pid bigint, p_log_start bigint, p_created timestamptz,
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

-- The per-group part of the ready set. partitions.pending is the shared
-- part: set by every push (HOT while already set), so it holds what was
-- pushed since some pop last looked. A pop that has consumed a pending
-- partition takes it out of the shared part and gives each subscribed group
-- still behind there a row here (clear_pending), so a group that lags does
-- not keep partitions in the set every other group reads: a pop reads a
-- window of the shared part and one of its own group's rows, never another
-- group's backlog. Pushes never touch this table, so they cost the same
-- whatever the number of groups. Rows of a partition are written only under
-- its row lock (FOR NO KEY UPDATE), so writers never wait on each other's
-- rows here.
CREATE TABLE {{schema}}.backlog (
    queue_id     bigint NOT NULL,
    group_name   text   NOT NULL,
    partition_id bigint NOT NULL REFERENCES {{schema}}.partitions (id) ON DELETE CASCADE,
    PRIMARY KEY (queue_id, group_name, partition_id)
) WITH (vacuum_truncate = false);
-- For the cascade when a partition is forgotten or its queue deleted.
CREATE INDEX backlog_partition_idx ON {{schema}}.backlog (partition_id);

-- Upkeep of the ready set for partition p_pid after a pop of group p_group
-- consumed it. If it is pending: every subscribed group behind on it (a
-- group without a cursor row there counts from where that row would start)
-- gets a backlog row, and the flag is cleared. Then p_group's own backlog
-- row goes if p_group has consumed everything retained. Never waits: a
-- partition someone holds (a push in flight) is skipped, and so is every
-- pending partition of a queue on which a group's first contact is in
-- progress (it holds the queue's contact lock exclusively until it commits;
-- its subscription is not visible yet, so it would get no backlog row).
-- Each check is a statement of its own, so its snapshot is taken after the
-- locks: a push cannot commit in between, and every committed group is
-- seen.
CREATE FUNCTION {{schema}}.clear_pending(p_pid bigint, p_group text)
RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_qid     bigint;
    v_pending boolean;
    v_done    boolean := false;
BEGIN
    SELECT queue_id, pending INTO v_qid, v_pending FROM {{schema}}.partitions
    WHERE id = p_pid FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_pending THEN
        IF NOT pg_try_advisory_xact_lock_shared(hashtextextended('queen/{{schema_name}}/contact/' || v_qid, 0)) THEN
            RETURN false;
        END IF;
        INSERT INTO {{schema}}.backlog (queue_id, group_name, partition_id)
        SELECT s.queue_id, s.group_name, p.id
        FROM {{schema}}.partitions p
        JOIN {{schema}}.subscriptions s ON s.queue_id = p.queue_id
        LEFT JOIN LATERAL (SELECT c.committed FROM {{schema}}.consumers c
                           WHERE c.partition_id = p.id AND c.group_name = s.group_name LIMIT 1) c ON true
        WHERE p.id = p_pid AND p.last_offset >= p.log_start
          AND coalesce(c.committed, {{schema}}.seed_offset(p.id, p.log_start, p.created_at, s.mode, s.created_at,
                                                           s.from_time)) < p.last_offset
        ORDER BY s.group_name
        ON CONFLICT DO NOTHING;
        UPDATE {{schema}}.partitions SET pending = false WHERE id = p_pid;
        v_done := true;
    END IF;
    DELETE FROM {{schema}}.backlog b
    USING {{schema}}.partitions p
    WHERE b.queue_id = v_qid AND b.group_name = p_group AND b.partition_id = p_pid AND p.id = p_pid
      AND (p.last_offset < p.log_start
           OR EXISTS (SELECT 1 FROM {{schema}}.consumers c
                      WHERE c.partition_id = p_pid AND c.group_name = p_group AND c.committed >= p.last_offset
                      OFFSET 0));
    RETURN v_done OR FOUND;
END
$$;

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

-- One step of a group's first-contact marking: the next 1024 partitions of
-- the queue by name. Those out of the ready set that the group is behind on
-- are locked in ascending id (the global order; a first contact may wait)
-- and, by a later statement, given a backlog row unless pending by then. The caller holds the group's seed lock.
CREATE FUNCTION {{schema}}.seed_chunk(p_qid bigint, p_group text)
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
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
-- and nobody clears it before the group is seen), then a first seed_chunk
-- step. Concurrent first pops of the group wait for the one doing it (the
-- group's seed lock), which is bounded work, and then go on as later pops.
-- The subscription time is read after the contact lock: a message created
-- at or after it cannot have been cleared from the ready set unseen.
-- With p_pids (not NULL): cursor rows for those partitions that lack one
-- (pop passes its window), in ascending id, without any lock of its own:
-- pops of the group seed concurrently.
CREATE FUNCTION {{schema}}.seed_consumers(p_qid bigint, p_group text, p_mode text, p_from timestamptz, p_pids bigint[])
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
    IF p_pids IS NOT NULL THEN
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
        ON CONFLICT DO NOTHING;
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/seed/' || p_qid || '/' || p_group, 0));
    IF p_group = '' THEN
        p_mode := 'all';
    END IF;
    PERFORM 1 FROM {{schema}}.subscriptions WHERE queue_id = p_qid AND group_name = p_group;
    IF NOT FOUND THEN
        -- Waits only for clears in flight, which never wait themselves.
        PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/contact/' || p_qid, 0));
        INSERT INTO {{schema}}.subscriptions (queue_id, group_name, mode, from_time, created_at, seed_after)
        VALUES (p_qid, p_group, p_mode, p_from, clock_timestamp(), CASE WHEN p_mode = 'new' THEN NULL ELSE '' END)
        ON CONFLICT DO NOTHING;
    END IF;
    PERFORM {{schema}}.seed_chunk(p_qid, p_group);
    RETURN true;
END
$$;

-- The first-contact signature.
CREATE FUNCTION {{schema}}.seed_consumers(p_qid bigint, p_group text, p_mode text, p_from timestamptz)
RETURNS boolean
LANGUAGE sql AS $$
    SELECT {{schema}}.seed_consumers(p_qid, p_group, p_mode, p_from, NULL::bigint[])
$$;

CREATE FUNCTION {{schema}}.pop(
    p_tenant     uuid,
    p_queue      text,
    p_group      text,
    p_partition  text,
    p_hints      text[],
    p_batch      integer,
    p_partitions integer,
    p_lease_ms   bigint,
    p_auto_ack   boolean,
    p_owner      text,
    p_mode       text,
    p_from       timestamptz,
    -- At most this many messages from one partition (a fused claim takes
    -- one partition for each of several callers, each with its own Batch).
    p_part_batch integer
) RETURNS SETOF {{schema}}.pop_row
LANGUAGE plpgsql
-- Array-driven statements would otherwise be re-planned on every call (as
-- in 003). Every statement here is a keyed lookup or a walk of the pending
-- index, never a scan.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_q        record;
    v_c        record;
    v_x        record;
    v_pend     bigint[];
    v_cand     bigint[];
    v_win      integer;
    v_lo       bigint;
    v_hi       bigint;
    v_from     bigint;
    v_pass     integer;
    v_n        integer;
    v_left     integer := p_batch;
    v_claimed  integer := 0;
    v_now      timestamptz := clock_timestamp();
    v_cutoff   timestamptz;
    v_start    bigint;
    v_end      bigint;
    v_seg_lo   bigint;
    v_vis      bigint;
    v_lease    uuid;
    v_expires  timestamptz;
    v_try      integer;
    v_deliv    integer;
    v_drained  bigint[] := '{}';
    v_caught   bigint[] := '{}';
    v_missing  boolean;
    v_seed     integer;
    v_full     boolean := false;
    v_seen     bigint[] := '{}';
    v_more     bigint[];
    v_pid      bigint;
    v_after    text;
    v_adv      bigint;
BEGIN
    p_part_batch := least(coalesce(p_part_batch, p_batch), p_batch);
    SELECT id, lease_time_ms, delayed_processing_ms, window_buffer_ms INTO v_q
    FROM {{schema}}.queues WHERE tenant = p_tenant AND name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_lease_ms <= 0 THEN
        p_lease_ms := v_q.lease_time_ms;
    END IF;
    v_cutoff := v_now - v_q.delayed_processing_ms * interval '1 millisecond';

    -- First contact (bounded, see seed_consumers), or one more step of its
    -- marking when no other pop of the group is taking one.
    SELECT s.seed_after INTO v_after FROM {{schema}}.subscriptions s
    WHERE s.queue_id = v_q.id AND s.group_name = p_group;
    IF NOT FOUND THEN
        PERFORM {{schema}}.seed_consumers(v_q.id, p_group, p_mode, p_from);
    ELSIF v_after IS NOT NULL
          AND pg_try_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/seed/' || v_q.id || '/' || p_group, 0)) THEN
        PERFORM {{schema}}.seed_chunk(v_q.id, p_group);
    END IF;
    -- A paused group claims nothing (see paused_groups). After the first
    -- contact, so a group paused before it still counts from its
    -- subscription, not from its Resume.
    IF EXISTS (SELECT 1 FROM {{schema}}.paused_groups g WHERE g.queue_id = v_q.id AND g.group_name = p_group) THEN
        RETURN;
    END IF;

    -- Up to two passes: the first over a window sized to the claim, the
    -- second, only if the first claimed less than asked and did not see the
    -- whole ready set, over a wider one.
    FOR v_pass IN 1 .. 2 LOOP
        -- The window this pop looks at: hinted partitions, then up to v_win ids
        -- of the shared ready set (pending) and up to v_win of this group's
        -- backlog, each from a random point, wrapping around. Never another
        -- group's backlog, and never more than a window: a pop is O(window) even
        -- when 100k keys have backlog, whichever group it is; the random start
        -- spreads concurrent pops and is fair over time. The ids are read on
        -- their own (the indexes are the only fit): in a join the planner may
        -- drive from the group's consumer rows (every partition) when
        -- statistics are stale.
        IF p_partition IS NULL THEN
            v_win := CASE WHEN v_pass = 1 THEN greatest(32, p_partitions * 4) ELSE 256 END;
            v_full := false;
            SELECT coalesce(array_agg(p.id), '{}') INTO v_pend
            FROM {{schema}}.partitions p
            WHERE v_pass = 1 AND p.queue_id = v_q.id AND p.name = ANY (p_hints)
              AND (p.pending OR EXISTS (SELECT 1 FROM {{schema}}.backlog b
                                        WHERE b.queue_id = v_q.id AND b.group_name = p_group AND b.partition_id = p.id
                                        OFFSET 0));
            -- queue_id as a range, ordered by (queue_id, id): only the partial
            -- index gives that order. With queue_id = a parameter the order is
            -- by id alone, and a generic plan walked the primary key filtering
            -- pending (it takes half the rows for pending), every partition of
            -- the schema when the set is small. Likewise for the backlog, whose
            -- partition_id index would otherwise give the order.
            v_lo := (SELECT p.id FROM {{schema}}.partitions p
                     WHERE p.queue_id BETWEEN v_q.id AND v_q.id AND p.pending
                     ORDER BY p.queue_id, p.id LIMIT 1);
            v_hi := (SELECT p.id FROM {{schema}}.partitions p
                     WHERE p.queue_id BETWEEN v_q.id AND v_q.id AND p.pending
                     ORDER BY p.queue_id DESC, p.id DESC LIMIT 1);
            IF v_lo IS NOT NULL THEN
                v_from := v_lo + floor(random() * (v_hi - v_lo + 1))::bigint;
                v_n := cardinality(v_pend);
                v_pend := v_pend || ARRAY(SELECT p.id FROM {{schema}}.partitions p
                                          WHERE p.queue_id BETWEEN v_q.id AND v_q.id AND p.pending AND p.id >= v_from
                                          ORDER BY p.queue_id, p.id LIMIT v_win);
                IF cardinality(v_pend) - v_n < v_win THEN
                    v_pend := v_pend || ARRAY(SELECT p.id FROM {{schema}}.partitions p
                                              WHERE p.queue_id BETWEEN v_q.id AND v_q.id AND p.pending AND p.id < v_from
                                              ORDER BY p.queue_id, p.id LIMIT v_win - (cardinality(v_pend) - v_n));
                END IF;
                v_full := v_full OR cardinality(v_pend) - v_n >= v_win;
            END IF;
            v_lo := (SELECT b.partition_id FROM {{schema}}.backlog b
                     WHERE b.queue_id BETWEEN v_q.id AND v_q.id AND b.group_name BETWEEN p_group AND p_group
                     ORDER BY b.queue_id, b.group_name, b.partition_id LIMIT 1);
            v_hi := (SELECT b.partition_id FROM {{schema}}.backlog b
                     WHERE b.queue_id BETWEEN v_q.id AND v_q.id AND b.group_name BETWEEN p_group AND p_group
                     ORDER BY b.queue_id DESC, b.group_name DESC, b.partition_id DESC LIMIT 1);
            IF v_lo IS NOT NULL THEN
                v_from := v_lo + floor(random() * (v_hi - v_lo + 1))::bigint;
                v_n := cardinality(v_pend);
                v_pend := v_pend || ARRAY(SELECT b.partition_id FROM {{schema}}.backlog b
                                          WHERE b.queue_id BETWEEN v_q.id AND v_q.id
                                            AND b.group_name BETWEEN p_group AND p_group AND b.partition_id >= v_from
                                          ORDER BY b.queue_id, b.group_name, b.partition_id LIMIT v_win);
                IF cardinality(v_pend) - v_n < v_win THEN
                    v_pend := v_pend || ARRAY(SELECT b.partition_id FROM {{schema}}.backlog b
                                              WHERE b.queue_id BETWEEN v_q.id AND v_q.id
                                                AND b.group_name BETWEEN p_group AND p_group AND b.partition_id < v_from
                                              ORDER BY b.queue_id, b.group_name, b.partition_id
                                              LIMIT v_win - (cardinality(v_pend) - v_n));
                END IF;
                v_full := v_full OR cardinality(v_pend) - v_n >= v_win;
            END IF;
            -- The second pass reads only what the first did not.
            IF v_pass = 2 THEN
                v_pend := ARRAY(SELECT u.id FROM unnest(v_pend) AS u(id) WHERE NOT (u.id = ANY (v_seen)));
            END IF;
        ELSE
            SELECT coalesce(array_agg(p.id), '{}') INTO v_pend
            FROM {{schema}}.partitions p WHERE p.queue_id = v_q.id AND p.name = p_partition;
        END IF;

        -- One read of the window: whether some partition of it was created
        -- since the group's first contact (no consumer row yet: seed, then
        -- read again), the claimable ones (something retained after the
        -- cursor, no live lease, the window buffer passed, the head message
        -- visible) in claim order, and the ones this group has consumed (the
        -- only ones the ready-set upkeep below needs to look at). No locks.
        FOR v_seed IN 1 .. 2 LOOP
            SELECT coalesce(bool_or(x.missing), false),
                   coalesce(array_agg(x.pid ORDER BY x.hinted DESC, x.upd, x.pid) FILTER (WHERE x.claimable), '{}'),
                   coalesce(array_agg(x.pid) FILTER (WHERE x.caught), '{}')
            INTO v_missing, v_cand, v_more
            FROM (SELECT p.id AS pid, (p.name = ANY (p_hints)) AS hinted, cc.updated_at AS upd,
                         cc.partition_id IS NULL AS missing,
                         -- Written to in the last second or so: it is likely
                         -- to be written again soon, so it stays in the ready
                         -- set (clearing it costs a partition write, and its
                         -- next push a non-HOT update to set it again).
                         ((p.last_offset < p.log_start OR cc.committed >= p.last_offset)
                          AND p.last_write_at < v_now - interval '2 seconds') AS caught,
                         (cc.partition_id IS NOT NULL
                          AND p.last_offset >= greatest(cc.committed + 1, p.log_start)
                          AND (cc.batch_end IS NULL OR cc.lease_expires_at <= v_now)
                          AND (v_q.window_buffer_ms = 0 OR coalesce(
                                (SELECT s.created_at FROM {{schema}}.segments s WHERE s.partition_id = p.id
                                 ORDER BY s.base_offset DESC LIMIT 1), '-infinity')
                                <= v_now - v_q.window_buffer_ms * interval '1 millisecond')
                          AND (v_q.delayed_processing_ms = 0 OR coalesce(
                                (SELECT s.created_at FROM {{schema}}.segments s WHERE s.partition_id = p.id
                                   AND s.base_offset <= greatest(cc.committed + 1, p.log_start)
                                 ORDER BY s.base_offset DESC LIMIT 1), '-infinity') <= v_cutoff)) AS claimable
                  FROM (SELECT DISTINCT id FROM unnest(v_pend) AS u(id)) AS r
                  JOIN {{schema}}.partitions p ON p.id = r.id
                  -- A keyed lookup per partition (LIMIT keeps the planner from
                  -- flattening it): as a plain join, a generic plan cached while
                  -- the table was small read every cursor of the group instead.
                  LEFT JOIN LATERAL (SELECT c.partition_id, c.committed, c.batch_end, c.lease_expires_at, c.updated_at
                                     FROM {{schema}}.consumers c
                                     WHERE c.partition_id = r.id AND c.group_name = p_group
                                     LIMIT 1) cc ON true) x;
            EXIT WHEN NOT v_missing OR v_seed = 2;
            PERFORM {{schema}}.seed_consumers(v_q.id, p_group, p_mode, p_from, v_pend);
        END LOOP;
        v_caught := v_caught || v_more;

        -- Claim in that order: one keyed try-lock each (SKIP LOCKED: never
        -- waits), re-checking the lease on the locked row.
        FOREACH v_pid IN ARRAY v_cand LOOP
            EXIT WHEN v_left <= 0 OR v_claimed >= p_partitions;
            -- A second try only if retention took the claimed messages
            -- between the lock and the read (see below).
            FOR v_try IN 1 .. 2 LOOP
                SELECT cc.partition_id, p.name, cc.committed, cc.deliveries, cc.delivered_max,
                       p.last_offset, p.log_start, cc.settled, cc.fail_offs, cc.fail_counts, cc.attempts
                INTO v_c
                FROM {{schema}}.consumers cc
                JOIN {{schema}}.partitions p ON p.id = cc.partition_id
                WHERE cc.partition_id = v_pid AND cc.group_name = p_group
                  AND p.last_offset >= greatest(cc.committed + 1, p.log_start)
                  AND (cc.batch_end IS NULL OR cc.lease_expires_at <= v_now)
                FOR UPDATE OF cc SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                v_start := greatest(v_c.committed + 1, v_c.log_start);
                IF v_c.settled IS NOT NULL THEN
                    v_start := {{schema}}.settled_advance(v_start - 1, v_c.settled) + 1;
                END IF;
                v_end := least(v_c.last_offset, v_start + least(v_left, p_part_batch) - 1);
                v_seg_lo := coalesce((SELECT max(s.base_offset) FROM {{schema}}.segments s
                                      WHERE s.partition_id = v_c.partition_id AND s.base_offset <= v_start), v_start);
                IF v_q.delayed_processing_ms > 0 THEN
                    -- created_at is monotone in offset order: the visible part is a prefix.
                    SELECT max(s.end_offset) INTO v_vis FROM {{schema}}.segments s
                    WHERE s.partition_id = v_c.partition_id AND s.base_offset BETWEEN v_seg_lo AND v_end
                      AND s.created_at <= v_cutoff;
                    v_end := least(v_end, coalesce(v_vis, v_start - 1));
                END IF;
                IF v_end < v_start AND v_start - 1 > v_c.committed AND v_c.settled IS NOT NULL THEN
                    -- Only settled offsets are left past a retention cut:
                    -- the cursor passes them, so the partition is not
                    -- claimable for nothing again.
                    UPDATE {{schema}}.consumers SET committed = v_start - 1,
                        settled = {{schema}}.offsets_above(settled, v_start - 1),
                        attempts = {{schema}}.fail_at(fail_offs, fail_counts, v_start),
                        fail_offs = {{schema}}.offsets_above(fail_offs, v_start),
                        fail_counts = {{schema}}.fail_counts_above(fail_offs, fail_counts, v_start),
                        deliveries = 0, updated_at = v_now
                    WHERE partition_id = v_c.partition_id AND group_name = p_group;
                END IF;
                EXIT WHEN v_end < v_start;
                IF p_auto_ack THEN
                    v_lease := NULL;
                    v_expires := NULL;
                    v_deliv := v_c.deliveries + 1;
                ELSE
                    v_lease := gen_random_uuid();
                    v_expires := v_now + p_lease_ms * interval '1 millisecond';
                    v_deliv := CASE WHEN v_c.committed = v_start - 1 THEN v_c.deliveries + 1 ELSE 1 END;
                END IF;

                -- The segments first, the cursor write after, and only if
                -- some segment was read: retention committing between the
                -- claim and the read leaves fewer segments (or none), never
                -- a lease (or an auto-ack) over messages nobody received.
                -- The row is locked: nothing else can move it meanwhile.
                RETURN QUERY
                SELECT v_c.partition_id, v_c.name, v_lease, v_expires, p_lease_ms, v_start, v_end, v_deliv, v_c.delivered_max,
                       s.base_offset, s.end_offset, s.created_at, s.blob, s.failures,
                       -- The out-of-order settlement state, once per partition;
                       -- the failures with the head's (attempts) when the
                       -- claim starts at it.
                       CASE WHEN row_number() OVER (ORDER BY s.base_offset) = 1 THEN v_c.settled END,
                       CASE WHEN row_number() OVER (ORDER BY s.base_offset) = 1 THEN
                           CASE WHEN v_c.attempts > 0 AND v_c.committed = v_start - 1 THEN v_start || v_c.fail_offs
                                ELSE v_c.fail_offs END END,
                       CASE WHEN row_number() OVER (ORDER BY s.base_offset) = 1 THEN
                           CASE WHEN v_c.attempts > 0 AND v_c.committed = v_start - 1 THEN v_c.attempts || v_c.fail_counts
                                ELSE v_c.fail_counts END END
                FROM {{schema}}.segments s
                WHERE s.partition_id = v_c.partition_id AND s.base_offset BETWEEN v_seg_lo AND v_end
                ORDER BY s.base_offset;
                IF FOUND THEN
                    IF p_auto_ack THEN
                        v_adv := v_end;
                        IF v_c.settled IS NOT NULL THEN
                            v_adv := {{schema}}.settled_advance(v_end, v_c.settled);
                        END IF;
                        UPDATE {{schema}}.consumers SET committed = v_adv,
                            batch_end = NULL, lease_id = NULL,
                            lease_owner = NULL, lease_expires_at = NULL, deliveries = 0,
                            attempts = {{schema}}.fail_at(fail_offs, fail_counts, v_adv + 1),
                            settled = CASE WHEN settled IS NULL THEN NULL
                                           ELSE {{schema}}.offsets_above(settled, v_adv) END,
                            fail_offs = CASE WHEN fail_offs IS NULL THEN NULL
                                             ELSE {{schema}}.offsets_above(fail_offs, v_adv + 1) END,
                            fail_counts = CASE WHEN fail_offs IS NULL THEN NULL
                                               ELSE {{schema}}.fail_counts_above(fail_offs, fail_counts, v_adv + 1) END,
                            delivered_max = greatest(delivered_max, v_end), updated_at = v_now
                        WHERE partition_id = v_c.partition_id AND group_name = p_group;
                    ELSE
                        UPDATE {{schema}}.consumers SET committed = v_start - 1, batch_end = v_end,
                            lease_id = v_lease, lease_owner = p_owner, lease_expires_at = v_expires,
                            deliveries = v_deliv,
                            attempts = CASE WHEN committed = v_start - 1 THEN attempts
                                            ELSE {{schema}}.fail_at(fail_offs, fail_counts, v_start) END,
                            settled = CASE WHEN committed = v_start - 1 THEN settled
                                           ELSE {{schema}}.offsets_above(settled, v_start - 1) END,
                            fail_offs = CASE WHEN committed = v_start - 1 THEN fail_offs
                                             ELSE {{schema}}.offsets_above(fail_offs, v_start) END,
                            fail_counts = CASE WHEN committed = v_start - 1 THEN fail_counts
                                               ELSE {{schema}}.fail_counts_above(fail_offs, fail_counts, v_start) END,
                            delivered_max = greatest(delivered_max, v_end), updated_at = v_now
                        WHERE partition_id = v_c.partition_id AND group_name = p_group;
                    END IF;
                    v_left := v_left - (v_end - v_start + 1)::integer;
                    v_claimed := v_claimed + 1;
                    IF p_auto_ack AND v_end >= v_c.last_offset THEN
                        v_drained := v_drained || v_c.partition_id;
                    END IF;
                    EXIT;
                END IF;
            END LOOP;
        END LOOP;
        EXIT WHEN p_partition IS NOT NULL OR NOT v_full OR v_left <= 0 OR v_claimed >= p_partitions;
        v_seen := v_seen || v_pend;
    END LOOP;

    -- Ready-set upkeep, at the end: this transaction does nothing after
    -- these try-locks, so they cannot join a deadlock. Acks leave drained
    -- partitions where they are (settle takes no partition locks); every pop
    -- passes to clear_pending the partitions its own auto-ack drained and up
    -- to 256 more of its window that its group has consumed, which keeps
    -- stale entries bounded by the pop rate, not the number of keys. A
    -- partition this group is behind on stays where it is (it is in the
    -- group's reach), so it is not even looked at.
    FOREACH v_pid IN ARRAY v_drained LOOP
        PERFORM {{schema}}.clear_pending(v_pid, p_group);
    END LOOP;
    IF p_partition IS NULL THEN
        FOR v_x IN
            SELECT r.id FROM (SELECT DISTINCT id FROM unnest(v_caught) AS u(id)) AS r
            WHERE NOT (r.id = ANY (v_drained))
            LIMIT 256
        LOOP
            PERFORM {{schema}}.clear_pending(v_x.id, p_group);
        END LOOP;
    END IF;
END
$$;

-- What a pop claimed but cannot hand over: messages Go cannot decompress,
-- parse or decrypt (a corrupt segment, a message sealed with another key).
-- They go to the dead-letter store with their reasons instead of failing
-- every claim that meets them. Under a lease (p_lease) they must be the
-- lease's head (consecutive; any offsets between the cursor and the first
-- were taken by retention), and the cursor moves past them; the lease is
-- cut to end at p_end (the message before the next undecodable one, which
-- a later claim then finds at its head) and released once nothing of it is
-- left. Returns false, writing nothing, if the lease is no
-- longer held. With AutoAck (p_lease NULL) the claim already moved the
-- cursor: only the dead letters are written.
CREATE FUNCTION {{schema}}.pop_dead_letter(
    p_pid      bigint,
    p_group    text,
    p_lease    uuid,
    p_end      bigint,
    p_offs     bigint[],
    p_ids      uuid[],
    p_txns     text[],
    p_flags    integer[],
    p_payloads bytea[],
    p_created  timestamptz[],
    p_reasons  text[],
    p_keys     text[] DEFAULT NULL, -- ordering keys ('' or NULL: none)
    p_headers  bytea[] DEFAULT NULL -- encoded headers (empty or NULL: none)
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    n      integer := coalesce(cardinality(p_offs), 0);
    v_c    record;
    v_p    record;
    v_comm bigint;
    v_end  bigint;
    v_now  timestamptz := clock_timestamp();
BEGIN
    IF coalesce(cardinality(p_ids), 0) <> n OR coalesce(cardinality(p_txns), 0) <> n
       OR coalesce(cardinality(p_flags), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR coalesce(cardinality(p_created), 0) <> n OR coalesce(cardinality(p_reasons), 0) <> n
       OR (p_keys IS NOT NULL AND cardinality(p_keys) <> n)
       OR (p_headers IS NOT NULL AND cardinality(p_headers) <> n) THEN
        RAISE EXCEPTION 'queen: pop_dead_letter arrays are not aligned';
    END IF;
    SELECT p.name, p.queue_id INTO v_p FROM {{schema}}.partitions p WHERE p.id = p_pid;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_lease IS NOT NULL THEN
        SELECT c.committed, c.batch_end, c.lease_id, c.lease_expires_at, c.settled INTO v_c
        FROM {{schema}}.consumers c
        WHERE c.partition_id = p_pid AND c.group_name = p_group
        FOR UPDATE;
        IF NOT FOUND OR v_c.lease_id IS DISTINCT FROM p_lease OR v_c.lease_expires_at <= v_now
           OR (n > 0 AND (p_offs[1] <= v_c.committed OR p_offs[n] <> p_offs[1] + n - 1
                          OR p_offs[n] > v_c.batch_end)) THEN
            RETURN false;
        END IF;
        v_comm := {{schema}}.settled_advance(CASE WHEN n > 0 THEN p_offs[n] ELSE v_c.committed END, v_c.settled);
        v_end := least(v_c.batch_end, coalesce(p_end, v_c.batch_end));
        UPDATE {{schema}}.consumers SET
            committed        = v_comm,
            attempts         = CASE WHEN v_comm > committed THEN {{schema}}.fail_at(fail_offs, fail_counts, v_comm + 1)
                                    ELSE attempts END,
            settled          = CASE WHEN settled IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(settled, v_comm) END,
            fail_offs        = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(fail_offs, v_comm + 1) END,
            fail_counts      = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.fail_counts_above(fail_offs, fail_counts, v_comm + 1) END,
            deliveries       = CASE WHEN v_comm = committed THEN deliveries
                                    WHEN v_comm < delivered_max THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN v_comm >= v_end THEN NULL ELSE v_end END,
            lease_id         = CASE WHEN v_comm >= v_end THEN NULL ELSE lease_id END,
            lease_owner      = CASE WHEN v_comm >= v_end THEN NULL ELSE lease_owner END,
            lease_expires_at = CASE WHEN v_comm >= v_end THEN NULL ELSE lease_expires_at END,
            updated_at       = v_now
        WHERE partition_id = p_pid AND group_name = p_group;
    END IF;
    INSERT INTO {{schema}}.dead_letters (queue_id, partition_id, partition_name, group_name,
        msg_offset, message_id, transaction_id, message_key, message_headers, flags, payload, message_created_at,
        attempts, reason)
    SELECT v_p.queue_id, p_pid, v_p.name, p_group, x.off, x.id, x.txn, nullif(x.key, ''), nullif(x.hdrs, '\x'::bytea),
           x.flags, x.payload, x.created, 0, x.reason
    FROM unnest(p_offs, p_ids, p_txns, p_flags, p_payloads, p_created, p_reasons, p_keys, p_headers)
         AS x(off, id, txn, flags, payload, created, reason, key, hdrs)
    ORDER BY x.off;
    RETURN true;
END
$$;

-- One verdict per settle input. status: 0 applied, 1 below the cursor (no
-- op), 2 lease lost, 3 applied and the message was dead-lettered, 4 applied
-- and the exhausted message was dropped, 5 no such cursor.
CREATE TYPE {{schema}}.settle_result AS (
    ord       integer,
    status    smallint,
    committed bigint
);

-- The minimal unsigned LEB128 varint of p_n (the frame format's uvarint).
CREATE FUNCTION {{schema}}.uvarint(p_n bigint)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_n   bigint := p_n;
    v_var bytea := '\x'::bytea;
BEGIN
    LOOP
        IF v_n >= 128 THEN
            v_var := v_var || set_byte('\x00'::bytea, 0, ((v_n & 127) | 128)::integer);
            v_n := v_n >> 7;
        ELSE
            RETURN v_var || set_byte('\x00'::bytea, 0, v_n::integer);
        END IF;
    END LOOP;
END
$$;

-- 6. The skip policy's re-enqueue. The raw-codec segment blob (codec byte 0,
-- see internal/segment) holding one frame (see internal/frame): u32 LE body
-- length, flags, 16-byte id, uvarint transaction-id length, transaction id,
-- the key (uvarint length and bytes) when there is one, the encoded headers
-- when there are any (passed through as Go encoded them), payload.
CREATE FUNCTION {{schema}}.raw_segment(p_id uuid, p_flags integer, p_txn text, p_payload bytea,
                                        p_key text DEFAULT NULL, p_headers bytea DEFAULT NULL)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_txn  bytea := convert_to(coalesce(p_txn, ''), 'UTF8');
    v_key  bytea := convert_to(coalesce(p_key, ''), 'UTF8');
    v_flag integer := coalesce(p_flags, 0) & 1;
    v_body bytea;
    v_len  bigint;
BEGIN
    -- The frame's key (FlagKey, bit 2) follows the transaction id, present
    -- exactly when non-empty (see internal/frame).
    IF octet_length(v_key) > 0 THEN
        v_flag := v_flag | 4;
        v_txn := v_txn || {{schema}}.uvarint(octet_length(v_key)) || v_key;
    END IF;
    -- The headers (FlagHeaders, bit 1) follow the key, present exactly when
    -- non-empty.
    IF octet_length(coalesce(p_headers, '\x'::bytea)) > 0 THEN
        v_flag := v_flag | 2;
        v_txn := v_txn || p_headers;
    END IF;
    v_body := set_byte('\x00'::bytea, 0, v_flag) || uuid_send(p_id)
              || {{schema}}.uvarint(octet_length(convert_to(coalesce(p_txn, ''), 'UTF8'))) || v_txn
              || coalesce(p_payload, '\x'::bytea);
    v_len := octet_length(v_body);
    RETURN '\x00'::bytea
        || set_byte(set_byte(set_byte(set_byte('\x00000000'::bytea,
               0, (v_len & 255)::integer), 1, ((v_len >> 8) & 255)::integer),
               2, ((v_len >> 16) & 255)::integer), 3, ((v_len >> 24) & 255)::integer)
        || v_body;
END
$$;

-- Appends one failed message at the tail of partition p_pid (whose row the
-- caller holds) as a segment of its own carrying p_failures, with the
-- original's hash row when that is still retained (a producer retrying the
-- transaction id while the message is live is still a duplicate), else a
-- zero hash (its dedup window had passed). Returns the new offset.
CREATE FUNCTION {{schema}}.requeue_one(
    p_pid      bigint,
    p_off      bigint,
    p_id       uuid,
    p_flags    integer,
    p_txn      text,
    p_payload  bytea,
    p_failures integer,
    p_key      text DEFAULT NULL,
    p_headers  bytea DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_hash bytea;
    v_now  timestamptz := clock_timestamp();  -- after the row lock: created_at stays monotone
BEGIN
    SELECT substring(t.hashes FROM ((p_off - t.base_offset) * 16 + 1)::integer FOR 16) INTO v_hash
    FROM (SELECT tt.base_offset, tt.end_offset, tt.hashes FROM {{schema}}.txns tt
          WHERE tt.partition_id = p_pid AND tt.base_offset <= p_off
          ORDER BY tt.base_offset DESC LIMIT 1) t
    WHERE t.end_offset >= p_off;
    IF v_hash IS NULL OR octet_length(v_hash) <> 16 THEN
        v_hash := '\x00000000000000000000000000000000'::bytea;
    END IF;
    -- The single allocator, without a dedup probe: the copy repeats its
    -- original's transaction id on purpose.
    RETURN ({{schema}}.push_one(p_pid, 1, v_hash, -1, {{schema}}.raw_segment(p_id, p_flags, p_txn, p_payload, p_key, p_headers),
                                0, v_now, p_failures)).base_offset;
END
$$;

-- 7. Settle, as in 003, with the failure policy and re-enqueued messages'
-- failure counts: a message's retry budget is what its segment carries plus
-- what its cursor has charged. A Fail under 'skip' that does not exhaust the
-- budget re-enqueues the message (requeue_one) and commits the cursor
-- through it; the result is status 0 (applied) as for any Fail. The
-- partition rows of those inputs are locked first, in ascending id, before
-- any consumer row: the global order (see the lock below for settle() inside
-- a larger transaction). Actions: 0 none, 1 fail, 2 retry, 3 dead letter,
-- 4 interrupt (a retry that also takes back the lease's delivery: a consumer
-- shutting down hands back what it did not finish, uncharged and uncounted).
CREATE FUNCTION {{schema}}.settle(
    p_pids       bigint[],
    p_groups     text[],
    p_leases     uuid[],
    p_ok         bigint[],
    p_act        smallint[],
    p_act_off    bigint[],
    p_release    boolean[],
    p_reasons    text[],
    p_dl_ids     uuid[],
    p_dl_txns    text[],
    p_dl_flags   integer[],
    p_dl_payload bytea[],
    p_dl_created timestamptz[],
    -- The messages' ordering keys ('' or NULL: none), kept by a re-enqueue
    -- and a dead letter.
    p_dl_keys    text[] DEFAULT NULL,
    -- Their encoded headers (empty or NULL: none), kept likewise.
    p_dl_headers bytea[] DEFAULT NULL
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql
-- Array-driven statements would otherwise be re-planned on every call.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n       integer := coalesce(cardinality(p_pids), 0);
    v_rqp   bigint[] := '{}';
    i       integer;
    v_c     record;
    v_now   timestamptz := clock_timestamp();
    v_comm  bigint;
    v_att   integer;
    v_prior integer;
    v_rel   boolean;
    v_dl    boolean;
    v_rq    boolean;
    v_spent integer;
    v_st    smallint;
    v_res   {{schema}}.settle_result[];
BEGIN
    IF coalesce(cardinality(p_groups), 0) <> n OR coalesce(cardinality(p_leases), 0) <> n
       OR coalesce(cardinality(p_ok), 0) <> n OR coalesce(cardinality(p_act), 0) <> n
       OR coalesce(cardinality(p_act_off), 0) <> n OR coalesce(cardinality(p_release), 0) <> n
       OR coalesce(cardinality(p_reasons), 0) <> n OR coalesce(cardinality(p_dl_ids), 0) <> n
       OR coalesce(cardinality(p_dl_txns), 0) <> n OR coalesce(cardinality(p_dl_flags), 0) <> n
       OR coalesce(cardinality(p_dl_payload), 0) <> n OR coalesce(cardinality(p_dl_created), 0) <> n
       OR (p_dl_keys IS NOT NULL AND cardinality(p_dl_keys) <> n)
       OR (p_dl_headers IS NOT NULL AND cardinality(p_dl_headers) <> n) THEN
        RAISE EXCEPTION 'queen: settle arrays are not aligned';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;

    -- Partitions a skip-policy failure may append to, locked before any
    -- consumer row. As the first statement of its transaction (a fused
    -- settle) nothing else is held, so waiting in ascending id is safe. Later
    -- in a transaction (Client.Tx settles after its pushes, whose partition
    -- locks it holds) waiting could close a cycle with a push bundle, so it
    -- takes only rows free now; a failure whose partition is busy at that
    -- instant is redelivered in place, as under pause.
    IF 1 = ANY (p_act) THEN
        IF transaction_timestamp() = statement_timestamp() THEN
            SELECT coalesce(array_agg(l.id), '{}') INTO v_rqp FROM (
                SELECT p.id FROM {{schema}}.partitions p
                JOIN {{schema}}.queues qq ON qq.id = p.queue_id
                WHERE p.id IN (SELECT x.pid FROM unnest(p_pids, p_act) AS x(pid, act) WHERE x.act = 1)
                  AND qq.failure_policy = 'skip'
                ORDER BY p.id
                FOR NO KEY UPDATE OF p) l;
        ELSE
            SELECT coalesce(array_agg(l.id), '{}') INTO v_rqp FROM (
                SELECT p.id FROM {{schema}}.partitions p
                JOIN {{schema}}.queues qq ON qq.id = p.queue_id
                WHERE p.id IN (SELECT x.pid FROM unnest(p_pids, p_act) AS x(pid, act) WHERE x.act = 1)
                  AND qq.failure_policy = 'skip'
                ORDER BY p.id
                FOR NO KEY UPDATE OF p SKIP LOCKED) l;
        END IF;
    END IF;

    FOR i IN SELECT o FROM unnest(p_pids, p_groups) WITH ORDINALITY AS x(pid, g, o) ORDER BY pid, g, o LOOP
        SELECT cc.committed, cc.batch_end, cc.lease_id, cc.lease_expires_at, cc.attempts,
               cc.settled, cc.fail_offs, cc.fail_counts,
               p.name AS partition_name, qq.id AS queue_id, qq.retry_limit, qq.dead_letter,
               qq.failure_policy, qq.encryption
        INTO v_c
        FROM {{schema}}.consumers cc
        JOIN {{schema}}.partitions p ON p.id = cc.partition_id
        JOIN {{schema}}.queues qq ON qq.id = p.queue_id
        WHERE cc.partition_id = p_pids[i] AND cc.group_name = p_groups[i]
        FOR UPDATE OF cc;
        IF NOT FOUND THEN
            v_res[i] := ROW(i, 5, NULL);
            CONTINUE;
        END IF;
        IF greatest(p_ok[i], CASE WHEN p_act[i] = 0 THEN -1 ELSE p_act_off[i] END) <= v_c.committed THEN
            v_res[i] := ROW(i, 1, v_c.committed);
            CONTINUE;
        END IF;
        IF v_c.lease_id IS DISTINCT FROM p_leases[i] OR v_c.lease_expires_at <= v_now
           OR greatest(p_ok[i], p_act_off[i]) > v_c.batch_end THEN
            v_res[i] := ROW(i, 2, v_c.committed);
            CONTINUE;
        END IF;

        v_comm := greatest(v_c.committed, p_ok[i]);
        v_att := v_c.attempts;
        v_rel := p_release[i];
        v_dl := false;
        v_rq := false;
        v_st := 0;
        v_prior := 0;
        IF p_act[i] IN (1, 3) THEN
            -- Failures the message carried in from an earlier re-enqueue.
            SELECT s.failures INTO v_prior
            FROM (SELECT ss.end_offset, ss.failures FROM {{schema}}.segments ss
                  WHERE ss.partition_id = p_pids[i] AND ss.base_offset <= p_act_off[i]
                  ORDER BY ss.base_offset DESC LIMIT 1) s
            WHERE s.end_offset >= p_act_off[i];
            v_prior := coalesce(v_prior, 0);
        END IF;
        IF p_act[i] IN (1, 2, 4) THEN
            v_comm := greatest(v_comm, p_act_off[i] - 1);
            v_rel := true;
        END IF;
        IF v_comm > v_c.committed THEN
            -- the new head's failures, if out-of-order settlement stored any
            v_att := {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
        END IF;
        v_spent := v_prior + v_att;
        IF p_act[i] = 1 THEN
            v_att := v_att + 1;
            v_spent := v_prior + v_att;
            IF v_spent >= greatest(v_c.retry_limit, 1) THEN
                v_comm := p_act_off[i];
                v_att := {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
                v_dl := v_c.dead_letter;
                v_st := CASE WHEN v_c.dead_letter THEN 3 ELSE 4 END;
            ELSIF v_c.failure_policy = 'skip' AND p_pids[i] = ANY (v_rqp)
                  -- push_bundle's check: nothing plaintext is written to an
                  -- encrypted queue. A message from before encryption was
                  -- switched on is redelivered in place instead.
                  AND NOT (v_c.encryption AND (coalesce(p_dl_flags[i], 0) & 1) = 0) THEN
                -- Out of the way: a copy at the tail, the cursor past it.
                v_rq := true;
                v_comm := p_act_off[i];
                v_att := {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
            END IF;
        ELSIF p_act[i] = 3 THEN
            v_comm := p_act_off[i];
            v_att := {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
            v_dl := true;
            v_st := 3;
        END IF;
        IF v_c.settled IS NOT NULL AND {{schema}}.settled_advance(v_comm, v_c.settled) > v_comm THEN
            -- Settled out of order above: the cursor passes the run.
            v_comm := {{schema}}.settled_advance(v_comm, v_c.settled);
            v_att := {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
        END IF;
        IF v_comm >= v_c.batch_end THEN
            v_rel := true;
        END IF;

        UPDATE {{schema}}.consumers SET
            committed        = v_comm,
            attempts         = v_att,
            settled          = CASE WHEN settled IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(settled, v_comm) END,
            fail_offs        = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(fail_offs, v_comm + 1) END,
            fail_counts      = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.fail_counts_above(fail_offs, fail_counts, v_comm + 1) END,
            -- An interrupt (4) takes back this lease's delivery of the
            -- message at the new cursor, so its next one is not a retry.
            deliveries       = CASE WHEN p_act[i] = 4 AND v_comm = v_c.committed THEN greatest(deliveries - 1, 0)
                                    WHEN p_act[i] = 4 THEN 0
                                    WHEN v_comm = v_c.committed THEN deliveries
                                    WHEN v_comm < delivered_max THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN v_rel THEN NULL ELSE batch_end END,
            lease_id         = CASE WHEN v_rel THEN NULL ELSE lease_id END,
            lease_owner      = CASE WHEN v_rel THEN NULL ELSE lease_owner END,
            lease_expires_at = CASE WHEN v_rel THEN NULL ELSE lease_expires_at END,
            updated_at       = v_now
        WHERE partition_id = p_pids[i] AND group_name = p_groups[i];

        IF v_rq THEN
            PERFORM {{schema}}.requeue_one(p_pids[i], p_act_off[i], p_dl_ids[i], p_dl_flags[i], p_dl_txns[i],
                                           p_dl_payload[i], v_spent, p_dl_keys[i], p_dl_headers[i]);
        END IF;
        IF v_dl THEN
            INSERT INTO {{schema}}.dead_letters (queue_id, partition_id, partition_name, group_name,
                msg_offset, message_id, transaction_id, message_key, message_headers, flags, payload,
                message_created_at, attempts, reason)
            VALUES (v_c.queue_id, p_pids[i], v_c.partition_name, p_groups[i], p_act_off[i], p_dl_ids[i],
                p_dl_txns[i], nullif(p_dl_keys[i], ''), nullif(p_dl_headers[i], '\x'::bytea), p_dl_flags[i], p_dl_payload[i], p_dl_created[i],
                v_spent, p_reasons[i]);
        END IF;
        v_res[i] := ROW(i, v_st, v_comm);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_res) ORDER BY 1;
END
$$;

-- The common case of ack fusion, set-based: pure acks (commit the cursor
-- through p_ok under lease p_leases), at most one per (partition, group).
-- Same verdicts as settle for such inputs. In the common case (every ack
-- valid) the whole batch is one UPDATE: it locks the cursor rows itself, in
-- ascending (partition id, group), the lock order, because the nested loop
-- it is forced into is driven by the sorted input, and it re-checks each
-- lease on the row version it locked. Only when some ack did not apply is a
-- second statement run, to tell why.
CREATE FUNCTION {{schema}}.ack_many(
    p_pids   bigint[],
    p_groups text[],
    p_leases uuid[],
    p_ok     bigint[]
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql
-- Generic plans of keyed lookups only: a plan cached while the table was
-- small must not turn into a scan of every cursor later.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    n      integer := coalesce(cardinality(p_pids), 0);
    v_now  timestamptz := clock_timestamp();
    v_done integer[];
BEGIN
    IF coalesce(cardinality(p_groups), 0) <> n OR coalesce(cardinality(p_leases), 0) <> n
       OR coalesce(cardinality(p_ok), 0) <> n THEN
        RAISE EXCEPTION 'queen: ack_many arrays are not aligned';
    END IF;
    WITH u AS (
        -- With out-of-order settlement stored (settled, fail_offs not NULL)
        -- the cursor also passes the settled run above o.ok; the CASEs keep
        -- the common case (both NULL) free of the helpers, which are not
        -- inlined.
        UPDATE {{schema}}.consumers c SET
            committed        = CASE WHEN c.settled IS NULL THEN o.ok
                                    ELSE {{schema}}.settled_advance(o.ok, c.settled) END,
            attempts         = CASE WHEN c.settled IS NULL AND c.fail_offs IS NULL THEN 0
                                    ELSE {{schema}}.fail_at(c.fail_offs, c.fail_counts,
                                                            {{schema}}.settled_advance(o.ok, c.settled) + 1) END,
            settled          = CASE WHEN c.settled IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(c.settled, {{schema}}.settled_advance(o.ok, c.settled)) END,
            fail_offs        = CASE WHEN c.fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(c.fail_offs, {{schema}}.settled_advance(o.ok, c.settled) + 1) END,
            fail_counts      = CASE WHEN c.fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.fail_counts_above(c.fail_offs, c.fail_counts,
                                                                      {{schema}}.settled_advance(o.ok, c.settled) + 1) END,
            deliveries       = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE {{schema}}.settled_advance(o.ok, c.settled) END) < c.delivered_max
                                    THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE {{schema}}.settled_advance(o.ok, c.settled) END) >= c.batch_end
                                    THEN NULL ELSE c.batch_end END,
            lease_id         = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE {{schema}}.settled_advance(o.ok, c.settled) END) >= c.batch_end
                                    THEN NULL ELSE c.lease_id END,
            lease_owner      = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE {{schema}}.settled_advance(o.ok, c.settled) END) >= c.batch_end
                                    THEN NULL ELSE c.lease_owner END,
            lease_expires_at = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE {{schema}}.settled_advance(o.ok, c.settled) END) >= c.batch_end
                                    THEN NULL ELSE c.lease_expires_at END,
            updated_at       = v_now
        FROM (SELECT * FROM unnest(p_pids, p_groups, p_leases, p_ok) WITH ORDINALITY AS x(pid, g, lease, ok, ord)
              ORDER BY x.pid, x.g) o
        WHERE c.partition_id = o.pid AND c.group_name = o.g
          AND o.ok > c.committed AND o.ok <= c.batch_end
          AND c.lease_id = o.lease AND c.lease_expires_at > v_now
        RETURNING o.ord
    )
    SELECT coalesce(array_agg(u.ord::integer), '{}') INTO v_done FROM u;

    IF cardinality(v_done) = n THEN
        RETURN QUERY SELECT o.ord::integer, 0::smallint, o.ok
                     FROM unnest(p_ok) WITH ORDINALITY AS o(ok, ord);
        RETURN;
    END IF;
    -- Why the others did not apply, from the rows as they are now (this
    -- transaction holds the ones it updated; the rest may have moved on).
    RETURN QUERY
    SELECT o.ord::integer,
           (CASE WHEN o.ord = ANY (v_done) THEN 0
                 WHEN c.partition_id IS NULL THEN 5
                 WHEN o.ok <= c.committed THEN 1
                 ELSE 2 END)::smallint,
           CASE WHEN o.ord = ANY (v_done) THEN o.ok ELSE c.committed END
    FROM unnest(p_pids, p_groups, p_ok) WITH ORDINALITY AS o(pid, g, ok, ord)
    LEFT JOIN LATERAL (SELECT c.partition_id, c.committed FROM {{schema}}.consumers c
                       WHERE c.partition_id = o.pid AND c.group_name = o.g LIMIT 1) c ON true
    ORDER BY o.ord;
END
$$;

-- Out-of-order settlement, for per-key parallel Consume (KeyConcurrency >
-- 1): one row per message outcome, rows of one lease together with its
-- (partition, group, lease), many leases per call (fused like settle).
-- Actions per row: 0 ack, 1 fail, 2 retry, 3 dead letter, 4 interrupt, 5
-- nothing (carries a lease's release, with the batch's last offset). A
-- lease's rows are applied together: an ack, a dead letter, a failure that
-- spends the budget (dead letter or drop) and a skip-policy failure (a copy
-- at the tail, requeue_one) settle their offset; committed moves over the
-- contiguous settled prefix and the rest goes to consumers.settled, which a
-- later claim skips. Any other failure is charged to its own offset (the
-- head's in attempts, others' in fail_offs / fail_counts), so RetryLimit
-- holds per message wherever it sits. A retry or an interrupt settles
-- nothing; an interrupt of the new head takes back the lease's delivery as
-- in settle. The lease is released when a row asks for it (p_release) or
-- committed reaches batch_end, and kept otherwise (a checkpoint). An
-- offset already settled gets status 1 and changes nothing, so resending
-- an outcome is harmless except a failure's charge. Status per row as
-- settle's, and 6: applied, the failure re-enqueued at the tail. Lock
-- order as settle: skip-policy partitions first, then cursor rows in
-- ascending (partition id, group).
CREATE FUNCTION {{schema}}.settle_keyed(
    p_pids       bigint[],
    p_groups     text[],
    p_leases     uuid[],
    p_offs       bigint[],
    p_act        smallint[],
    p_release    boolean[],
    p_reasons    text[],
    p_dl_ids     uuid[],
    p_dl_txns    text[],
    p_dl_flags   integer[],
    p_dl_payload bytea[],
    p_dl_created timestamptz[],
    p_dl_keys    text[] DEFAULT NULL, -- ordering keys ('' or NULL: none)
    p_dl_headers bytea[] DEFAULT NULL -- encoded headers (empty or NULL: none)
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n       integer := coalesce(cardinality(p_pids), 0);
    v_rqp   bigint[] := '{}';
    v_l     record;
    v_c     record;
    j       integer;
    k       integer;
    v_now   timestamptz := clock_timestamp();
    v_set   bigint[];
    v_fo    bigint[];
    v_fc    integer[];
    v_intr  bigint[];
    v_dup   integer[];
    v_comm  bigint;
    v_att   integer;
    v_prior integer;
    v_cnt   integer;
    v_rel   boolean;
    v_bad   boolean;
    v_st    smallint[];
    v_res   {{schema}}.settle_result[];
BEGIN
    IF coalesce(cardinality(p_groups), 0) <> n OR coalesce(cardinality(p_leases), 0) <> n
       OR coalesce(cardinality(p_offs), 0) <> n OR coalesce(cardinality(p_act), 0) <> n
       OR coalesce(cardinality(p_release), 0) <> n OR coalesce(cardinality(p_reasons), 0) <> n
       OR coalesce(cardinality(p_dl_ids), 0) <> n OR coalesce(cardinality(p_dl_txns), 0) <> n
       OR coalesce(cardinality(p_dl_flags), 0) <> n OR coalesce(cardinality(p_dl_payload), 0) <> n
       OR coalesce(cardinality(p_dl_created), 0) <> n
       OR (p_dl_keys IS NOT NULL AND cardinality(p_dl_keys) <> n)
       OR (p_dl_headers IS NOT NULL AND cardinality(p_dl_headers) <> n) THEN
        RAISE EXCEPTION 'queen: settle_keyed arrays are not aligned';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    -- As in settle: partitions a skip-policy failure may append to, first.
    IF 1 = ANY (p_act) THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO v_rqp FROM (
            SELECT p.id FROM {{schema}}.partitions p
            JOIN {{schema}}.queues qq ON qq.id = p.queue_id
            WHERE p.id IN (SELECT x.pid FROM unnest(p_pids, p_act) AS x(pid, act) WHERE x.act = 1)
              AND qq.failure_policy = 'skip'
            ORDER BY p.id
            FOR NO KEY UPDATE OF p) l;
    END IF;

    FOR v_l IN
        SELECT x.pid, x.g, x.lease, array_agg(x.o::integer ORDER BY x.off, x.o) AS ords
        FROM unnest(p_pids, p_groups, p_leases, p_offs) WITH ORDINALITY AS x(pid, g, lease, off, o)
        GROUP BY x.pid, x.g, x.lease
        ORDER BY x.pid, x.g, min(x.o)
    LOOP
        SELECT cc.committed, cc.batch_end, cc.lease_id, cc.lease_expires_at, cc.attempts,
               cc.settled, cc.fail_offs, cc.fail_counts,
               p.name AS partition_name, qq.id AS queue_id, qq.retry_limit, qq.dead_letter,
               qq.failure_policy, qq.encryption
        INTO v_c
        FROM {{schema}}.consumers cc
        JOIN {{schema}}.partitions p ON p.id = cc.partition_id
        JOIN {{schema}}.queues qq ON qq.id = p.queue_id
        WHERE cc.partition_id = v_l.pid AND cc.group_name = v_l.g
        FOR UPDATE OF cc;
        v_bad := NOT FOUND;
        IF v_bad THEN
            FOREACH j IN ARRAY v_l.ords LOOP
                v_res[j] := ROW(j, 5, NULL);
            END LOOP;
            CONTINUE;
        END IF;
        SELECT bool_or(p_act[o] <> 5 AND p_offs[o] > v_c.batch_end) INTO v_bad FROM unnest(v_l.ords) AS u(o);
        IF v_c.lease_id IS DISTINCT FROM v_l.lease OR v_c.lease_expires_at <= v_now OR v_bad THEN
            -- Everything at or below the cursor (a release carrier names
            -- the batch's last offset): nothing was left to do, as when the
            -- cursor reached the batch's end and that ended the lease.
            SELECT bool_and(p_offs[o] <= v_c.committed) INTO v_bad FROM unnest(v_l.ords) AS u(o);
            FOREACH j IN ARRAY v_l.ords LOOP
                v_res[j] := ROW(j, CASE WHEN v_bad THEN 1 ELSE 2 END, v_c.committed);
            END LOOP;
            CONTINUE;
        END IF;

        -- The failure map with the head's count in it, for the duration.
        v_fo := coalesce(v_c.fail_offs, '{}');
        v_fc := coalesce(v_c.fail_counts, '{}');
        IF v_c.attempts > 0 THEN
            v_fo := (v_c.committed + 1) || v_fo;
            v_fc := v_c.attempts || v_fc;
        END IF;
        -- Acks, set-based (a batch's settlement has a row per message):
        -- those already settled get status 1, the rest join the set.
        SELECT coalesce(array_agg(u.o), '{}') INTO v_dup
        FROM unnest(v_l.ords) AS u(o)
        WHERE p_act[u.o] = 0
          AND (p_offs[u.o] <= v_c.committed OR p_offs[u.o] IN (SELECT unnest(v_c.settled)));
        v_set := ARRAY(SELECT x.o FROM unnest(v_c.settled) AS x(o)
                       UNION
                       SELECT p_offs[u.o] FROM unnest(v_l.ords) AS u(o)
                       WHERE p_act[u.o] = 0 AND p_offs[u.o] > v_c.committed
                       ORDER BY 1);
        v_intr := ARRAY(SELECT p_offs[u.o] FROM unnest(v_l.ords) AS u(o) WHERE p_act[u.o] = 4);
        SELECT bool_or(p_release[u.o]) INTO v_rel FROM unnest(v_l.ords) AS u(o);
        FOREACH j IN ARRAY v_l.ords LOOP
            v_st[j] := 0;
        END LOOP;
        FOREACH j IN ARRAY v_dup LOOP
            v_st[j] := 1;
        END LOOP;
        -- Failures and dead letters, one by one (few: a failure is written
        -- as it happens); retries and interrupts settle nothing.
        FOR j IN SELECT u.o FROM unnest(v_l.ords) AS u(o) WHERE p_act[u.o] IN (1, 3) ORDER BY p_offs[u.o], u.o LOOP
            IF p_offs[j] <= v_c.committed OR p_offs[j] = ANY (v_set) THEN
                v_st[j] := 1;
                CONTINUE;
            END IF;
            SELECT s.failures INTO v_prior
            FROM (SELECT ss.end_offset, ss.failures FROM {{schema}}.segments ss
                  WHERE ss.partition_id = v_l.pid AND ss.base_offset <= p_offs[j]
                  ORDER BY ss.base_offset DESC LIMIT 1) s
            WHERE s.end_offset >= p_offs[j];
            v_prior := coalesce(v_prior, 0);
            k := array_position(v_fo, p_offs[j]);
            v_cnt := CASE WHEN k IS NULL THEN 0 ELSE v_fc[k] END;
            IF p_act[j] = 1 THEN
                v_cnt := v_cnt + 1;
            END IF;
            IF p_act[j] = 3 OR v_prior + v_cnt >= greatest(v_c.retry_limit, 1) THEN
                v_set := v_set || p_offs[j];
                v_st[j] := CASE WHEN p_act[j] = 3 OR v_c.dead_letter THEN 3 ELSE 4 END;
                IF v_st[j] = 3 THEN
                    INSERT INTO {{schema}}.dead_letters (queue_id, partition_id, partition_name, group_name,
                        msg_offset, message_id, transaction_id, message_key, message_headers, flags, payload,
                        message_created_at, attempts, reason)
                    VALUES (v_c.queue_id, v_l.pid, v_c.partition_name, v_l.g, p_offs[j], p_dl_ids[j],
                        p_dl_txns[j], nullif(p_dl_keys[j], ''), nullif(p_dl_headers[j], '\x'::bytea), p_dl_flags[j], p_dl_payload[j], p_dl_created[j],
                        v_prior + v_cnt, p_reasons[j]);
                END IF;
            ELSIF v_c.failure_policy = 'skip' AND v_l.pid = ANY (v_rqp)
                  AND NOT (v_c.encryption AND (coalesce(p_dl_flags[j], 0) & 1) = 0) THEN
                PERFORM {{schema}}.requeue_one(v_l.pid, p_offs[j], p_dl_ids[j], p_dl_flags[j], p_dl_txns[j],
                                               p_dl_payload[j], v_prior + v_cnt, p_dl_keys[j], p_dl_headers[j]);
                v_set := v_set || p_offs[j];
                v_st[j] := 6;
            ELSIF k IS NULL THEN
                v_fo := v_fo || p_offs[j];
                v_fc := v_fc || v_cnt;
            ELSE
                v_fc[k] := v_cnt;
            END IF;
        END LOOP;

        -- Sorted and unique, then the cursor over the contiguous run.
        v_set := ARRAY(SELECT DISTINCT u.o FROM unnest(v_set) AS u(o) ORDER BY u.o);
        v_comm := {{schema}}.settled_advance(v_c.committed, v_set);
        v_att := {{schema}}.fail_at(v_fo, v_fc, v_comm + 1);
        SELECT array_agg(u.o ORDER BY u.o), array_agg(u.c ORDER BY u.o) INTO v_fo, v_fc
        FROM unnest(v_fo, v_fc) AS u(o, c)
        WHERE u.o > v_comm + 1 AND NOT (u.o = ANY (v_set));
        IF v_comm >= v_c.batch_end THEN
            v_rel := true;
        END IF;
        UPDATE {{schema}}.consumers SET
            committed        = v_comm,
            attempts         = v_att,
            settled          = {{schema}}.offsets_above(v_set, v_comm),
            fail_offs        = v_fo,
            fail_counts      = v_fc,
            deliveries       = CASE WHEN (v_comm + 1) = ANY (v_intr) AND v_comm = v_c.committed
                                        THEN greatest(deliveries - 1, 0)
                                    WHEN (v_comm + 1) = ANY (v_intr) THEN 0
                                    WHEN v_comm = v_c.committed THEN deliveries
                                    WHEN v_comm < delivered_max THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN v_rel THEN NULL ELSE batch_end END,
            lease_id         = CASE WHEN v_rel THEN NULL ELSE lease_id END,
            lease_owner      = CASE WHEN v_rel THEN NULL ELSE lease_owner END,
            lease_expires_at = CASE WHEN v_rel THEN NULL ELSE lease_expires_at END,
            updated_at       = v_now
        WHERE partition_id = v_l.pid AND group_name = v_l.g;
        FOREACH j IN ARRAY v_l.ords LOOP
            v_res[j] := ROW(j, v_st[j], v_comm);
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_res) ORDER BY 1;
END
$$;

-- Pauses group p_group of queue (p_tenant, p_queue), creating the queue
-- (default options, as a first push would) if it does not exist.
CREATE FUNCTION {{schema}}.pause_group(p_tenant uuid, p_queue text, p_group text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_qid bigint;
BEGIN
    INSERT INTO {{schema}}.queues (tenant, name) VALUES (p_tenant, p_queue) ON CONFLICT DO NOTHING;
    SELECT id INTO v_qid FROM {{schema}}.queues WHERE tenant = p_tenant AND name = p_queue;
    INSERT INTO {{schema}}.paused_groups (queue_id, group_name) VALUES (v_qid, p_group) ON CONFLICT DO NOTHING;
END
$$;

-- Requeues dead letters p_ids of queue p_qid: each goes back to the tail of
-- its partition (by name: a partition forgotten since is created again) as
-- a segment of its own, with its message id, transaction id, key, headers
-- and stored payload (still ciphertext if it was), no failures, and hash
-- p_hashes[i] (xxh3-128 of its transaction id: ack by transaction id and
-- later producer retries find it; the copy itself is not probed, so it is
-- never a duplicate of its original). p_payloads[i] / p_flags[i], when not
-- NULL, replace the stored payload and flags (a plaintext dead letter of a
-- queue encrypted since, sealed by the client). In dead-letter id order per
-- partition; dead letters of one message (partition, message id) selected
-- together give one copy. The dead letters are deleted in the same
-- transaction: a retry finds only those not yet requeued. Ids of another
-- queue, gone already, or plaintext for an encrypted queue are left alone.
-- Lock order: partitions in ascending id, then dead letters (a leaf).
-- Returns the partitions written and how many messages each got.
CREATE FUNCTION {{schema}}.requeue_dead_letters(
    p_qid      bigint,
    p_ids      bigint[],
    p_hashes   bytea[],
    p_payloads bytea[],
    p_flags    integer[]
) RETURNS TABLE (part_name text, requeued integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n       integer := coalesce(cardinality(p_ids), 0);
    v_enc   boolean;
    v_names text[];
    v_pids  bigint[];
    v_now   timestamptz;
    v_mids  uuid[];
    v_txns  text[];
    v_keys  text[];
    v_hdrs  bytea[];
    v_fls   integer[];
    v_pls   bytea[];
    v_hs    bytea[];
    v_cnt   integer := 0;
    i       integer;
BEGIN
    IF coalesce(cardinality(p_hashes), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR coalesce(cardinality(p_flags), 0) <> n THEN
        RAISE EXCEPTION 'queen: requeue_dead_letters arrays are not aligned';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    SELECT q.encryption INTO v_enc FROM {{schema}}.queues q WHERE q.id = p_qid;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT array_agg(DISTINCT d.partition_name) INTO v_names
    FROM {{schema}}.dead_letters d WHERE d.id = ANY (p_ids) AND d.queue_id = p_qid;
    IF v_names IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO {{schema}}.partitions (queue_id, name)
    SELECT p_qid, u.nm FROM unnest(v_names) AS u(nm) ORDER BY u.nm
    ON CONFLICT DO NOTHING;
    -- Only partitions locked here take dead letters (one forgotten again
    -- since the insert keeps its dead letters for the next call).
    SELECT array_agg(l.name) INTO v_names FROM (
        SELECT p.id, p.name FROM {{schema}}.partitions p
        WHERE p.queue_id = p_qid AND p.name = ANY (v_names)
        ORDER BY p.id
        FOR NO KEY UPDATE) l;
    v_now := clock_timestamp(); -- after the row locks: created_at stays monotone
    WITH x AS (
        SELECT * FROM unnest(p_ids, p_hashes, p_payloads, p_flags) AS x(id, h, pl, fl)
    ), del AS (
        DELETE FROM {{schema}}.dead_letters d
        USING x
        WHERE d.id = x.id AND d.queue_id = p_qid AND d.partition_name = ANY (v_names)
          AND NOT (v_enc AND (coalesce(x.fl, d.flags) & 1) = 0)
        RETURNING d.id, d.partition_name, d.message_id, d.transaction_id, d.message_key,
                  d.message_headers, coalesce(x.fl, d.flags) AS flags, coalesce(x.pl, d.payload) AS payload, x.h
    ), one AS (
        SELECT DISTINCT ON (p.id, del.message_id) p.id AS pid, p.name, del.*
        FROM del JOIN {{schema}}.partitions p ON p.queue_id = p_qid AND p.name = del.partition_name
        ORDER BY p.id, del.message_id, del.id
    )
    SELECT array_agg(o.pid ORDER BY o.pid, o.id), array_agg(o.name ORDER BY o.pid, o.id),
           array_agg(o.message_id ORDER BY o.pid, o.id), array_agg(o.transaction_id ORDER BY o.pid, o.id),
           array_agg(o.message_key ORDER BY o.pid, o.id), array_agg(o.message_headers ORDER BY o.pid, o.id),
           array_agg(o.flags ORDER BY o.pid, o.id), array_agg(o.payload ORDER BY o.pid, o.id),
           array_agg(o.h ORDER BY o.pid, o.id)
    INTO v_pids, v_names, v_mids, v_txns, v_keys, v_hdrs, v_fls, v_pls, v_hs
    FROM one o;
    FOR i IN 1 .. coalesce(cardinality(v_pids), 0) LOOP
        -- The allocator without a dedup probe (window 0): the copy repeats
        -- its original's transaction id on purpose.
        PERFORM {{schema}}.push_one(v_pids[i], 1,
            CASE WHEN octet_length(v_hs[i]) = 16 THEN v_hs[i] ELSE '\x00000000000000000000000000000000'::bytea END,
            -1, {{schema}}.raw_segment(v_mids[i], v_fls[i], v_txns[i], v_pls[i], v_keys[i], v_hdrs[i]), 0, v_now, 0);
        IF i = cardinality(v_pids) OR v_pids[i + 1] <> v_pids[i] THEN
            part_name := v_names[i];
            requeued := v_cnt + 1;
            RETURN NEXT;
            v_cnt := 0;
        ELSE
            v_cnt := v_cnt + 1;
        END IF;
    END LOOP;
END
$$;
