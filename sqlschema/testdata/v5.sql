-- The upgrade fixture: a schema migrated to version 5 and filled by that
-- release (see TestWriteV5Fixture). Never regenerate it; {{schema_name}} is the schema.
--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: {{schema_name}}; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA {{schema_name}};


--
-- Name: pop_row; Type: TYPE; Schema: {{schema_name}}; Owner: -
--

CREATE TYPE {{schema_name}}.pop_row AS (
	partition_id bigint,
	partition_name text,
	lease_id uuid,
	lease_expires_at timestamp with time zone,
	lease_ms bigint,
	first_offset bigint,
	last_offset bigint,
	deliveries integer,
	delivered_max bigint,
	base_offset bigint,
	end_offset bigint,
	created_at timestamp with time zone,
	blob bytea,
	failures integer,
	settled bigint[],
	fail_offs bigint[],
	fail_counts integer[]
);


--
-- Name: push_result; Type: TYPE; Schema: {{schema_name}}; Owner: -
--

CREATE TYPE {{schema_name}}.push_result AS (
	ord integer,
	status smallint,
	partition_id bigint,
	base_offset bigint,
	created_at timestamp with time zone,
	dup_idx integer[],
	dup_off bigint[]
);


--
-- Name: settle_result; Type: TYPE; Schema: {{schema_name}}; Owner: -
--

CREATE TYPE {{schema_name}}.settle_result AS (
	ord integer,
	status smallint,
	committed bigint
);


--
-- Name: ack_many(bigint[], text[], uuid[], bigint[]); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.ack_many(p_pids bigint[], p_groups text[], p_leases uuid[], p_ok bigint[]) RETURNS SETOF {{schema_name}}.settle_result
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
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
        UPDATE "{{schema_name}}".consumers c SET
            committed        = CASE WHEN c.settled IS NULL THEN o.ok
                                    ELSE "{{schema_name}}".settled_advance(o.ok, c.settled) END,
            attempts         = CASE WHEN c.settled IS NULL AND c.fail_offs IS NULL THEN 0
                                    ELSE "{{schema_name}}".fail_at(c.fail_offs, c.fail_counts,
                                                            "{{schema_name}}".settled_advance(o.ok, c.settled) + 1) END,
            settled          = CASE WHEN c.settled IS NULL THEN NULL
                                    ELSE "{{schema_name}}".offsets_above(c.settled, "{{schema_name}}".settled_advance(o.ok, c.settled)) END,
            fail_offs        = CASE WHEN c.fail_offs IS NULL THEN NULL
                                    ELSE "{{schema_name}}".offsets_above(c.fail_offs, "{{schema_name}}".settled_advance(o.ok, c.settled) + 1) END,
            fail_counts      = CASE WHEN c.fail_offs IS NULL THEN NULL
                                    ELSE "{{schema_name}}".fail_counts_above(c.fail_offs, c.fail_counts,
                                                                      "{{schema_name}}".settled_advance(o.ok, c.settled) + 1) END,
            deliveries       = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE "{{schema_name}}".settled_advance(o.ok, c.settled) END) < c.delivered_max
                                    THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE "{{schema_name}}".settled_advance(o.ok, c.settled) END) >= c.batch_end
                                    THEN NULL ELSE c.batch_end END,
            lease_id         = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE "{{schema_name}}".settled_advance(o.ok, c.settled) END) >= c.batch_end
                                    THEN NULL ELSE c.lease_id END,
            lease_owner      = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE "{{schema_name}}".settled_advance(o.ok, c.settled) END) >= c.batch_end
                                    THEN NULL ELSE c.lease_owner END,
            lease_expires_at = CASE WHEN (CASE WHEN c.settled IS NULL THEN o.ok
                                               ELSE "{{schema_name}}".settled_advance(o.ok, c.settled) END) >= c.batch_end
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
    LEFT JOIN LATERAL (SELECT c.partition_id, c.committed FROM "{{schema_name}}".consumers c
                       WHERE c.partition_id = o.pid AND c.group_name = o.g LIMIT 1) c ON true
    ORDER BY o.ord;
END
$$;


--
-- Name: clear_pending(bigint, text); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.clear_pending(p_pid bigint, p_group text) RETURNS boolean
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
DECLARE
    v_qid     bigint;
    v_pending boolean;
    v_done    boolean := false;
BEGIN
    SELECT queue_id, pending INTO v_qid, v_pending FROM "{{schema_name}}".partitions
    WHERE id = p_pid FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_pending THEN
        IF NOT pg_try_advisory_xact_lock_shared(hashtextextended('queen/{{schema_name}}/contact/' || v_qid, 0)) THEN
            RETURN false;
        END IF;
        INSERT INTO "{{schema_name}}".backlog (queue_id, group_name, partition_id)
        SELECT s.queue_id, s.group_name, p.id
        FROM "{{schema_name}}".partitions p
        JOIN "{{schema_name}}".subscriptions s ON s.queue_id = p.queue_id
        LEFT JOIN LATERAL (SELECT c.committed FROM "{{schema_name}}".consumers c
                           WHERE c.partition_id = p.id AND c.group_name = s.group_name LIMIT 1) c ON true
        WHERE p.id = p_pid AND p.last_offset >= p.log_start
          AND coalesce(c.committed, "{{schema_name}}".seed_offset(p.id, p.log_start, p.created_at, s.mode, s.created_at,
                                                           s.from_time)) < p.last_offset
        ORDER BY s.group_name
        ON CONFLICT DO NOTHING;
        UPDATE "{{schema_name}}".partitions SET pending = false WHERE id = p_pid;
        v_done := true;
    END IF;
    DELETE FROM "{{schema_name}}".backlog b
    USING "{{schema_name}}".partitions p
    WHERE b.queue_id = v_qid AND b.group_name = p_group AND b.partition_id = p_pid AND p.id = p_pid
      AND (p.last_offset < p.log_start
           OR EXISTS (SELECT 1 FROM "{{schema_name}}".consumers c
                      WHERE c.partition_id = p_pid AND c.group_name = p_group AND c.committed >= p.last_offset
                      OFFSET 0));
    RETURN v_done OR FOUND;
END
$$;


--
-- Name: dedup_probe(bigint, integer, bytea, bigint, bigint, bigint, bigint, timestamp with time zone); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.dedup_probe(p_pid bigint, p_count integer, p_hashes bytea, p_verified bigint, p_last bigint, p_txns_from bigint, p_window_ms bigint, p_now timestamp with time zone, OUT dup_idx integer[], OUT dup_off bigint[]) RETURNS record
    LANGUAGE plpgsql
    SET enable_seqscan TO 'on'
    SET enable_hashjoin TO 'on'
    SET enable_mergejoin TO 'on'
    AS $$
BEGIN
    WITH inc AS (
        SELECT k, substring(p_hashes FROM k * 16 + 1 FOR 16) AS h
        FROM generate_series(0, p_count - 1) AS k
    ), st AS (
        SELECT t.base_offset + j AS off, substring(t.hashes FROM j * 16 + 1 FOR 16) AS h
        FROM "{{schema_name}}".txns t
        CROSS JOIN LATERAL generate_series(0, (t.end_offset - t.base_offset)::integer) AS j
        WHERE t.partition_id = p_pid
          AND t.end_offset > GREATEST(p_verified, p_txns_from - 1)
          AND t.base_offset <= p_last
          AND t.created_at > p_now - p_window_ms * interval '1 millisecond'
    ), d AS (
        SELECT inc.k, min(st.off) AS off FROM inc JOIN st USING (h) GROUP BY inc.k
    )
    SELECT array_agg(d.k ORDER BY d.k), array_agg(d.off ORDER BY d.k)
    INTO dup_idx, dup_off FROM d;
END
$$;


--
-- Name: delete_queue(uuid, text); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.delete_queue(p_tenant uuid, p_name text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_qid  bigint;
    v_pids bigint[];
BEGIN
    SELECT id INTO v_qid FROM "{{schema_name}}".queues
    WHERE tenant = p_tenant AND name = p_name
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    SELECT coalesce(array_agg(l.id), '{}') INTO v_pids
    FROM (SELECT p.id FROM "{{schema_name}}".partitions p WHERE p.queue_id = v_qid
          ORDER BY p.id FOR UPDATE) l;
    DELETE FROM "{{schema_name}}".segments WHERE partition_id = ANY (v_pids);
    DELETE FROM "{{schema_name}}".txns WHERE partition_id = ANY (v_pids);
    -- Partitions, cursors, subscriptions and dead letters cascade.
    DELETE FROM "{{schema_name}}".queues WHERE id = v_qid;
    RETURN true;
END
$$;


--
-- Name: fail_at(bigint[], integer[], bigint); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.fail_at(p_offs bigint[], p_counts integer[], p_off bigint) RETURNS integer
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN p_offs IS NULL THEN 0 ELSE coalesce(p_counts[array_position(p_offs, p_off)], 0) END
$$;


--
-- Name: fail_counts_above(bigint[], integer[], bigint); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.fail_counts_above(p_offs bigint[], p_counts integer[], p_head bigint) RETURNS integer[]
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN p_offs IS NULL THEN NULL
        ELSE (SELECT array_agg(u.c ORDER BY u.o) FROM unnest(p_offs, p_counts) AS u(o, c) WHERE u.o > p_head)
    END
$$;


--
-- Name: offsets_above(bigint[], bigint); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.offsets_above(p_offs bigint[], p_min bigint) RETURNS bigint[]
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN p_offs IS NULL THEN NULL
        ELSE (SELECT array_agg(u.o ORDER BY u.o) FROM unnest(p_offs) AS u(o) WHERE u.o > p_min)
    END
$$;


--
-- Name: pause_group(uuid, text, text); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.pause_group(p_tenant uuid, p_queue text, p_group text) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_qid bigint;
BEGIN
    INSERT INTO "{{schema_name}}".queues (tenant, name) VALUES (p_tenant, p_queue) ON CONFLICT DO NOTHING;
    SELECT id INTO v_qid FROM "{{schema_name}}".queues WHERE tenant = p_tenant AND name = p_queue;
    INSERT INTO "{{schema_name}}".paused_groups (queue_id, group_name) VALUES (v_qid, p_group) ON CONFLICT DO NOTHING;
END
$$;


--
-- Name: pop(uuid, text, text, text, text[], integer, integer, bigint, boolean, text, text, timestamp with time zone, integer); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.pop(p_tenant uuid, p_queue text, p_group text, p_partition text, p_hints text[], p_batch integer, p_partitions integer, p_lease_ms bigint, p_auto_ack boolean, p_owner text, p_mode text, p_from timestamp with time zone, p_part_batch integer) RETURNS SETOF {{schema_name}}.pop_row
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
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
    FROM "{{schema_name}}".queues WHERE tenant = p_tenant AND name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_lease_ms <= 0 THEN
        p_lease_ms := v_q.lease_time_ms;
    END IF;
    v_cutoff := v_now - v_q.delayed_processing_ms * interval '1 millisecond';

    -- First contact (bounded, see seed_consumers), or one more step of its
    -- marking when no other pop of the group is taking one.
    SELECT s.seed_after INTO v_after FROM "{{schema_name}}".subscriptions s
    WHERE s.queue_id = v_q.id AND s.group_name = p_group;
    IF NOT FOUND THEN
        PERFORM "{{schema_name}}".seed_consumers(v_q.id, p_group, p_mode, p_from);
    ELSIF v_after IS NOT NULL
          AND pg_try_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/seed/' || v_q.id || '/' || p_group, 0)) THEN
        PERFORM "{{schema_name}}".seed_chunk(v_q.id, p_group);
    END IF;
    -- A paused group claims nothing (see paused_groups). After the first
    -- contact, so a group paused before it still counts from its
    -- subscription, not from its Resume.
    IF EXISTS (SELECT 1 FROM "{{schema_name}}".paused_groups g WHERE g.queue_id = v_q.id AND g.group_name = p_group) THEN
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
            FROM "{{schema_name}}".partitions p
            WHERE v_pass = 1 AND p.queue_id = v_q.id AND p.name = ANY (p_hints)
              AND (p.pending OR EXISTS (SELECT 1 FROM "{{schema_name}}".backlog b
                                        WHERE b.queue_id = v_q.id AND b.group_name = p_group AND b.partition_id = p.id
                                        OFFSET 0));
            -- queue_id as a range, ordered by (queue_id, id): only the partial
            -- index gives that order. With queue_id = a parameter the order is
            -- by id alone, and a generic plan walked the primary key filtering
            -- pending (it takes half the rows for pending), every partition of
            -- the schema when the set is small. Likewise for the backlog, whose
            -- partition_id index would otherwise give the order.
            v_lo := (SELECT p.id FROM "{{schema_name}}".partitions p
                     WHERE p.queue_id BETWEEN v_q.id AND v_q.id AND p.pending
                     ORDER BY p.queue_id, p.id LIMIT 1);
            v_hi := (SELECT p.id FROM "{{schema_name}}".partitions p
                     WHERE p.queue_id BETWEEN v_q.id AND v_q.id AND p.pending
                     ORDER BY p.queue_id DESC, p.id DESC LIMIT 1);
            IF v_lo IS NOT NULL THEN
                v_from := v_lo + floor(random() * (v_hi - v_lo + 1))::bigint;
                v_n := cardinality(v_pend);
                v_pend := v_pend || ARRAY(SELECT p.id FROM "{{schema_name}}".partitions p
                                          WHERE p.queue_id BETWEEN v_q.id AND v_q.id AND p.pending AND p.id >= v_from
                                          ORDER BY p.queue_id, p.id LIMIT v_win);
                IF cardinality(v_pend) - v_n < v_win THEN
                    v_pend := v_pend || ARRAY(SELECT p.id FROM "{{schema_name}}".partitions p
                                              WHERE p.queue_id BETWEEN v_q.id AND v_q.id AND p.pending AND p.id < v_from
                                              ORDER BY p.queue_id, p.id LIMIT v_win - (cardinality(v_pend) - v_n));
                END IF;
                v_full := v_full OR cardinality(v_pend) - v_n >= v_win;
            END IF;
            v_lo := (SELECT b.partition_id FROM "{{schema_name}}".backlog b
                     WHERE b.queue_id BETWEEN v_q.id AND v_q.id AND b.group_name BETWEEN p_group AND p_group
                     ORDER BY b.queue_id, b.group_name, b.partition_id LIMIT 1);
            v_hi := (SELECT b.partition_id FROM "{{schema_name}}".backlog b
                     WHERE b.queue_id BETWEEN v_q.id AND v_q.id AND b.group_name BETWEEN p_group AND p_group
                     ORDER BY b.queue_id DESC, b.group_name DESC, b.partition_id DESC LIMIT 1);
            IF v_lo IS NOT NULL THEN
                v_from := v_lo + floor(random() * (v_hi - v_lo + 1))::bigint;
                v_n := cardinality(v_pend);
                v_pend := v_pend || ARRAY(SELECT b.partition_id FROM "{{schema_name}}".backlog b
                                          WHERE b.queue_id BETWEEN v_q.id AND v_q.id
                                            AND b.group_name BETWEEN p_group AND p_group AND b.partition_id >= v_from
                                          ORDER BY b.queue_id, b.group_name, b.partition_id LIMIT v_win);
                IF cardinality(v_pend) - v_n < v_win THEN
                    v_pend := v_pend || ARRAY(SELECT b.partition_id FROM "{{schema_name}}".backlog b
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
            FROM "{{schema_name}}".partitions p WHERE p.queue_id = v_q.id AND p.name = p_partition;
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
                                (SELECT s.created_at FROM "{{schema_name}}".segments s WHERE s.partition_id = p.id
                                 ORDER BY s.base_offset DESC LIMIT 1), '-infinity')
                                <= v_now - v_q.window_buffer_ms * interval '1 millisecond')
                          AND (v_q.delayed_processing_ms = 0 OR coalesce(
                                (SELECT s.created_at FROM "{{schema_name}}".segments s WHERE s.partition_id = p.id
                                   AND s.base_offset <= greatest(cc.committed + 1, p.log_start)
                                 ORDER BY s.base_offset DESC LIMIT 1), '-infinity') <= v_cutoff)) AS claimable
                  FROM (SELECT DISTINCT id FROM unnest(v_pend) AS u(id)) AS r
                  JOIN "{{schema_name}}".partitions p ON p.id = r.id
                  -- A keyed lookup per partition (LIMIT keeps the planner from
                  -- flattening it): as a plain join, a generic plan cached while
                  -- the table was small read every cursor of the group instead.
                  LEFT JOIN LATERAL (SELECT c.partition_id, c.committed, c.batch_end, c.lease_expires_at, c.updated_at
                                     FROM "{{schema_name}}".consumers c
                                     WHERE c.partition_id = r.id AND c.group_name = p_group
                                     LIMIT 1) cc ON true) x;
            EXIT WHEN NOT v_missing OR v_seed = 2;
            PERFORM "{{schema_name}}".seed_consumers(v_q.id, p_group, p_mode, p_from, v_pend);
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
                FROM "{{schema_name}}".consumers cc
                JOIN "{{schema_name}}".partitions p ON p.id = cc.partition_id
                WHERE cc.partition_id = v_pid AND cc.group_name = p_group
                  AND p.last_offset >= greatest(cc.committed + 1, p.log_start)
                  AND (cc.batch_end IS NULL OR cc.lease_expires_at <= v_now)
                FOR UPDATE OF cc SKIP LOCKED;
                EXIT WHEN NOT FOUND;
                v_start := greatest(v_c.committed + 1, v_c.log_start);
                IF v_c.settled IS NOT NULL THEN
                    v_start := "{{schema_name}}".settled_advance(v_start - 1, v_c.settled) + 1;
                END IF;
                v_end := least(v_c.last_offset, v_start + least(v_left, p_part_batch) - 1);
                v_seg_lo := coalesce((SELECT max(s.base_offset) FROM "{{schema_name}}".segments s
                                      WHERE s.partition_id = v_c.partition_id AND s.base_offset <= v_start), v_start);
                IF v_q.delayed_processing_ms > 0 THEN
                    -- created_at is monotone in offset order: the visible part is a prefix.
                    SELECT max(s.end_offset) INTO v_vis FROM "{{schema_name}}".segments s
                    WHERE s.partition_id = v_c.partition_id AND s.base_offset BETWEEN v_seg_lo AND v_end
                      AND s.created_at <= v_cutoff;
                    v_end := least(v_end, coalesce(v_vis, v_start - 1));
                END IF;
                IF v_end < v_start AND v_start - 1 > v_c.committed AND v_c.settled IS NOT NULL THEN
                    -- Only settled offsets are left past a retention cut:
                    -- the cursor passes them, so the partition is not
                    -- claimable for nothing again.
                    UPDATE "{{schema_name}}".consumers SET committed = v_start - 1,
                        settled = "{{schema_name}}".offsets_above(settled, v_start - 1),
                        attempts = "{{schema_name}}".fail_at(fail_offs, fail_counts, v_start),
                        fail_offs = "{{schema_name}}".offsets_above(fail_offs, v_start),
                        fail_counts = "{{schema_name}}".fail_counts_above(fail_offs, fail_counts, v_start),
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
                FROM "{{schema_name}}".segments s
                WHERE s.partition_id = v_c.partition_id AND s.base_offset BETWEEN v_seg_lo AND v_end
                ORDER BY s.base_offset;
                IF FOUND THEN
                    IF p_auto_ack THEN
                        v_adv := v_end;
                        IF v_c.settled IS NOT NULL THEN
                            v_adv := "{{schema_name}}".settled_advance(v_end, v_c.settled);
                        END IF;
                        UPDATE "{{schema_name}}".consumers SET committed = v_adv,
                            batch_end = NULL, lease_id = NULL,
                            lease_owner = NULL, lease_expires_at = NULL, deliveries = 0,
                            attempts = "{{schema_name}}".fail_at(fail_offs, fail_counts, v_adv + 1),
                            settled = CASE WHEN settled IS NULL THEN NULL
                                           ELSE "{{schema_name}}".offsets_above(settled, v_adv) END,
                            fail_offs = CASE WHEN fail_offs IS NULL THEN NULL
                                             ELSE "{{schema_name}}".offsets_above(fail_offs, v_adv + 1) END,
                            fail_counts = CASE WHEN fail_offs IS NULL THEN NULL
                                               ELSE "{{schema_name}}".fail_counts_above(fail_offs, fail_counts, v_adv + 1) END,
                            delivered_max = greatest(delivered_max, v_end), updated_at = v_now
                        WHERE partition_id = v_c.partition_id AND group_name = p_group;
                    ELSE
                        UPDATE "{{schema_name}}".consumers SET committed = v_start - 1, batch_end = v_end,
                            lease_id = v_lease, lease_owner = p_owner, lease_expires_at = v_expires,
                            deliveries = v_deliv,
                            attempts = CASE WHEN committed = v_start - 1 THEN attempts
                                            ELSE "{{schema_name}}".fail_at(fail_offs, fail_counts, v_start) END,
                            settled = CASE WHEN committed = v_start - 1 THEN settled
                                           ELSE "{{schema_name}}".offsets_above(settled, v_start - 1) END,
                            fail_offs = CASE WHEN committed = v_start - 1 THEN fail_offs
                                             ELSE "{{schema_name}}".offsets_above(fail_offs, v_start) END,
                            fail_counts = CASE WHEN committed = v_start - 1 THEN fail_counts
                                               ELSE "{{schema_name}}".fail_counts_above(fail_offs, fail_counts, v_start) END,
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
        PERFORM "{{schema_name}}".clear_pending(v_pid, p_group);
    END LOOP;
    IF p_partition IS NULL THEN
        FOR v_x IN
            SELECT r.id FROM (SELECT DISTINCT id FROM unnest(v_caught) AS u(id)) AS r
            WHERE NOT (r.id = ANY (v_drained))
            LIMIT 256
        LOOP
            PERFORM "{{schema_name}}".clear_pending(v_x.id, p_group);
        END LOOP;
    END IF;
END
$$;


--
-- Name: pop_dead_letter(bigint, text, uuid, bigint, bigint[], uuid[], text[], integer[], bytea[], timestamp with time zone[], text[], text[], bytea[]); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.pop_dead_letter(p_pid bigint, p_group text, p_lease uuid, p_end bigint, p_offs bigint[], p_ids uuid[], p_txns text[], p_flags integer[], p_payloads bytea[], p_created timestamp with time zone[], p_reasons text[], p_keys text[] DEFAULT NULL::text[], p_headers bytea[] DEFAULT NULL::bytea[]) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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
    SELECT p.name, p.queue_id INTO v_p FROM "{{schema_name}}".partitions p WHERE p.id = p_pid;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_lease IS NOT NULL THEN
        SELECT c.committed, c.batch_end, c.lease_id, c.lease_expires_at, c.settled INTO v_c
        FROM "{{schema_name}}".consumers c
        WHERE c.partition_id = p_pid AND c.group_name = p_group
        FOR UPDATE;
        IF NOT FOUND OR v_c.lease_id IS DISTINCT FROM p_lease OR v_c.lease_expires_at <= v_now
           OR (n > 0 AND (p_offs[1] <= v_c.committed OR p_offs[n] <> p_offs[1] + n - 1
                          OR p_offs[n] > v_c.batch_end)) THEN
            RETURN false;
        END IF;
        v_comm := "{{schema_name}}".settled_advance(CASE WHEN n > 0 THEN p_offs[n] ELSE v_c.committed END, v_c.settled);
        v_end := least(v_c.batch_end, coalesce(p_end, v_c.batch_end));
        UPDATE "{{schema_name}}".consumers SET
            committed        = v_comm,
            attempts         = CASE WHEN v_comm > committed THEN "{{schema_name}}".fail_at(fail_offs, fail_counts, v_comm + 1)
                                    ELSE attempts END,
            settled          = CASE WHEN settled IS NULL THEN NULL
                                    ELSE "{{schema_name}}".offsets_above(settled, v_comm) END,
            fail_offs        = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE "{{schema_name}}".offsets_above(fail_offs, v_comm + 1) END,
            fail_counts      = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE "{{schema_name}}".fail_counts_above(fail_offs, fail_counts, v_comm + 1) END,
            deliveries       = CASE WHEN v_comm = committed THEN deliveries
                                    WHEN v_comm < delivered_max THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN v_comm >= v_end THEN NULL ELSE v_end END,
            lease_id         = CASE WHEN v_comm >= v_end THEN NULL ELSE lease_id END,
            lease_owner      = CASE WHEN v_comm >= v_end THEN NULL ELSE lease_owner END,
            lease_expires_at = CASE WHEN v_comm >= v_end THEN NULL ELSE lease_expires_at END,
            updated_at       = v_now
        WHERE partition_id = p_pid AND group_name = p_group;
    END IF;
    INSERT INTO "{{schema_name}}".dead_letters (queue_id, partition_id, partition_name, group_name,
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


--
-- Name: purge_partition(bigint, bigint); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.purge_partition(p_pid bigint, p_idle_ms bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM "{{schema_name}}".partitions p
    WHERE p.id = p_pid
      AND p.last_write_at < clock_timestamp() - p_idle_ms * interval '1 millisecond'
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- A statement of its own: its snapshot follows the lock, so it sees
    -- everything a push committed before it.
    IF EXISTS (SELECT 1 FROM "{{schema_name}}".segments s WHERE s.partition_id = p_pid)
       OR EXISTS (SELECT 1 FROM "{{schema_name}}".consumers c WHERE c.partition_id = p_pid
                  AND c.lease_expires_at > clock_timestamp())
       -- created_at is monotone in offset order: the newest hash row decides.
       OR (SELECT t.created_at FROM "{{schema_name}}".txns t WHERE t.partition_id = p_pid
           ORDER BY t.base_offset DESC LIMIT 1)
          > clock_timestamp() - (SELECT q.dedup_window_ms FROM "{{schema_name}}".queues q
                                 JOIN "{{schema_name}}".partitions p ON p.queue_id = q.id
                                 WHERE p.id = p_pid) * interval '1 millisecond' THEN
        RETURN false;
    END IF;
    DELETE FROM "{{schema_name}}".txns WHERE partition_id = p_pid;
    DELETE FROM "{{schema_name}}".partitions WHERE id = p_pid;  -- consumers cascade
    RETURN true;
END
$$;


--
-- Name: purge_txns_step(bigint, bigint, integer); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.purge_txns_step(p_pid bigint, p_keep_ms bigint, p_max integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_n   integer;
    v_end bigint;
BEGIN
    PERFORM 1 FROM "{{schema_name}}".partitions WHERE id = p_pid FOR NO KEY UPDATE SKIP LOCKED; -- busy: next pass
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    WITH head AS (
        SELECT t.base_offset,
               bool_and(t.created_at < clock_timestamp() - p_keep_ms * interval '1 millisecond')
                   OVER (ORDER BY t.base_offset) AS due
        FROM "{{schema_name}}".txns t
        WHERE t.partition_id = p_pid
        ORDER BY t.base_offset
        LIMIT p_max
    ), d AS (
        DELETE FROM "{{schema_name}}".txns t
        USING head h
        WHERE t.partition_id = p_pid AND t.base_offset = h.base_offset AND h.due
        RETURNING t.end_offset
    )
    SELECT count(*), max(end_offset) INTO v_n, v_end FROM d;
    IF v_n > 0 THEN
        UPDATE "{{schema_name}}".partitions SET txns_start = v_end + 1 WHERE id = p_pid;
    END IF;
    RETURN v_n;
END
$$;


--
-- Name: push_bundle(text[], text[], integer[], bytea[], bigint[], bytea[], uuid[], integer[], boolean, integer[]); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.push_bundle(p_queues text[], p_partitions text[], p_counts integer[], p_hashes bytea[], p_verified bigint[], p_blobs bytea[], p_tenants uuid[], p_flags integer[], p_known boolean DEFAULT false, p_lanes integer[] DEFAULT NULL::integer[]) RETURNS SETOF {{schema_name}}.push_result
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
DECLARE
    n       integer := coalesce(cardinality(p_queues), 0);
    v_order integer[] := '{}';
    v_pids  bigint[];
    v_win   bigint[];
    v_enc   boolean[];
    v_lanes integer[];
    rec     record;
    v_now   timestamptz;
    v_res   "{{schema_name}}".push_result[];
    r       "{{schema_name}}".push_result;
    i       integer;
    v_fast  integer[] := '{}';
BEGIN
    -- Alignment guard: a silent misalignment would route verdicts to the
    -- wrong callers.
    IF coalesce(cardinality(p_partitions), 0) <> n OR coalesce(cardinality(p_counts), 0) <> n
       OR coalesce(cardinality(p_hashes), 0) <> n OR coalesce(cardinality(p_verified), 0) <> n
       OR coalesce(cardinality(p_blobs), 0) <> n OR coalesce(cardinality(p_tenants), 0) <> n
       OR coalesce(cardinality(p_flags), 0) <> n
       OR (p_lanes IS NOT NULL AND cardinality(p_lanes) <> n) THEN
        RAISE EXCEPTION 'queen: push_bundle arrays are not aligned';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;

    -- Provisioning skip: only insert when something is missing. Inserts are
    -- ordered on their unique keys so overlapping bundles never convoy.
    IF NOT p_known AND EXISTS (
        SELECT 1 FROM unnest(p_tenants, p_queues, p_partitions) AS u(t, q, p)
        WHERE NOT EXISTS (
            SELECT 1 FROM "{{schema_name}}".queues qq
            WHERE qq.tenant = u.t AND qq.name = u.q
              AND EXISTS (SELECT 1 FROM "{{schema_name}}".partitions pp WHERE pp.queue_id = qq.id AND pp.name = u.p))
    ) THEN
        INSERT INTO "{{schema_name}}".queues (tenant, name)
        SELECT DISTINCT t, q FROM unnest(p_tenants, p_queues) AS u(t, q)
        ORDER BY t, q
        ON CONFLICT DO NOTHING;
        INSERT INTO "{{schema_name}}".partitions (queue_id, name)
        SELECT DISTINCT qq.id, u.p
        FROM unnest(p_tenants, p_queues, p_partitions) AS u(t, q, p)
        JOIN "{{schema_name}}".queues qq ON qq.tenant = u.t AND qq.name = u.q
        ORDER BY qq.id, u.p
        ON CONFLICT DO NOTHING;
    END IF;

    -- A segment with keyed messages (flag 2) marks its queue keyed, which
    -- freezes the queue's lane count. Done before the partition locks (the
    -- lock order is queues, then partitions), and only while unset, so the
    -- queue row is written once in its life. The row lock it takes orders
    -- this push with a Configure changing lanes: that one either committed
    -- first (the resolve below, a later statement, reads its count) or
    -- waits and then sees keyed.
    -- Rows are locked in ascending id, so two first keyed pushes to the
    -- same queues cannot deadlock.
    IF EXISTS (SELECT 1 FROM unnest(p_flags) AS f(fl) WHERE (f.fl & 2) <> 0) THEN
        UPDATE "{{schema_name}}".queues qq SET keyed = true
        FROM (SELECT q2.id FROM "{{schema_name}}".queues q2
              WHERE q2.id IN (SELECT q3.id FROM unnest(p_tenants, p_queues, p_flags) AS u(t, q, fl)
                              JOIN "{{schema_name}}".queues q3 ON q3.tenant = u.t AND q3.name = u.q
                              WHERE (u.fl & 2) <> 0)
                AND NOT q2.keyed
              ORDER BY q2.id
              FOR NO KEY UPDATE) l
        WHERE qq.id = l.id;
    END IF;

    -- Resolve and lock every partition row in one statement, in ascending
    -- partition id: the global lock order shared with transactions and
    -- retention.
    FOR rec IN
        SELECT x.o, pp.id, x.dedup_window_ms, x.encryption, x.lanes
        FROM (SELECT u.o, qq.dedup_window_ms, qq.encryption, qq.lanes,
                     (SELECT p2.id FROM "{{schema_name}}".partitions p2
                      WHERE p2.queue_id = qq.id AND p2.name = u.p) AS pid
              FROM unnest(p_tenants, p_queues, p_partitions) WITH ORDINALITY AS u(t, q, p, o)
              JOIN "{{schema_name}}".queues qq ON qq.tenant = u.t AND qq.name = u.q) x
        JOIN "{{schema_name}}".partitions pp ON pp.id = x.pid
        ORDER BY pp.id, x.o -- a partition twice (Client.Tx): its segments in input order
        FOR NO KEY UPDATE OF pp
    LOOP
        v_order := v_order || rec.o::integer;
        v_pids[rec.o] := rec.id;
        v_win[rec.o] := rec.dedup_window_ms;
        v_enc[rec.o] := rec.encryption;
        v_lanes[rec.o] := rec.lanes;
    END LOOP;
    IF coalesce(cardinality(v_order), 0) <> n THEN
        -- A partition purged between provisioning and the lock: the client
        -- retries the bundle once on this code.
        RAISE EXCEPTION 'queen: push_bundle could not resolve every partition (% of %)',
            coalesce(cardinality(v_order), 0), n USING ERRCODE = 'QN001';
    END IF;
    v_now := clock_timestamp();

    FOREACH i IN ARRAY v_order LOOP
        IF v_enc[i] AND (p_flags[i] & 1) = 0 THEN
            v_res[i] := ROW(i, 2, v_pids[i], NULL, NULL, NULL, NULL);
        ELSIF coalesce(p_lanes[i], 0) <> 0 AND p_lanes[i] <> v_lanes[i] THEN
            v_res[i] := ROW(i, 3, v_pids[i], NULL, NULL, NULL, NULL);
        ELSIF v_win[i] > 0 THEN
            r := "{{schema_name}}".push_one(v_pids[i], p_counts[i], p_hashes[i], p_verified[i],
                                     p_blobs[i], v_win[i], v_now);
            r.ord := i;
            v_res[i] := r;
        ELSE
            -- push_one's stride check, for the set-based path below.
            IF p_counts[i] IS NULL OR p_counts[i] <= 0 OR octet_length(p_hashes[i]) <> 16 * p_counts[i] THEN
                RAISE EXCEPTION 'queen: hash blob is % bytes for % messages (want 16 each)',
                    octet_length(p_hashes[i]), p_counts[i];
            END IF;
            v_fast := v_fast || i;
        END IF;
    END LOOP;

    -- Segments with no dedup window (nothing to probe) are allocated all at
    -- once: one UPDATE of their partitions and one INSERT into each of
    -- segments and txns, instead of one push_one statement per segment. It
    -- is push_one's allocation; keep the two in step. A partition listed
    -- twice (Client.Tx) is bumped once by the sum of its counts, and its
    -- segments take consecutive ranges in input order.
    IF cardinality(v_fast) = 1 THEN
        -- One segment: push_one's single statement is cheaper than the CTE.
        i := v_fast[1];
        r := "{{schema_name}}".push_one(v_pids[i], p_counts[i], p_hashes[i], p_verified[i],
                                 p_blobs[i], 0, v_now);
        r.ord := i;
        v_res[i] := r;
    ELSIF cardinality(v_fast) > 1 THEN
        FOR rec IN
            WITH x AS (
                SELECT f.o, v_pids[f.o] AS pid, p_counts[f.o] AS cnt,
                       sum(p_counts[f.o]) OVER (PARTITION BY v_pids[f.o] ORDER BY f.o) AS upto
                FROM unnest(v_fast) AS f(o)
            ), a AS (
                SELECT x.pid, sum(x.cnt) AS tot FROM x GROUP BY x.pid
            ), u AS (
                UPDATE "{{schema_name}}".partitions p SET
                    last_offset   = p.last_offset + a.tot,
                    last_write_at = CASE WHEN v_now - p.last_write_at > interval '1 second'
                                         THEN v_now ELSE p.last_write_at END,
                    pending       = true
                FROM a
                WHERE p.id = a.pid
                RETURNING p.id, p.last_offset - a.tot AS before
            ), z AS (
                SELECT x.o, x.pid, x.cnt, u.before + x.upto AS last
                FROM x JOIN u ON u.id = x.pid
            ), s AS (
                INSERT INTO "{{schema_name}}".segments (partition_id, base_offset, end_offset, created_at, blob, failures)
                SELECT z.pid, z.last - z.cnt + 1, z.last, v_now, p_blobs[z.o], 0 FROM z
            ), t AS (
                INSERT INTO "{{schema_name}}".txns (partition_id, base_offset, end_offset, created_at, hashes)
                SELECT z.pid, z.last - z.cnt + 1, z.last, v_now, p_hashes[z.o] FROM z
            )
            SELECT z.o, z.pid, z.last - z.cnt + 1 AS base FROM z
        LOOP
            v_res[rec.o] := ROW(rec.o, 0, rec.pid, rec.base, v_now, NULL, NULL);
        END LOOP;
    END IF;

    -- Completeness guard: exactly one result per input, in input order.
    FOR i IN 1 .. n LOOP
        IF v_res[i].ord IS DISTINCT FROM i THEN
            RAISE EXCEPTION 'queen: push_bundle has no result for segment %', i;
        END IF;
        RETURN NEXT v_res[i];
    END LOOP;
END
$$;


--
-- Name: push_one(bigint, integer, bytea, bigint, bytea, bigint, timestamp with time zone, integer); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.push_one(p_pid bigint, p_count integer, p_hashes bytea, p_verified bigint, p_blob bytea, p_window_ms bigint, p_now timestamp with time zone, p_failures integer DEFAULT 0) RETURNS {{schema_name}}.push_result
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_last       bigint;
    v_txns_start bigint;
    r            "{{schema_name}}".push_result;
BEGIN
    -- A stride mismatch would mis-address acks silently: fail loudly.
    IF p_count IS NULL OR p_count <= 0 OR octet_length(p_hashes) <> 16 * p_count THEN
        RAISE EXCEPTION 'queen: hash blob is % bytes for % messages (want 16 each)',
            octet_length(p_hashes), p_count;
    END IF;
    r.partition_id := p_pid;

    IF p_window_ms > 0 THEN
        SELECT last_offset, txns_start INTO v_last, v_txns_start
        FROM "{{schema_name}}".partitions WHERE id = p_pid FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            r.status := 4;
            RETURN r;
        END IF;
        SELECT d.dup_idx, d.dup_off INTO r.dup_idx, r.dup_off
        FROM "{{schema_name}}".dedup_probe(p_pid, p_count, p_hashes, p_verified, v_last, v_txns_start,
                                    p_window_ms, p_now) d;
        IF r.dup_idx IS NOT NULL THEN
            r.status := 1;
            RETURN r;
        END IF;
    END IF;

    -- One statement allocates, marks the partition ready and writes both
    -- rows. pending = true changes nothing (so stays HOT) unless the
    -- partition had been drained.
    WITH u AS (
        UPDATE "{{schema_name}}".partitions SET
            last_offset   = last_offset + p_count,
            last_write_at = CASE WHEN p_now - last_write_at > interval '1 second'
                                 THEN p_now ELSE last_write_at END,
            pending       = true
        WHERE id = p_pid
        RETURNING last_offset
    ), s AS (
        INSERT INTO "{{schema_name}}".segments (partition_id, base_offset, end_offset, created_at, blob, failures)
        SELECT p_pid, u.last_offset - p_count + 1, u.last_offset, p_now, p_blob, p_failures FROM u
    ), t AS (
        INSERT INTO "{{schema_name}}".txns (partition_id, base_offset, end_offset, created_at, hashes)
        SELECT p_pid, u.last_offset - p_count + 1, u.last_offset, p_now, p_hashes FROM u
    )
    SELECT u.last_offset INTO v_last FROM u;
    IF v_last IS NULL THEN
        r.status := 4;
        RETURN r;
    END IF;

    r.status := 0;
    r.base_offset := v_last - p_count + 1;
    r.created_at := p_now;
    RETURN r;
END
$$;


--
-- Name: push_segment(uuid, text, text, integer, bytea, bytea, integer, integer); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.push_segment(p_tenant uuid, p_queue text, p_partition text, p_count integer, p_hashes bytea, p_blob bytea, p_flags integer, p_lanes integer) RETURNS {{schema_name}}.push_result
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_pid   bigint;
    v_win   bigint;
    v_enc   boolean;
    v_lanes integer;
    v_keyed boolean;
    r       "{{schema_name}}".push_result;
BEGIN
    -- Written like push_bundle's resolve (a subquery with both keys), for
    -- the same reason: no plan can walk the queue's partitions.
    SELECT (SELECT p2.id FROM "{{schema_name}}".partitions p2
            WHERE p2.queue_id = qq.id AND p2.name = p_partition),
           qq.dedup_window_ms, qq.encryption, qq.lanes, qq.keyed
    INTO v_pid, v_win, v_enc, v_lanes, v_keyed
    FROM "{{schema_name}}".queues qq
    WHERE qq.tenant = p_tenant AND qq.name = p_queue;

    r.ord := 1;
    IF v_pid IS NULL OR ((p_flags & 2) <> 0 AND NOT v_keyed) THEN
        r.status := 4;
        RETURN r;
    END IF;
    r.partition_id := v_pid;
    IF v_enc AND (p_flags & 1) = 0 THEN
        r.status := 2;
        RETURN r;
    END IF;
    IF coalesce(p_lanes, 0) <> 0 AND p_lanes <> v_lanes THEN
        r.status := 3;
        RETURN r;
    END IF;
    r := "{{schema_name}}".push_one(v_pid, p_count, p_hashes, -1, p_blob, v_win, clock_timestamp());
    r.ord := 1;
    RETURN r;
END
$$;


--
-- Name: raw_segment(uuid, integer, text, bytea, text, bytea); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.raw_segment(p_id uuid, p_flags integer, p_txn text, p_payload bytea, p_key text DEFAULT NULL::text, p_headers bytea DEFAULT NULL::bytea) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE
    AS $$
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
        v_txn := v_txn || "{{schema_name}}".uvarint(octet_length(v_key)) || v_key;
    END IF;
    -- The headers (FlagHeaders, bit 1) follow the key, present exactly when
    -- non-empty.
    IF octet_length(coalesce(p_headers, '\x'::bytea)) > 0 THEN
        v_flag := v_flag | 2;
        v_txn := v_txn || p_headers;
    END IF;
    v_body := set_byte('\x00'::bytea, 0, v_flag) || uuid_send(p_id)
              || "{{schema_name}}".uvarint(octet_length(convert_to(coalesce(p_txn, ''), 'UTF8'))) || v_txn
              || coalesce(p_payload, '\x'::bytea);
    v_len := octet_length(v_body);
    RETURN '\x00'::bytea
        || set_byte(set_byte(set_byte(set_byte('\x00000000'::bytea,
               0, (v_len & 255)::integer), 1, ((v_len >> 8) & 255)::integer),
               2, ((v_len >> 16) & 255)::integer), 3, ((v_len >> 24) & 255)::integer)
        || v_body;
END
$$;


--
-- Name: requeue_dead_letters(bigint, bigint[], bytea[], bytea[], integer[]); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.requeue_dead_letters(p_qid bigint, p_ids bigint[], p_hashes bytea[], p_payloads bytea[], p_flags integer[]) RETURNS TABLE(part_name text, requeued integer)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
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
    SELECT q.encryption INTO v_enc FROM "{{schema_name}}".queues q WHERE q.id = p_qid;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT array_agg(DISTINCT d.partition_name) INTO v_names
    FROM "{{schema_name}}".dead_letters d WHERE d.id = ANY (p_ids) AND d.queue_id = p_qid;
    IF v_names IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO "{{schema_name}}".partitions (queue_id, name)
    SELECT p_qid, u.nm FROM unnest(v_names) AS u(nm) ORDER BY u.nm
    ON CONFLICT DO NOTHING;
    -- Only partitions locked here take dead letters (one forgotten again
    -- since the insert keeps its dead letters for the next call).
    SELECT array_agg(l.name) INTO v_names FROM (
        SELECT p.id, p.name FROM "{{schema_name}}".partitions p
        WHERE p.queue_id = p_qid AND p.name = ANY (v_names)
        ORDER BY p.id
        FOR NO KEY UPDATE) l;
    v_now := clock_timestamp(); -- after the row locks: created_at stays monotone
    WITH x AS (
        SELECT * FROM unnest(p_ids, p_hashes, p_payloads, p_flags) AS x(id, h, pl, fl)
    ), del AS (
        DELETE FROM "{{schema_name}}".dead_letters d
        USING x
        WHERE d.id = x.id AND d.queue_id = p_qid AND d.partition_name = ANY (v_names)
          AND NOT (v_enc AND (coalesce(x.fl, d.flags) & 1) = 0)
        RETURNING d.id, d.partition_name, d.message_id, d.transaction_id, d.message_key,
                  d.message_headers, coalesce(x.fl, d.flags) AS flags, coalesce(x.pl, d.payload) AS payload, x.h
    ), one AS (
        SELECT DISTINCT ON (p.id, del.message_id) p.id AS pid, p.name, del.*
        FROM del JOIN "{{schema_name}}".partitions p ON p.queue_id = p_qid AND p.name = del.partition_name
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
        PERFORM "{{schema_name}}".push_one(v_pids[i], 1,
            CASE WHEN octet_length(v_hs[i]) = 16 THEN v_hs[i] ELSE '\x00000000000000000000000000000000'::bytea END,
            -1, "{{schema_name}}".raw_segment(v_mids[i], v_fls[i], v_txns[i], v_pls[i], v_keys[i], v_hdrs[i]), 0, v_now, 0);
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


--
-- Name: requeue_one(bigint, bigint, uuid, integer, text, bytea, integer, text, bytea); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.requeue_one(p_pid bigint, p_off bigint, p_id uuid, p_flags integer, p_txn text, p_payload bytea, p_failures integer, p_key text DEFAULT NULL::text, p_headers bytea DEFAULT NULL::bytea) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_hash bytea;
    v_now  timestamptz := clock_timestamp();  -- after the row lock: created_at stays monotone
BEGIN
    SELECT substring(t.hashes FROM ((p_off - t.base_offset) * 16 + 1)::integer FOR 16) INTO v_hash
    FROM (SELECT tt.base_offset, tt.end_offset, tt.hashes FROM "{{schema_name}}".txns tt
          WHERE tt.partition_id = p_pid AND tt.base_offset <= p_off
          ORDER BY tt.base_offset DESC LIMIT 1) t
    WHERE t.end_offset >= p_off;
    IF v_hash IS NULL OR octet_length(v_hash) <> 16 THEN
        v_hash := '\x00000000000000000000000000000000'::bytea;
    END IF;
    -- The single allocator, without a dedup probe: the copy repeats its
    -- original's transaction id on purpose.
    RETURN ("{{schema_name}}".push_one(p_pid, 1, v_hash, -1, "{{schema_name}}".raw_segment(p_id, p_flags, p_txn, p_payload, p_key, p_headers),
                                0, v_now, p_failures)).base_offset;
END
$$;


--
-- Name: retention_step(bigint, integer); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.retention_step(p_pid bigint, p_max integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_qid       bigint;
    v_ret       bigint;
    v_done_ret  bigint;
    v_created   timestamptz;
    v_committed bigint;
    v_groups    boolean;
    v_keep_from timestamptz;
    v_now       timestamptz := clock_timestamp();
    v_n         integer;
    v_end       bigint;
BEGIN
    SELECT q.id, q.retention_ms, q.completed_retention_ms, p.created_at
    INTO v_qid, v_ret, v_done_ret, v_created
    FROM "{{schema_name}}".partitions p JOIN "{{schema_name}}".queues q ON q.id = p.queue_id
    WHERE p.id = p_pid
    FOR NO KEY UPDATE OF p SKIP LOCKED; -- a push holds it: next pass
    IF NOT FOUND OR (v_ret <= 0 AND v_done_ret <= 0) THEN
        RETURN 0;
    END IF;
    IF v_done_ret > 0 THEN
        -- The slowest cursor here; then the oldest message some group
        -- without a cursor here needs (NULL: none does).
        SELECT min(c.committed), count(*) > 0 INTO v_committed, v_groups
        FROM "{{schema_name}}".consumers c WHERE c.partition_id = p_pid;
        SELECT min(CASE WHEN s.mode = 'all' OR v_created >= s.created_at THEN '-infinity'::timestamptz
                        WHEN s.mode = 'new' THEN s.created_at
                        ELSE least(coalesce(s.from_time, '-infinity'), s.created_at) END),
               v_groups OR count(*) > 0
        INTO v_keep_from, v_groups
        FROM "{{schema_name}}".subscriptions s
        WHERE s.queue_id = v_qid
          AND NOT EXISTS (SELECT 1 FROM "{{schema_name}}".consumers c
                          WHERE c.partition_id = p_pid AND c.group_name = s.group_name);
    END IF;

    WITH head AS (
        SELECT s.base_offset, s.end_offset,
               bool_and((v_ret > 0 AND s.created_at < v_now - v_ret * interval '1 millisecond')
                     OR (v_done_ret > 0 AND v_groups
                         AND s.created_at < v_now - v_done_ret * interval '1 millisecond'
                         AND (v_committed IS NULL OR s.end_offset <= v_committed)
                         AND (v_keep_from IS NULL OR s.created_at < v_keep_from)))
                   OVER (ORDER BY s.base_offset) AS due
        FROM "{{schema_name}}".segments s
        WHERE s.partition_id = p_pid
        ORDER BY s.base_offset
        LIMIT p_max
    ), d AS (
        DELETE FROM "{{schema_name}}".segments s
        USING head h
        WHERE s.partition_id = p_pid AND s.base_offset = h.base_offset AND h.due
        RETURNING s.end_offset
    )
    SELECT count(*), max(end_offset) INTO v_n, v_end FROM d;
    IF v_n > 0 THEN
        UPDATE "{{schema_name}}".partitions SET log_start = v_end + 1 WHERE id = p_pid;
    END IF;
    RETURN v_n;
END
$$;


--
-- Name: seed_chunk(bigint, text); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.seed_chunk(p_qid bigint, p_group text) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
DECLARE
    v      record;
    v_last text;
    v_n    integer;
    v_ids  bigint[];
BEGIN
    SELECT s.mode, s.from_time, s.created_at, s.seed_after INTO v
    FROM "{{schema_name}}".subscriptions s WHERE s.queue_id = p_qid AND s.group_name = p_group;
    IF NOT FOUND OR v.seed_after IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*), max(c.name),
           array_agg(c.id ORDER BY c.id) FILTER (
               WHERE NOT c.pending AND c.last_offset >= c.log_start AND NOT EXISTS (
                   SELECT 1 FROM "{{schema_name}}".consumers cc WHERE cc.partition_id = c.id AND cc.group_name = p_group OFFSET 0)
                 AND "{{schema_name}}".seed_offset(c.id, c.log_start, c.created_at, v.mode, v.created_at, v.from_time)
                     < c.last_offset)
    INTO v_n, v_last, v_ids
    FROM (SELECT p.id, p.name, p.pending, p.last_offset, p.log_start, p.created_at
          FROM "{{schema_name}}".partitions p
          WHERE p.queue_id = p_qid AND p.name >= v.seed_after
          ORDER BY p.name LIMIT 1025) c;
    IF v_ids IS NOT NULL THEN
        -- Into the group's own backlog, not the shared set: a new group's
        -- first contact does not slow the pops of the others.
        PERFORM 1 FROM "{{schema_name}}".partitions WHERE id = ANY (v_ids) ORDER BY id FOR NO KEY UPDATE;
        INSERT INTO "{{schema_name}}".backlog (queue_id, group_name, partition_id)
        SELECT p_qid, p_group, p.id FROM "{{schema_name}}".partitions p
        WHERE p.id = ANY (v_ids) AND NOT p.pending
        ORDER BY p.id
        ON CONFLICT DO NOTHING;
    END IF;
    -- The step re-reads the name it ended at (>=): one row means done.
    UPDATE "{{schema_name}}".subscriptions SET seed_after = CASE WHEN v_n <= 1 THEN NULL ELSE v_last END
    WHERE queue_id = p_qid AND group_name = p_group;
END
$$;


--
-- Name: seed_consumers(bigint, text, text, timestamp with time zone); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.seed_consumers(p_qid bigint, p_group text, p_mode text, p_from timestamp with time zone) RETURNS boolean
    LANGUAGE sql
    AS $$
    SELECT "{{schema_name}}".seed_consumers(p_qid, p_group, p_mode, p_from, NULL::bigint[])
$$;


--
-- Name: seed_consumers(bigint, text, text, timestamp with time zone, bigint[]); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.seed_consumers(p_qid bigint, p_group text, p_mode text, p_from timestamp with time zone, p_pids bigint[]) RETURNS boolean
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
DECLARE
    v record;
BEGIN
    IF p_pids IS NOT NULL THEN
        SELECT s.mode, s.from_time, s.created_at INTO v
        FROM "{{schema_name}}".subscriptions s WHERE s.queue_id = p_qid AND s.group_name = p_group;
        IF NOT FOUND THEN
            RETURN false;
        END IF;
        INSERT INTO "{{schema_name}}".consumers (partition_id, group_name, committed)
        SELECT p.id, p_group, "{{schema_name}}".seed_offset(p.id, p.log_start, p.created_at, v.mode, v.created_at, v.from_time)
        FROM "{{schema_name}}".partitions p
        -- queue_id + 0: only a filter. As an index condition, a generic plan
        -- cached while the queue was small ANDed a bitmap of every partition
        -- of the queue with the window's.
        WHERE p.id = ANY (p_pids) AND p.queue_id + 0 = p_qid
          -- A keyed probe per partition: OFFSET 0 keeps it a subplan. As an
          -- anti-join, a generic plan cached while the table was empty
          -- read every cursor of the group for every partition.
          AND NOT EXISTS (SELECT 1 FROM "{{schema_name}}".consumers c
                          WHERE c.partition_id = p.id AND c.group_name = p_group OFFSET 0)
        ORDER BY p.id
        ON CONFLICT DO NOTHING;
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/seed/' || p_qid || '/' || p_group, 0));
    IF p_group = '' THEN
        p_mode := 'all';
    END IF;
    PERFORM 1 FROM "{{schema_name}}".subscriptions WHERE queue_id = p_qid AND group_name = p_group;
    IF NOT FOUND THEN
        -- Waits only for clears in flight, which never wait themselves.
        PERFORM pg_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/contact/' || p_qid, 0));
        INSERT INTO "{{schema_name}}".subscriptions (queue_id, group_name, mode, from_time, created_at, seed_after)
        VALUES (p_qid, p_group, p_mode, p_from, clock_timestamp(), CASE WHEN p_mode = 'new' THEN NULL ELSE '' END)
        ON CONFLICT DO NOTHING;
    END IF;
    PERFORM "{{schema_name}}".seed_chunk(p_qid, p_group);
    RETURN true;
END
$$;


--
-- Name: seed_offset(bigint, bigint, timestamp with time zone, text, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.seed_offset(p_pid bigint, p_log_start bigint, p_created timestamp with time zone, p_mode text, p_since timestamp with time zone, p_from timestamp with time zone) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE
        WHEN p_mode = 'all' OR p_created >= p_since THEN p_log_start - 1
        ELSE greatest(p_log_start - 1, coalesce(
            (SELECT s.end_offset FROM "{{schema_name}}".segments s
             WHERE s.partition_id = p_pid
               AND s.created_at < CASE WHEN p_mode = 'new' THEN p_since ELSE least(p_from, p_since) END
             ORDER BY s.base_offset DESC LIMIT 1), p_log_start - 1))
    END
$$;


--
-- Name: segment_at(bigint, bigint); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.segment_at(p_pid bigint, p_off bigint) RETURNS TABLE(base_offset bigint, end_offset bigint, created_at timestamp with time zone, blob bytea)
    LANGUAGE sql STABLE
    AS $$
    SELECT c.base_offset, c.end_offset, c.created_at, c.blob
    FROM (SELECT s.base_offset, s.end_offset, s.created_at, s.blob
          FROM "{{schema_name}}".segments s
          WHERE s.partition_id = p_pid AND s.base_offset <= p_off
          ORDER BY s.base_offset DESC
          LIMIT 1) c
    WHERE c.end_offset >= p_off
$$;


--
-- Name: settle(bigint[], text[], uuid[], bigint[], smallint[], bigint[], boolean[], text[], uuid[], text[], integer[], bytea[], timestamp with time zone[], text[], bytea[]); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.settle(p_pids bigint[], p_groups text[], p_leases uuid[], p_ok bigint[], p_act smallint[], p_act_off bigint[], p_release boolean[], p_reasons text[], p_dl_ids uuid[], p_dl_txns text[], p_dl_flags integer[], p_dl_payload bytea[], p_dl_created timestamp with time zone[], p_dl_keys text[] DEFAULT NULL::text[], p_dl_headers bytea[] DEFAULT NULL::bytea[]) RETURNS SETOF {{schema_name}}.settle_result
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
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
    v_res   "{{schema_name}}".settle_result[];
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
                SELECT p.id FROM "{{schema_name}}".partitions p
                JOIN "{{schema_name}}".queues qq ON qq.id = p.queue_id
                WHERE p.id IN (SELECT x.pid FROM unnest(p_pids, p_act) AS x(pid, act) WHERE x.act = 1)
                  AND qq.failure_policy = 'skip'
                ORDER BY p.id
                FOR NO KEY UPDATE OF p) l;
        ELSE
            SELECT coalesce(array_agg(l.id), '{}') INTO v_rqp FROM (
                SELECT p.id FROM "{{schema_name}}".partitions p
                JOIN "{{schema_name}}".queues qq ON qq.id = p.queue_id
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
        FROM "{{schema_name}}".consumers cc
        JOIN "{{schema_name}}".partitions p ON p.id = cc.partition_id
        JOIN "{{schema_name}}".queues qq ON qq.id = p.queue_id
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
            FROM (SELECT ss.end_offset, ss.failures FROM "{{schema_name}}".segments ss
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
            v_att := "{{schema_name}}".fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
        END IF;
        v_spent := v_prior + v_att;
        IF p_act[i] = 1 THEN
            v_att := v_att + 1;
            v_spent := v_prior + v_att;
            IF v_spent >= greatest(v_c.retry_limit, 1) THEN
                v_comm := p_act_off[i];
                v_att := "{{schema_name}}".fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
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
                v_att := "{{schema_name}}".fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
            END IF;
        ELSIF p_act[i] = 3 THEN
            v_comm := p_act_off[i];
            v_att := "{{schema_name}}".fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
            v_dl := true;
            v_st := 3;
        END IF;
        IF v_c.settled IS NOT NULL AND "{{schema_name}}".settled_advance(v_comm, v_c.settled) > v_comm THEN
            -- Settled out of order above: the cursor passes the run.
            v_comm := "{{schema_name}}".settled_advance(v_comm, v_c.settled);
            v_att := "{{schema_name}}".fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
        END IF;
        IF v_comm >= v_c.batch_end THEN
            v_rel := true;
        END IF;

        UPDATE "{{schema_name}}".consumers SET
            committed        = v_comm,
            attempts         = v_att,
            settled          = CASE WHEN settled IS NULL THEN NULL
                                    ELSE "{{schema_name}}".offsets_above(settled, v_comm) END,
            fail_offs        = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE "{{schema_name}}".offsets_above(fail_offs, v_comm + 1) END,
            fail_counts      = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE "{{schema_name}}".fail_counts_above(fail_offs, fail_counts, v_comm + 1) END,
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
            PERFORM "{{schema_name}}".requeue_one(p_pids[i], p_act_off[i], p_dl_ids[i], p_dl_flags[i], p_dl_txns[i],
                                           p_dl_payload[i], v_spent, p_dl_keys[i], p_dl_headers[i]);
        END IF;
        IF v_dl THEN
            INSERT INTO "{{schema_name}}".dead_letters (queue_id, partition_id, partition_name, group_name,
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


--
-- Name: settle_keyed(bigint[], text[], uuid[], bigint[], smallint[], boolean[], text[], uuid[], text[], integer[], bytea[], timestamp with time zone[], text[], bytea[]); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.settle_keyed(p_pids bigint[], p_groups text[], p_leases uuid[], p_offs bigint[], p_act smallint[], p_release boolean[], p_reasons text[], p_dl_ids uuid[], p_dl_txns text[], p_dl_flags integer[], p_dl_payload bytea[], p_dl_created timestamp with time zone[], p_dl_keys text[] DEFAULT NULL::text[], p_dl_headers bytea[] DEFAULT NULL::bytea[]) RETURNS SETOF {{schema_name}}.settle_result
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
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
    v_res   "{{schema_name}}".settle_result[];
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
            SELECT p.id FROM "{{schema_name}}".partitions p
            JOIN "{{schema_name}}".queues qq ON qq.id = p.queue_id
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
        FROM "{{schema_name}}".consumers cc
        JOIN "{{schema_name}}".partitions p ON p.id = cc.partition_id
        JOIN "{{schema_name}}".queues qq ON qq.id = p.queue_id
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
            FROM (SELECT ss.end_offset, ss.failures FROM "{{schema_name}}".segments ss
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
                    INSERT INTO "{{schema_name}}".dead_letters (queue_id, partition_id, partition_name, group_name,
                        msg_offset, message_id, transaction_id, message_key, message_headers, flags, payload,
                        message_created_at, attempts, reason)
                    VALUES (v_c.queue_id, v_l.pid, v_c.partition_name, v_l.g, p_offs[j], p_dl_ids[j],
                        p_dl_txns[j], nullif(p_dl_keys[j], ''), nullif(p_dl_headers[j], '\x'::bytea), p_dl_flags[j], p_dl_payload[j], p_dl_created[j],
                        v_prior + v_cnt, p_reasons[j]);
                END IF;
            ELSIF v_c.failure_policy = 'skip' AND v_l.pid = ANY (v_rqp)
                  AND NOT (v_c.encryption AND (coalesce(p_dl_flags[j], 0) & 1) = 0) THEN
                PERFORM "{{schema_name}}".requeue_one(v_l.pid, p_offs[j], p_dl_ids[j], p_dl_flags[j], p_dl_txns[j],
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
        v_comm := "{{schema_name}}".settled_advance(v_c.committed, v_set);
        v_att := "{{schema_name}}".fail_at(v_fo, v_fc, v_comm + 1);
        SELECT array_agg(u.o ORDER BY u.o), array_agg(u.c ORDER BY u.o) INTO v_fo, v_fc
        FROM unnest(v_fo, v_fc) AS u(o, c)
        WHERE u.o > v_comm + 1 AND NOT (u.o = ANY (v_set));
        IF v_comm >= v_c.batch_end THEN
            v_rel := true;
        END IF;
        UPDATE "{{schema_name}}".consumers SET
            committed        = v_comm,
            attempts         = v_att,
            settled          = "{{schema_name}}".offsets_above(v_set, v_comm),
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


--
-- Name: settled_advance(bigint, bigint[]); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.settled_advance(p_comm bigint, p_settled bigint[]) RETURNS bigint
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN p_settled IS NULL OR NOT ((p_comm + 1) = ANY (p_settled)) THEN p_comm
        -- sorted and unique: the run is the entries whose rank above p_comm
        -- equals their distance from it
        ELSE (SELECT max(x.o) FROM (SELECT u.o, row_number() OVER (ORDER BY u.o) AS r
                                    FROM unnest(p_settled) AS u(o) WHERE u.o > p_comm) x
              WHERE x.o = p_comm + x.r)
    END
$$;


--
-- Name: uvarint(bigint); Type: FUNCTION; Schema: {{schema_name}}; Owner: -
--

CREATE FUNCTION {{schema_name}}.uvarint(p_n bigint) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE
    AS $$
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


SET default_table_access_method = heap;

--
-- Name: backlog; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.backlog (
    queue_id bigint NOT NULL,
    group_name text NOT NULL,
    partition_id bigint NOT NULL
)
WITH (vacuum_truncate='false');


--
-- Name: consumers; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.consumers (
    partition_id bigint NOT NULL,
    group_name text NOT NULL,
    committed bigint DEFAULT '-1'::integer NOT NULL,
    batch_end bigint,
    lease_id uuid,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    attempts integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    deliveries integer DEFAULT 0 NOT NULL,
    delivered_max bigint DEFAULT '-1'::integer NOT NULL,
    settled bigint[],
    fail_offs bigint[],
    fail_counts integer[]
)
WITH (fillfactor='50', vacuum_truncate='false');


--
-- Name: partitions; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.partitions (
    id bigint NOT NULL,
    queue_id bigint NOT NULL,
    name text NOT NULL,
    last_offset bigint DEFAULT '-1'::integer NOT NULL,
    log_start bigint DEFAULT 0 NOT NULL,
    txns_start bigint DEFAULT 0 NOT NULL,
    last_write_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    pending boolean DEFAULT true NOT NULL
)
WITH (fillfactor='50', vacuum_truncate='false');
ALTER TABLE ONLY {{schema_name}}.partitions ALTER COLUMN pending SET STATISTICS 0;


--
-- Name: queues; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.queues (
    id bigint NOT NULL,
    tenant uuid NOT NULL,
    name text NOT NULL,
    lease_time_ms bigint DEFAULT 300000 NOT NULL,
    retry_limit integer DEFAULT 3 NOT NULL,
    dead_letter boolean DEFAULT false NOT NULL,
    dedup_window_ms bigint DEFAULT 0 NOT NULL,
    encryption boolean DEFAULT false NOT NULL,
    delayed_processing_ms bigint DEFAULT 0 NOT NULL,
    window_buffer_ms bigint DEFAULT 0 NOT NULL,
    retention_ms bigint DEFAULT 0 NOT NULL,
    completed_retention_ms bigint DEFAULT 0 NOT NULL,
    failure_policy text DEFAULT 'pause'::text NOT NULL,
    lanes integer DEFAULT 64 NOT NULL,
    keyed boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT queues_failure_policy_check CHECK ((failure_policy = ANY (ARRAY['pause'::text, 'skip'::text]))),
    CONSTRAINT queues_lanes_check CHECK ((lanes > 0))
);


--
-- Name: segments; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.segments (
    partition_id bigint NOT NULL,
    base_offset bigint NOT NULL,
    end_offset bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    blob bytea NOT NULL,
    failures integer DEFAULT 0 NOT NULL
)
WITH (vacuum_truncate='false');
ALTER TABLE ONLY {{schema_name}}.segments ALTER COLUMN blob SET STORAGE EXTERNAL;


--
-- Name: consumer_lag; Type: VIEW; Schema: {{schema_name}}; Owner: -
--

CREATE VIEW {{schema_name}}.consumer_lag AS
 SELECT q.tenant,
    q.name AS queue,
    p.name AS partition,
    c.group_name,
    p.last_offset,
    c.committed,
    GREATEST((p.last_offset - GREATEST(c.committed, (p.log_start - 1))), (0)::bigint) AS lag_messages,
        CASE
            WHEN (p.last_offset > GREATEST(c.committed, (p.log_start - 1))) THEN EXTRACT(epoch FROM (clock_timestamp() - ( SELECT s.created_at
               FROM {{schema_name}}.segments s
              WHERE ((s.partition_id = p.id) AND (s.base_offset <= GREATEST((c.committed + 1), p.log_start)))
              ORDER BY s.base_offset DESC
             LIMIT 1)))
            ELSE (0)::numeric
        END AS lag_seconds,
    c.lease_owner,
    c.lease_expires_at
   FROM (({{schema_name}}.consumers c
     JOIN {{schema_name}}.partitions p ON ((p.id = c.partition_id)))
     JOIN {{schema_name}}.queues q ON ((q.id = p.queue_id)));


--
-- Name: dead_letters; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.dead_letters (
    id bigint NOT NULL,
    queue_id bigint NOT NULL,
    partition_id bigint NOT NULL,
    partition_name text NOT NULL,
    group_name text NOT NULL,
    msg_offset bigint NOT NULL,
    message_id uuid NOT NULL,
    transaction_id text NOT NULL,
    message_key text,
    message_headers bytea,
    flags integer DEFAULT 0 NOT NULL,
    payload bytea,
    message_created_at timestamp with time zone NOT NULL,
    attempts integer NOT NULL,
    reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: COLUMN dead_letters.message_headers; Type: COMMENT; Schema: {{schema_name}}; Owner: -
--

COMMENT ON COLUMN {{schema_name}}.dead_letters.message_headers IS 'The message''s encoded headers (the frame''s headers field); NULL when it has none.';


--
-- Name: dead_letters_id_seq; Type: SEQUENCE; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE {{schema_name}}.dead_letters ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME {{schema_name}}.dead_letters_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: partitions_id_seq; Type: SEQUENCE; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE {{schema_name}}.partitions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME {{schema_name}}.partitions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: paused_groups; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.paused_groups (
    queue_id bigint NOT NULL,
    group_name text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: queues_id_seq; Type: SEQUENCE; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE {{schema_name}}.queues ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME {{schema_name}}.queues_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: schema_migrations; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: settings; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.settings (
    id boolean DEFAULT true NOT NULL,
    maintenance boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT settings_id_check CHECK (id)
);


--
-- Name: subscriptions; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.subscriptions (
    queue_id bigint NOT NULL,
    group_name text NOT NULL,
    mode text NOT NULL,
    from_time timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    seed_after text,
    CONSTRAINT subscriptions_mode_check CHECK ((mode = ANY (ARRAY['all'::text, 'new'::text, 'from'::text])))
);


--
-- Name: txns; Type: TABLE; Schema: {{schema_name}}; Owner: -
--

CREATE TABLE {{schema_name}}.txns (
    partition_id bigint NOT NULL,
    base_offset bigint NOT NULL,
    end_offset bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    hashes bytea NOT NULL
)
WITH (vacuum_truncate='false');
ALTER TABLE ONLY {{schema_name}}.txns ALTER COLUMN hashes SET STORAGE EXTERNAL;


--
-- Data for Name: backlog; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--



--
-- Data for Name: consumers; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.consumers VALUES (1, 'g1', 2, NULL, NULL, NULL, NULL, 0, '2026-11-30 23:12:30.636984+00', 0, 2, NULL, NULL, NULL);
INSERT INTO {{schema_name}}.consumers VALUES (3, 'g1', 0, NULL, NULL, NULL, NULL, 0, '2026-11-30 23:12:30.641785+00', 0, 0, NULL, NULL, NULL);
INSERT INTO {{schema_name}}.consumers VALUES (2, 'g1', -1, 1, '68bbbded-c9d9-46cb-bc1b-57f25dcc1e42', 'vm/22784/2717ec22', '2100-01-01 00:00:00+00', 0, '2026-11-30 23:12:30.637384+00', 1, 1, NULL, NULL, NULL);


--
-- Data for Name: dead_letters; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.dead_letters OVERRIDING SYSTEM VALUE VALUES (1, 1, 3, 'p3', 'g1', 0, '01a22ebb-358c-7319-9ae5-70f6326d2f21', 'plain/p3/0', NULL, '\x0101690130', 2, '\x70332d30', '2026-11-30 23:12:30.605644+00', 0, 'fixture dead letter', '2026-11-30 23:12:30.63969+00');


--
-- Data for Name: partitions; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.partitions OVERRIDING SYSTEM VALUE VALUES (1, 1, 'p1', 4, 0, 0, '2026-11-30 23:12:30.568494+00', '2026-11-30 23:12:30.568494+00', true);
INSERT INTO {{schema_name}}.partitions OVERRIDING SYSTEM VALUE VALUES (2, 1, 'p2', 4, 0, 0, '2026-11-30 23:12:30.595637+00', '2026-11-30 23:12:30.595637+00', true);
INSERT INTO {{schema_name}}.partitions OVERRIDING SYSTEM VALUE VALUES (3, 1, 'p3', 4, 0, 0, '2026-11-30 23:12:30.605149+00', '2026-11-30 23:12:30.605149+00', true);
INSERT INTO {{schema_name}}.partitions OVERRIDING SYSTEM VALUE VALUES (4, 2, 'e1', 3, 0, 0, '2026-11-30 23:12:30.608552+00', '2026-11-30 23:12:30.608552+00', true);
INSERT INTO {{schema_name}}.partitions OVERRIDING SYSTEM VALUE VALUES (5, 1, 'lane-3', 1, 0, 0, '2026-11-30 23:12:30.609323+00', '2026-11-30 23:12:30.609323+00', true);
INSERT INTO {{schema_name}}.partitions OVERRIDING SYSTEM VALUE VALUES (7, 1, 'lane-2', 1, 0, 0, '2026-11-30 23:12:30.611694+00', '2026-11-30 23:12:30.611694+00', true);
INSERT INTO {{schema_name}}.partitions OVERRIDING SYSTEM VALUE VALUES (8, 1, 'lane-0', 0, 0, 0, '2026-11-30 23:12:30.614254+00', '2026-11-30 23:12:30.614254+00', true);
INSERT INTO {{schema_name}}.partitions OVERRIDING SYSTEM VALUE VALUES (6, 1, 'lane-1', 2, 0, 0, '2026-11-30 23:12:30.610382+00', '2026-11-30 23:12:30.610382+00', true);


--
-- Data for Name: paused_groups; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.paused_groups VALUES (1, 'gp', '2026-11-30 23:12:30.660105+00');


--
-- Data for Name: queues; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.queues OVERRIDING SYSTEM VALUE VALUES (2, '00000000-0000-0000-0000-000000000000', 'secret', 300000, 3, false, 0, true, 0, 0, 0, 0, 'pause', 64, false, '2026-11-30 23:12:30.567806+00', '2026-11-30 23:12:30.567806+00');
INSERT INTO {{schema_name}}.queues OVERRIDING SYSTEM VALUE VALUES (1, '00000000-0000-0000-0000-000000000000', 'plain', 300000, 2, true, 3153600000000, false, 0, 0, 0, 0, 'pause', 4, true, '2026-11-30 23:12:30.567392+00', '2026-11-30 23:12:30.567392+00');


--
-- Data for Name: schema_migrations; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.schema_migrations VALUES (1, 'data_model', '80d48934b0463785443406719f3aa2060d2bb9f0cca1b4ffbc6006913be0f778', '2026-11-30 23:12:30.485248+00');
INSERT INTO {{schema_name}}.schema_migrations VALUES (2, 'push', 'c9bda8ab0399f3ed70d5bc8969ab9e91a22b6d181460fbc6b54640bd1e5f51fc', '2026-11-30 23:12:30.52919+00');
INSERT INTO {{schema_name}}.schema_migrations VALUES (3, 'consume', 'b0dff00e58e68adeceda3e20ab2e9fc8220eab3ec48fe6e776778d5dc760a331', '2026-11-30 23:12:30.533484+00');
INSERT INTO {{schema_name}}.schema_migrations VALUES (4, 'maintenance', '680a50ca95296209cebe1f4acc8f588911c7e1745e390f0b64b4aa60c9042978', '2026-11-30 23:12:30.551591+00');
INSERT INTO {{schema_name}}.schema_migrations VALUES (5, 'frame_headers', 'bcfb341a3eaaf4eb73a1eac87a04c62d05bd8d5553a8c81b615c8b9664e782c1', '2026-11-30 23:12:30.561264+00');


--
-- Data for Name: segments; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.segments VALUES (1, 0, 2, '2026-11-30 23:12:30.570585+00', '\x00250000000201a22ebb3568736faa56d6ae2820bb570a706c61696e2f70312f30010169013070312d30250000000201a22ebb35687370b340b1c071a70cb80a706c61696e2f70312f31010169013170312d31250000000201a22ebb35687371ad1fbd21b60d12670a706c61696e2f70312f32010169013270312d32', 0);
INSERT INTO {{schema_name}}.segments VALUES (1, 3, 4, '2026-11-30 23:12:30.587529+00', '\x00250000000201a22ebb356c76e0909a1b8212a4799d0a706c61696e2f70312f33010169013370312d33250000000201a22ebb356c76e1a1d693e2c67c60230a706c61696e2f70312f34010169013470312d34', 0);
INSERT INTO {{schema_name}}.segments VALUES (2, 0, 2, '2026-11-30 23:12:30.598126+00', '\x00250000000201a22ebb35827274a256a6cad346acd30a706c61696e2f70322f30010169013070322d30250000000201a22ebb35827275bf80ed3b3e548d270a706c61696e2f70322f31010169013170322d31250000000201a22ebb3582727689eeb38c9f30153c0a706c61696e2f70322f32010169013270322d32', 0);
INSERT INTO {{schema_name}}.segments VALUES (2, 3, 4, '2026-11-30 23:12:30.6023+00', '\x00250000000201a22ebb358775d1b8e586958eea63480a706c61696e2f70322f33010169013370322d33250000000201a22ebb358775d28a42aa4cb8628e380a706c61696e2f70322f34010169013470322d34', 0);
INSERT INTO {{schema_name}}.segments VALUES (3, 0, 2, '2026-11-30 23:12:30.605644+00', '\x00250000000201a22ebb358c73199ae570f6326d2f210a706c61696e2f70332f30010169013070332d30250000000201a22ebb358c731a92a2f101e0f1b1c60a706c61696e2f70332f31010169013170332d31250000000201a22ebb358c731b85c90b403c0f7e630a706c61696e2f70332f32010169013270332d32', 0);
INSERT INTO {{schema_name}}.segments VALUES (3, 3, 4, '2026-11-30 23:12:30.607339+00', '\x00250000000201a22ebb358e71e7b98e34167258d3990a706c61696e2f70332f33010169013370332d33250000000201a22ebb358e71e89c02cc7f4690db1a0a706c61696e2f70332f34010169013470332d34', 0);
INSERT INTO {{schema_name}}.segments VALUES (4, 0, 3, '2026-11-30 23:12:30.608861+00', '\x00470000000301a22ebb35907161a860ddbdb81a2e2d0b7365637265742f65312f30010169013001ef9e13e9e379c25365145445b385452c4bcf814fedd4e2cba6d938b44eaa7d0f4722be7f470000000301a22ebb35907162951edcb5eca063ef0b7365637265742f65312f31010169013101ef9e13e93a91ad5ab5f3e049faa24358a7cc5f2eac9713ceb17c2d314b37de64427e139f470000000301a22ebb35907163ae5cbe2ab8d433cb0b7365637265742f65312f32010169013201ef9e13e9eaa4f0dd1367323958eeeea3af400a172f3aec20b22411f7a70c7da5a0fc56eb470000000301a22ebb35907164bb6f439b55c0acc90b7365637265742f65312f33010169013301ef9e13e94aeb9324bb160098ce561a96e62ae346132205db3defc8e5a5024a1d740c3731', 0);
INSERT INTO {{schema_name}}.segments VALUES (5, 0, 0, '2026-11-30 23:12:30.609963+00', '\x003f0000000401a22ebb359170da836fa84e85e6c7cb2430316132326562622d333539312d373064612d383336662d613834653835653663376362026b306b65792d6b30', 0);
INSERT INTO {{schema_name}}.segments VALUES (6, 0, 0, '2026-11-30 23:12:30.610633+00', '\x003f0000000401a22ebb35927733b93fe26910bb724f2430316132326562622d333539322d373733332d623933662d653236393130626237323466026b316b65792d6b31', 0);
INSERT INTO {{schema_name}}.segments VALUES (6, 1, 1, '2026-11-30 23:12:30.611044+00', '\x003f0000000401a22ebb3592773497d5dfd6f2fb15062430316132326562622d333539322d373733342d393764352d646664366632666231353036026b326b65792d6b32', 0);
INSERT INTO {{schema_name}}.segments VALUES (7, 0, 0, '2026-11-30 23:12:30.612367+00', '\x003f0000000401a22ebb359371328f9937f60c158f4c2430316132326562622d333539332d373133322d386639392d333766363063313538663463026b336b65792d6b33', 0);
INSERT INTO {{schema_name}}.segments VALUES (5, 1, 1, '2026-11-30 23:12:30.612996+00', '\x003f0000000401a22ebb35947466a8f5fd973ac4e2b72430316132326562622d333539342d373436362d613866352d666439373361633465326237026b346b65792d6b34', 0);
INSERT INTO {{schema_name}}.segments VALUES (7, 1, 1, '2026-11-30 23:12:30.613742+00', '\x003f0000000401a22ebb359570f0833eddfbedea72462430316132326562622d333539352d373066302d383333652d646466626564656137323436026b356b65792d6b35', 0);
INSERT INTO {{schema_name}}.segments VALUES (8, 0, 0, '2026-11-30 23:12:30.614541+00', '\x003f0000000401a22ebb359676fbbd1f6d5a297d07ad2430316132326562622d333539362d373666622d626431662d366435613239376430376164026b366b65792d6b36', 0);
INSERT INTO {{schema_name}}.segments VALUES (6, 2, 2, '2026-11-30 23:12:30.614951+00', '\x003f0000000401a22ebb359676fcaced50f9a369d2bc2430316132326562622d333539362d373666632d616365642d353066396133363964326263026b376b65792d6b37', 0);


--
-- Data for Name: settings; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.settings VALUES (true, false, '2026-11-30 23:12:30.551591+00');


--
-- Data for Name: subscriptions; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.subscriptions VALUES (1, 'g1', 'all', NULL, '2026-11-30 23:12:30.617528+00', NULL);


--
-- Data for Name: txns; Type: TABLE DATA; Schema: {{schema_name}}; Owner: -
--

INSERT INTO {{schema_name}}.txns VALUES (1, 0, 2, '2026-11-30 23:12:30.570585+00', '\x98d209f17ccdc02e7964f11ea5469def0e2f5f9da809702cb5f6ddba45c6f6f86003449cfcd2e6e560c2a84937736607');
INSERT INTO {{schema_name}}.txns VALUES (1, 3, 4, '2026-11-30 23:12:30.587529+00', '\x499a12763447562478e38bd232432cebfe88d77add4dca7437f56fc1de734fe3');
INSERT INTO {{schema_name}}.txns VALUES (2, 0, 2, '2026-11-30 23:12:30.598126+00', '\xa5184bd42a4f34750afd562e716a4bc87f0c681b44d1420afda7eab91999b1ef8fd450374fd35b0841b2efef73a0cae1');
INSERT INTO {{schema_name}}.txns VALUES (2, 3, 4, '2026-11-30 23:12:30.6023+00', '\x2a56bd4c1c402f98c7f9a1a8241eed6ade85154a80d836aba46db27ddfd38272');
INSERT INTO {{schema_name}}.txns VALUES (3, 0, 2, '2026-11-30 23:12:30.605644+00', '\x92ad23dc87f26c24fb0ac9ee576a6c8c6f204e7b1031dd5c1fc1a4b1034b92b03f0399b59c82e5adb0796fa04cce9cee');
INSERT INTO {{schema_name}}.txns VALUES (3, 3, 4, '2026-11-30 23:12:30.607339+00', '\xbf9b71f2c11265336453003e1e646f2efcd410c7cf7474d6693f0ddbb06ba75b');
INSERT INTO {{schema_name}}.txns VALUES (4, 0, 3, '2026-11-30 23:12:30.608861+00', '\x3dec08c63df7a436f8ca1144930c74619d916bf578c4cd0f49364230aaab7a503354b0cfbe55ea4b80fa14089a59d39d4663ca7291537cc8263d1635d15d2dd7');
INSERT INTO {{schema_name}}.txns VALUES (5, 0, 0, '2026-11-30 23:12:30.609963+00', '\x98674286c04b4440b697a5bd839fb8fa');
INSERT INTO {{schema_name}}.txns VALUES (6, 0, 0, '2026-11-30 23:12:30.610633+00', '\x149bcb5c57b2bff08edebedef9d32159');
INSERT INTO {{schema_name}}.txns VALUES (6, 1, 1, '2026-11-30 23:12:30.611044+00', '\x5fa0ca2a614579fe4b65272a7d4d6541');
INSERT INTO {{schema_name}}.txns VALUES (7, 0, 0, '2026-11-30 23:12:30.612367+00', '\xc5af13e59fc43275681984504332871a');
INSERT INTO {{schema_name}}.txns VALUES (5, 1, 1, '2026-11-30 23:12:30.612996+00', '\x64fa2049dadecfe6fdb747d53cd6de4c');
INSERT INTO {{schema_name}}.txns VALUES (7, 1, 1, '2026-11-30 23:12:30.613742+00', '\xcc514ded58d3a4e195579cb30b807d87');
INSERT INTO {{schema_name}}.txns VALUES (8, 0, 0, '2026-11-30 23:12:30.614541+00', '\xd9994733c1326b9a9575664e642a89ab');
INSERT INTO {{schema_name}}.txns VALUES (6, 2, 2, '2026-11-30 23:12:30.614951+00', '\x1f9553e6791a5f6fb9dab9559d13de28');


--
-- Name: dead_letters_id_seq; Type: SEQUENCE SET; Schema: {{schema_name}}; Owner: -
--

SELECT pg_catalog.setval('{{schema_name}}.dead_letters_id_seq', 1, true);


--
-- Name: partitions_id_seq; Type: SEQUENCE SET; Schema: {{schema_name}}; Owner: -
--

SELECT pg_catalog.setval('{{schema_name}}.partitions_id_seq', 8, true);


--
-- Name: queues_id_seq; Type: SEQUENCE SET; Schema: {{schema_name}}; Owner: -
--

SELECT pg_catalog.setval('{{schema_name}}.queues_id_seq', 11, true);


--
-- Name: backlog backlog_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.backlog
    ADD CONSTRAINT backlog_pkey PRIMARY KEY (queue_id, group_name, partition_id);


--
-- Name: consumers consumers_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.consumers
    ADD CONSTRAINT consumers_pkey PRIMARY KEY (partition_id, group_name);


--
-- Name: dead_letters dead_letters_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.dead_letters
    ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (id);


--
-- Name: partitions partitions_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.partitions
    ADD CONSTRAINT partitions_pkey PRIMARY KEY (id);


--
-- Name: partitions partitions_queue_name_key; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.partitions
    ADD CONSTRAINT partitions_queue_name_key UNIQUE (queue_id, name);


--
-- Name: paused_groups paused_groups_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.paused_groups
    ADD CONSTRAINT paused_groups_pkey PRIMARY KEY (queue_id, group_name);


--
-- Name: queues queues_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.queues
    ADD CONSTRAINT queues_pkey PRIMARY KEY (id);


--
-- Name: queues queues_tenant_name_key; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.queues
    ADD CONSTRAINT queues_tenant_name_key UNIQUE (tenant, name);


--
-- Name: schema_migrations schema_migrations_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);


--
-- Name: segments segments_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.segments
    ADD CONSTRAINT segments_pkey PRIMARY KEY (partition_id, base_offset);


--
-- Name: settings settings_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.settings
    ADD CONSTRAINT settings_pkey PRIMARY KEY (id);


--
-- Name: subscriptions subscriptions_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.subscriptions
    ADD CONSTRAINT subscriptions_pkey PRIMARY KEY (queue_id, group_name);


--
-- Name: txns txns_pkey; Type: CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.txns
    ADD CONSTRAINT txns_pkey PRIMARY KEY (partition_id, base_offset);


--
-- Name: backlog_partition_idx; Type: INDEX; Schema: {{schema_name}}; Owner: -
--

CREATE INDEX backlog_partition_idx ON {{schema_name}}.backlog USING btree (partition_id);


--
-- Name: dead_letters_queue_created_idx; Type: INDEX; Schema: {{schema_name}}; Owner: -
--

CREATE INDEX dead_letters_queue_created_idx ON {{schema_name}}.dead_letters USING btree (queue_id, created_at);


--
-- Name: dead_letters_queue_id_idx; Type: INDEX; Schema: {{schema_name}}; Owner: -
--

CREATE INDEX dead_letters_queue_id_idx ON {{schema_name}}.dead_letters USING btree (queue_id, id);


--
-- Name: partitions_pending_idx; Type: INDEX; Schema: {{schema_name}}; Owner: -
--

CREATE INDEX partitions_pending_idx ON {{schema_name}}.partitions USING btree (queue_id, id) WHERE pending;


--
-- Name: backlog backlog_partition_id_fkey; Type: FK CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.backlog
    ADD CONSTRAINT backlog_partition_id_fkey FOREIGN KEY (partition_id) REFERENCES {{schema_name}}.partitions(id) ON DELETE CASCADE;


--
-- Name: consumers consumers_partition_id_fkey; Type: FK CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.consumers
    ADD CONSTRAINT consumers_partition_id_fkey FOREIGN KEY (partition_id) REFERENCES {{schema_name}}.partitions(id) ON DELETE CASCADE;


--
-- Name: dead_letters dead_letters_queue_id_fkey; Type: FK CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.dead_letters
    ADD CONSTRAINT dead_letters_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES {{schema_name}}.queues(id) ON DELETE CASCADE;


--
-- Name: partitions partitions_queue_id_fkey; Type: FK CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.partitions
    ADD CONSTRAINT partitions_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES {{schema_name}}.queues(id) ON DELETE CASCADE;


--
-- Name: paused_groups paused_groups_queue_id_fkey; Type: FK CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.paused_groups
    ADD CONSTRAINT paused_groups_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES {{schema_name}}.queues(id) ON DELETE CASCADE;


--
-- Name: subscriptions subscriptions_queue_id_fkey; Type: FK CONSTRAINT; Schema: {{schema_name}}; Owner: -
--

ALTER TABLE ONLY {{schema_name}}.subscriptions
    ADD CONSTRAINT subscriptions_queue_id_fkey FOREIGN KEY (queue_id) REFERENCES {{schema_name}}.queues(id) ON DELETE CASCADE;


--
-- PostgreSQL database dump complete
--


