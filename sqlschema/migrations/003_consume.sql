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
    blob             bytea
);

-- Seeds the consumer rows a group lacks on queue p_qid (only partition
-- p_pid when not NULL), from the group's stored subscription. Returns false
-- when another session holds the seeding lock: the caller retries later and
-- never waits. The insert is ordered on the key, so it cannot convoy.
CREATE FUNCTION {{schema}}.seed_consumers(p_qid bigint, p_group text, p_mode text, p_from timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_mode text;
    v_from timestamptz;
    v_since timestamptz;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/seed/' || p_qid || '/' || p_group, 0)) THEN
        RETURN false;
    END IF;
    -- Queue mode always starts at the oldest retained message.
    IF p_group = '' THEN
        p_mode := 'all';
    END IF;
    -- First contact stores the choice; later calls reuse the stored one.
    INSERT INTO {{schema}}.subscriptions (queue_id, group_name, mode, from_time)
    VALUES (p_qid, p_group, p_mode, p_from)
    ON CONFLICT DO NOTHING;
    SELECT mode, from_time, created_at INTO v_mode, v_from, v_since
    FROM {{schema}}.subscriptions WHERE queue_id = p_qid AND group_name = p_group;

    -- Partitions created after the subscription are read from their start,
    -- whatever the mode: "new" means new to the group, not only new offsets.
    INSERT INTO {{schema}}.consumers (partition_id, group_name, committed)
    SELECT p.id, p_group,
           CASE
               WHEN v_mode = 'all' OR p.created_at >= v_since THEN p.log_start - 1
               WHEN v_mode = 'new' THEN p.last_offset
               ELSE coalesce((SELECT min(s.base_offset) FROM {{schema}}.segments s
                              WHERE s.partition_id = p.id AND s.created_at >= v_from), p.last_offset + 1) - 1
           END
    FROM {{schema}}.partitions p
    WHERE p.queue_id = p_qid
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.consumers c
                      WHERE c.partition_id = p.id AND c.group_name = p_group)
    ORDER BY p.id
    ON CONFLICT DO NOTHING;
    RETURN true;
END
$$;

-- Claims up to p_partitions lease-free partitions of a queue for a group
-- (SKIP LOCKED: never waits), takes up to p_batch messages across them in
-- claim order, writes each lease (or, with p_auto_ack, commits the cursor)
-- and returns the segments that hold the messages. p_partition NULL means
-- any partition; p_hints are tried first. p_lease_ms <= 0 means the queue's.
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
    p_from       timestamptz
) RETURNS SETOF {{schema}}.pop_row
LANGUAGE plpgsql
-- Array-driven statements would otherwise be re-planned on every call.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_q        record;
    v_c        record;
    v_left     integer := p_batch;
    v_now      timestamptz := clock_timestamp();
    v_cutoff   timestamptz;
    v_start    bigint;
    v_end      bigint;
    v_seg_lo   bigint;
    v_vis      bigint;
    v_lease    uuid;
    v_expires  timestamptz;
    v_deliv    integer;
BEGIN
    SELECT id, lease_time_ms, delayed_processing_ms, window_buffer_ms INTO v_q
    FROM {{schema}}.queues WHERE tenant = p_tenant AND name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_lease_ms <= 0 THEN
        p_lease_ms := v_q.lease_time_ms;
    END IF;
    v_cutoff := v_now - v_q.delayed_processing_ms * interval '1 millisecond';

    -- Consumer rows are created on first contact and for partitions that
    -- appeared since, never by an upsert per pop. The probe is read-only.
    IF EXISTS (SELECT 1 FROM {{schema}}.partitions p
               WHERE p.queue_id = v_q.id AND (p_partition IS NULL OR p.name = p_partition)
                 AND NOT EXISTS (SELECT 1 FROM {{schema}}.consumers cx
                                 WHERE cx.partition_id = p.id AND cx.group_name = p_group)) THEN
        PERFORM {{schema}}.seed_consumers(v_q.id, p_group, p_mode, p_from);
    END IF;

    FOR v_c IN
        SELECT cc.partition_id, p.name, cc.committed, cc.deliveries, cc.delivered_max,
               p.last_offset, p.log_start
        FROM {{schema}}.consumers cc
        JOIN {{schema}}.partitions p ON p.id = cc.partition_id
        WHERE p.queue_id = v_q.id AND cc.group_name = p_group
          AND (p_partition IS NULL OR p.name = p_partition)
          AND p.last_offset > cc.committed
          AND (cc.batch_end IS NULL OR cc.lease_expires_at <= v_now)
          AND (v_q.window_buffer_ms = 0 OR coalesce(
                (SELECT s.created_at FROM {{schema}}.segments s WHERE s.partition_id = p.id
                 ORDER BY s.base_offset DESC LIMIT 1), '-infinity')
                <= v_now - v_q.window_buffer_ms * interval '1 millisecond')
        ORDER BY (p.name = ANY (p_hints)) DESC, cc.updated_at, cc.partition_id
        LIMIT p_partitions
        FOR UPDATE OF cc SKIP LOCKED
    LOOP
        EXIT WHEN v_left <= 0;
        v_start := greatest(v_c.committed + 1, v_c.log_start);
        v_end := least(v_c.last_offset, v_start + v_left - 1);
        v_seg_lo := coalesce((SELECT max(s.base_offset) FROM {{schema}}.segments s
                              WHERE s.partition_id = v_c.partition_id AND s.base_offset <= v_start), v_start);
        IF v_q.delayed_processing_ms > 0 THEN
            -- created_at is monotone in offset order: the visible part is a prefix.
            SELECT max(s.end_offset) INTO v_vis FROM {{schema}}.segments s
            WHERE s.partition_id = v_c.partition_id AND s.base_offset BETWEEN v_seg_lo AND v_end
              AND s.created_at <= v_cutoff;
            v_end := least(v_end, coalesce(v_vis, v_start - 1));
        END IF;
        CONTINUE WHEN v_end < v_start;
        v_left := v_left - (v_end - v_start + 1)::integer;

        IF p_auto_ack THEN
            UPDATE {{schema}}.consumers SET committed = v_end, batch_end = NULL, lease_id = NULL,
                lease_owner = NULL, lease_expires_at = NULL, attempts = 0, deliveries = 0,
                delivered_max = greatest(delivered_max, v_end), updated_at = v_now
            WHERE partition_id = v_c.partition_id AND group_name = p_group;
            v_lease := NULL;
            v_expires := NULL;
            v_deliv := v_c.deliveries + 1;
        ELSE
            v_lease := gen_random_uuid();
            v_expires := v_now + p_lease_ms * interval '1 millisecond';
            -- A jump over retained-away offsets moves the cursor with it.
            UPDATE {{schema}}.consumers SET committed = v_start - 1, batch_end = v_end,
                lease_id = v_lease, lease_owner = p_owner, lease_expires_at = v_expires,
                deliveries = CASE WHEN committed = v_start - 1 THEN deliveries + 1 ELSE 1 END,
                attempts = CASE WHEN committed = v_start - 1 THEN attempts ELSE 0 END,
                delivered_max = greatest(delivered_max, v_end), updated_at = v_now
            WHERE partition_id = v_c.partition_id AND group_name = p_group
            RETURNING deliveries INTO v_deliv;
        END IF;

        RETURN QUERY
        SELECT v_c.partition_id, v_c.name, v_lease, v_expires, p_lease_ms, v_start, v_end, v_deliv, v_c.delivered_max,
               s.base_offset, s.end_offset, s.created_at, s.blob
        FROM {{schema}}.segments s
        WHERE s.partition_id = v_c.partition_id AND s.base_offset BETWEEN v_seg_lo AND v_end
        ORDER BY s.base_offset;
    END LOOP;
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

-- Settles many leases in one transaction. Per input i: commit the cursor
-- through p_ok[i] (-1: nothing), then apply p_act[i] to offset p_act_off[i]:
-- 0 none, 1 fail (charge the budget, release: redelivered from that
-- offset, or dead-lettered/dropped when exhausted), 2 retry (release, no
-- charge), 3 dead-letter now. p_release[i] releases the lease even when
-- messages of it remain. The p_dl_* arrays snapshot the acted-on message
-- for a dead letter. Rows are locked in ascending (partition id, group).
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
    p_dl_created timestamptz[]
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql
-- Array-driven statements would otherwise be re-planned on every call.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n       integer := coalesce(cardinality(p_pids), 0);
    i       integer;
    v_c     record;
    v_now   timestamptz := clock_timestamp();
    v_comm  bigint;
    v_att   integer;
    v_rel   boolean;
    v_dl    boolean;
    v_spent integer;
    v_st    smallint;
    v_res   {{schema}}.settle_result[];
BEGIN
    IF coalesce(cardinality(p_groups), 0) <> n OR coalesce(cardinality(p_leases), 0) <> n
       OR coalesce(cardinality(p_ok), 0) <> n OR coalesce(cardinality(p_act), 0) <> n
       OR coalesce(cardinality(p_act_off), 0) <> n OR coalesce(cardinality(p_release), 0) <> n
       OR coalesce(cardinality(p_reasons), 0) <> n OR coalesce(cardinality(p_dl_ids), 0) <> n
       OR coalesce(cardinality(p_dl_txns), 0) <> n OR coalesce(cardinality(p_dl_flags), 0) <> n
       OR coalesce(cardinality(p_dl_payload), 0) <> n OR coalesce(cardinality(p_dl_created), 0) <> n THEN
        RAISE EXCEPTION 'queen: settle arrays are not aligned';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;

    FOR i IN SELECT o FROM unnest(p_pids, p_groups) WITH ORDINALITY AS x(pid, g, o) ORDER BY pid, g, o LOOP
        SELECT cc.committed, cc.batch_end, cc.lease_id, cc.lease_expires_at, cc.attempts,
               p.name AS partition_name, qq.id AS queue_id, qq.retry_limit, qq.dead_letter
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
        v_st := 0;
        IF p_act[i] IN (1, 2) THEN
            -- Everything before the acted-on message is done; redelivery
            -- starts at it.
            v_comm := greatest(v_comm, p_act_off[i] - 1);
            v_rel := true;
        END IF;
        IF v_comm > v_c.committed THEN
            v_att := 0;
        END IF;
        v_spent := v_att;
        IF p_act[i] = 1 THEN
            v_att := v_att + 1;
            v_spent := v_att;
            IF v_att >= greatest(v_c.retry_limit, 1) THEN
                v_comm := p_act_off[i];
                v_att := 0;
                v_dl := v_c.dead_letter;
                v_st := CASE WHEN v_c.dead_letter THEN 3 ELSE 4 END;
            END IF;
        ELSIF p_act[i] = 3 THEN
            v_comm := p_act_off[i];
            v_att := 0;
            v_dl := true;
            v_st := 3;
        END IF;
        IF v_comm >= v_c.batch_end THEN
            v_rel := true;
        END IF;

        UPDATE {{schema}}.consumers SET
            committed        = v_comm,
            attempts         = v_att,
            -- A new head that was leased before has had one delivery.
            deliveries       = CASE WHEN v_comm = v_c.committed THEN deliveries
                                    WHEN v_comm < delivered_max THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN v_rel THEN NULL ELSE batch_end END,
            lease_id         = CASE WHEN v_rel THEN NULL ELSE lease_id END,
            lease_owner      = CASE WHEN v_rel THEN NULL ELSE lease_owner END,
            lease_expires_at = CASE WHEN v_rel THEN NULL ELSE lease_expires_at END,
            updated_at       = v_now
        WHERE partition_id = p_pids[i] AND group_name = p_groups[i];

        IF v_dl THEN
            INSERT INTO {{schema}}.dead_letters (queue_id, partition_id, partition_name, group_name,
                msg_offset, message_id, transaction_id, flags, payload, message_created_at, attempts, reason)
            VALUES (v_c.queue_id, p_pids[i], v_c.partition_name, p_groups[i], p_act_off[i], p_dl_ids[i],
                p_dl_txns[i], p_dl_flags[i], p_dl_payload[i], p_dl_created[i],
                v_spent, p_reasons[i]);
        END IF;
        v_res[i] := ROW(i, v_st, v_comm);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_res) ORDER BY 1;
END
$$;

-- The common case of ack fusion, set-based: pure acks (commit the cursor
-- through p_ok under lease p_leases), at most one per (partition, group).
-- Same verdicts as settle for such inputs, but one locking read and one
-- update for the whole batch instead of a loop of statements per ack.
CREATE FUNCTION {{schema}}.ack_many(
    p_pids   bigint[],
    p_groups text[],
    p_leases uuid[],
    p_ok     bigint[]
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql
-- PL/pgSQL caches the plan; a SQL function would plan it on every call.
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
    WITH o AS (
        SELECT * FROM unnest(p_pids, p_groups, p_leases, p_ok) WITH ORDINALITY AS o(pid, g, lease, ok, ord)
    ), l AS (
        -- Consumer rows in ascending (partition id, group): the lock order.
        SELECT c.partition_id, c.group_name, c.committed, c.batch_end, c.lease_id, c.lease_expires_at
        FROM {{schema}}.consumers c
        WHERE (c.partition_id, c.group_name) IN (SELECT pid, g FROM o)
        ORDER BY c.partition_id, c.group_name
        FOR UPDATE
    ), v AS (
        SELECT o.ord, o.pid, o.g, o.ok, l.committed, l.batch_end,
               CASE WHEN l.partition_id IS NULL THEN 5
                    WHEN o.ok <= l.committed THEN 1
                    WHEN l.lease_id IS DISTINCT FROM o.lease OR l.lease_expires_at <= clock_timestamp()
                         OR o.ok > l.batch_end THEN 2
                    ELSE 0 END AS st
        FROM o LEFT JOIN l ON l.partition_id = o.pid AND l.group_name = o.g
    ), u AS (
        UPDATE {{schema}}.consumers c SET
            committed        = v.ok,
            attempts         = 0,
            deliveries       = CASE WHEN v.ok < c.delivered_max THEN 1 ELSE 0 END,
            batch_end        = CASE WHEN v.ok >= c.batch_end THEN NULL ELSE c.batch_end END,
            lease_id         = CASE WHEN v.ok >= c.batch_end THEN NULL ELSE c.lease_id END,
            lease_owner      = CASE WHEN v.ok >= c.batch_end THEN NULL ELSE c.lease_owner END,
            lease_expires_at = CASE WHEN v.ok >= c.batch_end THEN NULL ELSE c.lease_expires_at END,
            updated_at       = clock_timestamp()
        FROM v
        WHERE v.st = 0 AND c.partition_id = v.pid AND c.group_name = v.g
        RETURNING c.partition_id
    )
    SELECT v.ord::integer, v.st::smallint, CASE WHEN v.st = 0 THEN v.ok ELSE v.committed END
    FROM v ORDER BY v.ord;
END
$$;
