-- Scheduled delivery (Item.DeliverAt): holding messages aside in
-- scheduled until due, and moving them into their partitions' logs.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- schedule_items.status, per item. The Go side mirrors this list
-- (scheduleStatus in schedule.go).
--   schedule status 0 scheduled: held in scheduled until due
--   schedule status 1 duplicate: its transaction id is already scheduled in the queue; dup_id is that message's id
--   schedule status 2 encryption_required: the queue is encrypted and an item is not; nothing written (one row, ord 0)
--   schedule status 3 lanes_changed: an item was routed with a lane count that is not the queue's; nothing written (one row, ord 0)

-- Holds items of one queue until their due time. The queue is created if
-- missing (as a push does) and marked keyed when an item has a key: a
-- scheduled keyed message freezes the lane count it was routed with, as a
-- stored one does. The queue row is then share-locked, which orders this
-- with a Configure (encryption, lanes) and a delete_queue: either
-- committed first and is read here, or waits for this to commit. The
-- encryption and lane checks are all-or-nothing: the client reads the
-- settings again and prepares the whole call anew. The transaction ids'
-- hashes must be distinct (the client folds repeats within a call).
--
-- Where a row goes (see migration 015): an item due after the watermark
-- and within the hour goes to the current generation; one due later, or
-- at or before the watermark (it came due while this waited: a move past
-- it has committed, and will not read the generations below its
-- watermark again), to the per-row table scheduled. The state row is
-- held FOR SHARE, so no move runs until this commits; a call that may
-- write scheduled holds it FOR NO KEY UPDATE instead, alone among
-- schedules: dedup spans both tables, and two schedules writing the same
-- hash to different tables would not see each other. Which lock a call
-- takes is decided before it is taken, by the clock: an item due within
-- a second may be passed by the watermark while this waits for the lock.
-- If one is passed all the same (the wait was longer), this raises QN004
-- having written nothing, and the client calls again.
CREATE OR REPLACE FUNCTION {{schema}}.schedule_items(
    p_tenant     uuid,
    p_queue      text,
    p_partitions text[],
    p_due        timestamptz[],
    p_hashes     bytea[],
    p_ids        uuid[],
    p_flags      integer[],
    p_lanes      integer[],
    p_blobs      bytea[]
) RETURNS TABLE (ord integer, status integer, dup_id uuid)
LANGUAGE plpgsql AS $$
DECLARE
    n        integer := coalesce(cardinality(p_partitions), 0);
    v_now    timestamptz := clock_timestamp();
    v_far    timestamptz;
    v_excl   boolean;
    v_wm_due timestamptz;
    v_wm_id  bigint;
    v_gen    integer;
    v_qid    bigint;
    v_enc    boolean;
    v_lanes  integer;
    v_new    bytea[];
    v_rows   bytea[];
    v_gens   bytea[];
    v_other_gens bytea[];
    v_dup_h  bytea[];
    v_dup_id uuid[];
BEGIN
    IF coalesce(cardinality(p_due), 0) <> n OR coalesce(cardinality(p_hashes), 0) <> n
       OR coalesce(cardinality(p_ids), 0) <> n OR coalesce(cardinality(p_flags), 0) <> n
       OR coalesce(cardinality(p_lanes), 0) <> n OR coalesce(cardinality(p_blobs), 0) <> n THEN
        RAISE EXCEPTION 'queen: schedule_items arrays are not aligned';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    -- Generations hold what is due within the hour: a generation is
    -- freed only once its last row moved, so far rows would pin it.
    v_far := v_now + interval '1 hour';
    v_excl := EXISTS (SELECT 1 FROM unnest(p_due) AS d(t) WHERE d.t <= v_now + interval '1 second' OR d.t >= v_far);
    IF v_excl THEN
        SELECT s.wm_due, s.wm_id, s.cur_gen INTO v_wm_due, v_wm_id, v_gen
        FROM {{schema}}.scheduled_state s FOR NO KEY UPDATE;
    ELSE
        SELECT s.wm_due, s.wm_id, s.cur_gen INTO v_wm_due, v_wm_id, v_gen
        FROM {{schema}}.scheduled_state s FOR SHARE;
        IF EXISTS (SELECT 1 FROM unnest(p_due) AS d(t) WHERE d.t <= v_wm_due) THEN
            RAISE EXCEPTION 'queen: a move passed a scheduled item while it waited; retried' USING ERRCODE = 'QN004';
        END IF;
    END IF;
    INSERT INTO {{schema}}.queues (tenant, name) VALUES (p_tenant, p_queue) ON CONFLICT DO NOTHING;
    -- As push_bundle: only while unset, so the row is written once.
    IF EXISTS (SELECT 1 FROM unnest(p_flags) AS f(fl) WHERE (f.fl & 2) <> 0) THEN
        UPDATE {{schema}}.queues SET keyed = true
        WHERE tenant = p_tenant AND name = p_queue AND NOT keyed;
    END IF;
    SELECT q.id, q.encryption, q.lanes INTO v_qid, v_enc, v_lanes
    FROM {{schema}}.queues q WHERE q.tenant = p_tenant AND q.name = p_queue
    FOR SHARE;
    IF NOT FOUND THEN
        -- Deleted between the insert and the lock: nothing written; retry.
        RAISE EXCEPTION 'queen: queue % was deleted while scheduling', p_queue USING ERRCODE = 'QN001';
    END IF;
    IF v_enc AND EXISTS (SELECT 1 FROM unnest(p_flags) AS f(fl) WHERE (f.fl & 1) = 0) THEN
        RETURN QUERY SELECT 0, 2, NULL::uuid;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_lanes) AS l(ln) WHERE l.ln <> 0 AND l.ln <> v_lanes) THEN
        RETURN QUERY SELECT 0, 3, NULL::uuid;
        RETURN;
    END IF;
    -- A hash scheduled already (committed before the state row was
    -- locked, in either table: a user's row of scheduled, failures 0, or
    -- a generation row above the watermark) is a duplicate; so is one a
    -- schedule in flight writes to the same table, which the insert's
    -- conflict waits for. A failed message's retry copy waiting in
    -- scheduled is not one (see scheduled_queue_hash_idx). Each table is
    -- read in a statement of its own, before the inserts: on Citus,
    -- scheduled is a reference table and scheduled_gen a table of the
    -- coordinator, which it joins in no statement, nor reads in a
    -- subquery correlated with unnest. Nothing that could change these
    -- reads commits between them and the inserts: a schedule that may
    -- write scheduled holds the state row alone, and the others write
    -- the current generation, whose conflicts the insert waits for.
    SELECT coalesce(array_agg(s.hash), '{}') INTO v_rows
    FROM {{schema}}.scheduled s
    WHERE s.queue_id = v_qid AND s.hash = ANY (p_hashes) AND s.failures = 0;
    SELECT coalesce(array_agg(o.hash), '{}'), coalesce(array_agg(o.hash) FILTER (WHERE o.gen <> v_gen), '{}')
    INTO v_gens, v_other_gens
    FROM {{schema}}.scheduled_gen o
    WHERE o.queue_id = v_qid AND o.hash = ANY (p_hashes) AND ROW(o.due_at, o.id) > ROW(v_wm_due, v_wm_id);
    WITH ins AS (
        INSERT INTO {{schema}}.scheduled_gen AS g (gen, id, queue_id, partition_name, due_at, hash, message_id, flags, lanes, blob)
        SELECT v_gen, nextval('{{schema}}.scheduled_id_seq'), v_qid, u.p, u.d, u.h, u.i, u.f, u.l, u.b
        FROM unnest(p_partitions, p_due, p_hashes, p_ids, p_flags, p_lanes, p_blobs) AS u(p, d, h, i, f, l, b)
        WHERE u.d > v_wm_due AND u.d < v_far
          AND NOT u.h = ANY (v_rows) AND NOT u.h = ANY (v_other_gens)
        -- A row of this generation with the hash that has moved is reused.
        ON CONFLICT (queue_id, hash, gen) DO UPDATE
        SET id = EXCLUDED.id, partition_name = EXCLUDED.partition_name, due_at = EXCLUDED.due_at,
            message_id = EXCLUDED.message_id, flags = EXCLUDED.flags, lanes = EXCLUDED.lanes, blob = EXCLUDED.blob
        WHERE ROW(g.due_at, g.id) <= ROW(v_wm_due, v_wm_id)
        RETURNING g.hash
    )
    SELECT coalesce(array_agg(hash), '{}') INTO v_new FROM ins;
    IF v_excl THEN
        WITH ins_row AS (
            INSERT INTO {{schema}}.scheduled (queue_id, partition_name, due_at, hash, message_id, flags, lanes, blob)
            SELECT v_qid, u.p, u.d, u.h, u.i, u.f, u.l, u.b
            FROM unnest(p_partitions, p_due, p_hashes, p_ids, p_flags, p_lanes, p_blobs) AS u(p, d, h, i, f, l, b)
            WHERE NOT (u.d > v_wm_due AND u.d < v_far) AND NOT u.h = ANY (v_gens)
            ON CONFLICT (queue_id, hash) WHERE failures = 0 DO NOTHING
            RETURNING hash
        )
        SELECT v_new || coalesce(array_agg(hash), '{}') INTO v_new FROM ins_row;
    END IF;
    -- Later statements, so the rows of duplicates committed while the
    -- inserts waited are in their snapshots.
    SELECT coalesce(array_agg(s.hash), '{}'), coalesce(array_agg(s.message_id), '{}') INTO v_dup_h, v_dup_id
    FROM {{schema}}.scheduled s
    WHERE s.queue_id = v_qid AND s.hash = ANY (p_hashes) AND s.failures = 0;
    SELECT v_dup_h || coalesce(array_agg(g.hash), '{}'), v_dup_id || coalesce(array_agg(g.message_id), '{}')
    INTO v_dup_h, v_dup_id
    FROM (SELECT DISTINCT ON (o.hash) o.hash, o.message_id FROM {{schema}}.scheduled_gen o
          WHERE o.queue_id = v_qid AND o.hash = ANY (p_hashes) AND ROW(o.due_at, o.id) > ROW(v_wm_due, v_wm_id)
          ORDER BY o.hash) g;
    RETURN QUERY
    SELECT u.o::integer,
           CASE WHEN nw.h IS NULL THEN 1 ELSE 0 END,
           CASE WHEN nw.h IS NULL THEN
               (SELECT d.id FROM unnest(v_dup_h, v_dup_id) WITH ORDINALITY AS d(h, id, k) WHERE d.h = u.h ORDER BY d.k LIMIT 1)
           END
    FROM unnest(p_hashes) WITH ORDINALITY AS u(h, o)
    LEFT JOIN unnest(v_new) AS nw(h) ON nw.h = u.h
    ORDER BY u.o;
END
$$;

-- Moves due messages (due_at at or before the database's clock) into their
-- partitions, earliest due first: up to p_limit of them and p_max_bytes of
-- blobs (the first always). Returns what it did: moved (appended), dropped
-- (duplicates of a stored message within the queue's dedup window, as for
-- a push), held (plaintext of a queue made encrypted since: kept, see
-- scheduled.held), the partitions appended to (for wakes), and the time
-- until the next due message by the database's clock (NULL when none).
--
-- One move at a time per schema: a transaction advisory lock, tried (a
-- mover that misses it moves nothing and looks again shortly). Two movers
-- in parallel would each append their own rows, and the later-due ones of
-- one could reach a partition first; serialized, every partition takes
-- its messages in due order (ties by schedule order).
--
-- Two sources, merged in (due_at, id) order: the generations' rows above
-- the watermark, read and left in place, and the per-row table's rows,
-- deleted. The state row is held FOR UPDATE first, so every schedule and
-- cancel has committed (they hold it FOR SHARE) and none starts until this
-- does: every generation row at or below the new watermark is in what this
-- reads. The watermark goes to the last row taken, or, when the pick took
-- every due row, to the clock read after the lock (a schedule due by then
-- writes scheduled, see schedule_items).
--
-- Exactly once: a generation row is taken by the move that raises the
-- watermark past it, once, and a cancel runs before or after that move,
-- whole; a per-row row is deleted and appended in the caller's one
-- transaction, and the DELETE decides. A crash or a cancelled statement
-- undoes all of it, watermark included.
-- The queues are key-shared first, SKIP LOCKED, in id order: the lock order
-- is queues, then partitions (push_bundle), and a queue being deleted (its
-- row held FOR UPDATE) is skipped rather than waited for while this holds
-- rows its delete cascades to. Its generation rows must stay above the
-- watermark (the delete may roll back), so the move then stops before
-- the first of them and looks again soon.
--
-- The rows of a partition of a queue without a dedup window go in one
-- segment (their frames concatenated after the raw codec byte, their
-- hashes likewise), as a push's bundle would; with a window each row is a
-- segment of its own, so a duplicate drops only itself. A verdict that
-- would drop or refuse more than it should (a window or encryption set by
-- a Configure racing this) raises, rolling the move back for the next try.
--
-- Then the generations: the current one is closed after five minutes (its
-- last row recorded) if a free one can take its place, and a closed one
-- whose last row is at or below the watermark is truncated. A truncate
-- that would wait (a reader of the generations, such as a Status, holds
-- the table) is left for a later move rather than holding every schedule
-- behind this.
--
-- Sequential scans are off: the per-row table's delete by a range stays
-- an index walk whatever the statistics. So is JIT: a scan of the small
-- state tables then costs over jit_above_cost, and compiling it cost
-- 0.46 s per move (half the move's server time at full scale).
CREATE OR REPLACE FUNCTION {{schema}}.move_scheduled(
    p_limit          integer,
    p_max_bytes      bigint,
    OUT moved        integer,
    OUT dropped      integer,
    OUT held         integer,
    OUT woke_tenants uuid[],
    OUT woke_queues  text[],
    OUT woke_parts   text[],
    OUT next_in_ms   bigint
)
LANGUAGE plpgsql
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_now     timestamptz;
    v_wm_due  timestamptz;
    v_wm_id   bigint;
    v_cur     integer;
    v_qids    bigint[];
    v_winq    bigint[];
    v_cut_due timestamptz;
    v_cut_id  bigint;
    v_skip_due timestamptz;
    v_skip_id bigint;
    v_candq   bigint[];
    v_encq    bigint[];
    v_left    timestamptz;
    v_tenants uuid[];
    v_queues  text[];
    v_parts   text[];
    v_counts  integer[];
    v_hashes  bytea[];
    v_flags   integer[];
    v_lanes   integer[];
    v_blobs   bytea[];
    v_fails   integer[];
    v_held    integer;
    v_g       integer;
    v_lt      text;
    n         integer;
    r         {{schema}}.push_result;
BEGIN
    moved := 0;
    dropped := 0;
    held := 0;
    woke_tenants := '{}';
    woke_queues := '{}';
    woke_parts := '{}';
    -- The key: "QUEE" above the table's oid, unique per schema.
    IF NOT pg_try_advisory_xact_lock((x'51554545'::bigint << 32) | '{{schema}}.scheduled'::regclass::oid::bigint) THEN
        next_in_ms := 0;
        RETURN;
    END IF;
    SELECT s.wm_due, s.wm_id, s.cur_gen INTO v_wm_due, v_wm_id, v_cur
    FROM {{schema}}.scheduled_state s FOR UPDATE;
    v_now := greatest(clock_timestamp(), v_wm_due);
    -- One walk of both sources' due indexes, one row past the limit: where
    -- the move stops (the last row within p_limit and p_max_bytes, earliest
    -- due first), the queues before it, and, when the limits cut, the
    -- first row left (its due time answers next_in_ms).
    SELECT max(v.due_at) FILTER (WHERE v.last), max(v.id) FILTER (WHERE v.last),
           coalesce(array_agg(DISTINCT v.queue_id) FILTER (WHERE v.take), '{}'),
           min(v.due_at) FILTER (WHERE NOT v.take)
    INTO v_cut_due, v_cut_id, v_candq, v_left
    FROM (SELECT w.*, w.take AND NOT lead(w.take, 1, false) OVER (ORDER BY w.due_at, w.id) AS last
          FROM (SELECT p.id, p.queue_id, p.due_at,
                       row_number() OVER (ORDER BY p.due_at, p.id) <= p_limit
                       AND (sum(p.len) OVER (ORDER BY p.due_at, p.id) <= p_max_bytes
                            OR row_number() OVER (ORDER BY p.due_at, p.id) = 1) AS take
                -- Each source limited in order: a merge of index walks that
                -- stops at the limit (a union of the two, limited once, was
                -- planned as a sort of every due row).
                FROM (SELECT x.id, x.queue_id, x.due_at, x.len
                      FROM ((SELECT g.id, g.queue_id, g.due_at, octet_length(g.blob) AS len
                             FROM {{schema}}.scheduled_gen g
                             WHERE ROW(g.due_at, g.id) > ROW(v_wm_due, v_wm_id) AND g.due_at <= v_now
                             ORDER BY g.due_at, g.id LIMIT p_limit + 1)
                            UNION ALL
                            (SELECT s.id, s.queue_id, s.due_at, octet_length(s.blob)
                             FROM {{schema}}.scheduled s
                             WHERE s.due_at <= v_now AND NOT s.held
                             ORDER BY s.due_at, s.id LIMIT p_limit + 1)) x
                      ORDER BY x.due_at, x.id LIMIT p_limit + 1) p) w) v;
    -- Nothing due locks no queue: on Citus a locking read of the queues
    -- reference table locks its shard on every node whatever rows it
    -- finds, and an idle mover's lock each second met first contacts as
    -- deadlocks (40P01).
    IF cardinality(v_candq) = 0 THEN
        v_qids := '{}';
        v_winq := '{}';
        v_encq := '{}';
    ELSE
        SELECT coalesce(array_agg(l.id), '{}'), coalesce(array_agg(l.id) FILTER (WHERE l.dedup_window_ms > 0), '{}'),
               coalesce(array_agg(l.id) FILTER (WHERE l.encryption), '{}')
        INTO v_qids, v_winq, v_encq
        FROM (SELECT q.id, q.dedup_window_ms, q.encryption FROM {{schema}}.queues q
              WHERE q.id = ANY (v_candq)
              ORDER BY q.id
              FOR KEY SHARE SKIP LOCKED) l;
    END IF;
    IF cardinality(v_qids) < cardinality(v_candq) THEN
        -- A queue being deleted: its rows stay for the cascade, due now
        -- (looked at again soon, in case it is not deleted after all). The
        -- move stops before its first generation row.
        v_left := v_now;
        SELECT g.due_at, g.id INTO v_skip_due, v_skip_id
        FROM {{schema}}.scheduled_gen g
        WHERE ROW(g.due_at, g.id) > ROW(v_wm_due, v_wm_id) AND ROW(g.due_at, g.id) <= ROW(v_cut_due, v_cut_id)
          AND g.queue_id = ANY (v_candq) AND NOT g.queue_id = ANY (v_qids)
        ORDER BY g.due_at, g.id LIMIT 1;
        IF FOUND THEN
            SELECT x.due_at, x.id INTO v_cut_due, v_cut_id
            FROM (SELECT g.due_at, g.id FROM {{schema}}.scheduled_gen g
                  WHERE ROW(g.due_at, g.id) > ROW(v_wm_due, v_wm_id) AND ROW(g.due_at, g.id) < ROW(v_skip_due, v_skip_id)
                  UNION ALL
                  SELECT s.due_at, s.id FROM {{schema}}.scheduled s
                  WHERE NOT s.held AND ROW(s.due_at, s.id) < ROW(v_skip_due, v_skip_id)) x
            ORDER BY x.due_at DESC, x.id DESC LIMIT 1;
            IF NOT FOUND THEN
                v_cut_due := NULL;
                v_cut_id := NULL;
            END IF;
        END IF;
    END IF;
    IF cardinality(v_qids) > 0 AND v_cut_due IS NOT NULL THEN
        -- Plaintext for a queue made encrypted since it was scheduled is
        -- held, not moved: nothing plaintext lands in an encrypted queue.
        -- A generation's is copied to scheduled, held there.
        IF cardinality(v_encq) > 0 THEN
            WITH h AS (
                UPDATE {{schema}}.scheduled s SET held = true
                WHERE ROW(s.due_at, s.id) <= ROW(v_cut_due, v_cut_id) AND NOT s.held
                  AND s.queue_id = ANY (v_encq) AND (s.flags & 1) = 0
                RETURNING 1
            )
            SELECT count(*) INTO held FROM h;
            WITH h AS (
                INSERT INTO {{schema}}.scheduled (id, queue_id, partition_name, due_at, hash, message_id, flags, lanes, blob, held)
                OVERRIDING SYSTEM VALUE
                SELECT g.id, g.queue_id, g.partition_name, g.due_at, g.hash, g.message_id, g.flags, g.lanes, g.blob, true
                FROM {{schema}}.scheduled_gen g
                WHERE ROW(g.due_at, g.id) > ROW(v_wm_due, v_wm_id) AND ROW(g.due_at, g.id) <= ROW(v_cut_due, v_cut_id)
                  AND g.queue_id = ANY (v_encq) AND (g.flags & 1) = 0
                RETURNING 1
            )
            SELECT count(*) INTO v_held FROM h;
            held := held + v_held;
        END IF;
        -- Grouped by queue id, named after: a join per segment, not per row.
        WITH d AS (
            DELETE FROM {{schema}}.scheduled s
            WHERE ROW(s.due_at, s.id) <= ROW(v_cut_due, v_cut_id) AND NOT s.held AND s.queue_id = ANY (v_qids)
            RETURNING s.id, s.queue_id, s.partition_name, s.due_at, s.hash, s.flags, s.lanes, s.blob, s.failures
        ), a AS (
            SELECT d.id, d.queue_id, d.partition_name, d.due_at, d.hash, d.flags, d.lanes, d.blob, d.failures FROM d
            UNION ALL
            SELECT g.id, g.queue_id, g.partition_name, g.due_at, g.hash, g.flags, g.lanes, g.blob, 0
            FROM {{schema}}.scheduled_gen g
            WHERE ROW(g.due_at, g.id) > ROW(v_wm_due, v_wm_id) AND ROW(g.due_at, g.id) <= ROW(v_cut_due, v_cut_id)
              AND g.queue_id = ANY (v_qids) AND NOT (g.queue_id = ANY (v_encq) AND (g.flags & 1) = 0)
        ), g AS (
            SELECT a.queue_id, a.partition_name, min(a.due_at) AS due, min(a.id) AS first_id,
                   count(*)::integer AS cnt,
                   '\x00'::bytea || string_agg(substring(a.blob FROM 2), ''::bytea ORDER BY a.due_at, a.id) AS blob,
                   string_agg(a.hash, ''::bytea ORDER BY a.due_at, a.id) AS hashes,
                   (bit_and(a.flags) & 1) | (bit_or(a.flags) & 2) AS flags,
                   CASE WHEN count(DISTINCT nullif(a.lanes, 0)) > 1 THEN -1
                        ELSE coalesce(max(nullif(a.lanes, 0)), 0) END AS lanes,
                   max(a.failures) AS failures
            FROM a
            -- A retry copy is a segment of its own: it carries its failures.
            GROUP BY a.queue_id, a.partition_name,
                     CASE WHEN a.queue_id = ANY (v_winq) OR a.failures > 0 THEN a.id END
        )
        SELECT array_agg(q.tenant ORDER BY g.due, g.first_id), array_agg(q.name ORDER BY g.due, g.first_id),
               array_agg(g.partition_name ORDER BY g.due, g.first_id), array_agg(g.cnt ORDER BY g.due, g.first_id),
               array_agg(g.hashes ORDER BY g.due, g.first_id), array_agg(g.flags ORDER BY g.due, g.first_id),
               array_agg(g.lanes ORDER BY g.due, g.first_id), array_agg(g.blob ORDER BY g.due, g.first_id),
               array_agg(g.failures ORDER BY g.due, g.first_id)
        INTO v_tenants, v_queues, v_parts, v_counts, v_hashes, v_flags, v_lanes, v_blobs, v_fails
        FROM g JOIN {{schema}}.queues q ON q.id = g.queue_id;
        n := coalesce(cardinality(v_parts), 0);
        IF n > 0 THEN
            -- The normal append path (a partition's segments in input
            -- order: due order). A retry copy repeats its original's
            -- transaction id on purpose, as requeue_one's does: its verified
            -- watermark is past any offset, so the dedup probe finds nothing
            -- to drop it for.
            FOR r IN
                SELECT * FROM {{schema}}.push_bundle(v_queues, v_parts, v_counts, v_hashes,
                                                     ARRAY(SELECT CASE WHEN f.n > 0 THEN 9223372036854775807 ELSE -1 END
                                                           FROM unnest(v_fails) WITH ORDINALITY AS f(n, o) ORDER BY f.o),
                                                     v_blobs, v_tenants, v_flags, false, v_lanes)
            LOOP
                IF r.status = 0 AND v_fails[r.ord] > 0 THEN
                    -- push_bundle writes no failures: the copy's segment
                    -- carries them, so RetryLimit holds across copies.
                    UPDATE {{schema}}.segments SET failures = v_fails[r.ord]
                    WHERE partition_id = r.partition_id AND base_offset = r.base_offset;
                END IF;
                IF r.status = 0 THEN
                    moved := moved + v_counts[r.ord];
                    woke_tenants := woke_tenants || v_tenants[r.ord];
                    woke_queues := woke_queues || v_queues[r.ord];
                    woke_parts := woke_parts || v_parts[r.ord];
                ELSIF r.status = 1 AND v_counts[r.ord] = 1 THEN
                    dropped := dropped + 1;
                ELSE
                    RAISE EXCEPTION 'queen: move_scheduled: verdict % for % messages of %/%; the queue changed, retried',
                        r.status, v_counts[r.ord], v_queues[r.ord], v_parts[r.ord] USING ERRCODE = 'QN002';
                END IF;
            END LOOP;
        END IF;
    END IF;
    -- The watermark: past every due row when the pick took them all, else
    -- to the last row taken (never down: a late row of scheduled may sort
    -- below it).
    IF v_left IS NULL THEN
        v_cut_due := v_now;
        v_cut_id := 9223372036854775807;
    END IF;
    IF v_cut_due IS NOT NULL AND ROW(v_cut_due, v_cut_id) > ROW(v_wm_due, v_wm_id) THEN
        v_wm_due := v_cut_due;
        v_wm_id := v_cut_id;
        UPDATE {{schema}}.scheduled_state SET wm_due = v_wm_due, wm_id = v_wm_id;
    END IF;
    -- Free the closed generations the watermark passed, then close the
    -- current one if it is old and a free one can take its place.
    FOR v_g IN SELECT s.gen FROM {{schema}}.scheduled_gens s
               WHERE s.closed AND (s.last_due IS NULL OR ROW(s.last_due, s.last_id) <= ROW(v_wm_due, v_wm_id))
               ORDER BY s.gen
    LOOP
        v_lt := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '100ms', true);
            EXECUTE 'TRUNCATE {{schema}}.scheduled_g' || v_g;
            UPDATE {{schema}}.scheduled_gens SET opened = NULL, closed = false, last_due = NULL, last_id = NULL
            WHERE gen = v_g;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        PERFORM set_config('lock_timeout', v_lt, true);
    END LOOP;
    SELECT s.gen INTO v_g FROM {{schema}}.scheduled_gens s WHERE s.opened IS NULL ORDER BY s.gen LIMIT 1;
    IF FOUND AND (SELECT s.opened FROM {{schema}}.scheduled_gens s WHERE s.gen = v_cur) <= v_now - interval '5 minutes' THEN
        UPDATE {{schema}}.scheduled_gens s SET closed = true, last_due = l.due_at, last_id = l.id
        FROM (SELECT NULL::timestamptz AS due_at, NULL::bigint AS id) z
        LEFT JOIN LATERAL (SELECT g.due_at, g.id FROM {{schema}}.scheduled_gen g WHERE g.gen = v_cur
                           ORDER BY g.due_at DESC, g.id DESC LIMIT 1) l ON true
        WHERE s.gen = v_cur;
        UPDATE {{schema}}.scheduled_gens SET opened = v_now WHERE gen = v_g;
        UPDATE {{schema}}.scheduled_state SET cur_gen = v_g;
    END IF;
    IF v_left IS NOT NULL THEN
        next_in_ms := ceil(extract(epoch FROM (v_left - clock_timestamp())) * 1000)::bigint;
    ELSE
        -- Past the rows due at the pick: a schedule committed since is
        -- told to movers by its own notification.
        SELECT ceil(extract(epoch FROM (min(x.due_at) - clock_timestamp())) * 1000)::bigint INTO next_in_ms
        FROM (SELECT min(s.due_at) AS due_at FROM {{schema}}.scheduled s WHERE NOT s.held AND s.due_at > v_now
              UNION ALL
              SELECT min(g.due_at) FROM {{schema}}.scheduled_gen g WHERE ROW(g.due_at, g.id) > ROW(v_wm_due, v_wm_id)) x;
    END IF;
END
$$;

-- Deletes the scheduled messages of a queue with these transaction id
-- hashes and returns how many. It holds the state row FOR SHARE, so a
-- move runs wholly before it (a message it moved is delivered, not
-- cancelled: its generation row is at or below the watermark, its
-- per-row row gone) or wholly after (a cancelled message is not there to
-- move). A failed message's retry copy (failures > 0) is not a user's
-- schedule and is left alone, unless held: plaintext of a queue made
-- encrypted during its wait, which nothing but a cancel removes.
CREATE OR REPLACE FUNCTION {{schema}}.cancel_scheduled(p_tenant uuid, p_queue text, p_hashes bytea[])
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_wm_due timestamptz;
    v_wm_id  bigint;
    v_n      bigint;
    v_m      bigint;
BEGIN
    SELECT s.wm_due, s.wm_id INTO v_wm_due, v_wm_id FROM {{schema}}.scheduled_state s FOR SHARE;
    WITH d AS (
        DELETE FROM {{schema}}.scheduled s
        USING {{schema}}.queues q
        WHERE q.tenant = p_tenant AND q.name = p_queue AND s.queue_id = q.id AND s.hash = ANY (p_hashes)
          AND (s.failures = 0 OR s.held)
        RETURNING 1
    )
    SELECT count(*) INTO v_n FROM d;
    WITH d AS (
        DELETE FROM {{schema}}.scheduled_gen g
        USING {{schema}}.queues q
        WHERE q.tenant = p_tenant AND q.name = p_queue AND g.queue_id = q.id AND g.hash = ANY (p_hashes)
          AND ROW(g.due_at, g.id) > ROW(v_wm_due, v_wm_id)
        RETURNING 1
    )
    SELECT count(*) INTO v_m FROM d;
    RETURN v_n + v_m;
END
$$;
