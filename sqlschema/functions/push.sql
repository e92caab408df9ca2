-- Pushing: the allocator and its callers.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- push_result.status, the verdict per segment of push_bundle and
-- push_segment. alloc.Status mirrors this list and TestStatusCodesMatchSQL
-- compares the two: a code keeps its meaning for good (a new verdict is a
-- new code, and callers that cannot handle it call a new function name).
--   push status 0 queued: stored at base_offset
--   push status 1 duplicate: nothing written; dup_idx/dup_off pair incoming frame indexes with the stored offsets they repeat
--   push status 2 encryption_required: the queue is encrypted and the segment is not; nothing written
--   push status 3 lanes_changed: keys were routed with a lane count that is not the queue's (stale settings); nothing written
--   push status 4 needs_bundle: push_segment did not take the segment (see there); nothing written, send it with push_bundle

-- The dedup probe: the offsets of stored messages, within the window, that
-- the incoming hashes repeat (pairwise with their frame indexes), or NULLs.
CREATE OR REPLACE FUNCTION {{schema}}.dedup_probe(
    p_pid       bigint,
    p_count     integer,
    p_hashes    bytea,
    p_verified  bigint,
    p_last      bigint,
    p_txns_from bigint,
    p_window_ms bigint,
    p_now       timestamptz,
    OUT dup_idx integer[],
    OUT dup_off bigint[]
)
LANGUAGE plpgsql
-- push_bundle forbids hash joins for its own keyed statements, and a
-- function's settings reach the functions it calls: dedup_hits may join
-- every incoming hash against every stored one of the window, which as a
-- nested loop made a 200-message segment cost half a second. The settings
-- live here, not on push_one, whose every call would pay for them.
SET enable_seqscan = on
SET enable_hashjoin = on
SET enable_mergejoin = on
AS $$
DECLARE
    v_base  bigint[];
    v_end   bigint[];
    v_len   integer[];
    v_blob  bytea;
    v_exact boolean;
    s_base  bigint[];
    s_end   bigint[];
    s_len   integer[];
    s_blob  bytea;
    s_exact boolean;
    v_lo    bigint := GREATEST(p_verified, p_txns_from - 1);
    v_cut   timestamptz := p_now - p_window_ms * interval '1 millisecond';
    v_past  bigint; -- a segment's base offset: it and all below are older than the window
    v_x     bigint;
    v_step  bigint := 1;
    v_b     bigint;
    v_t     timestamptz;
    v_hk    integer[];
    v_hp    bigint[];
BEGIN
    -- The window's hashes first, by partition (one shard on the Citus
    -- layout, which plans no join of them with parameters), then the match
    -- (dedup_hits, dedup_offsets).
    -- They live in two places (migration 017): in the segment rows pushed
    -- since, and in hash rows (written before, by an earlier release's
    -- client, or by retention for segments it deleted). Each read is a
    -- statement of its own, routed to the partition's shard. No offset is
    -- in both, and none moves between them in between: retention copies a
    -- segment's hashes and deletes it in one transaction, holding the
    -- partition row, which the caller holds here. Each read gives its rows'
    -- hash blobs end to end, with each row's offsets and length (the
    -- aggregates of one statement see its rows in one order).
    SELECT array_agg(t.base_offset), array_agg(t.end_offset), array_agg(octet_length(t.hashes)),
           string_agg(t.hashes, ''::bytea), bool_and(octet_length(t.hashes) = 16 * (t.end_offset - t.base_offset + 1))
    INTO v_base, v_end, v_len, v_blob, v_exact
    FROM {{schema}}.txns t
    WHERE t.partition_id = p_pid
      AND t.end_offset > v_lo
      AND t.base_offset <= p_last
      AND t.created_at > v_cut;
    -- The window's segments are a suffix of the partition's (created_at
    -- is monotone in offset order), but the read below filters by time
    -- only row by row: unless the first segment past v_lo is in the
    -- window, probe back from p_last, doubling the step, for one that is
    -- not, and read only past it. So the read is of about the window's
    -- rows (at most its span again), whatever the retention keeps, for
    -- log2(span) probes of one row each.
    SELECT s.created_at INTO v_t
    FROM {{schema}}.segments s
    WHERE s.partition_id = p_pid AND s.base_offset > v_lo AND s.base_offset <= p_last
    ORDER BY s.base_offset LIMIT 1;
    IF FOUND AND v_t <= v_cut THEN
        v_x := p_last;
        LOOP
            SELECT s.base_offset, s.created_at INTO v_b, v_t
            FROM {{schema}}.segments s
            WHERE s.partition_id = p_pid AND s.base_offset <= v_x
            ORDER BY s.base_offset DESC LIMIT 1;
            EXIT WHEN NOT FOUND;
            IF v_t <= v_cut THEN
                v_past := v_b;
                EXIT;
            END IF;
            v_x := v_b - v_step;
            v_step := v_step * 2;
        END LOOP;
    END IF;
    SELECT array_agg(s.base_offset), array_agg(s.end_offset), array_agg(octet_length(s.hashes)),
           string_agg(s.hashes, ''::bytea), bool_and(octet_length(s.hashes) = 16 * (s.end_offset - s.base_offset + 1))
    INTO s_base, s_end, s_len, s_blob, s_exact
    FROM {{schema}}.segments s
    WHERE s.partition_id = p_pid
      AND s.base_offset > coalesce(v_past, -9223372036854775808)
      AND s.end_offset > v_lo
      AND s.base_offset <= p_last
      AND s.created_at > v_cut
      AND s.hashes IS NOT NULL;
    IF coalesce(cardinality(v_base), 0) + coalesce(cardinality(s_base), 0) = 0 THEN
        RETURN;
    END IF;
    v_blob := coalesce(v_blob, ''::bytea) || coalesce(s_blob, ''::bytea);
    -- Searched for up to 16 incoming hashes: a search reads the whole
    -- blob for each, the join cuts every stored hash once (over 20,000
    -- stored hashes, 20 to 50 searches cost one join: BenchmarkDedupHits,
    -- and pushbench's acct).
    SELECT h.hit_k, h.hit_p INTO v_hk, v_hp
    FROM {{schema}}.dedup_hits(p_count, p_hashes, v_blob, coalesce(v_exact, true) AND coalesce(s_exact, true), 16) h;
    IF cardinality(v_hk) > 0 THEN
        SELECT o.dup_idx, o.dup_off INTO dup_idx, dup_off
        FROM {{schema}}.dedup_offsets(v_hk, v_hp, coalesce(v_base, '{}') || coalesce(s_base, '{}'),
                                      coalesce(v_end, '{}') || coalesce(s_end, '{}'),
                                      coalesce(v_len, '{}') || coalesce(s_len, '{}')) o;
    END IF;
END
$$;

-- The match of dedup_probe: where in p_blob the p_count incoming hashes
-- (16 bytes each in p_hashes) occur, as pairs of an incoming index and a
-- byte position (from 0) in the blob. The blob is the stored rows' hashes
-- end to end; p_exact says every row is exactly 16 bytes an offset.
-- Up to p_scan_max incoming hashes, each is looked for in the blob itself
-- (position(): a byte search, no row per stored hash), every occurrence
-- kept, straddling or off the grid ones too (dedup_offsets sorts them
-- out). More, or one hash found in too many places, and the blob is cut
-- into 16-byte slots joined with the incoming hashes (by hash: its cost
-- grows with the window, not with the incoming count times the window);
-- that needs p_exact, else the search goes on. The blob is a parameter,
-- the rows' arrays are not: PL/pgSQL expands every array argument on entry,
-- which for a window of one-message segments cost as much as the search.
CREATE OR REPLACE FUNCTION {{schema}}.dedup_hits(
    p_count     integer,
    p_hashes    bytea,
    p_blob      bytea,
    p_exact     boolean,
    p_scan_max  integer,
    OUT hit_k   integer[],
    OUT hit_p   bigint[]
)
LANGUAGE plpgsql IMMUTABLE
SET enable_seqscan = on
SET enable_hashjoin = on
SET enable_mergejoin = on
AS $$
DECLARE
    v_h    bytea;
    v_at   integer;
    v_pos  integer;
    v_n    integer;
    v_k    integer;
    v_join boolean := p_exact AND p_count > p_scan_max;
BEGIN
    -- A search for fewer than 16 bytes would find them everywhere.
    IF p_count IS NULL OR p_count < 0 OR coalesce(octet_length(p_hashes), 0) <> 16 * p_count THEN
        RAISE EXCEPTION 'queen: hash blob is % bytes for % messages (want 16 each)',
            octet_length(p_hashes), p_count;
    END IF;
    hit_k := '{}';
    hit_p := '{}';
    IF NOT v_join THEN
        <<incoming>>
        FOR v_k IN 0 .. p_count - 1 LOOP
            v_h := substring(p_hashes FROM v_k * 16 + 1 FOR 16);
            v_at := 0; -- bytes of the blob searched past
            v_n := 0;
            LOOP
                v_pos := position(v_h IN CASE WHEN v_at = 0 THEN p_blob ELSE substring(p_blob FROM v_at + 1) END);
                EXIT WHEN v_pos = 0;
                hit_k := hit_k || v_k;
                hit_p := hit_p || (v_at + v_pos - 1)::bigint;
                v_at := v_at + v_pos;
                v_n := v_n + 1;
                -- Found in many places (hashes chosen to straddle stored
                -- ones): each further search copies the rest of the blob.
                IF v_n > 16 AND p_exact THEN
                    v_join := true;
                    EXIT incoming;
                END IF;
            END LOOP;
        END LOOP;
    END IF;
    IF v_join THEN
        SELECT coalesce(array_agg(inc.k), '{}'), coalesce(array_agg(st.p), '{}') INTO hit_k, hit_p
        FROM (SELECT k, substring(p_hashes FROM k * 16 + 1 FOR 16) AS h
              FROM generate_series(0, p_count - 1) AS k) inc
        JOIN (SELECT i::bigint * 16 AS p, substring(p_blob FROM i * 16 + 1 FOR 16) AS h
              FROM generate_series(0, octet_length(p_blob) / 16 - 1) AS i) st USING (h);
    END IF;
END
$$;

-- dedup_hits' occurrences as stored offsets: row i of the blob covers
-- offsets p_base[i]..p_end[i] with p_len[i] bytes, its j-th hash the 16
-- bytes at 16j of the row (a row shorter than its offsets has fewer, and
-- bytes past them count for nothing). An occurrence that starts a stored
-- hash of its row is that offset; each incoming hash's lowest one is its
-- answer (NULLs: none).
CREATE OR REPLACE FUNCTION {{schema}}.dedup_offsets(
    p_k         integer[],
    p_p         bigint[],
    p_base      bigint[],
    p_end       bigint[],
    p_len       integer[],
    OUT dup_idx integer[],
    OUT dup_off bigint[]
)
LANGUAGE sql IMMUTABLE AS $$
    SELECT array_agg(d.k ORDER BY d.k), array_agg(d.off ORDER BY d.k)
    FROM (SELECT h.k, min(x.b + (h.p - x.c) / 16) AS off
          FROM unnest(p_k, p_p) AS h(k, p)
          JOIN (SELECT u.b, u.e, coalesce(u.l, 0) AS l, sum(coalesce(u.l, 0)) OVER (ORDER BY u.o) - coalesce(u.l, 0) AS c
                FROM unnest(p_base, p_end, p_len) WITH ORDINALITY AS u(b, e, l, o)) x
            ON h.p >= x.c AND h.p < x.c + x.l
          WHERE (h.p - x.c) % 16 = 0 AND h.p - x.c + 16 <= x.l AND (h.p - x.c) / 16 <= x.e - x.b
          GROUP BY h.k) d
$$;

-- The allocator, also marking the partition pending. created_at is
-- monotone in offset order: a caller holding the row passes the time it
-- took after locking it; one that does not passes NULL, and the segment is
-- stamped once the UPDATE holds the row (after any earlier writer
-- committed). Status 4 (nothing written) when the partition row is gone:
-- only push_segment, which does not lock the row before, can meet that.
CREATE OR REPLACE FUNCTION {{schema}}.push_one(
    p_pid       bigint,
    p_count     integer,
    p_hashes    bytea,
    p_verified  bigint,
    p_blob      bytea,
    p_window_ms bigint,
    p_now       timestamptz,
    -- Failures the segment's (single) message already carries: set when
    -- settle re-enqueues a failed message under the 'skip' policy.
    p_failures  integer DEFAULT 0
) RETURNS {{schema}}.push_result
LANGUAGE plpgsql
AS $$
DECLARE
    v_last       bigint;
    v_txns_start bigint;
    r            {{schema}}.push_result;
BEGIN
    -- A stride mismatch would mis-address acks silently: fail loudly.
    IF p_count IS NULL OR p_count <= 0 OR octet_length(p_hashes) <> 16 * p_count THEN
        RAISE EXCEPTION 'queen: hash blob is % bytes for % messages (want 16 each)',
            octet_length(p_hashes), p_count;
    END IF;
    r.partition_id := p_pid;

    IF p_window_ms > 0 THEN
        SELECT last_offset, txns_start INTO v_last, v_txns_start
        FROM {{schema}}.partitions WHERE id = p_pid FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            r.status := 4;
            RETURN r;
        END IF;
        p_now := coalesce(p_now, clock_timestamp()); -- the row is held now
        SELECT d.dup_idx, d.dup_off INTO r.dup_idx, r.dup_off
        FROM {{schema}}.dedup_probe(p_pid, p_count, p_hashes, p_verified, v_last, v_txns_start,
                                    p_window_ms, p_now) d;
        IF r.dup_idx IS NOT NULL THEN
            r.status := 1;
            RETURN r;
        END IF;
    END IF;

    -- The allocation marks the partition ready (pending = true changes
    -- nothing, so stays HOT, unless the partition had been drained) and
    -- takes the row lock; the segment's time is read after it, then both
    -- rows are written. Three statements, not one with the time read in
    -- it: Citus runs no volatile function in DML on a distributed table.
    -- last_write_at only needs the second, so a time read before the lock
    -- does for it.
    r.created_at := coalesce(p_now, clock_timestamp());
    UPDATE {{schema}}.partitions SET
        last_offset   = last_offset + p_count,
        last_write_at = CASE WHEN r.created_at - last_write_at > interval '1 second'
                             THEN r.created_at ELSE last_write_at END,
        pending       = true
    WHERE id = p_pid
    RETURNING last_offset INTO v_last;
    IF NOT FOUND THEN
        r.status := 4;
        r.created_at := NULL;
        RETURN r;
    END IF;
    r.created_at := coalesce(p_now, clock_timestamp()); -- the row is held now
    -- The hashes in the segment's row (migration 017): no hash row.
    INSERT INTO {{schema}}.segments (partition_id, base_offset, end_offset, created_at, blob, failures, hashes)
    VALUES (p_pid, v_last - p_count + 1, v_last, r.created_at, p_blob, p_failures, p_hashes);

    r.status := 0;
    r.base_offset := v_last - p_count + 1;
    RETURN r;
END
$$;

-- A partition's id (migration 016): the first 8 bytes of
-- sha256(queue id, probe, name) (queue id and probe big-endian, 8 and 4
-- bytes, the name in UTF-8) as a big-endian bigint, its sign bit cleared
-- and its lowest bit set (positive, 62 bits of hash). internal/citus's
-- PartitionKey computes the same on the client. Derived from the queue's
-- id, not its name: a queue deleted and created again has a new id, so
-- nothing still naming the old queue's partitions (rows a delete has not
-- reached yet, a lease being settled, a client's cached ids) can meet the
-- new queue's. sha256 because the server derives ids too (a partition
-- created by a scheduled move, a dead-letter requeue or the previous
-- release's push_bundle) and PostgreSQL has it built in, as Go does: no
-- hash ported to keep bit-exact on either side.
-- STABLE, as convert_to is: the planner inlines a SQL function only when
-- its body is no more volatile than its declaration, and the call it
-- made instead (declared IMMUTABLE) cost about three times the inlined
-- expression, in push_segment on every isolated push it runs.
CREATE OR REPLACE FUNCTION {{schema}}.partition_key(p_qid bigint, p_name text, p_probe integer)
RETURNS bigint
LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT ('x' || encode(substr(sha256(int8send(p_qid) || int4send(p_probe) || convert_to(p_name, 'UTF8')), 1, 8),
                          'hex'))::bit(64)::bigint & 9223372036854775807 | 1
$$;

-- The id of partition p_name of queue p_qid, or NULL: at its derived id,
-- else at its second probe (the first was taken when it was created; both
-- are looked at, since that one may have been purged since), else by name
-- (a partition created before migration 016). Each lookup by id is routed
-- to one shard on the Citus layout; only a partition not found at either
-- probe pays the lookup by name, which runs on every shard there.
CREATE OR REPLACE FUNCTION {{schema}}.partition_of(p_qid bigint, p_name text)
RETURNS bigint
LANGUAGE plpgsql STABLE
-- Citus: the lookup over every shard on one connection per worker. After a
-- parallel one the transaction can no longer write a reference table that
-- a distributed one references (queues: a first keyed push marks its
-- queue after looking its new partitions up). A placeholder elsewhere.
SET citus.multi_shard_modify_mode = 'sequential'
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_qid IS NULL OR p_name IS NULL THEN
        RETURN NULL;
    END IF;
    FOR k IN 0 .. 1 LOOP
        v_id := {{schema}}.partition_key(p_qid, p_name, k);
        PERFORM FROM {{schema}}.partitions p WHERE p.id = v_id AND p.queue_id = p_qid AND p.name = p_name;
        IF FOUND THEN
            RETURN v_id;
        END IF;
    END LOOP;
    -- Literals, not parameters: Citus plans no statement over every shard
    -- with a PL/pgSQL parameter in it.
    EXECUTE format('SELECT p.id FROM {{schema}}.partitions p WHERE p.queue_id = %s AND p.name = %L', p_qid, p_name)
    INTO v_id;
    RETURN v_id;
END
$$;

-- Creates partition p_name of queue p_qid, its last offset p_last, unless
-- it exists: its id, and whether this call created it. The one place a
-- partition row is inserted. At its derived id, or at the second probe if
-- another partition holds that (a 63-bit collision); the primary key
-- decides between concurrent creators, so one partition gets one row on
-- the Citus layout too, where (queue_id, name) is not a constraint. The
-- caller holds the queue row (key share): its foreign key.
CREATE OR REPLACE FUNCTION {{schema}}.add_partition(p_qid bigint, p_name text, p_last bigint,
                                                    OUT id bigint, OUT created boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_q bigint;
    v_n text;
BEGIN
    created := false;
    id := {{schema}}.partition_of(p_qid, p_name);
    IF id IS NOT NULL THEN
        RETURN;
    END IF;
    FOR k IN 0 .. 1 LOOP
        id := {{schema}}.partition_key(p_qid, p_name, k);
        -- No conflict target: on PostgreSQL the unique (queue_id, name)
        -- also holds, and a creator that lost to it finds the row below.
        INSERT INTO {{schema}}.partitions (id, queue_id, name, last_offset)
        VALUES (id, p_qid, p_name, p_last)
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            created := true;
            RETURN;
        END IF;
        -- A statement of its own: it sees the row a concurrent creator
        -- committed while the insert waited for it.
        SELECT p.queue_id, p.name INTO v_q, v_n FROM {{schema}}.partitions p WHERE p.id = add_partition.id;
        IF v_q = p_qid AND v_n = p_name THEN
            RETURN;
        END IF;
    END LOOP;
    id := {{schema}}.partition_of(p_qid, p_name);
    IF id IS NULL THEN
        RAISE EXCEPTION 'queen: partition % of queue %: both of its ids are taken', quote_literal(p_name), p_qid;
    END IF;
END
$$;

-- Adds partitions p_names[i] to queues p_qids[i] where missing. The queue
-- rows are key-shared (in id order, as a foreign key check would) first,
-- and only the rows locked get partitions: a queue deleted meanwhile is
-- waited out and skipped, where the partition's foreign key check would
-- fail raw (a queue re-created since has another id). A queue locked here
-- cannot be deleted until the caller commits. Partitions are created in
-- (queue, name) order, as every creator does, so overlapping creators
-- never wait on each other in a cycle. PL/pgSQL: Citus runs no SQL
-- function with parameters over a distributed table.
CREATE OR REPLACE FUNCTION {{schema}}.add_partitions(p_qids bigint[], p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    rec record;
BEGIN
    FOR rec IN
        WITH l AS MATERIALIZED (
            SELECT qq.id FROM {{schema}}.queues qq
            WHERE qq.id = ANY (p_qids)
            ORDER BY qq.id
            FOR KEY SHARE
        )
        SELECT DISTINCT u.qid, u.nm
        FROM unnest(p_qids, p_names) AS u(qid, nm)
        JOIN l ON l.id = u.qid
        ORDER BY u.qid, u.nm
    LOOP
        PERFORM {{schema}}.add_partition(rec.qid, rec.nm, -1);
    END LOOP;
END
$$;

-- push_bundle on the routed layout (settings.routed: Citus, partitions
-- distributed by id), one partition per statement so that each is routed
-- to the one shard that holds it: a bundle whose partitions all live on
-- one worker commits there without a two-phase commit. Same arguments,
-- verdicts and locks as push_bundle's set-based form, which it keeps in
-- step with: queues created, partitions created in
-- (queue, name) order, queues marked keyed in id order, then partition
-- rows locked in ascending id, the time read, and every segment allocated
-- by push_one under those locks (so a partition's segments take
-- consecutive offsets in input order, as the set-based allocator gives).
-- What it does not do: a partition it creates is inserted unallocated and
-- then updated (the set form's first-touch shortcut is for PostgreSQL).
CREATE OR REPLACE FUNCTION {{schema}}.push_routed(
    p_queues     text[],
    p_partitions text[],
    p_counts     integer[],
    p_hashes     bytea[],
    p_verified   bigint[],
    p_blobs      bytea[],
    p_tenants    uuid[],
    p_flags      integer[],
    p_known      boolean,
    p_lanes      integer[]
) RETURNS SETOF {{schema}}.push_result
LANGUAGE plpgsql AS $$
DECLARE
    n       integer := cardinality(p_queues);
    v_qids  bigint[];
    v_qid   bigint;
    v_locked bigint[];
    v_pids  bigint[];
    v_win   bigint[];
    v_enc   boolean[];
    v_lanes integer[];
    v_res   {{schema}}.push_result[];
    v_now   timestamptz;
    rec     record;
    r       {{schema}}.push_result;
    i       integer;
BEGIN
    -- Queues (a reference table: read where the call runs).
    SELECT array_agg(qq.id ORDER BY u.o) INTO v_qids
    FROM unnest(p_tenants, p_queues) WITH ORDINALITY AS u(t, q, o)
    LEFT JOIN {{schema}}.queues qq ON qq.tenant = u.t AND qq.name = u.q;
    -- Each queue's lock against Queue.Delete, shared, in id order, before
    -- any other lock: a queue row's lock on the coordinator does not reach
    -- the worker where a new partition's foreign key is checked, so
    -- delete_queue takes this one exclusively. Held to commit, as the key
    -- share of the set-based form: a delete waits for this push, or this
    -- push finds the queue gone (below: no partition created, QN001).
    -- The coordinator's lock: every call of the layer runs there.
    v_locked := ARRAY(SELECT DISTINCT u.qid FROM unnest(v_qids) AS u(qid) WHERE u.qid IS NOT NULL ORDER BY 1);
    FOREACH v_qid IN ARRAY v_locked LOOP
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('queen/{{schema_name}}/queue/' || v_qid, 0));
    END LOOP;
    IF array_position(v_qids, NULL) IS NOT NULL THEN
        FOR rec IN SELECT DISTINCT u.t, u.q FROM unnest(p_tenants, p_queues) AS u(t, q) ORDER BY u.t, u.q LOOP
            INSERT INTO {{schema}}.queues (tenant, name) VALUES (rec.t, rec.q) ON CONFLICT DO NOTHING;
        END LOOP;
        SELECT array_agg(qq.id ORDER BY u.o) INTO v_qids
        FROM unnest(p_tenants, p_queues) WITH ORDINALITY AS u(t, q, o)
        LEFT JOIN {{schema}}.queues qq ON qq.tenant = u.t AND qq.name = u.q;
        -- Queues another push created meanwhile: locked too.
        FOREACH v_qid IN ARRAY ARRAY(SELECT DISTINCT u.qid FROM unnest(v_qids) AS u(qid)
                                     WHERE u.qid IS NOT NULL AND NOT (u.qid = ANY (v_locked)) ORDER BY 1) LOOP
            PERFORM pg_advisory_xact_lock_shared(hashtextextended('queen/{{schema_name}}/queue/' || v_qid, 0));
        END LOOP;
    END IF;

    -- Partitions, in (queue, name) order: each found by its derived id (one
    -- shard), else created. The queue rows are not key-shared ahead, as
    -- add_partitions does: on Citus that locks the reference table on every
    -- node, and concurrent pushes deadlocked across nodes. The queue lock
    -- above keeps a delete out; a queue deleted before it is skipped here
    -- (a statement after the lock sees the delete), and the resolve
    -- below reports QN001.
    FOR rec IN
        SELECT DISTINCT u.qid, u.p FROM unnest(v_qids, p_partitions) AS u(qid, p)
        WHERE u.qid IS NOT NULL ORDER BY u.qid, u.p
    LOOP
        IF NOT p_known AND {{schema}}.partition_of(rec.qid, rec.p) IS NULL THEN
            IF EXISTS (SELECT 1 FROM {{schema}}.queues qq WHERE qq.id = rec.qid) THEN
                PERFORM {{schema}}.add_partition(rec.qid, rec.p, -1);
            END IF;
        END IF;
    END LOOP;

    -- First keyed segments mark their queues keyed, in id order, before
    -- any partition lock (push_bundle's rule).
    FOR rec IN
        SELECT DISTINCT u.qid FROM unnest(v_qids, p_flags) AS u(qid, fl)
        JOIN {{schema}}.queues qq ON qq.id = u.qid
        WHERE (u.fl & 2) <> 0 AND NOT qq.keyed ORDER BY u.qid
    LOOP
        UPDATE {{schema}}.queues SET keyed = true WHERE id = rec.qid AND NOT keyed;
    END LOOP;

    -- Settings, read after the keyed marks; partitions resolved again.
    SELECT array_agg(qq.dedup_window_ms ORDER BY u.o), array_agg(qq.encryption ORDER BY u.o),
           array_agg(qq.lanes ORDER BY u.o)
    INTO v_win, v_enc, v_lanes
    FROM unnest(v_qids) WITH ORDINALITY AS u(qid, o)
    LEFT JOIN {{schema}}.queues qq ON qq.id = u.qid;
    FOR i IN 1 .. n LOOP
        v_pids[i] := {{schema}}.partition_of(v_qids[i], p_partitions[i]);
    END LOOP;

    -- Lock in ascending id, one shard each.
    FOR rec IN SELECT DISTINCT u.pid FROM unnest(v_pids[1:n]) AS u(pid) ORDER BY u.pid LOOP
        PERFORM FROM {{schema}}.partitions p WHERE p.id = rec.pid FOR NO KEY UPDATE;
        IF rec.pid IS NULL OR NOT FOUND THEN
            RAISE EXCEPTION 'queen: push_bundle could not resolve every partition' USING ERRCODE = 'QN001';
        END IF;
    END LOOP;
    v_now := clock_timestamp();

    FOR rec IN SELECT u.o::integer AS o FROM unnest(v_pids[1:n]) WITH ORDINALITY AS u(pid, o) ORDER BY u.pid, u.o LOOP
        i := rec.o;
        IF v_enc[i] AND (p_flags[i] & 1) = 0 THEN
            v_res[i] := ROW(i, 2, v_pids[i], NULL, NULL, NULL, NULL)::{{schema}}.push_result;
        ELSIF coalesce(p_lanes[i], 0) <> 0 AND p_lanes[i] <> v_lanes[i] THEN
            v_res[i] := ROW(i, 3, v_pids[i], NULL, NULL, NULL, NULL)::{{schema}}.push_result;
        ELSE
            r := {{schema}}.push_one(v_pids[i], p_counts[i], p_hashes[i], p_verified[i],
                                     p_blobs[i], v_win[i], v_now);
            r.ord := i;
            v_res[i] := r;
        END IF;
    END LOOP;

    FOR i IN 1 .. n LOOP
        IF v_res[i].ord IS DISTINCT FROM i THEN
            RAISE EXCEPTION 'queen: push_bundle has no result for segment %', i;
        END IF;
        RETURN NEXT v_res[i];
    END LOOP;
END
$$;

-- push_bundle, with its two partition lookups written so the
-- only index that fits is the unique (queue_id, name): each is a subquery
-- with both keys as parameters. Written as a join, a generic plan cached
-- while the partitions table was small (a new install, a queue gaining
-- 100k keys) looked partitions up by queue_id alone through another
-- (queue_id, ...) index and filtered on the name, so every bundle
-- walked every partition of its queue until autovacuum's next ANALYZE
-- invalidated the plan (measured: 50 ms per bundle at ~50k partitions,
-- first-touch pushes at ~300 keys/s for a minute).
CREATE OR REPLACE FUNCTION {{schema}}.push_bundle(
    p_queues     text[],
    p_partitions text[],
    p_counts     integer[],
    p_hashes     bytea[],
    p_verified   bigint[],
    p_blobs      bytea[],
    p_tenants    uuid[],
    p_flags      integer[],
    -- The client saw every partition of the bundle committed to before:
    -- skip the existence check. Wrong only if one was purged since, which
    -- the resolve below detects (QN001) and the client retries without it.
    p_known      boolean DEFAULT false,
    -- Per segment, the lane count the client routed its keyed messages
    -- with (0: none of its messages was routed to a lane). A count that is
    -- not the queue's rejects the segment (status 3): the client re-routes.
    p_lanes      integer[] DEFAULT NULL
) RETURNS SETOF {{schema}}.push_result
LANGUAGE plpgsql
-- Custom plans would be re-planned on every call (array sizes vary); the
-- generic plans of these key lookups are the right ones. The setting also
-- covers push_one, called from here. A generic plan is cached for the life
-- of the connection, possibly while partitions is small: the planner is
-- denied the scans and joins that walk a whole table (as in pop), so the
-- set-based allocator below stays a keyed lookup per partition.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
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
    v_res   {{schema}}.push_result[];
    r       {{schema}}.push_result;
    i       integer;
    -- The segments with no dedup window, in lock order (ascending partition,
    -- input order within one): input index, partition, first and last
    -- offset; and per partition its new last offset.
    v_last  bigint[];
    f_ord   integer[] := '{}';
    f_pid   bigint[] := '{}';
    f_base  bigint[] := '{}';
    f_end   bigint[] := '{}';
    u_pid   bigint[] := '{}';
    u_last  bigint[] := '{}';
    nf      integer := 0;
    nu      integer := 0;
    v_cpid  bigint;
    v_clast bigint;
    -- Partitions this call created with their offsets allocated (ascending),
    -- and per segment whether its partition is one of them.
    n_ids   bigint[] := '{}';
    m_qid   bigint[];
    m_name  text[];
    m_last  bigint[];
    v_pre   boolean[];
    v_cpre  boolean;
    j       integer := 1;
    -- What the resolve read, per segment in no particular order: input
    -- index, partition, its last offset and its queue's settings; the
    -- number of segments resolved and of partitions, and whether every
    -- segment goes to the set-based allocator; whether this call created
    -- every partition of the bundle.
    v_cnt   bigint;
    v_ndist bigint;
    v_allnew boolean;
    r_o     integer[];
    r_pid   bigint[];
    r_last  bigint[];
    r_win   bigint[];
    r_enc   boolean[];
    r_lanes integer[];
    v_fast  boolean;
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
    -- By its key: a sequential scan, denied here, costs a plan enough to be
    -- JIT-compiled on every call (40-90 ms).
    IF (SELECT st.routed FROM {{schema}}.settings st WHERE st.id = true) THEN
        RETURN QUERY SELECT * FROM {{schema}}.push_routed(p_queues, p_partitions, p_counts, p_hashes, p_verified,
                                                          p_blobs, p_tenants, p_flags, p_known, p_lanes);
        RETURN;
    END IF;

    -- Provisioning skip: only insert when something is missing. Inserts are
    -- ordered on their unique keys so overlapping bundles never convoy.
    IF NOT p_known AND EXISTS (
        SELECT 1 FROM unnest(p_tenants, p_queues, p_partitions) AS u(t, q, p)
        WHERE NOT EXISTS (
            SELECT 1 FROM {{schema}}.queues qq
            WHERE qq.tenant = u.t AND qq.name = u.q
              AND EXISTS (SELECT 1 FROM {{schema}}.partitions pp WHERE pp.queue_id = qq.id AND pp.name = u.p))
    ) THEN
        INSERT INTO {{schema}}.queues (tenant, name)
        SELECT DISTINCT t, q FROM unnest(p_tenants, p_queues) AS u(t, q)
        ORDER BY t, q
        ON CONFLICT DO NOTHING;
        IF EXISTS (SELECT 1 FROM unnest(p_flags) AS f(fl) WHERE (f.fl & 2) <> 0) THEN
            -- A keyed segment: its queue's lane count is settled below,
            -- under the queue row's lock. Resolved here; add_partitions adds
            -- none to a queue deleted since (the resolve below then reports
            -- QN001).
            PERFORM {{schema}}.add_partitions(array_agg(qq.id), array_agg(u.p))
            FROM unnest(p_tenants, p_queues, p_partitions) AS u(t, q, p)
            JOIN {{schema}}.queues qq ON qq.tenant = u.t AND qq.name = u.q;
        ELSE
            -- add_partitions' insert, but a new partition whose segments
            -- all go to the set-based allocator below (judged on the queue
            -- settings read here, which the allocator then keeps to) is
            -- created with their offsets already allocated: the allocator
            -- writes them from offset 0 and does not update the row. An
            -- update of a row inserted by the same transaction cost a
            -- first-touch segment about as much again as a later one (the
            -- row's foreign key is checked again, as for any row inserted
            -- by the updating transaction). Nobody else sees the row before
            -- commit; a partition some other bundle created meanwhile
            -- conflicts and takes the usual path.
            -- Set-based: one statement resolves what to create, one inserts
            -- every partition missing at its derived id, and only what that
            -- insert skipped and no other push created meanwhile (a taken
            -- id) goes through add_partition, one at a time. Calling
            -- add_partition for each new partition (two ids hashed, two
            -- lookups by id, one by name as dynamic SQL, then the insert)
            -- made a first-touch segment cost six times a later one.
            SELECT array_agg(x.qid ORDER BY x.qid, x.p), array_agg(x.p ORDER BY x.qid, x.p),
                   array_agg(CASE WHEN x.fast THEN x.tot - 1 ELSE -1 END ORDER BY x.qid, x.p)
            INTO m_qid, m_name, m_last
            FROM (
                WITH l AS MATERIALIZED (
                    SELECT qq.id, qq.tenant, qq.name, qq.dedup_window_ms, qq.encryption
                    FROM {{schema}}.queues qq
                    WHERE qq.id IN (SELECT q3.id FROM unnest(p_tenants, p_queues) AS u(t, q)
                                    JOIN {{schema}}.queues q3 ON q3.tenant = u.t AND q3.name = u.q)
                    ORDER BY qq.id
                    FOR KEY SHARE
                )
                SELECT l.id AS qid, u.p, sum(u.c) AS tot,
                       bool_and(l.dedup_window_ms = 0 AND (NOT l.encryption OR (u.fl & 1) <> 0)
                                AND coalesce(p_lanes[u.o], 0) = 0 AND u.c > 0) AS fast
                FROM unnest(p_tenants, p_queues, p_partitions, p_counts, p_flags)
                     WITH ORDINALITY AS u(t, q, p, c, fl, o)
                JOIN l ON l.tenant = u.t AND l.name = u.q
                GROUP BY l.id, u.p
            ) x
            WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.partitions pp WHERE pp.queue_id = x.qid AND pp.name = x.p);
            IF m_qid IS NOT NULL THEN
                -- In (queue, name) order, as every creator inserts: two
                -- bundles creating the same partitions wait on each other's
                -- rows in one order. A row some other push committed since
                -- the lookup above, or a taken id, conflicts: not created.
                WITH ins AS (
                    INSERT INTO {{schema}}.partitions (id, queue_id, name, last_offset)
                    SELECT {{schema}}.partition_key(m.qid, m.p, 0), m.qid, m.p, m.last
                    FROM unnest(m_qid, m_name, m_last) AS m(qid, p, last)
                    ORDER BY m.qid, m.p
                    ON CONFLICT DO NOTHING
                    RETURNING id, last_offset
                )
                SELECT coalesce(array_agg(ins.id ORDER BY ins.id) FILTER (WHERE ins.last_offset >= 0), '{}')
                INTO n_ids FROM ins;
                -- A statement of its own: it sees what a concurrent creator
                -- committed while the insert waited for it.
                FOR rec IN
                    SELECT m.qid, m.p, m.last
                    FROM unnest(m_qid, m_name, m_last) AS m(qid, p, last)
                    WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.partitions pp
                                      WHERE pp.queue_id = m.qid AND pp.name = m.p)
                    ORDER BY m.qid, m.p
                LOOP
                    SELECT a.id, a.created AND rec.last >= 0 INTO v_cpid, v_cpre
                    FROM {{schema}}.add_partition(rec.qid, rec.p, rec.last) a;
                    IF v_cpre THEN
                        n_ids := n_ids || v_cpid;
                    END IF;
                END LOOP;
            END IF;
            n_ids := ARRAY(SELECT x FROM unnest(n_ids) AS x ORDER BY x);
            v_cpid := NULL;
            v_cpre := NULL;
        END IF;
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
        UPDATE {{schema}}.queues qq SET keyed = true
        FROM (SELECT q2.id FROM {{schema}}.queues q2
              WHERE q2.id IN (SELECT q3.id FROM unnest(p_tenants, p_queues, p_flags) AS u(t, q, fl)
                              JOIN {{schema}}.queues q3 ON q3.tenant = u.t AND q3.name = u.q
                              WHERE (u.fl & 2) <> 0)
                AND NOT q2.keyed
              ORDER BY q2.id
              FOR NO KEY UPDATE) l
        WHERE qq.id = l.id;
    END IF;

    -- Resolve and lock every partition row in one statement, in ascending
    -- partition id: the global lock order shared with transactions and
    -- retention. The rows come out of the sort and are locked in that order
    -- (the subquery's LockRows sits above its Sort), then gathered into
    -- arrays, whose order nothing below relies on: each element carries its
    -- input index. Also judged here, under the locks, from the settings
    -- read with them: whether every segment goes to the set-based allocator
    -- (no dedup window, not refused, a valid hash blob; push_one's
    -- allocation otherwise), which lets the bundle take the set path below.
    SELECT count(*), count(DISTINCT l.id), array_agg(l.o), array_agg(l.id), array_agg(l.last_offset),
           array_agg(l.dedup_window_ms), array_agg(l.encryption), array_agg(l.lanes),
           coalesce(bool_and(coalesce(
               l.dedup_window_ms <= 0
               AND NOT coalesce(l.encryption AND (p_flags[l.o] & 1) = 0, false)
               AND NOT coalesce(coalesce(p_lanes[l.o], 0) <> 0 AND p_lanes[l.o] <> l.lanes, false)
               AND p_counts[l.o] > 0 AND octet_length(p_hashes[l.o]) = 16 * p_counts[l.o], false)), false)
    INTO v_cnt, v_ndist, r_o, r_pid, r_last, r_win, r_enc, r_lanes, v_fast
    FROM (
        SELECT x.o::integer AS o, pp.id, x.dedup_window_ms, x.encryption, x.lanes, pp.last_offset
        FROM (SELECT u.o, qq.dedup_window_ms, qq.encryption, qq.lanes,
                     (SELECT p2.id FROM {{schema}}.partitions p2
                      WHERE p2.queue_id = qq.id AND p2.name = u.p) AS pid
              FROM unnest(p_tenants, p_queues, p_partitions) WITH ORDINALITY AS u(t, q, p, o)
              JOIN {{schema}}.queues qq ON qq.tenant = u.t AND qq.name = u.q) x
        JOIN {{schema}}.partitions pp ON pp.id = x.pid
        ORDER BY pp.id, x.o -- a partition twice (Client.Tx): its segments in input order
        FOR NO KEY UPDATE OF pp
    ) l;
    IF v_cnt <> n THEN
        -- A partition purged between provisioning and the lock: the client
        -- retries the bundle once on this code.
        RAISE EXCEPTION 'queen: push_bundle could not resolve every partition (% of %)',
            v_cnt, n USING ERRCODE = 'QN001';
    END IF;
    v_now := clock_timestamp();

    -- The common bundle (the lifecycle load's: one-message segments, each
    -- to a partition of its own, no dedup window, nothing refused, the
    -- partitions all known or all created by this call) is allocated with
    -- no PL/pgSQL step per segment: the loops below cost about as much a
    -- segment as the statements' own work. Each partition is listed once,
    -- so a segment's range starts right after its partition's last offset
    -- as read under the lock, or at 0 in a partition this call created,
    -- whose row (inserted with these offsets allocated) is not updated.
    -- Anything else takes the general form below: a partition listed
    -- twice (Client.Tx: consecutive ranges in input order), some of the
    -- partitions new and some not (telling which would take a membership
    -- test per segment against n_ids, quadratic in the bundle), a segment
    -- push_one allocates or one refused, or a single segment.
    v_allnew := cardinality(n_ids) = n;
    IF v_fast AND n > 1 AND v_ndist = n AND (v_allnew OR cardinality(n_ids) = 0) THEN
        -- push_one's allocation, set-based, as below.
        IF NOT v_allnew THEN
            UPDATE {{schema}}.partitions p SET
                last_offset   = u.last + p_counts[u.o],
                last_write_at = CASE WHEN v_now - p.last_write_at > interval '1 second'
                                     THEN v_now ELSE p.last_write_at END,
                pending       = true
            FROM unnest(r_pid, r_last, r_o) AS u(id, last, o)
            WHERE p.id = u.id;
        END IF;
        INSERT INTO {{schema}}.segments (partition_id, base_offset, end_offset, created_at, blob, failures, hashes)
        SELECT g.pid, g.base, g.base + p_counts[g.o] - 1, v_now, p_blobs[g.o], 0, p_hashes[g.o]
        FROM (SELECT u.o, u.pid, CASE WHEN v_allnew THEN 0 ELSE u.last + 1 END AS base
              FROM unnest(r_o, r_pid, r_last) AS u(o, pid, last)) g;
        -- Exactly one result per input: the resolve found n rows, one per
        -- input index. In input order, with push_result's types.
        RETURN QUERY
            SELECT u.o, 0::smallint, u.pid, CASE WHEN v_allnew THEN 0 ELSE u.last + 1 END, v_now,
                   NULL::integer[], NULL::bigint[]
            FROM unnest(r_o, r_pid, r_last) AS u(o, pid, last)
            ORDER BY u.o;
        RETURN;
    END IF;

    -- The general form: segment by segment in lock order.
    FOR rec IN
        SELECT g.o, g.pid, g.win, g.enc, g.lanes, g.last
        FROM unnest(r_o, r_pid, r_win, r_enc, r_lanes, r_last) AS g(o, pid, win, enc, lanes, last)
        ORDER BY g.pid, g.o
    LOOP
        v_order := v_order || rec.o;
        v_pids[rec.o] := rec.pid;
        v_win[rec.o] := rec.win;
        v_enc[rec.o] := rec.enc;
        v_lanes[rec.o] := rec.lanes;
        -- Read under the row lock: nothing else moves it before commit.
        v_last[rec.o] := rec.last;
        WHILE j <= cardinality(n_ids) AND n_ids[j] < rec.pid LOOP
            j := j + 1;
        END LOOP;
        v_pre[rec.o] := j <= cardinality(n_ids) AND n_ids[j] = rec.pid;
    END LOOP;

    FOREACH i IN ARRAY v_order LOOP
        -- A partition created above was judged there: the allocator's.
        IF NOT v_pre[i] THEN
            IF v_enc[i] AND (p_flags[i] & 1) = 0 THEN
                v_res[i] := ROW(i, 2, v_pids[i], NULL, NULL, NULL, NULL)::{{schema}}.push_result;
                CONTINUE;
            ELSIF coalesce(p_lanes[i], 0) <> 0 AND p_lanes[i] <> v_lanes[i] THEN
                v_res[i] := ROW(i, 3, v_pids[i], NULL, NULL, NULL, NULL)::{{schema}}.push_result;
                CONTINUE;
            ELSIF v_win[i] > 0 THEN
                r := {{schema}}.push_one(v_pids[i], p_counts[i], p_hashes[i], p_verified[i],
                                         p_blobs[i], v_win[i], v_now);
                r.ord := i;
                v_res[i] := r;
                CONTINUE;
            END IF;
        END IF;
        -- The set-based allocator's: push_one's stride check first.
        IF p_counts[i] IS NULL OR p_counts[i] <= 0 OR octet_length(p_hashes[i]) <> 16 * p_counts[i] THEN
            RAISE EXCEPTION 'queen: hash blob is % bytes for % messages (want 16 each)',
                octet_length(p_hashes[i]), p_counts[i];
        END IF;
        -- Offsets follow from the last offset read under the lock. A
        -- partition listed twice (Client.Tx) takes consecutive ranges
        -- in input order, which is v_order's within one partition.
        IF v_pids[i] IS DISTINCT FROM v_cpid THEN
            v_cpid := v_pids[i];
            v_cpre := v_pre[i];
            IF v_cpre THEN
                v_clast := -1; -- created above with these offsets
            ELSE
                v_clast := v_last[i];
                nu := nu + 1;
                u_pid[nu] := v_cpid;
            END IF;
        END IF;
        nf := nf + 1;
        f_ord[nf] := i;
        f_pid[nf] := v_cpid;
        f_base[nf] := v_clast + 1;
        v_clast := v_clast + p_counts[i];
        f_end[nf] := v_clast;
        IF NOT v_cpre THEN
            u_last[nu] := v_clast;
        END IF;
    END LOOP;

    -- Segments with no dedup window (nothing to probe) are allocated all at
    -- once, with the offsets computed above: one UPDATE of their partitions
    -- and one INSERT of segments (hashes in their rows), instead of one
    -- push_one statement per segment. No statement joins two sets, so the
    -- cost stays linear in the bundle (a join of the UPDATE's RETURNING
    -- with the segments was a nested loop, quadratic, under this
    -- function's settings). It is push_one's allocation; keep the two in
    -- step.
    IF nf = 1 AND nu = 1 THEN
        -- One segment: push_one's single statement is cheaper.
        i := f_ord[1];
        r := {{schema}}.push_one(v_pids[i], p_counts[i], p_hashes[i], p_verified[i],
                                 p_blobs[i], 0, v_now);
        r.ord := i;
        v_res[i] := r;
    ELSIF nf > 0 THEN
        IF nu > 0 THEN
            UPDATE {{schema}}.partitions p SET
                last_offset   = u.last,
                last_write_at = CASE WHEN v_now - p.last_write_at > interval '1 second'
                                     THEN v_now ELSE p.last_write_at END,
                pending       = true
            FROM unnest(u_pid, u_last) AS u(id, last)
            WHERE p.id = u.id;
        END IF;
        INSERT INTO {{schema}}.segments (partition_id, base_offset, end_offset, created_at, blob, failures, hashes)
        SELECT f.pid, f.base, f.en, v_now, p_blobs[f.o], 0, p_hashes[f.o]
        FROM unnest(f_ord, f_pid, f_base, f_end) AS f(o, pid, base, en);
        -- Cast, not a bare ROW: its int status and untyped NULLs would be
        -- converted to push_result through text, per segment.
        FOR k IN 1 .. nf LOOP
            v_res[f_ord[k]] := ROW(f_ord[k], 0, f_pid[k], f_base[k], v_now, NULL, NULL)::{{schema}}.push_result;
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

-- One segment to a partition the client has committed to before: the idle
-- push. push_bundle's arrays, provisioning and loops cost an isolated push
-- more than its commit; this resolves the one partition in one statement
-- and allocates with push_one. It answers status 4, writing nothing, when
-- push_bundle's extra work is needed: the partition does not exist (new,
-- or purged since) or the segment is the first keyed one of its queue
-- (which marks the queue keyed). Verdicts 0-3 are push_bundle's.
-- The row is not locked ahead: push_one's UPDATE locks it (and without a
-- dedup window nothing is read before), which saves a lock record per push
-- (~60 us of an isolated push's latency). A partition deleted in between
-- makes push_one answer 4.
CREATE OR REPLACE FUNCTION {{schema}}.push_segment(
    p_tenant    uuid,
    p_queue     text,
    p_partition text,
    p_count     integer,
    p_hashes    bytea,
    p_blob      bytea,
    p_flags     integer,
    p_lanes     integer
) RETURNS {{schema}}.push_result
LANGUAGE plpgsql
AS $$
DECLARE
    v_qid   bigint;
    v_pid   bigint;
    v_win   bigint;
    v_enc   boolean;
    v_lanes integer;
    v_keyed boolean;
    r       {{schema}}.push_result;
BEGIN
    SELECT qq.id, qq.dedup_window_ms, qq.encryption, qq.lanes, qq.keyed
    INTO v_qid, v_win, v_enc, v_lanes, v_keyed
    FROM {{schema}}.queues qq
    WHERE qq.tenant = p_tenant AND qq.name = p_queue;
    -- By its derived id (one shard on the Citus layout), else the other
    -- places partition_of looks.
    v_pid := {{schema}}.partition_key(v_qid, p_partition, 0);
    PERFORM FROM {{schema}}.partitions p WHERE p.id = v_pid AND p.queue_id = v_qid AND p.name = p_partition;
    IF NOT FOUND THEN
        v_pid := {{schema}}.partition_of(v_qid, p_partition);
    END IF;

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
    -- NULL time: stamped once the row is held (see push_one).
    r := {{schema}}.push_one(v_pid, p_count, p_hashes, -1, p_blob, v_win, NULL);
    r.ord := 1;
    RETURN r;
END
$$;

-- The segment covering offset p_off of partition p_pid, if retention kept it.
-- PL/pgSQL: Citus runs no SQL function with parameters over a distributed
-- table.
CREATE OR REPLACE FUNCTION {{schema}}.segment_at(p_pid bigint, p_off bigint)
RETURNS TABLE (base_offset bigint, end_offset bigint, created_at timestamptz, blob bytea)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT c.base_offset, c.end_offset, c.created_at, c.blob
    FROM (SELECT s.base_offset, s.end_offset, s.created_at, s.blob
          FROM {{schema}}.segments s
          WHERE s.partition_id = p_pid AND s.base_offset <= p_off
          ORDER BY s.base_offset DESC
          LIMIT 1) c
    WHERE c.end_offset >= p_off;
END
$$;
