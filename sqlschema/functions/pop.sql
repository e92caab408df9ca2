-- Claiming: the ready set's clearing, pop and its steps, and the dead-lettering of undecodable claims.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- Upkeep of the ready set for partitions p_pids after a pop of group
-- p_group consumed them. Each that is pending: every subscribed group
-- behind on it (a group without a cursor row there counts from where that
-- row would start) gets a backlog row, and the flag is cleared. Then
-- p_group's own backlog row of each goes if p_group has consumed
-- everything retained. Never waits: a partition someone holds (a push in
-- flight) is skipped, and so is every pending partition of a queue on
-- which a group's first contact is in progress (it holds the queue's
-- contact lock exclusively until it commits; its subscription is not
-- visible yet, so it would get no backlog row). The partitions are locked
-- first, in one statement; each check after is a statement of its own, so
-- its snapshot is taken after the locks: a push cannot commit in between,
-- and every committed group is seen. One pass over all the partitions, not
-- a call for each: a drain of many keys passed dozens to every pop, and a
-- call each (its statements, its locks one at a time) was the largest
-- single cost of such a pop. On the routed layout (p_routed, the
-- settings' flag as the caller read it), clear_pending_routed for each.
-- Returns how many partitions left the ready set or p_group's backlog. No
-- SET clauses: its callers' hold (keyed lookups).
CREATE OR REPLACE FUNCTION {{schema}}.clear_pending_many(p_pids bigint[], p_group text, p_routed boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_ids   bigint[]; -- locked
    v_pend  bigint[]; -- locked and pending
    v_pq    bigint[]; -- their queues
    v_q     bigint;
    v_skip  bigint[] := '{}'; -- queues whose contact lock is taken
    v_drop  bigint[];         -- their pending partitions
    v_n     integer := 0;
    v_d     integer;
BEGIN
    IF coalesce(cardinality(p_pids), 0) = 0 THEN
        RETURN 0;
    END IF;
    IF p_routed THEN
        FOREACH v_q IN ARRAY p_pids LOOP
            IF {{schema}}.clear_pending_routed(v_q, p_group) THEN
                v_n := v_n + 1;
            END IF;
        END LOOP;
        RETURN v_n;
    END IF;
    SELECT array_agg(x.id ORDER BY x.id), array_agg(x.id ORDER BY x.id) FILTER (WHERE x.pending),
           array_agg(x.queue_id ORDER BY x.id) FILTER (WHERE x.pending)
    INTO v_ids, v_pend, v_pq
    FROM (SELECT p.id, p.pending, p.queue_id FROM {{schema}}.partitions p
          WHERE p.id = ANY (p_pids) ORDER BY p.id
          FOR NO KEY UPDATE SKIP LOCKED) x;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    IF v_pend IS NOT NULL THEN
        FOR v_q IN SELECT DISTINCT u.q FROM unnest(v_pq) AS u(q) LOOP
            IF NOT pg_try_advisory_xact_lock_shared(hashtextextended('queen/{{schema_name}}/contact/' || v_q, 0)) THEN
                v_skip := v_skip || v_q;
            END IF;
        END LOOP;
        IF cardinality(v_skip) > 0 THEN
            -- Left as they are, their backlog rows too.
            v_drop := ARRAY(SELECT u.id FROM unnest(v_pend, v_pq) AS u(id, q) WHERE u.q = ANY (v_skip));
            v_ids := ARRAY(SELECT i FROM unnest(v_ids) AS i WHERE NOT i = ANY (v_drop));
            v_pend := ARRAY(SELECT i FROM unnest(v_pend) AS i WHERE NOT i = ANY (v_drop));
        END IF;
    END IF;
    IF cardinality(v_pend) > 0 THEN
        INSERT INTO {{schema}}.backlog (queue_id, group_name, partition_id)
        SELECT s.queue_id, s.group_name, p.id
        FROM {{schema}}.partitions p
        JOIN {{schema}}.subscriptions s ON s.queue_id = p.queue_id
        LEFT JOIN LATERAL (SELECT c.committed FROM {{schema}}.consumers c
                           WHERE c.partition_id = p.id AND c.group_name = s.group_name LIMIT 1) c ON true
        WHERE p.id = ANY (v_pend) AND p.last_offset >= p.log_start
          AND coalesce(c.committed, {{schema}}.seed_offset(p.id, p.log_start, p.created_at, s.mode, s.created_at,
                                                           s.from_time)) < p.last_offset
        ORDER BY s.queue_id, s.group_name, p.id
        ON CONFLICT DO NOTHING;
        UPDATE {{schema}}.partitions SET pending = false WHERE id = ANY (v_pend);
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    IF cardinality(v_ids) > 0 THEN
        DELETE FROM {{schema}}.backlog b
        USING {{schema}}.partitions p
        WHERE b.partition_id = ANY (v_ids) AND b.group_name = p_group AND p.id = b.partition_id
          AND b.queue_id = p.queue_id
          AND (p.last_offset < p.log_start
               OR EXISTS (SELECT 1 FROM {{schema}}.consumers c
                          WHERE c.partition_id = p.id AND c.group_name = p_group AND c.committed >= p.last_offset
                          OFFSET 0));
        GET DIAGNOSTICS v_d = ROW_COUNT;
        v_n := v_n + v_d;
    END IF;
    RETURN v_n;
END
$$;

-- clear_pending_many for one partition, under the name the first
-- migrations gave the clear (linger_ack passes the flag it read instead).
CREATE OR REPLACE FUNCTION {{schema}}.clear_pending(p_pid bigint, p_group text)
RETURNS boolean
LANGUAGE sql AS $$
    SELECT {{schema}}.clear_pending_many(ARRAY[p_pid], p_group,
                                         (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true)) > 0
$$;

-- pop is one call from the client; the steps it takes are functions of
-- their own, called only from pop (whose SET clauses they run under):
--
--   pop_first_contact  the group's subscription, or one more marking step
--   pop_window         which partitions this pass looks at
--   pop_ready          one read of the window: which are claimable
--   pop_claim          lock one cursor and size its claim
--   (pop itself)       read the claim's segments: the rows it returns
--   pop_take           write the claim to the cursor
--   pop_upkeep         the ready set's upkeep, last
--
-- A step holds whole statements, run in pop's order, and no decision
-- spans two steps: what one statement decides stays one statement (see
-- DESIGN.md, "Which snapshot each decision stands on"). The steps are
-- VOLATILE, so each of their statements takes its own snapshot, as a
-- statement of pop's own body does. pop assigns each step's result (never
-- PERFORM or SELECT ... FROM): a plain expression is evaluated without an
-- executor of its own, so a step costs its statements and a few µs for
-- the call; pop_upkeep is called only when it has partitions to look at.

-- First contact of group p_group with queue p_qid (bounded, see
-- seed_consumers), or one more step of its marking when no other pop of
-- the group is taking one. False: the queue was deleted since pop read it
-- (the first contact found no queue row), and pop claims nothing.
CREATE OR REPLACE FUNCTION {{schema}}.pop_first_contact(p_qid bigint, p_group text, p_mode text, p_from timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_after text;
BEGIN
    SELECT s.seed_after INTO v_after FROM {{schema}}.subscriptions s
    WHERE s.queue_id = p_qid AND s.group_name = p_group;
    IF NOT FOUND THEN
        RETURN {{schema}}.seed_consumers(p_qid, p_group, p_mode, p_from);
    ELSIF v_after IS NOT NULL
          AND pg_try_advisory_xact_lock(hashtextextended('queen/{{schema_name}}/seed/' || p_qid || '/' || p_group, 0)) THEN
        PERFORM {{schema}}.seed_chunk(p_qid, p_group);
    END IF;
    RETURN true;
END
$$;

-- The window pass p_pass of a pop looks at: partitions hinted (first pass
-- only), then up to p_win ids of the shared ready set (pending) and up to
-- p_win of this group's backlog, each from a random point, wrapping
-- around; the second pass drops what the first saw (p_seen). Never another
-- group's backlog, and never more than a window: a pop is O(window) even
-- when 100k keys have backlog, whichever group it is; the random start
-- spreads concurrent pops and is fair over time. The ids are read on their
-- own (the indexes are the only fit): in a join the planner may drive from
-- the group's consumer rows (every partition) when statistics are stale.
-- is_full: the ready set or the backlog had more than the window holds.
CREATE OR REPLACE FUNCTION {{schema}}.pop_window(p_qid bigint, p_group text, p_hints text[], p_pass integer,
                                               p_win integer, p_seen bigint[], OUT ids bigint[], OUT is_full boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_lo   bigint;
    v_hi   bigint;
    v_from bigint;
    v_n    integer;
BEGIN
    is_full := false;
    SELECT coalesce(array_agg(p.id), '{}') INTO ids
    FROM {{schema}}.partitions p
    WHERE p_pass = 1 AND p.queue_id = p_qid AND p.name = ANY (p_hints)
      AND (p.pending OR EXISTS (SELECT 1 FROM {{schema}}.backlog b
                                WHERE b.queue_id = p_qid AND b.group_name = p_group AND b.partition_id = p.id
                                OFFSET 0));
    -- queue_id as a range, ordered by (queue_id, id): only the partial
    -- index gives that order. With queue_id = a parameter the order is by
    -- id alone, and a generic plan walked the primary key filtering
    -- pending (it takes half the rows for pending), every partition of the
    -- schema when the set is small. Likewise for the backlog, whose
    -- partition_id index would otherwise give the order.
    v_lo := (SELECT p.id FROM {{schema}}.partitions p
             WHERE p.queue_id BETWEEN p_qid AND p_qid AND p.pending
             ORDER BY p.queue_id, p.id LIMIT 1);
    v_hi := (SELECT p.id FROM {{schema}}.partitions p
             WHERE p.queue_id BETWEEN p_qid AND p_qid AND p.pending
             ORDER BY p.queue_id DESC, p.id DESC LIMIT 1);
    IF v_lo IS NOT NULL THEN
        v_from := v_lo + floor(random() * (v_hi - v_lo + 1))::bigint;
        v_n := cardinality(ids);
        ids := ids || ARRAY(SELECT p.id FROM {{schema}}.partitions p
                            WHERE p.queue_id BETWEEN p_qid AND p_qid AND p.pending AND p.id >= v_from
                            ORDER BY p.queue_id, p.id LIMIT p_win);
        IF cardinality(ids) - v_n < p_win THEN
            ids := ids || ARRAY(SELECT p.id FROM {{schema}}.partitions p
                                WHERE p.queue_id BETWEEN p_qid AND p_qid AND p.pending AND p.id < v_from
                                ORDER BY p.queue_id, p.id LIMIT p_win - (cardinality(ids) - v_n));
        END IF;
        is_full := is_full OR cardinality(ids) - v_n >= p_win;
    END IF;
    v_lo := (SELECT b.partition_id FROM {{schema}}.backlog b
             WHERE b.queue_id BETWEEN p_qid AND p_qid AND b.group_name BETWEEN p_group AND p_group
             ORDER BY b.queue_id, b.group_name, b.partition_id LIMIT 1);
    v_hi := (SELECT b.partition_id FROM {{schema}}.backlog b
             WHERE b.queue_id BETWEEN p_qid AND p_qid AND b.group_name BETWEEN p_group AND p_group
             ORDER BY b.queue_id DESC, b.group_name DESC, b.partition_id DESC LIMIT 1);
    IF v_lo IS NOT NULL THEN
        v_from := v_lo + floor(random() * (v_hi - v_lo + 1))::bigint;
        v_n := cardinality(ids);
        ids := ids || ARRAY(SELECT b.partition_id FROM {{schema}}.backlog b
                            WHERE b.queue_id BETWEEN p_qid AND p_qid
                              AND b.group_name BETWEEN p_group AND p_group AND b.partition_id >= v_from
                            ORDER BY b.queue_id, b.group_name, b.partition_id LIMIT p_win);
        IF cardinality(ids) - v_n < p_win THEN
            ids := ids || ARRAY(SELECT b.partition_id FROM {{schema}}.backlog b
                                WHERE b.queue_id BETWEEN p_qid AND p_qid
                                  AND b.group_name BETWEEN p_group AND p_group AND b.partition_id < v_from
                                ORDER BY b.queue_id, b.group_name, b.partition_id
                                LIMIT p_win - (cardinality(ids) - v_n));
        END IF;
        is_full := is_full OR cardinality(ids) - v_n >= p_win;
    END IF;
    -- The second pass reads only what the first did not.
    IF p_pass = 2 THEN
        ids := ARRAY(SELECT u.id FROM unnest(ids) AS u(id) WHERE NOT (u.id = ANY (p_seen)));
    END IF;
END
$$;

-- What group p_group of queue p_qid can claim at p_now, up to p_win ids of
-- the ready set and as many of the group's backlog: partitions that hold
-- messages past the group's cursor (or that it has no cursor on yet), with
-- no live lease, no retry or parking still to wait. pop reads it only when
-- its windows claimed nothing and did not cover the set: read partitions
-- stay in the set until an upkeep finds them caught up (not within 2 s of
-- their last write), so windows of the set alone can miss the few a group
-- still lags on. A walk of the pending index, a cursor probe each.
CREATE OR REPLACE FUNCTION {{schema}}.lag_window(p_qid bigint, p_group text, p_win integer, p_now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
BEGIN
    RETURN ARRAY(SELECT p.id FROM {{schema}}.partitions p
                 LEFT JOIN {{schema}}.consumers c ON c.partition_id = p.id AND c.group_name = p_group
                 WHERE p.queue_id BETWEEN p_qid AND p_qid AND p.pending AND p.last_offset >= p.log_start
                   AND (c.partition_id IS NULL
                        OR (p.last_offset > c.committed
                            AND (c.batch_end IS NULL OR c.lease_expires_at <= p_now)
                            AND (c.retry_at IS NULL OR c.retry_at <= p_now)
                            AND (c.idle_until IS NULL OR c.idle_until <= p_now
                                 OR p.last_offset > coalesce(c.idle_seen, p.last_offset))))
                 ORDER BY p.queue_id, p.id LIMIT p_win)
        || ARRAY(SELECT b.partition_id FROM {{schema}}.backlog b
                 JOIN {{schema}}.partitions p ON p.id = b.partition_id
                 LEFT JOIN {{schema}}.consumers c ON c.partition_id = b.partition_id AND c.group_name = p_group
                 WHERE b.queue_id BETWEEN p_qid AND p_qid AND b.group_name BETWEEN p_group AND p_group
                   AND NOT p.pending AND p.last_offset >= p.log_start
                   AND (c.partition_id IS NULL
                        OR (p.last_offset > c.committed
                            AND (c.batch_end IS NULL OR c.lease_expires_at <= p_now)
                            AND (c.retry_at IS NULL OR c.retry_at <= p_now)
                            AND (c.idle_until IS NULL OR c.idle_until <= p_now
                                 OR p.last_offset > coalesce(c.idle_seen, p.last_offset))))
                 ORDER BY b.queue_id, b.group_name, b.partition_id LIMIT p_win);
END
$$;

-- One read of window p_ids for group p_group of queue p_qid (window
-- buffer p_window_ms, delay p_delay_ms): the claimable partitions (something
-- retained after the cursor, no live lease, the window buffer passed, the
-- head message visible at p_cutoff) in claim order, hinted first, and the
-- ones this group has consumed (caught: the only ones the ready-set upkeep
-- needs to look at). No locks. A partition of the window created since the
-- group's first contact has no cursor row yet: seeded, then the window is
-- read again. A parked partition (idle_until, see migration 14) is not
-- claimable until then or until messages past idle_seen arrive; one whose
-- head waits (wait_offs) only for a keyed claim (p_keyed).
CREATE OR REPLACE FUNCTION {{schema}}.pop_ready(p_qid bigint, p_window_ms bigint, p_delay_ms bigint,
                                              p_group text, p_mode text, p_from timestamptz, p_ids bigint[],
                                              p_hints text[], p_now timestamptz, p_cutoff timestamptz,
                                              p_keyed boolean, OUT cand bigint[], OUT caught bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_missing boolean;
    v_seed    integer;
BEGIN
    FOR v_seed IN 1 .. 2 LOOP
        SELECT coalesce(bool_or(x.missing), false),
               coalesce(array_agg(x.pid ORDER BY x.hinted DESC, x.upd, x.pid) FILTER (WHERE x.claimable), '{}'),
               coalesce(array_agg(x.pid) FILTER (WHERE x.caught), '{}')
        INTO v_missing, cand, caught
        FROM (SELECT p.id AS pid, (p.name = ANY (p_hints)) AS hinted, cc.updated_at AS upd,
                     cc.partition_id IS NULL AS missing,
                     -- Written to in the last second or so: it is likely to
                     -- be written again soon, so it stays in the ready set
                     -- (clearing it costs a partition write, and its next
                     -- push a non-HOT update to set it again).
                     ((p.last_offset < p.log_start OR cc.committed >= p.last_offset)
                      AND p.last_write_at < p_now - interval '2 seconds') AS caught,
                     (cc.partition_id IS NOT NULL
                      AND p.last_offset >= greatest(cc.committed + 1, p.log_start)
                      AND (cc.batch_end IS NULL OR cc.lease_expires_at <= p_now)
                      -- a failed head waiting out its retry backoff
                      AND (cc.retry_at IS NULL OR cc.retry_at <= p_now)
                      -- parked with waiting keys only
                      AND (cc.idle_until IS NULL OR cc.idle_until <= p_now
                           OR p.last_offset > coalesce(cc.idle_seen, p.last_offset))
                      AND (p_keyed OR cc.wait_offs IS NULL
                           OR NOT {{schema}}.head_waits(cc.wait_offs, cc.wait_at, cc.committed, cc.settled, p_now))
                      AND (p_window_ms = 0 OR coalesce(
                            (SELECT s.created_at FROM {{schema}}.segments s WHERE s.partition_id = p.id
                             ORDER BY s.base_offset DESC LIMIT 1), '-infinity')
                            <= p_now - p_window_ms * interval '1 millisecond')
                      AND (p_delay_ms = 0 OR coalesce(
                            (SELECT s.created_at FROM {{schema}}.segments s WHERE s.partition_id = p.id
                               AND s.base_offset <= greatest(cc.committed + 1, p.log_start)
                             ORDER BY s.base_offset DESC LIMIT 1), '-infinity') <= p_cutoff)) AS claimable
              FROM (SELECT DISTINCT id FROM unnest(p_ids) AS u(id)) AS r
              JOIN {{schema}}.partitions p ON p.id = r.id
              -- A keyed lookup per partition (LIMIT keeps the planner from
              -- flattening it): as a plain join, a generic plan cached while
              -- the table was small read every cursor of the group instead.
              LEFT JOIN LATERAL (SELECT c.partition_id, c.committed, c.batch_end, c.lease_expires_at, c.updated_at,
                                        c.retry_at, c.idle_until, c.idle_seen, c.wait_offs, c.wait_at, c.settled
                                 FROM {{schema}}.consumers c
                                 WHERE c.partition_id = r.id AND c.group_name = p_group
                                 LIMIT 1) cc ON true) x;
        EXIT WHEN NOT v_missing OR v_seed = 2;
        PERFORM {{schema}}.seed_consumers(p_qid, p_group, p_mode, p_from, p_ids);
    END LOOP;
END
$$;

-- Locks group p_group's cursor on partition p_pid if it is still
-- claimable (SKIP LOCKED: never waits), re-checking the lease and the
-- retry backoff (retry_at) on the locked row, and sizes the claim: from the cursor (past offsets settled
-- out of order) up to p_max messages, with p_delayed only the prefix
-- created by p_cutoff (created_at is monotone in offset order). seg_lo is
-- the base offset of the segment holding claim_first; log_end is the
-- partition's last offset. When only settled offsets
-- are left past a retention cut the cursor passes them, so the partition
-- is not claimable for nothing again. All NULL when nothing is claimed.
-- The row stays locked: nothing else moves the cursor until pop_take.
--
-- The claim takes p_max messages not settled out of order (claim_end;
-- while a wait holds, not waiting nor held behind one either), reaching
-- at most claim_reach past the cursor. The waits still holding
-- (wait_offs, see migration 14): a keyed claim (p_keyed, per-key
-- Consume) returns them in wait_offs / wait_at, and its client starts
-- neither those messages nor their keys' later ones; any other claim
-- ends before the first of them (it cannot tell keys apart), and takes
-- nothing when the head waits. seen is the last offset the claim saw when
-- it reached the partition's end (new messages past it could join a
-- claim), NULL when it stopped short (pop_take keeps it for parking).
CREATE OR REPLACE FUNCTION {{schema}}.pop_claim(
    p_pid bigint, p_group text, p_max integer, p_now timestamptz, p_delayed boolean, p_cutoff timestamptz,
    p_keyed boolean,
    OUT pid bigint, OUT part_name text, OUT committed bigint, OUT deliveries integer, OUT delivered_max bigint,
    OUT log_end bigint, OUT settled bigint[], OUT fail_offs bigint[], OUT fail_counts integer[],
    OUT attempts integer, OUT claim_first bigint, OUT claim_last bigint, OUT seg_lo bigint,
    OUT wait_offs bigint[], OUT wait_at timestamptz[], OUT seen bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_c     record;
    v_start bigint;
    v_end   bigint;
    v_lo    bigint;
    v_vis   bigint;
BEGIN
    SELECT cc.partition_id, p.name, cc.committed, cc.deliveries, cc.delivered_max,
           p.last_offset, p.log_start, cc.settled, cc.fail_offs, cc.fail_counts, cc.attempts,
           -- the CASEs keep the common case free of the helpers (SQL
           -- functions with subqueries are not inlined)
           CASE WHEN cc.wait_offs IS NOT NULL
                THEN {{schema}}.waits_live(cc.wait_offs, cc.wait_at, cc.committed, cc.settled, p_now) END AS wo,
           CASE WHEN cc.wait_offs IS NOT NULL
                THEN {{schema}}.waits_live_at(cc.wait_offs, cc.wait_at, cc.committed, cc.settled, p_now) END AS wa,
           cc.held_offs
    INTO v_c
    FROM {{schema}}.consumers cc
    JOIN {{schema}}.partitions p ON p.id = cc.partition_id
    WHERE cc.partition_id = p_pid AND p.id = p_pid AND cc.group_name = p_group
      AND p.last_offset >= greatest(cc.committed + 1, p.log_start)
      AND (cc.batch_end IS NULL OR cc.lease_expires_at <= p_now)
      AND (cc.retry_at IS NULL OR cc.retry_at <= p_now)
      AND (cc.idle_until IS NULL OR cc.idle_until <= p_now
           OR p.last_offset > coalesce(cc.idle_seen, p.last_offset))
    FOR UPDATE OF cc SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_start := greatest(v_c.committed + 1, v_c.log_start);
    IF v_c.settled IS NOT NULL THEN
        v_start := {{schema}}.settled_advance(v_start - 1, v_c.settled) + 1;
    END IF;
    -- Counted toward p_max: what may start. Settled messages do not, nor,
    -- while a wait holds, the waiting ones and those held behind them. The
    -- reach counts from the cursor, or from the retention cut when that
    -- passed it (nothing settled lies below the cut that matters).
    IF v_c.settled IS NULL AND v_c.wo IS NULL THEN
        v_end := v_start + p_max - 1;
    ELSE
        v_end := {{schema}}.claim_end(v_start, p_max,
            CASE WHEN v_c.wo IS NULL THEN v_c.settled
                 ELSE ARRAY(SELECT DISTINCT u.o FROM unnest(coalesce(v_c.settled, '{}') || v_c.wo
                                                            || coalesce(v_c.held_offs, '{}')) AS u(o)
                            ORDER BY u.o) END,
            greatest(v_c.committed, v_c.log_start - 1) + {{schema}}.claim_reach(p_max));
    END IF;
    seen := CASE WHEN v_end >= v_c.last_offset THEN v_c.last_offset END;
    v_end := least(v_c.last_offset, v_end);
    IF NOT p_keyed AND v_c.wo IS NOT NULL THEN
        -- Not keyed: up to the first waiting message only.
        v_end := least(v_end, (SELECT min(u.o) FROM unnest(v_c.wo) AS u(o) WHERE u.o >= v_start) - 1);
    END IF;
    v_lo := coalesce((SELECT max(s.base_offset) FROM {{schema}}.segments s
                      WHERE s.partition_id = v_c.partition_id AND s.base_offset <= v_start), v_start);
    IF p_delayed THEN
        SELECT max(s.end_offset) INTO v_vis FROM {{schema}}.segments s
        WHERE s.partition_id = v_c.partition_id AND s.base_offset BETWEEN v_lo AND v_end
          AND s.created_at <= p_cutoff;
        v_end := least(v_end, coalesce(v_vis, v_start - 1));
    END IF;
    IF v_end < v_start AND v_start - 1 > v_c.committed AND v_c.settled IS NOT NULL THEN
        UPDATE {{schema}}.consumers c SET committed = v_start - 1,
            settled = {{schema}}.offsets_above(c.settled, v_start - 1),
            attempts = {{schema}}.fail_at(c.fail_offs, c.fail_counts, v_start),
            fail_offs = {{schema}}.offsets_above(c.fail_offs, v_start),
            fail_counts = {{schema}}.fail_counts_above(c.fail_offs, c.fail_counts, v_start),
            deliveries = 0, updated_at = p_now
        WHERE c.partition_id = v_c.partition_id AND c.group_name = p_group;
    END IF;
    IF v_end < v_start THEN
        RETURN;
    END IF;
    pid := v_c.partition_id;
    part_name := v_c.name;
    committed := v_c.committed;
    deliveries := v_c.deliveries;
    delivered_max := v_c.delivered_max;
    log_end := v_c.last_offset;
    settled := v_c.settled;
    fail_offs := v_c.fail_offs;
    fail_counts := v_c.fail_counts;
    attempts := v_c.attempts;
    claim_first := v_start;
    claim_last := v_end;
    seg_lo := v_lo;
    IF p_keyed AND v_c.wo IS NOT NULL THEN
        SELECT array_agg(u.o ORDER BY u.o), array_agg(u.t ORDER BY u.o) INTO wait_offs, wait_at
        FROM unnest(v_c.wo, v_c.wa) AS u(o, t) WHERE u.o BETWEEN v_start AND v_end;
    END IF;
END
$$;

-- Writes a claim of [p_first, p_last] on partition p_pid, whose cursor row
-- (committed p_committed, settled p_settled) pop_claim locked, for group
-- p_group: with AutoAck (p_lease NULL) the cursor commits through it (and
-- past the settled run above), else the lease takes it (p_lease, p_owner,
-- p_expires, delivery p_deliv); failure counts and settled offsets left
-- below the new cursor go. A lease keeps p_seen (pop_claim's seen) in
-- idle_seen for a release that parks it; any claim ends a parking.
-- Whether the row was written.
CREATE OR REPLACE FUNCTION {{schema}}.pop_take(p_pid bigint, p_group text, p_first bigint, p_last bigint,
                                             p_settled bigint[], p_lease uuid, p_owner text,
                                             p_expires timestamptz, p_deliv integer, p_now timestamptz,
                                             p_seen bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_adv bigint;
BEGIN
    IF p_lease IS NULL THEN
        v_adv := p_last;
        IF p_settled IS NOT NULL THEN
            v_adv := {{schema}}.settled_advance(p_last, p_settled);
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
            delivered_max = greatest(delivered_max, p_last), retry_at = NULL,
            wait_at = CASE WHEN wait_offs IS NULL THEN NULL
                           ELSE {{schema}}.waits_live_at(wait_offs, wait_at, v_adv, settled, p_now) END,
            wait_offs = CASE WHEN wait_offs IS NULL THEN NULL
                             ELSE {{schema}}.waits_live(wait_offs, wait_at, v_adv, settled, p_now) END,
            held_offs = CASE WHEN held_offs IS NULL
                               OR {{schema}}.waits_live(wait_offs, wait_at, v_adv, settled, p_now) IS NULL THEN NULL
                             ELSE held_offs END,
            idle_until = NULL, idle_seen = NULL, updated_at = p_now
        WHERE partition_id = p_pid AND group_name = p_group;
    ELSE
        UPDATE {{schema}}.consumers SET committed = p_first - 1, batch_end = p_last,
            lease_id = p_lease, lease_owner = p_owner, lease_expires_at = p_expires,
            deliveries = p_deliv,
            attempts = CASE WHEN committed = p_first - 1 THEN attempts
                            ELSE {{schema}}.fail_at(fail_offs, fail_counts, p_first) END,
            settled = CASE WHEN committed = p_first - 1 THEN settled
                           ELSE {{schema}}.offsets_above(settled, p_first - 1) END,
            fail_offs = CASE WHEN committed = p_first - 1 THEN fail_offs
                             ELSE {{schema}}.offsets_above(fail_offs, p_first) END,
            fail_counts = CASE WHEN committed = p_first - 1 THEN fail_counts
                               ELSE {{schema}}.fail_counts_above(fail_offs, fail_counts, p_first) END,
            delivered_max = greatest(delivered_max, p_last), retry_at = NULL,
            -- waits that passed mean nothing: dropped, so a cursor that
            -- had some is plain again (pop_ahead)
            wait_at = CASE WHEN wait_offs IS NULL THEN NULL
                           ELSE {{schema}}.waits_live_at(wait_offs, wait_at, p_first - 1, settled, p_now) END,
            wait_offs = CASE WHEN wait_offs IS NULL THEN NULL
                             ELSE {{schema}}.waits_live(wait_offs, wait_at, p_first - 1, settled, p_now) END,
            held_offs = CASE WHEN held_offs IS NULL
                               OR {{schema}}.waits_live(wait_offs, wait_at, p_first - 1, settled, p_now) IS NULL
                             THEN NULL ELSE held_offs END,
            idle_until = NULL, idle_seen = p_seen, updated_at = p_now
        WHERE partition_id = p_pid AND group_name = p_group;
    END IF;
    RETURN FOUND;
END
$$;

-- Ready-set upkeep for group p_group after a pop, at its end: this
-- transaction does nothing after these try-locks, so they cannot join a
-- deadlock. Acks leave drained partitions where they are (settle takes no
-- partition locks); every pop passes to clear_pending the partitions its
-- own auto-ack drained (p_drained) and, when it was not for one partition
-- (p_window), up to 256 more of its window that its group has consumed
-- (p_caught), which keeps stale entries bounded by the pop rate, not the
-- number of keys. A partition this group is behind on stays where it is
-- (it is in the group's reach), so it is not even looked at. Returns how
-- many partitions it passed to clear_pending_many (in one call).
CREATE OR REPLACE FUNCTION {{schema}}.pop_upkeep(p_group text, p_drained bigint[], p_caught bigint[],
                                               p_window boolean)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_more   bigint[] := '{}';
    v_n      integer := cardinality(p_drained);
    v_routed boolean := (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true);
BEGIN
    IF p_window THEN
        -- On the Citus layout each clear is a few round trips to a worker:
        -- 256 of them outlived a 2 s statement timeout, pop after pop. The
        -- rest stay pending (claimable as ever) for later pops to clear.
        v_more := ARRAY(SELECT r.id FROM (SELECT DISTINCT id FROM unnest(p_caught) AS u(id)) AS r
                        WHERE NOT (r.id = ANY (p_drained))
                        LIMIT CASE WHEN v_routed THEN 16 ELSE 256 END);
        v_n := v_n + cardinality(v_more);
    END IF;
    PERFORM {{schema}}.clear_pending_many(p_drained || v_more, p_group, v_routed);
    RETURN v_n;
END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.pop_v2(
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
    p_part_batch integer,
    -- A per-key Consume's claim (KeyConcurrency > 1, not AutoAck): it is
    -- given the waits of its messages (see pop_claim).
    p_keyed      boolean
) RETURNS SETOF {{schema}}.pop_row
LANGUAGE plpgsql
-- Array-driven statements would otherwise be re-planned on every call.
-- Every statement here and in the steps is a keyed lookup or a walk of
-- the pending index, never a scan.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_q       record;
    v_c       record;
    v_w       record;
    v_r       record;
    v_done    boolean;
    v_n       integer;
    v_pend    bigint[];
    v_full    boolean := false;
    v_cand    bigint[];
    v_pass    integer;
    v_try     integer;
    v_pid     bigint;
    v_left    integer := p_batch;
    v_claimed integer := 0;
    v_now     timestamptz := clock_timestamp();
    v_cutoff  timestamptz;
    v_lease   uuid;
    v_expires timestamptz;
    v_deliv   integer;
    v_drained bigint[] := '{}';
    v_caught  bigint[] := '{}';
    v_seen    bigint[] := '{}';
    v_s       record;
    v_grp     integer;
    v_rest    boolean := false;
    v_lag     bigint[];
    v_grp12   integer;
BEGIN
    p_part_batch := least(coalesce(p_part_batch, p_batch), p_batch);
    SELECT id, lease_time_ms, delayed_processing_ms, window_buffer_ms,
           (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) AS routed INTO v_q
    FROM {{schema}}.queues WHERE tenant = p_tenant AND name = p_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_lease_ms <= 0 THEN
        p_lease_ms := v_q.lease_time_ms;
    END IF;
    v_cutoff := v_now - v_q.delayed_processing_ms * interval '1 millisecond';
    -- A member's claim is its heartbeat (rate-limited, see member_seen),
    -- whatever it then finds: paused or idle, it is still there.
    IF strpos(p_owner, '#') > 0 THEN
        v_done := {{schema}}.member_seen(v_q.id, p_group, p_owner, v_now);
    END IF;

    v_done := {{schema}}.pop_first_contact(v_q.id, p_group, p_mode, p_from);
    IF NOT v_done THEN
        RETURN; -- the queue was deleted since it was read
    END IF;
    -- A paused group claims nothing (see paused_groups). After the first
    -- contact, so a group paused before it still counts from its
    -- subscription, not from its Resume.
    IF EXISTS (SELECT 1 FROM {{schema}}.paused_groups g WHERE g.queue_id = v_q.id AND g.group_name = p_group) THEN
        RETURN;
    END IF;

    -- Up to two passes: the first over a window sized to the claim, the
    -- second, only if the first claimed less than asked and did not see the
    -- whole ready set, over a wider one. When both claimed nothing and
    -- did not see it all, a pass over what the group can claim (lag_window;
    -- on the routed layout lag_window_routed, one worker's at a time): an
    -- empty pop has then looked at everything the group lags on.
    v_pass := 0;
    LOOP
        v_pass := v_pass + 1;
        IF p_partition IS NULL AND NOT v_q.routed AND v_pass >= 3 THEN
            v_pend := {{schema}}.lag_window(v_q.id, p_group, 256, v_now);
            v_rest := false;
            v_full := false;
        ELSIF p_partition IS NULL AND v_q.routed AND v_pass >= 3 THEN
            IF v_pass = 3 THEN
                v_grp12 := v_grp;
                v_lag := {{schema}}.lag_window_routed(v_q.id, p_group, 256, v_now);
            ELSE
                v_lag := v_s.rest;
            END IF;
            v_s := {{schema}}.worker_split(v_lag, NULL);
            v_grp := v_s.grp;
            v_pend := v_s.mine;
            v_rest := cardinality(v_s.rest) > 0;
            v_full := false;
        ELSIF p_partition IS NULL AND v_q.routed THEN
            v_w := {{schema}}.pop_window_routed(v_q.id, p_group, p_hints, v_pass,
                                                CASE WHEN v_pass = 1 THEN greatest(32, p_partitions * 4) ELSE 256 END,
                                                v_seen);
            -- One worker's partitions only, so the claim commits there
            -- without a two-phase commit: the first id's worker (a hint's,
            -- or a random point's of the ready set), kept once it claimed.
            v_s := {{schema}}.worker_split(v_w.ids, CASE WHEN v_claimed > 0 THEN v_grp END);
            IF v_s.grp IS DISTINCT FROM v_grp THEN
                v_caught := '{}'; -- the upkeep writes one worker too
            END IF;
            v_grp := v_s.grp;
            v_pend := v_s.mine;
            v_rest := cardinality(v_s.rest) > 0;
            v_full := v_w.is_full;
        ELSIF p_partition IS NULL THEN
            v_w := {{schema}}.pop_window(v_q.id, p_group, p_hints, v_pass,
                                         CASE WHEN v_pass = 1 THEN greatest(32, p_partitions * 4) ELSE 256 END, v_seen);
            v_pend := v_w.ids;
            v_full := v_w.is_full;
        ELSIF v_q.routed THEN
            v_pend := coalesce(ARRAY[{{schema}}.partition_of(v_q.id, p_partition)], '{}');
            v_pend := array_remove(v_pend, NULL);
        ELSE
            SELECT coalesce(array_agg(p.id), '{}') INTO v_pend
            FROM {{schema}}.partitions p WHERE p.queue_id = v_q.id AND p.name = p_partition;
        END IF;
        IF v_q.routed THEN
            v_r := {{schema}}.pop_ready_routed(v_q.id, v_q.window_buffer_ms, v_q.delayed_processing_ms, p_group, p_mode,
                                               p_from, v_pend, p_hints, v_now, v_cutoff, p_keyed AND NOT p_auto_ack);
        ELSE
            v_r := {{schema}}.pop_ready(v_q.id, v_q.window_buffer_ms, v_q.delayed_processing_ms, p_group, p_mode,
                                        p_from, v_pend, p_hints, v_now, v_cutoff, p_keyed AND NOT p_auto_ack);
        END IF;
        v_cand := v_r.cand;
        IF v_pass <= 2 THEN
            v_caught := v_caught || v_r.caught;
        END IF;

        -- Claim in that order: one keyed try-lock each, re-checked on the
        -- locked row.
        FOREACH v_pid IN ARRAY v_cand LOOP
            EXIT WHEN v_left <= 0 OR v_claimed >= p_partitions;
            -- A second try only if retention took the claimed messages
            -- between the lock and the read (see below).
            FOR v_try IN 1 .. 2 LOOP
                v_c := {{schema}}.pop_claim(v_pid, p_group, least(v_left, p_part_batch), v_now,
                                            v_q.delayed_processing_ms > 0, v_cutoff, p_keyed AND NOT p_auto_ack);
                EXIT WHEN v_c.pid IS NULL;
                IF p_auto_ack THEN
                    v_lease := NULL;
                    v_expires := NULL;
                    v_deliv := v_c.deliveries + 1;
                ELSE
                    v_lease := gen_random_uuid();
                    v_expires := v_now + p_lease_ms * interval '1 millisecond';
                    -- A head that waits is not delivered by this claim.
                    v_deliv := CASE WHEN v_c.committed <> v_c.claim_first - 1 THEN 1
                                    WHEN v_c.claim_first = ANY (coalesce(v_c.wait_offs, '{}')) THEN v_c.deliveries
                                    ELSE v_c.deliveries + 1 END;
                END IF;

                -- The segments first, the cursor write after, and only if
                -- some segment was read: retention committing between the
                -- claim and the read leaves fewer segments (or none), never
                -- a lease (or an auto-ack) over messages nobody received.
                -- The row is locked: nothing else can move it meanwhile.
                RETURN QUERY
                SELECT v_c.pid, v_c.part_name, v_lease, v_expires, p_lease_ms, v_c.claim_first, v_c.claim_last, v_deliv,
                       v_c.delivered_max, s.base_offset, s.end_offset, s.created_at, s.blob, s.failures,
                       -- The out-of-order settlement state, once per partition;
                       -- the failures with the head's (attempts) when the
                       -- claim starts at it.
                       CASE WHEN row_number() OVER (ORDER BY s.base_offset) = 1 THEN v_c.settled END,
                       CASE WHEN row_number() OVER (ORDER BY s.base_offset) = 1 THEN
                           CASE WHEN v_c.attempts > 0 AND v_c.committed = v_c.claim_first - 1 THEN v_c.claim_first || v_c.fail_offs
                                ELSE v_c.fail_offs END END,
                       CASE WHEN row_number() OVER (ORDER BY s.base_offset) = 1 THEN
                           CASE WHEN v_c.attempts > 0 AND v_c.committed = v_c.claim_first - 1 THEN v_c.attempts || v_c.fail_counts
                                ELSE v_c.fail_counts END END,
                       CASE WHEN row_number() OVER (ORDER BY s.base_offset) = 1 THEN v_c.wait_offs END,
                       CASE WHEN row_number() OVER (ORDER BY s.base_offset) = 1 THEN v_c.wait_at END
                FROM {{schema}}.segments s
                WHERE s.partition_id = v_c.pid AND s.base_offset BETWEEN v_c.seg_lo AND v_c.claim_last
                ORDER BY s.base_offset;
                IF FOUND THEN
                    v_done := {{schema}}.pop_take(v_c.pid, p_group, v_c.claim_first, v_c.claim_last, v_c.settled, v_lease,
                                                  p_owner, v_expires, v_deliv, v_now, v_c.seen);
                    v_left := v_left - (v_c.claim_last - v_c.claim_first + 1)::integer;
                    v_claimed := v_claimed + 1;
                    IF p_auto_ack AND v_c.claim_last >= v_c.log_end THEN
                        v_drained := v_drained || v_c.pid;
                    END IF;
                    EXIT;
                END IF;
            END LOOP;
        END LOOP;
        IF v_pass >= 3 AND v_claimed > 0 AND v_grp IS DISTINCT FROM v_grp12 THEN
            v_caught := '{}'; -- the upkeep writes the claim's worker only
        END IF;
        EXIT WHEN p_partition IS NOT NULL OR v_left <= 0 OR v_claimed >= p_partitions;
        -- On the routed layout, a pass that claimed nothing on its worker
        -- tries another's next; past the second pass, only while nothing
        -- was claimed, and the lag window's workers one by one.
        IF v_pass = 2 THEN
            EXIT WHEN NOT (v_claimed = 0 AND (v_full OR v_rest));
        ELSE
            EXIT WHEN NOT (v_full OR (v_rest AND v_claimed = 0)) OR v_pass >= 16;
        END IF;
        v_seen := v_seen || v_pend;
    END LOOP;

    IF cardinality(v_drained) > 0 OR (p_partition IS NULL AND cardinality(v_caught) > 0) THEN
        v_n := {{schema}}.pop_upkeep(p_group, v_drained, v_caught, p_partition IS NULL);
    END IF;
END
$$;

-- A claim ahead for the holder of lease p_lease on group p_group's cursor
-- of partition p_pid (Consume's prefetch, see DESIGN.md): the next up to
-- p_max messages after the lease's batch_end join the same lease, which is
-- renewed to end p_lease_ms from now (<= 0: the queue's lease time) and
-- covers both batches; the rows are pop's, for those messages (but for the
-- blob of a segment this holder was sent before, see below). With p_ok
-- >= 0 it first acks through p_ok (an in-order ack, as settle's, in the
-- same statement): the ack that would end the lease at batch_end keeps it
-- for the batch claimed here. Nothing is written and no row returned when
-- the lease is not live, p_ok is not above the cursor or passes batch_end,
-- nothing is retained past batch_end, the group is paused, another
-- partition of the queue is in the ready set or the group's backlog (ready
-- partitions take turns), the queue delays or windows its messages, or the
-- cursor holds out-of-order settlement state (settled, fail_offs): the
-- caller then settles as usual.
-- Deliveries: without an ack the head's count stands (this claim does not
-- start at the cursor); with one, the run after the new cursor was
-- delivered once (the batch claimed ahead before, and this one), or as
-- often as the head when an earlier lease had delivered past batch_end.
CREATE OR REPLACE FUNCTION {{schema}}.pop_ahead(p_pid bigint, p_group text, p_lease uuid, p_ok bigint,
                                              p_max integer, p_lease_ms bigint)
RETURNS SETOF {{schema}}.pop_row
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_c     record;
    v_now   timestamptz := clock_timestamp();
    v_first bigint;
    v_last  bigint;
    v_lo    bigint;
    v_comm  bigint;
    v_deliv integer;
    v_ms    bigint;
    v_exp   timestamptz;
BEGIN
    SELECT cc.committed, cc.batch_end, cc.lease_id, cc.lease_expires_at, cc.deliveries, cc.delivered_max,
           cc.settled, cc.fail_offs, cc.wait_offs, p.name, p.last_offset, p.log_start, p.queue_id,
           qq.lease_time_ms, qq.delayed_processing_ms, qq.window_buffer_ms,
           (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) AS routed
    INTO v_c
    FROM {{schema}}.consumers cc
    JOIN {{schema}}.partitions p ON p.id = cc.partition_id
    JOIN {{schema}}.queues qq ON qq.id = p.queue_id
    WHERE cc.partition_id = p_pid AND p.id = p_pid AND cc.group_name = p_group
    FOR UPDATE OF cc;
    IF NOT FOUND OR v_c.lease_id IS DISTINCT FROM p_lease OR v_c.lease_expires_at <= v_now
       OR v_c.batch_end IS NULL OR v_c.settled IS NOT NULL OR v_c.fail_offs IS NOT NULL OR v_c.wait_offs IS NOT NULL
       OR v_c.delayed_processing_ms > 0 OR v_c.window_buffer_ms > 0 OR p_max < 1
       OR (p_ok >= 0 AND (p_ok <= v_c.committed OR p_ok > v_c.batch_end)) THEN
        RETURN;
    END IF;
    -- Paused, or another partition ready: the lease ends with its batch,
    -- so partitions rotate as without claims ahead.
    IF v_c.routed THEN
        IF {{schema}}.lease_yields_routed(v_c.queue_id, p_group, p_pid) THEN
            RETURN;
        END IF;
    ELSIF {{schema}}.lease_yields(v_c.queue_id, p_group, p_pid) THEN
        RETURN;
    END IF;
    v_first := greatest(v_c.batch_end + 1, v_c.log_start);
    v_last := least(v_c.last_offset, v_first + p_max - 1);
    IF v_last < v_first THEN
        RETURN;
    END IF;
    v_lo := coalesce((SELECT max(s.base_offset) FROM {{schema}}.segments s
                      WHERE s.partition_id = p_pid AND s.base_offset <= v_first), v_first);
    IF p_ok >= 0 THEN
        v_comm := p_ok;
        v_deliv := CASE WHEN v_c.delivered_max > v_c.batch_end THEN greatest(v_c.deliveries, 1) ELSE 1 END;
    ELSE
        v_comm := v_c.committed;
        v_deliv := greatest(v_c.deliveries, 1);
    END IF;
    v_ms := CASE WHEN p_lease_ms > 0 THEN p_lease_ms ELSE v_c.lease_time_ms END;
    v_exp := greatest(v_c.lease_expires_at, v_now + v_ms * interval '1 millisecond');

    -- The segments first, the cursor write only if some segment was read
    -- (as in pop: retention may have taken them since). A segment that
    -- starts at or before batch_end holds the lease's last offset: the
    -- claim that took it under this lease sent it to this holder already,
    -- so its blob is not read and sent again (NULL; the client decompressed
    -- it then, and fetches it by itself if it no longer has it).
    RETURN QUERY
    SELECT p_pid, v_c.name, p_lease, v_exp, v_ms, v_first, v_last, v_deliv, v_c.delivered_max,
           s.base_offset, s.end_offset, s.created_at,
           CASE WHEN s.base_offset <= v_c.batch_end THEN NULL ELSE s.blob END, s.failures,
           NULL::bigint[], NULL::bigint[], NULL::integer[], NULL::bigint[], NULL::timestamptz[]
    FROM {{schema}}.segments s
    WHERE s.partition_id = p_pid AND s.base_offset BETWEEN v_lo AND v_last
    ORDER BY s.base_offset;
    IF FOUND THEN
        UPDATE {{schema}}.consumers SET committed = v_comm,
            attempts = CASE WHEN v_comm > committed THEN 0 ELSE attempts END,
            deliveries = v_deliv, delivered_max = greatest(delivered_max, v_last),
            batch_end = v_last, lease_expires_at = v_exp, updated_at = v_now
        WHERE partition_id = p_pid AND group_name = p_group;
    END IF;
END
$$;

-- The lingering lease (Consume, see DESIGN.md "The lingering lease"): the
-- holder of lease p_lease on group p_group's cursor of partition p_pid
-- acks its batch through p_ok, its batch_end, and keeps the lease over the
-- drained partition, so the next messages are taken under it by
-- pop_linger instead of a claim. A durable commit, as settle's: an acked
-- message never comes back. The lease's end is brought in to at most
-- p_keep_ms from now (> 0): the batch is acked, nothing is in flight, and
-- a holder that dies while it lingers holds the partition that long, not
-- a whole lease time; lease_end is the lease's end then. Status: 0
-- applied (log_end: the partition's last offset then), 1 p_ok at or below
-- the cursor, 2 the lease is not live, or p_ok passes batch_end (then the
-- lease is let go: see below), 3 applied, the lease let go as settle's
-- ack would (where pop_ahead declines: the queue delays or windows its
-- messages, the group is paused, or another partition of the queue is in
-- the ready set or the group's backlog, so ready partitions take turns),
-- -1 declined, nothing written, the caller settles as usual: p_ok is not
-- batch_end, or the cursor holds out-of-order state. A partition
-- drained by the ack leaves the ready set (clear_pending, which never
-- waits): no claim of this group does it while the lease lingers.
CREATE OR REPLACE FUNCTION {{schema}}.linger_ack(p_pid bigint, p_group text, p_lease uuid, p_ok bigint,
                                               p_keep_ms bigint, OUT status integer, OUT log_end bigint,
                                               OUT lease_end timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_c   record;
    v_l   record;
    v_now timestamptz := clock_timestamp();
    v_keep timestamptz;
BEGIN
    SELECT cc.committed, cc.batch_end, cc.lease_id, cc.lease_owner, cc.lease_expires_at, cc.delivered_max,
           cc.settled, cc.fail_offs, cc.wait_offs, p.last_offset, p.queue_id, p.pending,
           qq.delayed_processing_ms, qq.window_buffer_ms,
           (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) AS routed
    INTO v_c
    FROM {{schema}}.consumers cc
    JOIN {{schema}}.partitions p ON p.id = cc.partition_id
    JOIN {{schema}}.queues qq ON qq.id = p.queue_id
    WHERE cc.partition_id = p_pid AND p.id = p_pid AND cc.group_name = p_group
    FOR UPDATE OF cc;
    IF NOT FOUND OR v_c.lease_id IS DISTINCT FROM p_lease OR v_c.lease_expires_at <= v_now THEN
        status := 2;
        RETURN;
    END IF;
    IF p_ok <= v_c.committed THEN
        status := 1;
        RETURN;
    END IF;
    IF p_ok > v_c.batch_end THEN
        -- Not claimed under this lease as far as the server knows: a crash
        -- lost pop_linger's asynchronous commit. The holder lets the lease
        -- go, and the messages are delivered again at once.
        SELECT * INTO v_l FROM {{schema}}.lease_after(true, v_c.batch_end, v_c.lease_id, v_c.lease_owner,
                                                      v_c.lease_expires_at);
        UPDATE {{schema}}.consumers SET batch_end = v_l.batch_end, lease_id = v_l.lease_id,
            lease_owner = v_l.lease_owner, lease_expires_at = v_l.lease_expires_at, updated_at = v_now
        WHERE partition_id = p_pid AND group_name = p_group;
        status := 2;
        RETURN;
    END IF;
    IF p_ok <> v_c.batch_end OR v_c.settled IS NOT NULL OR v_c.fail_offs IS NOT NULL OR v_c.wait_offs IS NOT NULL THEN
        status := -1;
        RETURN;
    END IF;
    status := 0;
    IF v_c.delayed_processing_ms > 0 OR v_c.window_buffer_ms > 0 THEN
        status := 3;
    ELSIF v_c.routed THEN
        IF {{schema}}.lease_yields_routed(v_c.queue_id, p_group, p_pid) THEN
            status := 3;
        END IF;
    ELSIF {{schema}}.lease_yields(v_c.queue_id, p_group, p_pid) THEN
        status := 3;
    END IF;
    -- The ack as settle_v2's in-order ack through batch_end writes it, but
    -- for the lease, kept unless status 3. The lease as lease_after says,
    -- from the row as locked; not a multiple assignment from a subquery,
    -- which Citus cannot run ("unrecognized paramkind").
    -- (The time a variable: Citus takes no stable function in a CASE.)
    v_keep := v_now + p_keep_ms * interval '1 millisecond';
    SELECT * INTO v_l FROM {{schema}}.lease_after(status = 3, v_c.batch_end, v_c.lease_id, v_c.lease_owner,
                                                  v_c.lease_expires_at);
    UPDATE {{schema}}.consumers SET committed = p_ok, attempts = 0,
        deliveries = CASE WHEN p_ok < delivered_max THEN 1 ELSE 0 END, retry_at = NULL,
        batch_end = v_l.batch_end, lease_id = v_l.lease_id, lease_owner = v_l.lease_owner,
        lease_expires_at = CASE WHEN status = 3 OR p_keep_ms <= 0 THEN v_l.lease_expires_at
                                ELSE least(v_l.lease_expires_at, v_keep) END,
        updated_at = v_now
    WHERE partition_id = p_pid AND group_name = p_group
    RETURNING consumers.lease_expires_at INTO lease_end;
    IF status = 3 THEN
        RETURN;
    END IF;
    log_end := v_c.last_offset;
    IF v_c.pending AND p_ok >= v_c.last_offset THEN
        -- Last: its locks are tried, never waited for.
        PERFORM {{schema}}.clear_pending_many(ARRAY[p_pid], p_group, v_c.routed);
    END IF;
END
$$;

-- Whether the lingering lease p_lease is still held for a take, from its
-- cursor row as locked: the lease is p_lease's and live, and batch_end is
-- not behind the cursor. Not held: pop_linger says the linger is over,
-- push_take takes nothing. The one rule of both.
CREATE OR REPLACE FUNCTION {{schema}}.linger_held(p_lease_id uuid, p_expires timestamptz, p_batch_end bigint,
                                                p_committed bigint, p_lease uuid, p_now timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_lease_id = p_lease AND p_expires > p_now AND p_batch_end >= p_committed, false)
$$;

-- Whether a held lingering lease gives way without looking at other
-- partitions (lease_yields does that): the holder lets go (p_max < 1),
-- the cursor holds out-of-order state, or the queue delays or windows its
-- messages (pop_ahead's reasons to decline). pop_linger then lets the
-- lease go, push_take takes nothing. The one rule of both.
CREATE OR REPLACE FUNCTION {{schema}}.linger_declines(p_max integer, p_settled bigint[], p_fail_offs bigint[],
                                                    p_wait_offs bigint[], p_delay_ms bigint, p_window_ms bigint)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_max < 1 OR p_settled IS NOT NULL OR p_fail_offs IS NOT NULL OR p_wait_offs IS NOT NULL
        OR p_delay_ms > 0 OR p_window_ms > 0
$$;

-- The take under a held lingering lease, after its caller locked the
-- cursor row and found the lease held (linger_held) and not giving way:
-- the next up to p_max messages after batch_end, or, if batch_end is
-- above committed, what lies between (taken but never handed to the
-- holder, which takes only once it acked all it had: a push_take whose
-- push's outcome the pusher could not tell, or a pop_linger whose answer
-- was lost; taken again as it stands, its deliveries already counted).
-- Returns the rows, NULL for none (nothing written); the cursor is written
-- only if some segment was read (retention may have taken them). A
-- segment that starts at or before committed was sent to this holder
-- under this lease (as in pop_ahead): its blob is not sent again. The
-- rows carry the lease's end as it is (see pop_linger). The one take of
-- pop_linger and push_take.
CREATE OR REPLACE FUNCTION {{schema}}.linger_claim(p_pid bigint, p_group text, p_name text, p_lease uuid,
                                                 p_expires timestamptz, p_lease_ms bigint, p_committed bigint,
                                                 p_batch_end bigint, p_log_start bigint, p_last_offset bigint,
                                                 p_max integer, p_deliv integer, p_dmax bigint, p_now timestamptz)
RETURNS {{schema}}.pop_row[]
LANGUAGE plpgsql AS $$
DECLARE
    v_first bigint;
    v_last  bigint;
    v_rows  {{schema}}.pop_row[];
BEGIN
    IF p_batch_end > p_committed THEN
        v_first := greatest(p_committed + 1, p_log_start);
        v_last := p_batch_end;
    ELSE
        v_first := greatest(p_batch_end + 1, p_log_start);
        v_last := least(p_last_offset, v_first + p_max - 1);
    END IF;
    IF v_last < v_first THEN
        RETURN NULL;
    END IF;
    -- One statement: the segment holding v_first (an initplan) to v_last.
    -- The initplan is written as the backward scan it must be: max()
    -- became one only where the planner had statistics, and a generic
    -- plan made without them read every segment of the partition below
    -- v_first (BenchmarkPushTake's take grew with the partition).
    SELECT array_agg(ROW(p_pid, p_name, p_lease, p_expires, p_lease_ms, v_first, v_last, greatest(p_deliv, 1), p_dmax,
                         s.base_offset, s.end_offset, s.created_at,
                         CASE WHEN s.base_offset <= p_committed THEN NULL ELSE s.blob END, s.failures,
                         NULL, NULL, NULL, NULL, NULL)::{{schema}}.pop_row ORDER BY s.base_offset)
    INTO v_rows
    FROM {{schema}}.segments s
    WHERE s.partition_id = p_pid
      AND s.base_offset BETWEEN coalesce((SELECT s2.base_offset FROM {{schema}}.segments s2
                                          WHERE s2.partition_id = p_pid AND s2.base_offset <= v_first
                                          ORDER BY s2.base_offset DESC LIMIT 1), v_first)
                            AND v_last;
    IF v_rows IS NOT NULL THEN
        UPDATE {{schema}}.consumers SET committed = greatest(committed, v_first - 1),
            deliveries = greatest(deliveries, 1), delivered_max = greatest(delivered_max, v_last),
            batch_end = v_last, updated_at = p_now
        WHERE partition_id = p_pid AND group_name = p_group;
    END IF;
    RETURN v_rows;
END
$$;

-- The claim under a lingering lease (linger_ack): the next up to p_max
-- messages after batch_end join lease p_lease (of p_lease_ms, <= 0: the
-- queue's lease time, as the rows say), which the holder acked through
-- (committed = batch_end: nothing of it is in flight); if batch_end is
-- above committed, what lies between is taken again (linger_claim). Its
-- transaction commits with synchronous_commit off, so the holder does not
-- wait for the WAL flush: a crash may lose the claim (batch_end,
-- deliveries), whose messages are then delivered again under a later
-- lease (at least once). The lease's end is not changed (the rows carry
-- the durable one): only a durable renewal moves it, so the holder never
-- believes its lease lasts longer than any server state a crash could
-- leave. No row: nothing to take, nothing written. One row with a NULL
-- lease_id: the linger is over, the lease let go (in the same
-- asynchronous commit) or not held (linger_held): it is not p_lease's or
-- not live; or pop_ahead's reasons to decline (linger_declines, or
-- lease_yields: the group is paused, another partition of the queue is
-- ready); or p_max < 1, the holder letting go.
CREATE OR REPLACE FUNCTION {{schema}}.pop_linger(p_pid bigint, p_group text, p_lease uuid, p_max integer,
                                               p_lease_ms bigint)
RETURNS SETOF {{schema}}.pop_row
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_c     record;
    v_now   timestamptz := clock_timestamp();
    v_yield boolean;
    v_l     record;
    v_rows  {{schema}}.pop_row[];
    v_row   {{schema}}.pop_row;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT cc.committed, cc.batch_end, cc.lease_id, cc.lease_owner, cc.lease_expires_at, cc.deliveries,
           cc.delivered_max, cc.settled, cc.fail_offs, cc.wait_offs, p.name, p.last_offset, p.log_start, p.queue_id,
           qq.lease_time_ms, qq.delayed_processing_ms, qq.window_buffer_ms,
           (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) AS routed
    INTO v_c
    FROM {{schema}}.consumers cc
    JOIN {{schema}}.partitions p ON p.id = cc.partition_id
    JOIN {{schema}}.queues qq ON qq.id = p.queue_id
    WHERE cc.partition_id = p_pid AND p.id = p_pid AND cc.group_name = p_group
    FOR UPDATE OF cc;
    IF NOT FOUND OR NOT {{schema}}.linger_held(v_c.lease_id, v_c.lease_expires_at, v_c.batch_end, v_c.committed,
                                               p_lease, v_now) THEN
        RETURN QUERY SELECT * FROM {{schema}}.linger_over(p_pid, v_c.name);
        RETURN;
    END IF;
    v_yield := {{schema}}.linger_declines(p_max, v_c.settled, v_c.fail_offs, v_c.wait_offs,
                                          v_c.delayed_processing_ms, v_c.window_buffer_ms);
    -- Each form in a statement of its own: Citus plans no SQL function
    -- with parameters over a distributed table, even on a branch not taken.
    IF NOT v_yield AND v_c.routed THEN
        v_yield := {{schema}}.lease_yields_routed(v_c.queue_id, p_group, p_pid);
    ELSIF NOT v_yield THEN
        v_yield := {{schema}}.lease_yields(v_c.queue_id, p_group, p_pid);
    END IF;
    IF v_yield THEN
        SELECT * INTO v_l FROM {{schema}}.lease_after(true, v_c.batch_end, v_c.lease_id, v_c.lease_owner,
                                                      v_c.lease_expires_at);
        UPDATE {{schema}}.consumers SET batch_end = v_l.batch_end, lease_id = v_l.lease_id,
            lease_owner = v_l.lease_owner, lease_expires_at = v_l.lease_expires_at, updated_at = v_now
        WHERE partition_id = p_pid AND group_name = p_group;
        RETURN QUERY SELECT * FROM {{schema}}.linger_over(p_pid, v_c.name);
        RETURN;
    END IF;
    v_rows := {{schema}}.linger_claim(p_pid, p_group, v_c.name, p_lease, v_c.lease_expires_at,
                                      CASE WHEN p_lease_ms > 0 THEN p_lease_ms ELSE v_c.lease_time_ms END,
                                      v_c.committed, v_c.batch_end, v_c.log_start, v_c.last_offset, p_max,
                                      v_c.deliveries, v_c.delivered_max, v_now);
    FOREACH v_row IN ARRAY coalesce(v_rows, '{}') LOOP
        RETURN NEXT v_row;
    END LOOP;
END
$$;

-- The take in a push's own transaction (the hand-off, see DESIGN.md "The
-- lingering lease"): a push of the lingering holder's own process to the
-- partition takes the next messages under lease p_lease in the same
-- implicit transaction, right after its append, so the take rides the
-- push's durable commit and saves pop_linger's round trip and commit.
-- It takes only where pop_linger would (linger_held, linger_declines,
-- lease_yields, linger_claim: the same rules) and else returns nothing,
-- writing nothing: the holder then calls pop_linger, which lets the lease
-- go or ends the linger, so that is decided in one place (a decline is
-- rare). On the routed layout it takes nothing (the client calls it there
-- only on plain PostgreSQL, as tests do): pop_linger takes, with
-- lease_yields_routed. It must
-- never fail the push: the consumer row is locked only if no other
-- transaction holds it (else nothing taken), and any error, a cancel
-- included, is caught with its subtransaction rolled back (nothing
-- taken); the rows are returned after that block, so none is returned
-- for a take rolled back. Never waiting for a lock, it adds no lock order
-- to the push's lock of its partition row, so no function that locks a
-- consumer row and then a partition row can deadlock with it. Its own
-- statements, not a call of pop_linger, whose extra work (a second lock
-- of the row, a nested set-returning call under SET clauses,
-- synchronous_commit set and restored, a statement of its own for the
-- segment search) cost the push about half as much
-- server time again per take (BENCHMARKS.md, "The push's take made
-- lean").
CREATE OR REPLACE FUNCTION {{schema}}.push_take(p_pid bigint, p_group text, p_lease uuid, p_max integer,
                                              p_lease_ms bigint)
RETURNS SETOF {{schema}}.pop_row
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    v_c    record;
    v_now  timestamptz := clock_timestamp();
    v_rows {{schema}}.pop_row[];
    v_row  {{schema}}.pop_row;
BEGIN
    BEGIN
        SELECT cc.committed, cc.batch_end, cc.lease_id, cc.lease_expires_at, cc.deliveries, cc.delivered_max,
               cc.settled, cc.fail_offs, cc.wait_offs, p.name, p.last_offset, p.log_start, p.queue_id,
               qq.lease_time_ms, qq.delayed_processing_ms, qq.window_buffer_ms,
               (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) AS routed
        INTO v_c
        FROM {{schema}}.consumers cc
        JOIN {{schema}}.partitions p ON p.id = cc.partition_id
        JOIN {{schema}}.queues qq ON qq.id = p.queue_id
        WHERE cc.partition_id = p_pid AND p.id = p_pid AND cc.group_name = p_group
        FOR UPDATE OF cc SKIP LOCKED;
        IF FOUND AND NOT v_c.routed
           AND {{schema}}.linger_held(v_c.lease_id, v_c.lease_expires_at, v_c.batch_end, v_c.committed,
                                      p_lease, v_now)
           AND NOT {{schema}}.linger_declines(p_max, v_c.settled, v_c.fail_offs, v_c.wait_offs,
                                              v_c.delayed_processing_ms, v_c.window_buffer_ms) THEN
            IF NOT {{schema}}.lease_yields(v_c.queue_id, p_group, p_pid) THEN
                v_rows := {{schema}}.linger_claim(p_pid, p_group, v_c.name, p_lease, v_c.lease_expires_at,
                                                  CASE WHEN p_lease_ms > 0 THEN p_lease_ms
                                                       ELSE v_c.lease_time_ms END,
                                                  v_c.committed, v_c.batch_end, v_c.log_start, v_c.last_offset,
                                                  p_max, v_c.deliveries, v_c.delivered_max, v_now);
            END IF;
        END IF;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        v_rows := NULL; -- nothing taken: the holder takes by pop_linger
    END;
    FOREACH v_row IN ARRAY coalesce(v_rows, '{}') LOOP
        RETURN NEXT v_row;
    END LOOP;
END
$$;

-- pop_linger's row saying the linger is over: no lease, no offsets.
CREATE OR REPLACE FUNCTION {{schema}}.linger_over(p_pid bigint, p_name text)
RETURNS SETOF {{schema}}.pop_row
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_pid, coalesce(p_name, ''), NULL::uuid, NULL::timestamptz, 0::bigint, -1::bigint, -1::bigint, 0, -1::bigint,
           -1::bigint, -1::bigint, 'epoch'::timestamptz, NULL::bytea, 0,
           NULL::bigint[], NULL::bigint[], NULL::integer[], NULL::bigint[], NULL::timestamptz[]
$$;

-- What a pop claimed but cannot hand over: messages Go cannot decompress,
-- parse or decrypt (a corrupt segment, a message sealed with another key).
-- They go to the dead-letter store with their reasons instead of failing
-- every claim that meets them. Under a lease (p_lease) they must lie in the
-- lease's range. At its head (every offset from the cursor to the last of
-- them is one of them or settled) the cursor moves past them; above a gap
-- (a key's waiting head or another lane's message in flight, per-key
-- Consume) they are settled out of order as a keyed ack is, since
-- committing through them would complete the gap unseen. The lease is cut
-- to end at p_end (the message before the next undecodable one, which a
-- later claim then finds at its head) and released once nothing of it is
-- left; a cut lease saw no further than p_end, so a parking of the
-- partition (idle_seen) ends as soon as anything lies past it. Returns
-- false, writing nothing, if the lease is no longer held. With AutoAck
-- (p_lease NULL) the claim already moved the cursor: only the dead letters
-- are written.
CREATE OR REPLACE FUNCTION {{schema}}.pop_dead_letter(
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
    v_dls  {{schema}}.dead_letter_snapshot[] := {{schema}}.dead_letter_snapshots('pop_dead_letter', n, NULL, p_ids,
                                                    p_txns, p_flags, p_payloads, p_created, p_keys, p_headers, p_reasons);
    v_c    record;
    v_p    record;
    v_comm bigint;
    v_end  bigint;
    v_set  bigint[];
    v_now  timestamptz := clock_timestamp();
BEGIN
    SELECT p.name, p.queue_id INTO v_p FROM {{schema}}.partitions p WHERE p.id = p_pid;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- The queue row the dead letters' foreign key needs, before the cursor
    -- row (the lock order): a delete_queue holding it would otherwise wait
    -- for the cursor row while this waits for it. Gone: so is the cursor.
    PERFORM 1 FROM {{schema}}.queues q WHERE q.id = v_p.queue_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_lease IS NOT NULL THEN
        SELECT c.committed, c.batch_end, c.lease_id, c.lease_expires_at, c.settled INTO v_c
        FROM {{schema}}.consumers c
        WHERE c.partition_id = p_pid AND c.group_name = p_group
        FOR UPDATE;
        IF NOT FOUND OR v_c.lease_id IS DISTINCT FROM p_lease OR v_c.lease_expires_at <= v_now
           OR (n > 0 AND (p_offs[1] <= v_c.committed OR p_offs[n] > v_c.batch_end)) THEN
            RETURN false;
        END IF;
        v_set := v_c.settled;
        IF n > 0 AND EXISTS (SELECT 1 FROM generate_series(v_c.committed + 1, p_offs[n]) AS g(o)
                             WHERE g.o <> ALL (p_offs) AND g.o <> ALL (coalesce(v_c.settled, '{}'::bigint[]))) THEN
            -- Above a gap: settled out of order.
            v_set := ARRAY(SELECT DISTINCT u.o FROM unnest(coalesce(v_c.settled, '{}'::bigint[]) || p_offs) AS u(o)
                           ORDER BY u.o);
            v_comm := {{schema}}.settled_advance(v_c.committed, v_set);
        ELSE
            v_comm := {{schema}}.settled_advance(CASE WHEN n > 0 THEN p_offs[n] ELSE v_c.committed END, v_set);
        END IF;
        v_end := least(v_c.batch_end, coalesce(p_end, v_c.batch_end));
        UPDATE {{schema}}.consumers SET
            committed        = v_comm,
            attempts         = CASE WHEN v_comm > committed THEN {{schema}}.fail_at(fail_offs, fail_counts, v_comm + 1)
                                    ELSE attempts END,
            settled          = CASE WHEN v_set IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(v_set, v_comm) END,
            fail_offs        = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.offsets_above(fail_offs, v_comm + 1) END,
            fail_counts      = CASE WHEN fail_offs IS NULL THEN NULL
                                    ELSE {{schema}}.fail_counts_above(fail_offs, fail_counts, v_comm + 1) END,
            deliveries       = CASE WHEN v_comm = committed THEN deliveries
                                    WHEN v_comm < delivered_max THEN 1 ELSE 0 END,
            (batch_end, lease_id, lease_owner, lease_expires_at)
                             = (SELECT * FROM {{schema}}.lease_after(v_comm >= v_end, v_end, lease_id, lease_owner,
                                                                     lease_expires_at)),
            idle_seen        = CASE WHEN v_end < batch_end THEN least(coalesce(idle_seen, v_end), v_end)
                                    ELSE idle_seen END,
            updated_at       = v_now
        WHERE partition_id = p_pid AND group_name = p_group;
    END IF;
    PERFORM {{schema}}.insert_dead_letters(v_p.queue_id, p_pid, v_p.name, p_group, p_offs, array_fill(0, ARRAY[n]), v_dls);
    RETURN true;
END
$$;

-- Renews lease p_lease on group p_group's cursor of partition p_pid to end
-- p_ms from now, if it is live: the new end, NULL when not live. p_owner,
-- a member's lease owner (client '#' member id) or NULL: the renewal is
-- the member's heartbeat too (member_seen, rate-limited). The time is read
-- once, before the write: Citus runs no volatile function in an UPDATE of
-- a distributed table.
CREATE OR REPLACE FUNCTION {{schema}}.extend_lease(p_pid bigint, p_group text, p_lease uuid, p_ms bigint,
                                                 p_owner text)
RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := clock_timestamp();
    v_exp  timestamptz := v_now + p_ms * interval '1 millisecond';
    v_qid  bigint;
    v_seen boolean;
BEGIN
    UPDATE {{schema}}.consumers SET lease_expires_at = v_exp
    WHERE partition_id = p_pid AND group_name = p_group AND lease_id = p_lease AND lease_expires_at > v_now;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_owner IS NOT NULL THEN
        SELECT p.queue_id INTO v_qid FROM {{schema}}.partitions p WHERE p.id = p_pid;
        v_seen := {{schema}}.member_seen(v_qid, p_group, p_owner, v_now);
    END IF;
    RETURN v_exp;
END
$$;
