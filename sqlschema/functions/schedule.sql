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
    n       integer := coalesce(cardinality(p_partitions), 0);
    v_qid   bigint;
    v_enc   boolean;
    v_lanes integer;
    v_new   bytea[];
BEGIN
    IF coalesce(cardinality(p_due), 0) <> n OR coalesce(cardinality(p_hashes), 0) <> n
       OR coalesce(cardinality(p_ids), 0) <> n OR coalesce(cardinality(p_flags), 0) <> n
       OR coalesce(cardinality(p_lanes), 0) <> n OR coalesce(cardinality(p_blobs), 0) <> n THEN
        RAISE EXCEPTION 'queen: schedule_items arrays are not aligned';
    END IF;
    IF n = 0 THEN
        RETURN;
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
    -- A hash already scheduled (committed, or by a transaction this waits
    -- for) is not inserted: a duplicate. Only users' scheduled rows count
    -- (failures 0): a failed message's retry copy waiting there is not
    -- one (see scheduled_queue_hash_idx).
    WITH ins AS (
        INSERT INTO {{schema}}.scheduled (queue_id, partition_name, due_at, hash, message_id, flags, lanes, blob)
        SELECT v_qid, u.p, u.d, u.h, u.i, u.f, u.l, u.b
        FROM unnest(p_partitions, p_due, p_hashes, p_ids, p_flags, p_lanes, p_blobs) AS u(p, d, h, i, f, l, b)
        ON CONFLICT (queue_id, hash) WHERE failures = 0 DO NOTHING
        RETURNING hash
    )
    SELECT coalesce(array_agg(ins.hash), '{}') INTO v_new FROM ins;
    -- A later statement, so the rows of duplicates committed while the
    -- insert waited are in its snapshot.
    RETURN QUERY
    SELECT u.o::integer,
           CASE WHEN nw.h IS NULL THEN 1 ELSE 0 END,
           CASE WHEN nw.h IS NULL THEN
               (SELECT s.message_id FROM {{schema}}.scheduled s
                WHERE s.queue_id = v_qid AND s.hash = u.h AND s.failures = 0)
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
-- Exactly once: the rows are deleted and appended in the caller's one
-- transaction, and the DELETE decides. The pick reads without locking (a
-- row lock per message cost about a third of a move); a cancel (a DELETE)
-- that reaches a picked row first makes this DELETE wait for it and then
-- skip the row (cancelled, not moved), and one that comes later waits for
-- this to commit and finds the row gone (delivered, not cancelled).
-- The queues are key-shared first, SKIP LOCKED, in id order: the lock order
-- is queues, then partitions (push_bundle), and a queue being deleted (its
-- row held FOR UPDATE) is skipped rather than waited for while this holds
-- rows its delete cascades to.
--
-- The rows of a partition of a queue without a dedup window go in one
-- segment (their frames concatenated after the raw codec byte, their
-- hashes likewise), as a push's bundle would; with a window each row is a
-- segment of its own, so a duplicate drops only itself. A verdict that
-- would drop or refuse more than it should (a window or encryption set by
-- a Configure racing this) raises, rolling the move back for the next try.
--
-- Cost is per row (pick, delete, concatenate) plus per segment
-- (push_bundle), so a mover that lets due rows gather moves them cheaper.
-- Sequential scans are off: the delete by an id array stays a lookup per
-- row whatever the statistics (a scan and hash join was planned for 5000
-- rows of 200,000 and took ten times as long).
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
AS $$
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_qids    bigint[];
    v_winq    bigint[];
    v_cut_due timestamptz;
    v_cut_id  bigint;
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
    -- One walk of the due index, one row past the limit: where the move
    -- stops (the last row within p_limit and p_max_bytes, earliest due
    -- first), the queues before it, and, when the limits cut, the first
    -- row left (its due time answers next_in_ms without walking the index
    -- again past the rows just deleted).
    SELECT max(v.due_at) FILTER (WHERE v.last), max(v.id) FILTER (WHERE v.last),
           coalesce(array_agg(DISTINCT v.queue_id) FILTER (WHERE v.take), '{}'),
           min(v.due_at) FILTER (WHERE NOT v.take)
    INTO v_cut_due, v_cut_id, v_candq, v_left
    FROM (SELECT w.*, w.take AND NOT lead(w.take, 1, false) OVER (ORDER BY w.due_at, w.id) AS last
          FROM (SELECT p.id, p.queue_id, p.due_at,
                       row_number() OVER (ORDER BY p.due_at, p.id) <= p_limit
                       AND (sum(p.len) OVER (ORDER BY p.due_at, p.id) <= p_max_bytes
                            OR row_number() OVER (ORDER BY p.due_at, p.id) = 1) AS take
                FROM (SELECT x.id, x.queue_id, x.due_at, octet_length(x.blob) AS len
                      FROM {{schema}}.scheduled x
                      WHERE x.due_at <= v_now AND NOT x.held
                      ORDER BY x.due_at, x.id LIMIT p_limit + 1) p) w) v;
    SELECT coalesce(array_agg(l.id), '{}'), coalesce(array_agg(l.id) FILTER (WHERE l.dedup_window_ms > 0), '{}'),
           coalesce(array_agg(l.id) FILTER (WHERE l.encryption), '{}')
    INTO v_qids, v_winq, v_encq
    FROM (SELECT q.id, q.dedup_window_ms, q.encryption FROM {{schema}}.queues q
          WHERE q.id = ANY (v_candq)
          ORDER BY q.id
          FOR KEY SHARE SKIP LOCKED) l;
    IF cardinality(v_qids) < cardinality(v_candq) THEN
        -- A queue being deleted: its rows stay for the cascade, due now
        -- (looked at again soon, in case it is not deleted after all).
        v_left := v_now;
    END IF;
    IF cardinality(v_qids) > 0 THEN
        -- Plaintext for a queue made encrypted since it was scheduled is
        -- held, not moved: nothing plaintext lands in an encrypted queue.
        IF cardinality(v_encq) > 0 THEN
            WITH h AS (
                UPDATE {{schema}}.scheduled s SET held = true
                WHERE ROW(s.due_at, s.id) <= ROW(v_cut_due, v_cut_id) AND NOT s.held
                  AND s.queue_id = ANY (v_encq) AND (s.flags & 1) = 0
                RETURNING 1
            )
            SELECT count(*) INTO held FROM h;
        END IF;
        -- Grouped by queue id, named after: a join per segment, not per row.
        WITH d AS (
            DELETE FROM {{schema}}.scheduled s
            WHERE ROW(s.due_at, s.id) <= ROW(v_cut_due, v_cut_id) AND NOT s.held AND s.queue_id = ANY (v_qids)
            RETURNING s.id, s.queue_id, s.partition_name, s.due_at, s.hash, s.flags, s.lanes, s.blob, s.failures
        ), g AS (
            SELECT d.queue_id, d.partition_name, min(d.due_at) AS due, min(d.id) AS first_id,
                   count(*)::integer AS cnt,
                   '\x00'::bytea || string_agg(substring(d.blob FROM 2), ''::bytea ORDER BY d.due_at, d.id) AS blob,
                   string_agg(d.hash, ''::bytea ORDER BY d.due_at, d.id) AS hashes,
                   (bit_and(d.flags) & 1) | (bit_or(d.flags) & 2) AS flags,
                   CASE WHEN count(DISTINCT nullif(d.lanes, 0)) > 1 THEN -1
                        ELSE coalesce(max(nullif(d.lanes, 0)), 0) END AS lanes,
                   max(d.failures) AS failures
            FROM d
            -- A retry copy is a segment of its own: it carries its failures.
            GROUP BY d.queue_id, d.partition_name,
                     CASE WHEN d.queue_id = ANY (v_winq) OR d.failures > 0 THEN d.id END
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
    IF v_left IS NOT NULL THEN
        next_in_ms := ceil(extract(epoch FROM (v_left - clock_timestamp())) * 1000)::bigint;
    ELSE
        -- Past the rows due at the pick: what is due before it is either
        -- moved now or is a queue's being deleted, and a schedule
        -- committed since is told to movers by its own notification.
        SELECT ceil(extract(epoch FROM (min(s.due_at) - clock_timestamp())) * 1000)::bigint INTO next_in_ms
        FROM {{schema}}.scheduled s WHERE NOT s.held AND s.due_at > v_now;
    END IF;
END
$$;

-- Deletes the scheduled messages of a queue with these transaction id
-- hashes and returns how many. A row a mover holds is waited for, and is
-- then gone: delivered, not cancelled. A failed message's retry copy
-- (failures > 0) is not a user's schedule and is left alone, unless held:
-- plaintext of a queue made encrypted during its wait, which nothing but
-- a cancel removes.
CREATE OR REPLACE FUNCTION {{schema}}.cancel_scheduled(p_tenant uuid, p_queue text, p_hashes bytea[])
RETURNS bigint
LANGUAGE sql AS $$
    WITH d AS (
        DELETE FROM {{schema}}.scheduled s
        USING {{schema}}.queues q
        WHERE q.tenant = p_tenant AND q.name = p_queue AND s.queue_id = q.id AND s.hash = ANY (p_hashes)
          AND (s.failures = 0 OR s.held)
        RETURNING 1
    )
    SELECT count(*) FROM d
$$;
