-- Settling: acks, failures, retries and dead letters, and the skip policy's re-enqueue.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- settle_result.status, the verdict per input of settle_rows (through
-- settle_v2 and settle_keyed_v2, and the previous release's settle and
-- settle_keyed, which call those) and ack_many, and the actions (p_act)
-- they take. The
-- constants of internal/stmt (Settle*, Act*) mirror these lists and
-- TestStatusCodesMatchSQL compares them: a code keeps its meaning for
-- good.
--   settle status 0 applied: the cursor moved (or the failure was charged)
--   settle status 1 below_cursor: already settled; nothing changed
--   settle status 2 lease_lost: the lease is not the cursor's live one; nothing changed
--   settle status 3 dead_lettered: applied, and the message went to the dead letters
--   settle status 4 dropped: applied, and the exhausted message was dropped
--   settle status 5 unknown: no such cursor
--   settle status 6 requeued: applied, the failure re-enqueued at the tail (settle_keyed only; settle answers 0)
--   settle action 0 none: an ack
--   settle action 1 fail: charge a failure (retry limit, failure policy)
--   settle action 2 retry: redeliver in place, uncharged
--   settle action 3 dead_letter: dead-letter the message
--   settle action 4 interrupt: a retry that also takes back the lease's delivery
--   settle action 5 carry: no outcome, only the lease's release (settle_keyed only)
--   settle action 6 park: a carry whose batch was left with waiting keys only (settle_keyed only)
--   settle action 7 held: a message left unstarted behind a waiting one of its key (settle_keyed only)

-- The hash row a failed message's copy carries (requeue_one, and a copy
-- waiting in scheduled): its original's, the message at offset p_off of
-- partition p_pid, while that is still retained (a producer retrying the
-- transaction id while the message is live is still a duplicate), else a
-- zero hash (its dedup window had passed). The hash is in the covering
-- segment's row (pushed since migration 017) or in a hash row (pushed
-- before, or copied there by retention).
CREATE OR REPLACE FUNCTION {{schema}}.requeue_hash(p_pid bigint, p_off bigint)
RETURNS bytea
LANGUAGE plpgsql AS $$
DECLARE
    v_hash bytea;
BEGIN
    SELECT substring(c.hashes FROM ((p_off - c.base_offset) * 16 + 1)::integer FOR 16) INTO v_hash
    FROM (SELECT ss.base_offset, ss.end_offset, ss.hashes FROM {{schema}}.segments ss
          WHERE ss.partition_id = p_pid AND ss.base_offset <= p_off
          ORDER BY ss.base_offset DESC LIMIT 1) c
    WHERE c.end_offset >= p_off;
    IF v_hash IS NULL THEN
        SELECT substring(t.hashes FROM ((p_off - t.base_offset) * 16 + 1)::integer FOR 16) INTO v_hash
        FROM (SELECT tt.base_offset, tt.end_offset, tt.hashes FROM {{schema}}.txns tt
              WHERE tt.partition_id = p_pid AND tt.base_offset <= p_off
              ORDER BY tt.base_offset DESC LIMIT 1) t
        WHERE t.end_offset >= p_off;
    END IF;
    IF v_hash IS NULL OR octet_length(v_hash) <> 16 THEN
        v_hash := '\x00000000000000000000000000000000'::bytea;
    END IF;
    RETURN v_hash;
END
$$;

-- Appends the failed message at offset p_off of partition p_pid (whose row
-- the caller holds) at its tail as p_blob, a segment of its own that the
-- client built (the message's frame as stored, in a raw-codec blob),
-- carrying p_failures, with requeue_hash's hash row. Returns the new
-- offset.
CREATE OR REPLACE FUNCTION {{schema}}.requeue_one(
    p_pid      bigint,
    p_off      bigint,
    p_blob     bytea,
    p_failures integer
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := clock_timestamp();  -- after the row lock: created_at stays monotone
BEGIN
    -- The single allocator, without a dedup probe: the copy repeats its
    -- original's transaction id on purpose.
    RETURN ({{schema}}.push_one(p_pid, 1, {{schema}}.requeue_hash(p_pid, p_off), -1, p_blob, 0, v_now,
                                p_failures)).base_offset;
END
$$;

-- Holds the failed message at offset p_off of partition p_pid (named
-- p_part, of queue p_qid, whose row the caller key-shares) aside in
-- scheduled until p_due: its copy, the segment p_blob carrying p_failures
-- (at least 1: it marks the row a retry) and requeue_hash's hash row,
-- which move_scheduled appends at the partition's tail then. p_id and
-- p_flags are the message's id and frame flags (1: the blob is
-- ciphertext, so the mover does not hold it on an encrypted queue).
CREATE OR REPLACE FUNCTION {{schema}}.requeue_later(
    p_qid      bigint,
    p_pid      bigint,
    p_part     text,
    p_off      bigint,
    p_due      timestamptz,
    p_id       uuid,
    p_flags    integer,
    p_blob     bytea,
    p_failures integer
) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO {{schema}}.scheduled (queue_id, partition_name, due_at, hash, message_id, flags, lanes, blob, failures)
    VALUES (p_qid, p_part, p_due, {{schema}}.requeue_hash(p_pid, p_off), p_id, coalesce(p_flags, 0) & 1, 0, p_blob,
            greatest(p_failures, 1))
$$;

-- The wait in ms before the next attempt of a message whose n-th charged
-- failure asked for p_asked ms (RetryAfter; NULL or 0: none): that, else
-- the queue's schedule (retry_wait_ms, p_u its uniform draw); 0: none.
-- With p_u 0 it is the least wait the failure can get, so whether there is
-- one at all is known before the draw (lock_skip_failures).
CREATE OR REPLACE FUNCTION {{schema}}.failure_wait_ms(p_asked bigint, p_n integer, p_min bigint, p_max bigint,
                                                    p_u double precision)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN coalesce(p_asked, 0) > 0 THEN p_asked
                ELSE {{schema}}.retry_wait_ms(p_n, p_min, p_max, p_u) END
$$;

-- Takes, per input row of settle_rows, the lock a skip-policy failure
-- (action 1 on a skip-policy queue) needs, and returns the row's route (0
-- for every other row, and for one whose lock was not taken: redelivered
-- in place):
--   1 now: no wait (failure_wait_ms is 0): the copy is appended at once
--     (requeue_one), so its partition row is locked FOR NO KEY UPDATE;
--   2 later: a wait: the copy waits in scheduled (requeue_later), whose
--     foreign key takes the queue row KEY SHARE; taken here, before any
--     cursor row, as the lock order says (a delete_queue holding the
--     queue row would otherwise wait for the cursor row this holds while
--     this waits for the queue row).
-- The queue row of every failure (action 1, which may spend the budget)
-- and dead letter (3) is taken KEY SHARE likewise, whatever the route: a
-- dead letter's foreign key needs it.
-- Queues first, then partitions, each in ascending id. With p_wait it
-- waits for each; without, it takes only the rows free now (see
-- settle_v2). The wait policy is syntax, not a value, so without dynamic
-- SQL (re-planned on every call) the two policies are two statements
-- each; they stay side by side here, with the rule of which rows written
-- once above them.
CREATE OR REPLACE FUNCTION {{schema}}.lock_skip_failures(p_pids bigint[], p_act smallint[], p_wait boolean,
                                                        p_retry_ms bigint[])
RETURNS smallint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_route smallint[];
    v_qids  bigint[];
    v_pids  bigint[];
BEGIN
    IF (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        RETURN {{schema}}.lock_skip_failures_routed(p_pids, p_act, p_wait, p_retry_ms);
    END IF;
    -- Read unlocked: a Configure racing this may change the policy or the
    -- backoff. settle_rows re-reads both under the cursor row lock and
    -- takes a route only if this took its lock.
    v_route := ARRAY(
        SELECT (CASE WHEN x.act = 1 AND qq.failure_policy = 'skip' THEN
                         CASE WHEN {{schema}}.failure_wait_ms(p_retry_ms[x.o], 1, qq.retry_backoff_min_ms,
                                                              qq.retry_backoff_max_ms, 0) > 0
                              THEN 2 ELSE 1 END
                     ELSE 0 END)::smallint
        FROM unnest(p_pids, p_act) WITH ORDINALITY AS x(pid, act, o)
        LEFT JOIN {{schema}}.partitions p ON p.id = x.pid
        LEFT JOIN {{schema}}.queues qq ON qq.id = p.queue_id
        ORDER BY x.o);
    IF NOT (1 = ANY (v_route) OR 2 = ANY (v_route) OR 1 = ANY (p_act) OR 3 = ANY (p_act)) THEN
        RETURN v_route;
    END IF;
    -- Also the queues of the rows that may write a dead letter (a failure
    -- that spends the budget, a dead letter), whose foreign key takes the
    -- queue row KEY SHARE too: before the cursor row, for the same reason.
    v_qids := ARRAY(SELECT p.queue_id FROM {{schema}}.partitions p
                    WHERE p.id IN (SELECT x.pid FROM unnest(p_pids, v_route, p_act) AS x(pid, r, act)
                                   WHERE x.r = 2 OR x.act IN (1, 3)));
    v_pids := ARRAY(SELECT x.pid FROM unnest(p_pids, v_route) AS x(pid, r) WHERE x.r = 1);
    IF p_wait THEN
        SELECT coalesce(array_agg(l.id), '{}') INTO v_qids FROM (
            SELECT q.id FROM {{schema}}.queues q WHERE q.id = ANY (v_qids) ORDER BY q.id FOR KEY SHARE) l;
        SELECT coalesce(array_agg(l.id), '{}') INTO v_pids FROM (
            SELECT p.id FROM {{schema}}.partitions p WHERE p.id = ANY (v_pids) ORDER BY p.id FOR NO KEY UPDATE) l;
    ELSE
        SELECT coalesce(array_agg(l.id), '{}') INTO v_qids FROM (
            SELECT q.id FROM {{schema}}.queues q WHERE q.id = ANY (v_qids) ORDER BY q.id FOR KEY SHARE SKIP LOCKED) l;
        SELECT coalesce(array_agg(l.id), '{}') INTO v_pids FROM (
            SELECT p.id FROM {{schema}}.partitions p WHERE p.id = ANY (v_pids) ORDER BY p.id
            FOR NO KEY UPDATE SKIP LOCKED) l;
    END IF;
    RETURN ARRAY(SELECT (CASE WHEN x.r = 1 AND x.pid = ANY (v_pids) THEN 1
                              WHEN x.r = 2 AND p.queue_id = ANY (v_qids) THEN 2
                              ELSE 0 END)::smallint
                 FROM unnest(p_pids, v_route) WITH ORDINALITY AS x(pid, r, o)
                 LEFT JOIN {{schema}}.partitions p ON p.id = x.pid
                 ORDER BY x.o);
END
$$;

-- The failures the message at offset p_off of partition p_pid carried in
-- from an earlier re-enqueue (its segment's count); 0 when none.
CREATE OR REPLACE FUNCTION {{schema}}.segment_failures(p_pid bigint, p_off bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    SELECT s.failures INTO v_n
    FROM (SELECT ss.end_offset, ss.failures FROM {{schema}}.segments ss
          WHERE ss.partition_id = p_pid AND ss.base_offset <= p_off
          ORDER BY ss.base_offset DESC LIMIT 1) s
    WHERE s.end_offset >= p_off;
    RETURN coalesce(v_n, 0);
END
$$;

-- Settling, the one function: rows of outcomes, each naming its cursor
-- and lease (p_pids, p_groups, p_leases), an offset (p_offs), an action
-- (p_act), whether it ends the lease (p_release), its dead-letter snapshot
-- (p_dls, read for failures and dead letters) and, per failure, the
-- segment its re-enqueue appends (p_blobs: the message's frame exactly as
-- stored, in a raw-codec blob the client builds; NULL for the other
-- actions; a failure that re-enqueues without one fails the call). The
-- rows of one lease are settled together under its locked cursor row.
--
-- Keyed rows (p_keyed, per-key parallel Consume, KeyConcurrency > 1) are
-- the general case: one row per message outcome, many per lease, settled
-- out of order. An ack, a dead letter, a failure that spends the budget
-- (dead letter or drop) and a skip-policy failure (a copy at the tail,
-- now or when its wait is over) settle their offset; committed moves over the contiguous
-- settled prefix and the rest goes to consumers.settled, which a later
-- claim skips. Any other failure is charged to its own offset (the head's
-- in attempts, others' in fail_offs / fail_counts), so RetryLimit holds
-- per message wherever it sits, and, when its wait (failure_wait_ms) is
-- not 0, noted in wait_offs / wait_at: a later claim does not deliver it
-- before then, while the rest of the lane goes on (see pop_claim). A
-- retry or an interrupt settles nothing; an interrupt of the new head
-- takes back the lease's delivery. Action 5 carries only a lease's
-- release (with the batch's last offset); action 6 (park) is a carry from
-- a holder that was left with waiting keys only: the partition is parked
-- (idle_until: the earliest wait's end; idle_seen was set by the claim)
-- unless some failure charged above the cursor has no wait (it is
-- redelivered at once). Action 7 (held) notes a message its holder left
-- unstarted behind a waiting one of its key in held_offs, which claims
-- do not count toward their Batch while a wait holds (see pop_claim). The
-- lease is released when a row asks for it or committed reaches
-- batch_end, and kept otherwise (a checkpoint). An offset already settled
-- gets status 1 and changes nothing, so resending an outcome is harmless
-- except a failure's charge; a skip-policy failure re-enqueued answers 6.
--
-- In-order rows (NOT p_keyed, Ack/Fail/AckBatch) are one per lease
-- settlement: commit the cursor through p_ok, then act at p_offs (actions
-- 1, 2 and 4 also commit what is before it and end the lease; 3 commits
-- through it). A failure is charged to the head (attempts) and, under
-- 'skip' while the budget lasts, re-enqueued and passed (status 0, as any
-- Fail); the failure that spends the budget dead-letters or drops.
-- Status 1 when everything named is at or below the cursor, 2 when the
-- lease is not live or the offsets pass batch_end.
--
-- A skip-policy failure's copy is appended at once (requeue_one) when its
-- wait (failure_wait_ms: the handler's RetryAfter, else the queue's
-- backoff) is 0, else held in scheduled until then (requeue_later), which
-- move_scheduled appends when due; either way the cursor passes the
-- failed message now, so nothing waits behind it.
--
-- A message's retry budget is what its segment carries (segment_failures)
-- plus what its cursor has charged. Lock order (lock_skip_failures): the
-- queues of skip-policy failures with a wait (KEY SHARE, for
-- requeue_later's foreign key), then the partitions of those without one
-- (requeue_one appends there), each in ascending id, waiting for them
-- only with p_wait (see settle_v2), then the cursor rows in ascending
-- (partition id, group).
CREATE OR REPLACE FUNCTION {{schema}}.settle_rows(
    p_keyed   boolean,
    p_wait    boolean,
    p_pids    bigint[],
    p_groups  text[],
    p_leases  uuid[],
    p_ok      bigint[], -- in-order rows only (NULL when keyed)
    p_offs    bigint[],
    p_act     smallint[],
    p_release boolean[],
    p_dls     {{schema}}.dead_letter_snapshot[],
    p_blobs   bytea[],
    -- Per failure (action 1), the wait in ms before the next attempt the
    -- handler asked for (RetryAfter); NULL, 0 or the array NULL: the
    -- queue's schedule (failure_wait_ms). It applies to a row redelivered
    -- in place (a keyed one waits alone, see wait_offs) and to a
    -- skip-policy copy.
    p_retry_ms bigint[]
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql
-- Array-driven statements would otherwise be re-planned on every call.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n       integer := coalesce(cardinality(p_pids), 0);
    v_what  text := CASE WHEN p_keyed THEN 'settle_keyed' ELSE 'settle' END;
    v_route smallint[] := '{}';
    v_l     record;
    v_c     record;
    i       integer;
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
    v_spent integer;
    v_rel   boolean;
    v_bad   boolean;
    v_dl    boolean;
    v_rq    boolean;
    v_wait  bigint;
    v_retry timestamptz;
    v_wo    bigint[];
    v_held  bigint[];
    v_wa    timestamptz[];
    v_park  boolean;
    v_idle  timestamptz;
    v_st    smallint[];
    v_res   {{schema}}.settle_result[];
BEGIN
    IF coalesce(cardinality(p_groups), 0) <> n OR coalesce(cardinality(p_leases), 0) <> n
       OR (NOT p_keyed AND coalesce(cardinality(p_ok), 0) <> n)
       OR (p_retry_ms IS NOT NULL AND cardinality(p_retry_ms) <> n)
       OR coalesce(cardinality(p_offs), 0) <> n OR coalesce(cardinality(p_act), 0) <> n
       OR coalesce(cardinality(p_release), 0) <> n OR coalesce(cardinality(p_dls), 0) <> n
       OR coalesce(cardinality(p_blobs), 0) <> n THEN
        RAISE EXCEPTION 'queen: % arrays are not aligned', v_what;
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    IF 1 = ANY (p_act) OR 3 = ANY (p_act) THEN
        v_route := {{schema}}.lock_skip_failures(p_pids, p_act, p_wait, p_retry_ms);
    END IF;

    -- One lease at a time: a keyed lease's rows together, in offset
    -- order; each in-order row on its own.
    FOR v_l IN
        SELECT x.pid, x.g, x.lease, array_agg(x.o::integer ORDER BY x.off, x.o) AS ords
        FROM unnest(p_pids, p_groups, p_leases, p_offs) WITH ORDINALITY AS x(pid, g, lease, off, o)
        GROUP BY x.pid, x.g, x.lease, CASE WHEN p_keyed THEN 0 ELSE x.o END
        ORDER BY x.pid, x.g, min(x.o)
    LOOP
        SELECT cc.committed, cc.batch_end, cc.lease_id, cc.lease_expires_at, cc.attempts,
               cc.settled, cc.fail_offs, cc.fail_counts, cc.wait_offs, cc.wait_at, cc.held_offs,
               p.name AS partition_name, qq.id AS queue_id, qq.retry_limit, qq.dead_letter,
               qq.failure_policy, qq.encryption, qq.retry_backoff_min_ms, qq.retry_backoff_max_ms
        INTO v_c
        FROM {{schema}}.consumers cc
        JOIN {{schema}}.partitions p ON p.id = cc.partition_id
        JOIN {{schema}}.queues qq ON qq.id = p.queue_id
        WHERE cc.partition_id = v_l.pid AND p.id = v_l.pid AND cc.group_name = v_l.g
        FOR UPDATE OF cc;
        IF NOT FOUND THEN
            FOREACH j IN ARRAY v_l.ords LOOP
                v_res[j] := ROW(j, 5, NULL);
            END LOOP;
            CONTINUE;
        END IF;

        IF NOT p_keyed THEN
            i := v_l.ords[1];
            IF greatest(p_ok[i], CASE WHEN p_act[i] = 0 THEN -1 ELSE p_offs[i] END) <= v_c.committed THEN
                v_res[i] := ROW(i, 1, v_c.committed);
                CONTINUE;
            END IF;
            IF v_c.lease_id IS DISTINCT FROM p_leases[i] OR v_c.lease_expires_at <= v_now
               OR greatest(p_ok[i], p_offs[i]) > v_c.batch_end THEN
                v_res[i] := ROW(i, 2, v_c.committed);
                CONTINUE;
            END IF;

            v_comm := greatest(v_c.committed, p_ok[i]);
            v_att := v_c.attempts;
            v_rel := p_release[i];
            v_dl := false;
            v_rq := false;
            v_st[i] := 0;
            v_prior := 0;
            v_retry := NULL;
            IF p_act[i] IN (1, 3) THEN
                v_prior := {{schema}}.segment_failures(v_l.pid, p_offs[i]);
            END IF;
            IF p_act[i] IN (1, 2, 4) THEN
                v_comm := greatest(v_comm, p_offs[i] - 1);
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
                    v_comm := p_offs[i];
                    v_att := {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
                    v_dl := v_c.dead_letter;
                    v_st[i] := CASE WHEN v_c.dead_letter THEN 3 ELSE 4 END;
                ELSIF v_c.failure_policy = 'skip' AND v_route[i] IN (1, 2)
                      -- push_bundle's check: nothing plaintext is written to
                      -- an encrypted queue. A message from before encryption
                      -- was switched on is redelivered in place instead.
                      AND NOT (v_c.encryption AND (coalesce((p_dls[i]).flags, 0) & 1) = 0) THEN
                    -- Out of the way: a copy at the tail (now, or held in
                    -- scheduled until its wait is over), the cursor past it.
                    IF p_blobs[i] IS NULL THEN
                        RAISE EXCEPTION 'queen: % input % re-enqueues a failure without its segment', v_what, i;
                    END IF;
                    v_rq := true;
                    v_comm := p_offs[i];
                    v_att := {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
                ELSE
                    -- Redelivered in place: not before its backoff (the
                    -- rule is retry_wait_ms) or the wait the handler asked
                    -- for. The lease is released (v_rel above), so the wait
                    -- holds no consumer; pop skips the cursor until then.
                    v_wait := {{schema}}.failure_wait_ms(p_retry_ms[i], v_spent, v_c.retry_backoff_min_ms,
                                                         v_c.retry_backoff_max_ms, random());
                    IF v_wait > 0 THEN
                        v_retry := v_now + v_wait * interval '1 millisecond';
                    END IF;
                END IF;
            ELSIF p_act[i] = 3 THEN
                v_comm := p_offs[i];
                v_att := {{schema}}.fail_at(v_c.fail_offs, v_c.fail_counts, v_comm + 1);
                v_dl := true;
                v_st[i] := 3;
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
                (batch_end, lease_id, lease_owner, lease_expires_at)
                                 = (SELECT * FROM {{schema}}.lease_after(v_rel, batch_end, lease_id, lease_owner,
                                                                         lease_expires_at)),
                retry_at         = v_retry,
                updated_at       = v_now
            WHERE partition_id = v_l.pid AND group_name = v_l.g;

            IF v_rq AND v_route[i] = 2 THEN
                PERFORM {{schema}}.requeue_later(v_c.queue_id, v_l.pid, v_c.partition_name, p_offs[i],
                    v_now + {{schema}}.failure_wait_ms(p_retry_ms[i], v_spent, v_c.retry_backoff_min_ms,
                                                       v_c.retry_backoff_max_ms, random()) * interval '1 millisecond',
                    (p_dls[i]).message_id, (p_dls[i]).flags, p_blobs[i], v_spent);
            ELSIF v_rq THEN
                PERFORM {{schema}}.requeue_one(v_l.pid, p_offs[i], p_blobs[i], v_spent);
            END IF;
            IF v_dl THEN
                PERFORM {{schema}}.insert_dead_letters(v_c.queue_id, v_l.pid, v_c.partition_name, v_l.g,
                                                       ARRAY[p_offs[i]], ARRAY[v_spent], ARRAY[p_dls[i]]);
            END IF;
            v_res[i] := ROW(i, v_st[i], v_comm);
            CONTINUE;
        END IF;

        -- Keyed rows from here.
        SELECT bool_or(p_act[o] NOT IN (5, 6) AND p_offs[o] > v_c.batch_end) INTO v_bad FROM unnest(v_l.ords) AS u(o);
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
        SELECT bool_or(p_release[u.o]), bool_or(p_act[u.o] = 6) INTO v_rel, v_park FROM unnest(v_l.ords) AS u(o);
        -- The waits that still hold; a failure below replaces its own.
        v_wo := '{}';
        v_wa := '{}';
        IF v_c.wait_offs IS NOT NULL THEN
            v_wo := coalesce({{schema}}.waits_live(v_c.wait_offs, v_c.wait_at, v_c.committed, v_c.settled, v_now), '{}');
            v_wa := coalesce({{schema}}.waits_live_at(v_c.wait_offs, v_c.wait_at, v_c.committed, v_c.settled, v_now),
                             '{}');
        END IF;
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
            v_prior := {{schema}}.segment_failures(v_l.pid, p_offs[j]);
            k := array_position(v_fo, p_offs[j]);
            v_cnt := CASE WHEN k IS NULL THEN 0 ELSE v_fc[k] END;
            IF p_act[j] = 1 THEN
                v_cnt := v_cnt + 1;
            END IF;
            IF p_act[j] = 3 OR v_prior + v_cnt >= greatest(v_c.retry_limit, 1) THEN
                v_set := v_set || p_offs[j];
                v_st[j] := CASE WHEN p_act[j] = 3 OR v_c.dead_letter THEN 3 ELSE 4 END;
                IF v_st[j] = 3 THEN
                    PERFORM {{schema}}.insert_dead_letters(v_c.queue_id, v_l.pid, v_c.partition_name, v_l.g,
                                                           ARRAY[p_offs[j]], ARRAY[v_prior + v_cnt], ARRAY[p_dls[j]]);
                END IF;
            ELSIF v_c.failure_policy = 'skip' AND v_route[j] IN (1, 2)
                  AND NOT (v_c.encryption AND (coalesce((p_dls[j]).flags, 0) & 1) = 0) THEN
                IF p_blobs[j] IS NULL THEN
                    RAISE EXCEPTION 'queen: % input % re-enqueues a failure without its segment', v_what, j;
                END IF;
                IF v_route[j] = 2 THEN
                    PERFORM {{schema}}.requeue_later(v_c.queue_id, v_l.pid, v_c.partition_name, p_offs[j],
                        v_now + {{schema}}.failure_wait_ms(p_retry_ms[j], v_prior + v_cnt, v_c.retry_backoff_min_ms,
                                                           v_c.retry_backoff_max_ms, random()) * interval '1 millisecond',
                        (p_dls[j]).message_id, (p_dls[j]).flags, p_blobs[j], v_prior + v_cnt);
                ELSE
                    PERFORM {{schema}}.requeue_one(v_l.pid, p_offs[j], p_blobs[j], v_prior + v_cnt);
                END IF;
                v_set := v_set || p_offs[j];
                v_st[j] := 6;
            ELSE
                IF k IS NULL THEN
                    v_fo := v_fo || p_offs[j];
                    v_fc := v_fc || v_cnt;
                ELSE
                    v_fc[k] := v_cnt;
                END IF;
                -- Redelivered in place, not before its wait: the message
                -- alone waits (wait_offs), its key behind it in the
                -- client, the lane's other keys go on.
                IF p_act[j] = 1 THEN
                    v_wait := {{schema}}.failure_wait_ms(p_retry_ms[j], v_prior + v_cnt, v_c.retry_backoff_min_ms,
                                                         v_c.retry_backoff_max_ms, random());
                    k := array_position(v_wo, p_offs[j]);
                    IF k IS NOT NULL THEN
                        v_wo := v_wo[:k - 1] || v_wo[k + 1:];
                        v_wa := v_wa[:k - 1] || v_wa[k + 1:];
                    END IF;
                    IF v_wait > 0 THEN
                        v_wo := v_wo || p_offs[j];
                        v_wa := v_wa || (v_now + v_wait * interval '1 millisecond');
                    END IF;
                END IF;
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
        -- Waits of what is still unsettled above the new cursor, in order.
        SELECT array_agg(u.o ORDER BY u.o), array_agg(u.t ORDER BY u.o) INTO v_wo, v_wa
        FROM unnest(v_wo, v_wa) AS u(o, t)
        WHERE u.o > v_comm AND NOT (u.o = ANY (v_set));
        -- Held behind a wait: meaningful only while one holds.
        v_held := CASE WHEN v_wo IS NULL THEN NULL
            ELSE ARRAY(SELECT DISTINCT u.o FROM unnest(coalesce(v_c.held_offs, '{}')
                                                       || ARRAY(SELECT p_offs[x.o] FROM unnest(v_l.ords) AS x(o)
                                                                WHERE p_act[x.o] = 7)) AS u(o)
                       WHERE u.o > v_comm AND NOT (u.o = ANY (v_set)) ORDER BY u.o) END;
        IF cardinality(v_held) = 0 THEN
            v_held := NULL;
        END IF;
        -- Parked: only waiting keys were left, and every failure charged
        -- above the cursor (attempts for its head, fail_offs) waits.
        v_idle := NULL;
        IF v_rel AND v_park AND v_wo IS NOT NULL
           AND (v_att = 0 OR (v_comm + 1) = ANY (v_wo))
           AND NOT EXISTS (SELECT 1 FROM unnest(v_fo) AS u(o) WHERE NOT (u.o = ANY (v_wo))) THEN
            v_idle := (SELECT min(u.t) FROM unnest(v_wa) AS u(t));
        END IF;
        UPDATE {{schema}}.consumers SET
            committed        = v_comm,
            attempts         = v_att,
            settled          = {{schema}}.offsets_above(v_set, v_comm),
            fail_offs        = v_fo,
            fail_counts      = v_fc,
            wait_offs        = v_wo,
            wait_at          = v_wa,
            held_offs        = v_held,
            idle_until       = v_idle,
            deliveries       = CASE WHEN (v_comm + 1) = ANY (v_intr) AND v_comm = v_c.committed
                                        THEN greatest(deliveries - 1, 0)
                                    WHEN (v_comm + 1) = ANY (v_intr) THEN 0
                                    WHEN v_comm = v_c.committed THEN deliveries
                                    WHEN v_comm < delivered_max THEN 1 ELSE 0 END,
            (batch_end, lease_id, lease_owner, lease_expires_at)
                             = (SELECT * FROM {{schema}}.lease_after(v_rel, batch_end, lease_id, lease_owner,
                                                                     lease_expires_at)),
            updated_at       = v_now
        WHERE partition_id = v_l.pid AND group_name = v_l.g;
        FOREACH j IN ARRAY v_l.ords LOOP
            v_res[j] := ROW(j, v_st[j], v_comm);
        END LOOP;
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_res) ORDER BY 1;
END
$$;

-- In-order settling (settle_rows, NOT p_keyed), with the arguments the
-- client's Settle statement passes: per lease settlement, commit through
-- p_ok then act (0 none, 1 fail, 2 retry, 3 dead letter, 4 interrupt: a
-- retry that also takes back the lease's delivery, so a consumer shutting
-- down hands back what it did not finish, uncharged and uncounted) on the
-- message at p_act_off, whose dead-letter snapshot the p_dl_* arrays and
-- p_reasons hold. While its transaction has written and locked no row
-- (no transaction id assigned yet: a fused settle, its own transaction, or
-- Client.Tx without pushes) nothing is held, so it waits for the
-- skip-policy failures' locks in ascending id. After writes (Client.Tx
-- settles after its pushes, whose partition locks it holds) waiting could
-- close a cycle with a push bundle, so it takes only rows free now; a
-- failure whose lock is busy at that instant is redelivered in place, as
-- under pause. (Not transaction_timestamp() = statement_timestamp(): over
-- the extended protocol Bind starts the transaction and Execute restarts
-- the statement clock, so the two never match.)
CREATE OR REPLACE FUNCTION {{schema}}.settle_v2(
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
    p_dl_keys    text[],  -- ordering keys ('' or NULL: none)
    p_dl_headers bytea[], -- encoded headers (empty or NULL: none)
    p_blobs      bytea[], -- per failure, its re-enqueue's segment (see settle_rows); NULL otherwise
    p_retry_ms   bigint[] -- per failure, the wait RetryAfter asked for (see settle_rows); NULL: the schedule
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM {{schema}}.settle_rows(false, pg_current_xact_id_if_assigned() IS NULL,
        p_pids, p_groups, p_leases, p_ok, p_act_off, p_act, p_release,
        {{schema}}.dead_letter_snapshots('settle', coalesce(cardinality(p_pids), 0), p_act, p_dl_ids, p_dl_txns,
                                         p_dl_flags, p_dl_payload, p_dl_created, p_dl_keys, p_dl_headers, p_reasons),
        p_blobs, p_retry_ms);
END
$$;

-- Out-of-order settling (settle_rows with keyed rows), with the arguments
-- the client's SettleKeyed statement passes; it always waits for the
-- skip-policy failures' locks (lock_skip_failures).
CREATE OR REPLACE FUNCTION {{schema}}.settle_keyed_v2(
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
    p_dl_keys    text[],  -- ordering keys ('' or NULL: none)
    p_dl_headers bytea[], -- encoded headers (empty or NULL: none)
    p_blobs      bytea[], -- per failure, its re-enqueue's segment (see settle_rows); NULL otherwise
    p_retry_ms   bigint[] -- per failure, the wait RetryAfter asked for (see settle_rows); NULL: the schedule
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM {{schema}}.settle_rows(true, true, p_pids, p_groups, p_leases, NULL, p_offs, p_act,
        p_release, {{schema}}.dead_letter_snapshots('settle_keyed', coalesce(cardinality(p_pids), 0), p_act, p_dl_ids,
                                                    p_dl_txns, p_dl_flags, p_dl_payload, p_dl_created, p_dl_keys,
                                                    p_dl_headers, p_reasons),
        p_blobs, p_retry_ms);
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
CREATE OR REPLACE FUNCTION {{schema}}.ack_many(
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
    IF (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        RETURN QUERY SELECT * FROM {{schema}}.ack_many_routed(p_pids, p_groups, p_leases, p_ok);
        RETURN;
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
            (batch_end, lease_id, lease_owner, lease_expires_at)
                             = (SELECT * FROM {{schema}}.lease_after(
                                    (CASE WHEN c.settled IS NULL THEN o.ok
                                          ELSE {{schema}}.settled_advance(o.ok, c.settled) END) >= c.batch_end,
                                    c.batch_end, c.lease_id, c.lease_owner, c.lease_expires_at)),
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
