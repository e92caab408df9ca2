-- The consume path's steps on the routed layout (settings.routed: Citus,
-- partitions distributed by id; see DESIGN.md "On Citus").
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.
--
-- Each function here does what its namesake without _routed does, in the
-- shapes Citus plans: one partition per statement, by id (routed to its
-- shard); a statement over every shard of a queue EXECUTEd with literals
-- (Citus plans none with a PL/pgSQL parameter in it); no SQL function with
-- parameters over a distributed table; no row lock over several shards.
-- The set-based namesakes stay PostgreSQL's: per-partition statements cost
-- a pop one statement per partition of its window.

-- seed_offset as PL/pgSQL: Citus runs no SQL function with parameters
-- that reads a distributed table.
CREATE OR REPLACE FUNCTION {{schema}}.seed_offset_routed(p_pid bigint, p_log_start bigint, p_created timestamptz,
                                                       p_mode text, p_since timestamptz, p_from timestamptz)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_end bigint;
BEGIN
    IF p_mode = 'all' OR p_created >= p_since THEN
        RETURN p_log_start - 1;
    END IF;
    SELECT s.end_offset INTO v_end FROM {{schema}}.segments s
    WHERE s.partition_id = p_pid
      AND s.created_at < CASE WHEN p_mode = 'new' THEN p_since ELSE least(p_from, p_since) END
    ORDER BY s.base_offset DESC LIMIT 1;
    RETURN greatest(p_log_start - 1, coalesce(v_end, p_log_start - 1));
END
$$;

-- seed_chunk's step: the next 1024 partitions of the queue by name, each
-- with whether the group has a cursor there and where one would start
-- (seed_offset spelled out: the newest segment before the cut, found by
-- max() and joined by its key), in one statement over every shard (the
-- tables are co-located: each shard answers for its partitions); those the
-- group is behind on are locked one statement each in ascending id, each
-- given a backlog row unless pending by then. One read, not a few
-- statements per partition: a first contact over a thousand partitions
-- cost a thousand round trips to the workers and outlived the statement
-- timeout, rolled back and redone by every pop. Done when the read
-- reached the queue's last name: a first contact over fewer than 1024
-- partitions is one step, so the pops after it write no reference row (a
-- two-phase commit each).
CREATE OR REPLACE FUNCTION {{schema}}.seed_chunk_routed(p_qid bigint, p_group text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v       record;
    r       record;
    v_last  text;
    v_n     integer := 0;
    v_ids   bigint[] := '{}';
    v_id    bigint;
    v_cut   timestamptz;
    v_seed  bigint;
    v_todo  bigint[] := '{}';
BEGIN
    SELECT s.mode, s.from_time, s.created_at, s.seed_after INTO v
    FROM {{schema}}.subscriptions s WHERE s.queue_id = p_qid AND s.group_name = p_group;
    IF NOT FOUND OR v.seed_after IS NULL THEN
        RETURN;
    END IF;
    -- seed_offset_routed's cut; 'all' finds no segment before it (a
    -- constant false condition instead would let the planner drop the
    -- join on partition_id, which Citus then refuses).
    v_cut := CASE WHEN v.mode = 'all' THEN '-infinity'
                  WHEN v.mode = 'new' THEN v.created_at ELSE least(v.from_time, v.created_at) END;
    -- The names first (Citus pushes no join down under an ORDER BY ...
    -- LIMIT on another column), then their rows and cursors by id.
    EXECUTE format('SELECT coalesce(array_agg(x.id), ''{}''), count(*), max(x.name)
                    FROM (SELECT p.id, p.name FROM {{schema}}.partitions p
                          WHERE p.queue_id = %s AND p.name >= %L ORDER BY p.name LIMIT 1025) x',
                   p_qid, v.seed_after) INTO v_ids, v_n, v_last;
    FOR r IN EXECUTE format('SELECT p.id, p.pending, p.last_offset, p.log_start, p.created_at,
                                    c.partition_id IS NOT NULL AS has_cursor, ss.end_offset AS seed_end
                             FROM {{schema}}.partitions p
                             LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = %L
                             LEFT JOIN LATERAL (SELECT max(z.base_offset) AS b FROM {{schema}}.segments z
                                                WHERE z.partition_id = p.id AND z.created_at < %L::timestamptz) sb ON true
                             LEFT JOIN {{schema}}.segments ss ON ss.partition_id = p.id AND ss.base_offset = sb.b
                             WHERE p.id = ANY (%L::bigint[])',
                            p_group, v_cut, v_ids) LOOP
        CONTINUE WHEN r.pending OR r.last_offset < r.log_start OR r.has_cursor;
        -- seed_offset_routed's answer.
        v_seed := CASE WHEN v.mode = 'all' OR r.created_at >= v.created_at THEN r.log_start - 1
                       ELSE greatest(r.log_start - 1, coalesce(r.seed_end, r.log_start - 1)) END;
        IF v_seed < r.last_offset THEN
            v_todo := v_todo || r.id;
        END IF;
    END LOOP;
    v_ids := v_todo;
    v_ids := ARRAY(SELECT u.id FROM unnest(v_ids) AS u(id) ORDER BY u.id);
    -- Each row locked, then one statement for the backlog rows (it runs on
    -- each shard with its partitions): a push that set pending meanwhile
    -- has committed (the row is held), and the ready set has it.
    FOREACH v_id IN ARRAY v_ids LOOP
        PERFORM 1 FROM {{schema}}.partitions p WHERE p.id = v_id FOR NO KEY UPDATE;
    END LOOP;
    IF cardinality(v_ids) > 0 THEN
        EXECUTE format('INSERT INTO {{schema}}.backlog (queue_id, group_name, partition_id)
                        SELECT %s, %L, p.id FROM {{schema}}.partitions p
                        WHERE p.id = ANY (%L::bigint[]) AND NOT p.pending
                        ON CONFLICT DO NOTHING', p_qid, p_group, v_ids);
    END IF;
    UPDATE {{schema}}.subscriptions SET seed_after = CASE WHEN v_n < 1025 THEN NULL ELSE v_last END
    WHERE queue_id = p_qid AND group_name = p_group;
END
$$;

-- seed_consumers' cursor rows for the partitions p_pids lacking one: each
-- partition row taken KEY SHARE SKIP LOCKED, one statement each in
-- ascending id, then its cursor inserted.
CREATE OR REPLACE FUNCTION {{schema}}.seed_consumers_routed(p_qid bigint, p_group text, p_pids bigint[])
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v     record;
    v_p   record;
    v_id  bigint;
    v_off bigint;
BEGIN
    SELECT s.mode, s.from_time, s.created_at INTO v
    FROM {{schema}}.subscriptions s WHERE s.queue_id = p_qid AND s.group_name = p_group;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    FOREACH v_id IN ARRAY ARRAY(SELECT DISTINCT u.id FROM unnest(p_pids) AS u(id) ORDER BY u.id) LOOP
        PERFORM 1 FROM {{schema}}.consumers c WHERE c.partition_id = v_id AND c.group_name = p_group;
        CONTINUE WHEN FOUND;
        SELECT p.log_start, p.created_at INTO v_p FROM {{schema}}.partitions p
        WHERE p.id = v_id AND p.queue_id = p_qid
        FOR KEY SHARE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        v_off := {{schema}}.seed_offset_routed(v_id, v_p.log_start, v_p.created_at, v.mode, v.created_at, v.from_time);
        INSERT INTO {{schema}}.consumers (partition_id, group_name, committed) VALUES (v_id, p_group, v_off)
        ON CONFLICT DO NOTHING;
    END LOOP;
    RETURN true;
END
$$;

-- Up to p_win ids of the set p_from_where ("FROM ... WHERE ...", with
-- literals, its rows aliased x with an id column) from a random point,
-- wrapping around, in that order; is_full: the set had p_win or more. One
-- statement over every shard, each shard returning its first p_win in
-- that order. The point is drawn over the whole id range, not the set's:
-- partition ids are hashes, uniform over it (see partition_key).
-- One connection per worker: a read over several opens more under load,
-- and the claim's writes then go to the connection that read each shard,
-- so two connections to one worker commit with a two-phase commit.
CREATE OR REPLACE FUNCTION {{schema}}.window_routed(p_from_where text, p_win integer,
                                                  OUT ids bigint[], OUT is_full boolean)
LANGUAGE plpgsql
SET citus.max_adaptive_executor_pool_size = 1
AS $$
DECLARE
    v_from bigint := floor(random() * 9223372036854775807::float8)::bigint;
BEGIN
    EXECUTE format('SELECT ARRAY(SELECT x.id %s ORDER BY x.id < %s, x.id LIMIT %s)', p_from_where, v_from, p_win)
    INTO ids;
    is_full := cardinality(ids) >= p_win;
END
$$;

-- What group p_group of queue p_qid can claim at p_now, up to p_win ids
-- from a random point: the ready set's and the group's backlog's
-- partitions that hold messages past the group's cursor (or that it has no
-- cursor on yet), with no live lease, no retry or parking still to wait.
-- Each a join of co-located tables, run by every shard for its own
-- partitions. A pop reads it only when its windows came back with nothing
-- to claim and did not cover the ready set (see pop_v2): partitions every
-- group has read leave the set a few a pop on this layout, so windows of
-- the set alone can miss the few a group still lags on, pop after pop.
CREATE OR REPLACE FUNCTION {{schema}}.lag_window_routed(p_qid bigint, p_group text, p_win integer,
                                                      p_now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_due  text := format('x.last_offset >= x.log_start
        AND (c.partition_id IS NULL
             OR (x.last_offset > c.committed
                 AND (c.batch_end IS NULL OR c.lease_expires_at <= %1$L)
                 AND (c.retry_at IS NULL OR c.retry_at <= %1$L)
                 AND (c.idle_until IS NULL OR c.idle_until <= %1$L
                      OR x.last_offset > coalesce(c.idle_seen, x.last_offset))))', p_now);
    v_w    record;
    v_ids  bigint[];
BEGIN
    v_w := {{schema}}.window_routed(format('FROM {{schema}}.partitions x
        LEFT JOIN {{schema}}.consumers c ON c.partition_id = x.id AND c.group_name = %L
        WHERE x.queue_id = %s AND x.pending AND %s', p_group, p_qid, v_due), p_win);
    v_ids := v_w.ids;
    v_w := {{schema}}.window_routed(format('FROM {{schema}}.backlog b
        JOIN {{schema}}.partitions x ON x.id = b.partition_id
        LEFT JOIN {{schema}}.consumers c ON c.partition_id = b.partition_id AND c.group_name = %1$L
        WHERE b.queue_id = %2$s AND b.group_name = %1$L AND NOT x.pending AND %3$s', p_group, p_qid, v_due), p_win);
    RETURN v_ids || v_w.ids;
END
$$;

-- The ids of p_ids on worker group p_grp (NULL: the first id's), in
-- p_ids' order, and the others: a claim takes one worker's partitions, so
-- it commits there with no two-phase commit. The groups are the
-- coordinator's metadata, current after a rebalance. Without Citus (the
-- routed forms tested on PostgreSQL) every id is in one group, 0.
CREATE OR REPLACE FUNCTION {{schema}}.worker_split(p_ids bigint[], p_grp integer, OUT grp integer,
                                                 OUT mine bigint[], OUT rest bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_g integer[];
BEGIN
    IF to_regclass('pg_catalog.pg_dist_placement') IS NULL THEN
        grp := 0;
        mine := p_ids;
        rest := '{}';
        RETURN;
    END IF;
    v_g := ARRAY(SELECT (SELECT min(pl.groupid) FROM pg_catalog.pg_dist_placement pl
                         WHERE pl.shardid = get_shard_id_for_distribution_column('{{schema}}.partitions', u.id))
                 FROM unnest(p_ids) WITH ORDINALITY AS u(id, ord) ORDER BY u.ord);
    grp := coalesce(p_grp, v_g[1]);
    mine := ARRAY(SELECT u.id FROM unnest(p_ids, v_g) WITH ORDINALITY AS u(id, g, ord)
                  WHERE u.g IS NOT DISTINCT FROM grp ORDER BY u.ord);
    rest := ARRAY(SELECT u.id FROM unnest(p_ids, v_g) WITH ORDINALITY AS u(id, g, ord)
                  WHERE u.g IS DISTINCT FROM grp ORDER BY u.ord);
END
$$;

-- pop_window's ids: hints by derived id (partition_of), then the ready set
-- and the group's backlog, each read over every shard with literals.
CREATE OR REPLACE FUNCTION {{schema}}.pop_window_routed(p_qid bigint, p_group text, p_hints text[], p_pass integer,
                                                      p_win integer, p_seen bigint[], OUT ids bigint[],
                                                      OUT is_full boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_id   bigint;
    v_h    text;
    v_pend boolean;
    v_w    record;
BEGIN
    is_full := false;
    ids := '{}';
    IF p_pass = 1 AND p_hints IS NOT NULL THEN
        FOREACH v_h IN ARRAY p_hints LOOP
            v_id := {{schema}}.partition_of(p_qid, v_h);
            CONTINUE WHEN v_id IS NULL OR v_id = ANY (ids);
            SELECT p.pending INTO v_pend FROM {{schema}}.partitions p WHERE p.id = v_id;
            IF NOT coalesce(v_pend, false) THEN
                PERFORM 1 FROM {{schema}}.backlog b
                WHERE b.partition_id = v_id AND b.queue_id = p_qid AND b.group_name = p_group;
                v_pend := FOUND;
            END IF;
            IF v_pend THEN
                ids := ids || v_id;
            END IF;
        END LOOP;
    END IF;
    v_w := {{schema}}.window_routed(format('FROM {{schema}}.partitions x WHERE x.queue_id = %s AND x.pending', p_qid),
                                    p_win);
    ids := ids || v_w.ids;
    is_full := v_w.is_full;
    v_w := {{schema}}.window_routed(format('FROM (SELECT b.partition_id AS id FROM {{schema}}.backlog b
                                            WHERE b.queue_id = %s AND b.group_name = %L) x WHERE true',
                                           p_qid, p_group), p_win);
    ids := ids || v_w.ids;
    is_full := is_full OR v_w.is_full;
    IF p_pass = 2 THEN
        ids := ARRAY(SELECT u.id FROM unnest(ids) AS u(id) WHERE NOT (u.id = ANY (p_seen)));
    END IF;
END
$$;

-- pop_ready: the window's rows with the group's cursors in one read, then,
-- for a windowed or delayed queue, each claimable one's segment times; the
-- order and the flags as pop_ready's.
CREATE OR REPLACE FUNCTION {{schema}}.pop_ready_routed(p_qid bigint, p_window_ms bigint, p_delay_ms bigint,
                                                     p_group text, p_mode text, p_from timestamptz, p_ids bigint[],
                                                     p_hints text[], p_now timestamptz, p_cutoff timestamptz,
                                                     p_keyed boolean, OUT cand bigint[], OUT caught bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_seed    integer;
    v_missing bigint[];
    v_id      bigint;
    v_p       record;
    v_c       record;
    v_ok      boolean;
    v_at      timestamptz;
    v_pids    bigint[];
    v_hinted  boolean[];
    v_upd     timestamptz[];
BEGIN
    caught := '{}';
    cand := '{}';
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN;
    END IF;
    FOR v_seed IN 1 .. 2 LOOP
        v_missing := '{}';
        v_pids := '{}';
        v_hinted := '{}';
        v_upd := '{}';
        caught := '{}';
        -- The window's rows and the group's cursors in one read (each shard
        -- answers for its partitions), not two statements per partition:
        -- a window of 256 cost 512 round trips to the workers.
        FOR v_p IN EXECUTE format('SELECT p.id, p.name, p.last_offset, p.log_start, p.last_write_at,
                                          c.partition_id IS NOT NULL AS has_cursor, c.committed, c.batch_end,
                                          c.lease_expires_at, c.updated_at, c.retry_at, c.idle_until, c.idle_seen,
                                          c.wait_offs, c.wait_at, c.settled
                                   FROM {{schema}}.partitions p
                                   LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = %L
                                   WHERE p.id = ANY (%L::bigint[])',
                                  p_group, ARRAY(SELECT DISTINCT u.id FROM unnest(p_ids) AS u(id))) LOOP
            v_id := v_p.id;
            v_c := v_p;
            IF NOT v_p.has_cursor THEN
                v_missing := v_missing || v_id;
                CONTINUE;
            END IF;
            IF (v_p.last_offset < v_p.log_start OR v_c.committed >= v_p.last_offset)
               AND v_p.last_write_at < p_now - interval '2 seconds' THEN
                caught := caught || v_id;
            END IF;
            v_ok := v_p.last_offset >= greatest(v_c.committed + 1, v_p.log_start)
                AND (v_c.batch_end IS NULL OR v_c.lease_expires_at <= p_now)
                AND (v_c.retry_at IS NULL OR v_c.retry_at <= p_now)
                AND (v_c.idle_until IS NULL OR v_c.idle_until <= p_now
                     OR v_p.last_offset > coalesce(v_c.idle_seen, v_p.last_offset))
                AND (p_keyed OR v_c.wait_offs IS NULL
                     OR NOT {{schema}}.head_waits(v_c.wait_offs, v_c.wait_at, v_c.committed, v_c.settled, p_now));
            IF v_ok AND p_window_ms > 0 THEN
                SELECT s.created_at INTO v_at FROM {{schema}}.segments s WHERE s.partition_id = v_id
                ORDER BY s.base_offset DESC LIMIT 1;
                v_ok := coalesce(v_at, '-infinity') <= p_now - p_window_ms * interval '1 millisecond';
            END IF;
            IF v_ok AND p_delay_ms > 0 THEN
                SELECT s.created_at INTO v_at FROM {{schema}}.segments s WHERE s.partition_id = v_id
                  AND s.base_offset <= greatest(v_c.committed + 1, v_p.log_start)
                ORDER BY s.base_offset DESC LIMIT 1;
                v_ok := coalesce(v_at, '-infinity') <= p_cutoff;
            END IF;
            IF v_ok THEN
                v_pids := v_pids || v_id;
                v_hinted := v_hinted || coalesce(v_p.name = ANY (p_hints), false);
                v_upd := v_upd || v_c.updated_at;
            END IF;
        END LOOP;
        EXIT WHEN cardinality(v_missing) = 0 OR v_seed = 2;
        PERFORM {{schema}}.seed_consumers_routed(p_qid, p_group, v_missing);
    END LOOP;
    cand := ARRAY(SELECT u.pid FROM unnest(v_pids, v_hinted, v_upd) AS u(pid, hinted, upd)
                  ORDER BY u.hinted DESC, u.upd, u.pid);
END
$$;

-- lease_yields, each read of the queue's partitions with literals.
CREATE OR REPLACE FUNCTION {{schema}}.lease_yields_routed(p_qid bigint, p_group text, p_pid bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v boolean;
BEGIN
    PERFORM 1 FROM {{schema}}.paused_groups g WHERE g.queue_id = p_qid AND g.group_name = p_group;
    IF FOUND THEN
        RETURN true;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM {{schema}}.partitions p
                                   WHERE p.queue_id = %s AND p.pending AND p.id <> %s)
                        OR EXISTS (SELECT 1 FROM {{schema}}.backlog b
                                   WHERE b.queue_id = %s AND b.group_name = %L AND b.partition_id <> %s)',
                   p_qid, p_pid, p_qid, p_group, p_pid)
    INTO v;
    RETURN v;
END
$$;

-- clear_pending_many's form on the routed layout, one partition a call
-- (each statement a router query to one worker: a lock of many
-- partitions in one statement is not one there). The same rule: if
-- partition p_pid is pending, the groups behind on it get backlog rows
-- (mark_behind_routed) and the flag is cleared; then p_group's own backlog
-- row goes if p_group has consumed everything retained. Never waits (see
-- clear_pending_many). Whether it changed anything.
CREATE OR REPLACE FUNCTION {{schema}}.clear_pending_routed(p_pid bigint, p_group text)
RETURNS boolean
LANGUAGE plpgsql
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
        PERFORM {{schema}}.mark_behind_routed(p_pid, v_qid);
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


-- clear_pending's marking of a pending partition p_pid of queue p_qid
-- (whose row the caller holds, and the queue's contact lock): a backlog
-- row for every subscribed group behind on it, one statement each.
CREATE OR REPLACE FUNCTION {{schema}}.mark_behind_routed(p_pid bigint, p_qid bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_p    record;
    v_s    record;
    v_comm bigint;
BEGIN
    SELECT p.last_offset, p.log_start, p.created_at INTO v_p FROM {{schema}}.partitions p WHERE p.id = p_pid;
    IF NOT FOUND OR v_p.last_offset < v_p.log_start THEN
        RETURN;
    END IF;
    FOR v_s IN SELECT s.group_name, s.mode, s.created_at, s.from_time FROM {{schema}}.subscriptions s
               WHERE s.queue_id = p_qid ORDER BY s.group_name LOOP
        SELECT c.committed INTO v_comm FROM {{schema}}.consumers c
        WHERE c.partition_id = p_pid AND c.group_name = v_s.group_name;
        IF NOT FOUND THEN
            v_comm := {{schema}}.seed_offset_routed(p_pid, v_p.log_start, v_p.created_at, v_s.mode, v_s.created_at,
                                                   v_s.from_time);
        END IF;
        IF v_comm < v_p.last_offset THEN
            INSERT INTO {{schema}}.backlog (queue_id, group_name, partition_id) VALUES (p_qid, v_s.group_name, p_pid)
            ON CONFLICT DO NOTHING;
        END IF;
    END LOOP;
END
$$;

-- lock_skip_failures, one row per statement: each row's queue read by its
-- partition's id, the queue rows of skip-policy failures with a wait
-- (route 2) and of dead letters (action 3) taken KEY SHARE one statement
-- each in ascending id, then the partitions of route 1, likewise. Unlike
-- lock_skip_failures, a failure that may spend its budget (action 1) does
-- not take its queue row ahead: on Citus that lock is taken on every node,
-- a two-phase commit for every Fail. Such a failure's dead letter takes the
-- row by its foreign key after the cursor row; a Queue.Delete in between
-- then ends in a deadlock, which PostgreSQL (or Citus's detector across
-- nodes) breaks by failing one of the two.
CREATE OR REPLACE FUNCTION {{schema}}.lock_skip_failures_routed(p_pids bigint[], p_act smallint[], p_wait boolean,
                                                               p_retry_ms bigint[])
RETURNS smallint[]
LANGUAGE plpgsql AS $$
DECLARE
    n       integer := coalesce(cardinality(p_pids), 0);
    v_route smallint[] := '{}';
    v_qid   bigint[] := '{}';
    v_q     record;
    v_id    bigint;
    v_lockq bigint[] := '{}';
    v_lockp bigint[] := '{}';
    v_gotq  bigint[] := '{}';
    v_gotp  bigint[] := '{}';
    i       integer;
BEGIN
    FOR i IN 1 .. n LOOP
        v_qid[i] := NULL;
        v_route[i] := 0;
        SELECT p.queue_id INTO v_id FROM {{schema}}.partitions p WHERE p.id = p_pids[i];
        CONTINUE WHEN NOT FOUND;
        v_qid[i] := v_id;
        IF p_act[i] = 1 THEN
            SELECT qq.failure_policy, qq.retry_backoff_min_ms, qq.retry_backoff_max_ms INTO v_q
            FROM {{schema}}.queues qq WHERE qq.id = v_id;
            IF FOUND AND v_q.failure_policy = 'skip' THEN
                v_route[i] := CASE WHEN {{schema}}.failure_wait_ms(p_retry_ms[i], 1, v_q.retry_backoff_min_ms,
                                                                   v_q.retry_backoff_max_ms, 0) > 0
                                   THEN 2 ELSE 1 END;
            END IF;
        END IF;
        IF v_route[i] = 2 OR p_act[i] = 3 THEN
            v_lockq := v_lockq || v_id;
        ELSIF v_route[i] = 1 THEN
            v_lockp := v_lockp || p_pids[i];
        END IF;
    END LOOP;
    IF cardinality(v_lockq) = 0 AND cardinality(v_lockp) = 0 THEN
        RETURN v_route;
    END IF;
    FOREACH v_id IN ARRAY ARRAY(SELECT DISTINCT u.id FROM unnest(v_lockq) AS u(id) ORDER BY u.id) LOOP
        IF p_wait THEN
            PERFORM 1 FROM {{schema}}.queues q WHERE q.id = v_id FOR KEY SHARE;
        ELSE
            PERFORM 1 FROM {{schema}}.queues q WHERE q.id = v_id FOR KEY SHARE SKIP LOCKED;
        END IF;
        IF FOUND THEN
            v_gotq := v_gotq || v_id;
        END IF;
    END LOOP;
    FOREACH v_id IN ARRAY ARRAY(SELECT DISTINCT u.id FROM unnest(v_lockp) AS u(id) ORDER BY u.id) LOOP
        IF p_wait THEN
            PERFORM 1 FROM {{schema}}.partitions p WHERE p.id = v_id FOR NO KEY UPDATE;
        ELSE
            PERFORM 1 FROM {{schema}}.partitions p WHERE p.id = v_id FOR NO KEY UPDATE SKIP LOCKED;
        END IF;
        IF FOUND THEN
            v_gotp := v_gotp || v_id;
        END IF;
    END LOOP;
    FOR i IN 1 .. n LOOP
        v_route[i] := CASE WHEN v_route[i] = 1 AND p_pids[i] = ANY (v_gotp) THEN 1
                           WHEN v_route[i] = 2 AND v_qid[i] = ANY (v_gotq) THEN 2
                           ELSE 0 END;
    END LOOP;
    RETURN v_route;
END
$$;

-- ack_many, one cursor per statement in ascending (partition id, group),
-- the lock order: as one UPDATE ... FROM unnest it runs on every shard,
-- and commits with a two-phase commit over every worker.
CREATE OR REPLACE FUNCTION {{schema}}.ack_many_routed(
    p_pids   bigint[],
    p_groups text[],
    p_leases uuid[],
    p_ok     bigint[]
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := clock_timestamp();
    x      record;
    v_c    record;
    v_comm bigint;
    v_res  {{schema}}.settle_result[];
BEGIN
    FOR x IN SELECT u.pid, u.g, u.lease, u.ok, u.ord::integer AS ord
             FROM unnest(p_pids, p_groups, p_leases, p_ok) WITH ORDINALITY AS u(pid, g, lease, ok, ord)
             ORDER BY u.pid, u.g LOOP
        SELECT c.committed, c.batch_end, c.lease_id, c.lease_expires_at, c.settled, c.fail_offs, c.fail_counts,
               c.delivered_max
        INTO v_c
        FROM {{schema}}.consumers c WHERE c.partition_id = x.pid AND c.group_name = x.g
        FOR UPDATE;
        IF NOT FOUND THEN
            v_res[x.ord] := ROW(x.ord, 5, NULL);
            CONTINUE;
        ELSIF x.ok <= v_c.committed THEN
            v_res[x.ord] := ROW(x.ord, 1, v_c.committed);
            CONTINUE;
        ELSIF x.ok > v_c.batch_end OR v_c.lease_id IS DISTINCT FROM x.lease OR v_c.lease_expires_at <= v_now THEN
            v_res[x.ord] := ROW(x.ord, 2, v_c.committed);
            CONTINUE;
        END IF;
        v_comm := CASE WHEN v_c.settled IS NULL THEN x.ok ELSE {{schema}}.settled_advance(x.ok, v_c.settled) END;
        UPDATE {{schema}}.consumers c SET
            committed        = v_comm,
            attempts         = CASE WHEN v_c.settled IS NULL AND v_c.fail_offs IS NULL THEN 0
                                    ELSE {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1) END,
            settled          = CASE WHEN v_c.settled IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(v_c.settled, v_comm) END,
            fail_offs        = CASE WHEN v_c.fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(v_c.fail_offs, v_comm + 1) END,
            fail_counts      = CASE WHEN v_c.fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.fail_counts_above(v_c.fail_offs, v_c.fail_counts, v_comm + 1) END,
            deliveries       = CASE WHEN v_comm < v_c.delivered_max THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN v_comm >= v_c.batch_end THEN NULL ELSE c.batch_end END,
            lease_id         = CASE WHEN v_comm >= v_c.batch_end THEN NULL ELSE c.lease_id END,
            lease_owner      = CASE WHEN v_comm >= v_c.batch_end THEN NULL ELSE c.lease_owner END,
            lease_expires_at = CASE WHEN v_comm >= v_c.batch_end THEN NULL ELSE c.lease_expires_at END,
            updated_at       = v_now
        WHERE c.partition_id = x.pid AND c.group_name = x.g;
        v_res[x.ord] := ROW(x.ord, 0, x.ok);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_res) ORDER BY 1;
END
$$;
