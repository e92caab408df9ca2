-- Dead letters: storing them (from settle and pop), and the operator
-- actions on groups and dead letters: pause and requeue.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- The dead-letter snapshots (type dead_letter_snapshot) of the parallel
-- arrays a statement passes, one per input, in input order; p_keys and
-- p_headers may be NULL (none). Arrays not p_n long fail the call, named
-- by p_what (the caller's name for itself). With p_act (settling's
-- actions) only a failure (1) or a dead letter (3) reads its snapshot: the
-- others get NULL, and a call without either builds none, so a batch of
-- acks pays only for the check.
CREATE OR REPLACE FUNCTION {{schema}}.dead_letter_snapshots(
    p_what     text,
    p_n        integer,
    p_act      smallint[],
    p_ids      uuid[],
    p_txns     text[],
    p_flags    integer[],
    p_payloads bytea[],
    p_created  timestamptz[],
    p_keys     text[],
    p_headers  bytea[],
    p_reasons  text[]
) RETURNS {{schema}}.dead_letter_snapshot[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF coalesce(cardinality(p_ids), 0) <> p_n OR coalesce(cardinality(p_txns), 0) <> p_n
       OR coalesce(cardinality(p_flags), 0) <> p_n OR coalesce(cardinality(p_payloads), 0) <> p_n
       OR coalesce(cardinality(p_created), 0) <> p_n OR coalesce(cardinality(p_reasons), 0) <> p_n
       OR (p_keys IS NOT NULL AND cardinality(p_keys) <> p_n)
       OR (p_headers IS NOT NULL AND cardinality(p_headers) <> p_n) THEN
        RAISE EXCEPTION 'queen: % arrays are not aligned', p_what;
    END IF;
    IF p_act IS NOT NULL AND NOT (1 = ANY (p_act) OR 3 = ANY (p_act)) THEN
        RETURN array_fill(NULL::{{schema}}.dead_letter_snapshot, ARRAY[p_n]);
    END IF;
    RETURN ARRAY(SELECT CASE WHEN p_act IS NULL OR p_act[x.o] IN (1, 3)
                             THEN ROW(x.id, x.txn, x.fl, x.pl, x.at, x.k, x.h, x.r)::{{schema}}.dead_letter_snapshot END
                 FROM unnest(p_ids, p_txns, p_flags, p_payloads, p_created, p_keys, p_headers, p_reasons)
                      WITH ORDINALITY AS x(id, txn, fl, pl, at, k, h, r, o)
                 ORDER BY x.o);
END
$$;

-- Stores dead letters of group p_group from partition p_pid (of queue
-- p_qid, named p_part): per message its offset, the attempts it spent and
-- its snapshot, in offset order. The one INSERT into dead_letters of
-- settling and of pop_dead_letter.
CREATE OR REPLACE FUNCTION {{schema}}.insert_dead_letters(
    p_qid      bigint,
    p_pid      bigint,
    p_part     text,
    p_group    text,
    p_offs     bigint[],
    p_attempts integer[],
    p_dls      {{schema}}.dead_letter_snapshot[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {{schema}}.dead_letters (queue_id, partition_id, partition_name, group_name,
        msg_offset, message_id, transaction_id, message_key, message_headers, flags, payload, message_created_at,
        attempts, reason)
    SELECT p_qid, p_pid, p_part, p_group, x.off, x.id, x.txn, nullif(x.key, ''), nullif(x.hdrs, '\x'::bytea),
           x.flags, x.payload, x.created, x.att, x.reason
    -- A composite array unnests into its fields.
    FROM unnest(p_offs, p_attempts, p_dls) AS x(off, att, id, txn, flags, payload, created, key, hdrs, reason)
    ORDER BY x.off;
END
$$;

-- Pauses group p_group of queue (p_tenant, p_queue), creating the queue
-- (default options, as a first push would) if it does not exist.
CREATE OR REPLACE FUNCTION {{schema}}.pause_group(p_tenant uuid, p_queue text, p_group text)
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

-- One page of the dead letters of queue (p_tenant, p_queue) that a
-- DeadLetterQuery selects, in id order: groups p_groups, partition
-- p_partition, stored in [p_since, p_until), ids above p_after and in
-- p_ids, at most p_limit (a NULL filter selects all). Listing, requeueing
-- and discarding select through it. PL/pgSQL, not plain SQL: Citus plans
-- no SQL function with parameters over its tables; a page is at most
-- p_limit rows, so not being inlined costs little.
CREATE OR REPLACE FUNCTION {{schema}}.dead_letters_page(p_tenant uuid, p_queue text, p_groups text[],
                                                      p_partition text, p_since timestamptz,
                                                      p_until timestamptz, p_after bigint, p_limit integer,
                                                      p_ids bigint[])
RETURNS SETOF {{schema}}.dead_letters
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT d.*
    FROM {{schema}}.dead_letters d
    JOIN {{schema}}.queues q ON q.id = d.queue_id
    WHERE q.tenant = p_tenant AND q.name = p_queue
      AND (p_groups IS NULL OR d.group_name = ANY (p_groups))
      AND (p_partition IS NULL OR d.partition_name = p_partition)
      AND (p_since IS NULL OR d.created_at >= p_since)
      AND (p_until IS NULL OR d.created_at < p_until)
      AND d.id > p_after
      AND (p_ids IS NULL OR d.id = ANY (p_ids))
    ORDER BY d.id
    LIMIT p_limit;
END
$$;

-- Deletes the page of dead letters dead_letters_page selects with the same
-- arguments, those up to p_max (NULL: all of it), in one call: all of it
-- or none. Returns how many it deleted (one a requeue deleted meanwhile is
-- not counted). The page is read first and deleted by id: a DELETE joining
-- the page function runs it on every node of the Citus layout, where it
-- fails.
CREATE OR REPLACE FUNCTION {{schema}}.discard_dead_letters(p_tenant uuid, p_queue text, p_groups text[],
                                                         p_partition text, p_since timestamptz,
                                                         p_until timestamptz, p_after bigint, p_limit integer,
                                                         p_ids bigint[], p_max bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_n   bigint;
BEGIN
    SELECT array_agg(d.id) INTO v_ids
    FROM {{schema}}.dead_letters_page(p_tenant, p_queue, p_groups, p_partition, p_since, p_until, p_after,
                                      p_limit, p_ids) d
    WHERE p_max IS NULL OR d.id <= p_max;
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    DELETE FROM {{schema}}.dead_letters WHERE id = ANY (v_ids);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- Deletes the dead letters past their queue's dead_letter_retention_ms,
-- oldest first per queue (dead_letters_queue_created_idx), at most p_max
-- in all; one a requeue or discard holds is left for the next pass.
-- Returns how many. Reads first: with none due it writes nothing, where a
-- DELETE of no row would be, on the Citus layout (a reference table), a
-- two-phase commit over every node, each maintenance pass.
CREATE OR REPLACE FUNCTION {{schema}}.dead_letter_retention_step(p_max integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    v_n   bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.queues q
                   WHERE q.dead_letter_retention_ms > 0
                     AND EXISTS (SELECT 1 FROM {{schema}}.dead_letters d
                                 WHERE d.queue_id = q.id
                                   AND d.created_at < v_now - q.dead_letter_retention_ms * interval '1 millisecond')) THEN
        RETURN 0;
    END IF;
    WITH due AS (
        SELECT x.id
        FROM {{schema}}.queues q
        CROSS JOIN LATERAL (
            SELECT d.id FROM {{schema}}.dead_letters d
            WHERE d.queue_id = q.id
              AND d.created_at < v_now - q.dead_letter_retention_ms * interval '1 millisecond'
            ORDER BY d.created_at
            LIMIT p_max
            FOR UPDATE OF d SKIP LOCKED) x
        WHERE q.dead_letter_retention_ms > 0
        LIMIT p_max
    ), del AS (
        DELETE FROM {{schema}}.dead_letters d USING due WHERE d.id = due.id RETURNING 1
    )
    SELECT count(*) INTO v_n FROM del;
    RETURN v_n;
END
$$;

-- Requeues dead letters p_ids of queue p_qid: each goes back to the tail
-- of its partition (by name: a partition forgotten since is created again)
-- as p_blobs[i], a segment of its own that the client built from the dead
-- letter (a raw-codec blob of one frame: its message id, transaction id,
-- key, headers and stored payload, still ciphertext if it was, or the
-- client's sealing of a plaintext one for a queue encrypted since), with
-- no failures and hash p_hashes[i] (xxh3-128 of its transaction id: ack by
-- transaction id and later producer retries find it; the copy itself is
-- not probed, so it is never a duplicate of its original). p_payloads[i] /
-- p_flags[i] are not NULL only for a dead letter the client sealed: its
-- sealed payload and flags. The flags (else the stored ones) keep
-- plaintext out of an encrypted queue; the payload is not read, as the
-- blob holds it, but the previous release passed it there and its
-- statement's arguments are a prefix of the current one's. A dead letter
-- it requeues without a blob fails the call. In dead-letter id order per
-- partition; dead letters of one message (partition, message id) selected
-- together give one copy. The dead letters are deleted in the same
-- transaction: a retry finds only those not yet requeued. Ids of another
-- queue, gone already, or plaintext for an encrypted queue are left alone.
-- Lock order: partitions in ascending id, then dead letters (a leaf).
-- Returns the partitions written and how many messages each got.
CREATE OR REPLACE FUNCTION {{schema}}.requeue_dead_letters_v2(
    p_qid      bigint,
    p_ids      bigint[],
    p_hashes   bytea[],
    p_payloads bytea[],
    p_flags    integer[],
    p_blobs    bytea[]
) RETURNS TABLE (part_name text, requeued integer)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    n       integer := coalesce(cardinality(p_ids), 0);
    v_enc   boolean;
    v_names text[];
    v_name  text;
    v_pid   bigint;
    v_lpids bigint[];
    v_routed boolean := (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true);
    v_dids  bigint[];
    v_dnames text[];
    v_dmsgs uuid[];
    v_pids  bigint[];
    v_now   timestamptz;
    v_bls   bytea[];
    v_hs    bytea[];
    v_cnt   integer := 0;
    i       integer;
BEGIN
    IF coalesce(cardinality(p_hashes), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR coalesce(cardinality(p_flags), 0) <> n OR coalesce(cardinality(p_blobs), 0) <> n THEN
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
    -- None if the queue was deleted meanwhile: nothing is requeued.
    PERFORM {{schema}}.add_partitions(array_fill(p_qid, ARRAY[cardinality(v_names)]), v_names);
    -- Only partitions locked here take dead letters (one forgotten again
    -- since the insert keeps its dead letters for the next call).
    IF v_routed THEN
        -- The Citus layout: by derived id, locked one per statement (each
        -- routed to its shard) in ascending id.
        v_lpids := '{}';
        FOREACH v_name IN ARRAY v_names LOOP
            v_pid := {{schema}}.partition_of(p_qid, v_name);
            IF v_pid IS NOT NULL THEN
                v_lpids := v_lpids || v_pid;
            END IF;
        END LOOP;
        SELECT coalesce(array_agg(DISTINCT u.id ORDER BY u.id), '{}') INTO v_pids FROM unnest(v_lpids) AS u(id);
        v_lpids := '{}';
        v_names := '{}';
        FOREACH v_pid IN ARRAY v_pids LOOP
            SELECT p.name INTO v_name FROM {{schema}}.partitions p WHERE p.id = v_pid FOR NO KEY UPDATE;
            IF FOUND THEN
                v_lpids := v_lpids || v_pid;
                v_names := v_names || v_name;
            END IF;
        END LOOP;
    ELSE
        SELECT array_agg(l.id), array_agg(l.name) INTO v_lpids, v_names FROM (
            SELECT p.id, p.name FROM {{schema}}.partitions p
            WHERE p.queue_id = p_qid AND p.name = ANY (v_names)
            ORDER BY p.id
            FOR NO KEY UPDATE) l;
    END IF;
    v_now := clock_timestamp(); -- after the row locks: created_at stays monotone
    IF v_routed THEN
        -- The Citus layout plans no DELETE in a CTE here, nor a join with
        -- partitions (distributed): the dead letters are locked (one a
        -- requeue or discard deleted meanwhile is gone), read, deleted by
        -- id, then matched with the partitions locked above by name.
        PERFORM 1 FROM {{schema}}.dead_letters d
        WHERE d.id = ANY (p_ids) AND d.queue_id = p_qid AND d.partition_name = ANY (v_names)
        ORDER BY d.id FOR UPDATE;
        SELECT array_agg(d.id), array_agg(d.partition_name), array_agg(d.message_id), array_agg(x.h), array_agg(x.bl)
        INTO v_dids, v_dnames, v_dmsgs, v_hs, v_bls
        FROM {{schema}}.dead_letters d
        JOIN unnest(p_ids, p_hashes, p_flags, p_blobs) AS x(id, h, fl, bl) ON x.id = d.id
        WHERE d.queue_id = p_qid AND d.partition_name = ANY (v_names)
          AND NOT (v_enc AND (coalesce(x.fl, d.flags) & 1) = 0);
        DELETE FROM {{schema}}.dead_letters d WHERE d.id = ANY (v_dids);
        WITH one AS (
            SELECT DISTINCT ON (p.id, del.message_id) p.id AS pid, p.name, del.*
            FROM unnest(v_dids, v_dnames, v_dmsgs, v_hs, v_bls) AS del(id, partition_name, message_id, h, bl)
            JOIN unnest(v_lpids, v_names) AS p(id, name) ON p.name = del.partition_name
            ORDER BY p.id, del.message_id, del.id
        )
        SELECT array_agg(o.pid ORDER BY o.pid, o.id), array_agg(o.name ORDER BY o.pid, o.id),
               array_agg(o.bl ORDER BY o.pid, o.id), array_agg(o.h ORDER BY o.pid, o.id)
        INTO v_pids, v_names, v_bls, v_hs
        FROM one o;
    ELSE
        WITH x AS (
            SELECT * FROM unnest(p_ids, p_hashes, p_flags, p_blobs) AS x(id, h, fl, bl)
        ), del AS (
            DELETE FROM {{schema}}.dead_letters d
            USING x
            WHERE d.id = x.id AND d.queue_id = p_qid AND d.partition_name = ANY (v_names)
              AND NOT (v_enc AND (coalesce(x.fl, d.flags) & 1) = 0)
            RETURNING d.id, d.partition_name, d.message_id, x.h, x.bl
        ), one AS (
            SELECT DISTINCT ON (p.id, del.message_id) p.id AS pid, p.name, del.*
            FROM del JOIN {{schema}}.partitions p ON p.queue_id = p_qid AND p.name = del.partition_name
            ORDER BY p.id, del.message_id, del.id
        )
        SELECT array_agg(o.pid ORDER BY o.pid, o.id), array_agg(o.name ORDER BY o.pid, o.id),
               array_agg(o.bl ORDER BY o.pid, o.id), array_agg(o.h ORDER BY o.pid, o.id)
        INTO v_pids, v_names, v_bls, v_hs
        FROM one o;
    END IF;
    FOR i IN 1 .. coalesce(cardinality(v_pids), 0) LOOP
        IF v_bls[i] IS NULL THEN
            RAISE EXCEPTION 'queen: requeue_dead_letters_v2: a dead letter without its segment';
        END IF;
        -- The allocator without a dedup probe (window 0): the copy repeats
        -- its original's transaction id on purpose.
        PERFORM {{schema}}.push_one(v_pids[i], 1,
            CASE WHEN octet_length(v_hs[i]) = 16 THEN v_hs[i] ELSE '\x00000000000000000000000000000000'::bytea END,
            -1, v_bls[i], 0, v_now, 0);
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
