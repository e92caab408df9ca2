-- Helpers over a cursor's out-of-order settled offsets and failure counts.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- The cursor once it passes the settled offsets contiguous with p_comm.
CREATE OR REPLACE FUNCTION {{schema}}.settled_advance(p_comm bigint, p_settled bigint[])
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
CREATE OR REPLACE FUNCTION {{schema}}.offsets_above(p_offs bigint[], p_min bigint)
RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_offs IS NULL THEN NULL
        ELSE (SELECT array_agg(u.o ORDER BY u.o) FROM unnest(p_offs) AS u(o) WHERE u.o > p_min)
    END
$$;

-- The failures stored for offset p_off; 0 when none.
CREATE OR REPLACE FUNCTION {{schema}}.fail_at(p_offs bigint[], p_counts integer[], p_off bigint)
RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_offs IS NULL THEN 0 ELSE coalesce(p_counts[array_position(p_offs, p_off)], 0) END
$$;

CREATE OR REPLACE FUNCTION {{schema}}.fail_counts_above(p_offs bigint[], p_counts integer[], p_head bigint)
RETURNS integer[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_offs IS NULL THEN NULL
        ELSE (SELECT array_agg(u.c ORDER BY u.o) FROM unnest(p_offs, p_counts) AS u(o, c) WHERE u.o > p_head)
    END
$$;

-- How far past the cursor a claim may reach: with messages settled out of
-- order above a waiting one (per-key Consume, see consumers.wait_offs),
-- other keys run ahead of it up to this many offsets, or one claim's
-- Batch when that is more. It bounds settled (one entry per offset) while
-- a key waits.
CREATE OR REPLACE FUNCTION {{schema}}.claim_reach(p_max integer)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(p_max, 10000)::bigint
$$;

-- The last offset of a claim starting at p_start that takes p_max
-- messages not in p_settled (sorted): every settled offset inside the
-- range widens it by one, so a claim over a lane whose head waits still
-- carries p_max messages to handle. At most p_limit.
CREATE OR REPLACE FUNCTION {{schema}}.claim_end(p_start bigint, p_max integer, p_settled bigint[], p_limit bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_end bigint := p_start + p_max - 1;
    v_o   bigint;
BEGIN
    IF p_settled IS NOT NULL THEN
        FOREACH v_o IN ARRAY p_settled LOOP
            CONTINUE WHEN v_o < p_start;
            EXIT WHEN v_o > v_end OR v_end >= p_limit;
            v_end := v_end + 1;
        END LOOP;
    END IF;
    RETURN least(v_end, p_limit);
END
$$;

-- The waits (wait_offs, wait_at) that still hold at p_now, above cursor
-- p_comm and not settled: the offsets, in order.
CREATE OR REPLACE FUNCTION {{schema}}.waits_live(p_offs bigint[], p_at timestamptz[], p_comm bigint,
                                               p_settled bigint[], p_now timestamptz)
RETURNS bigint[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_offs IS NULL THEN NULL
        ELSE (SELECT array_agg(u.o ORDER BY u.o) FROM unnest(p_offs, p_at) AS u(o, t)
              WHERE u.o > p_comm AND u.t > p_now AND NOT (u.o = ANY (coalesce(p_settled, '{}'::bigint[]))))
    END
$$;

-- Their times, in the same order.
CREATE OR REPLACE FUNCTION {{schema}}.waits_live_at(p_offs bigint[], p_at timestamptz[], p_comm bigint,
                                                  p_settled bigint[], p_now timestamptz)
RETURNS timestamptz[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_offs IS NULL THEN NULL
        ELSE (SELECT array_agg(u.t ORDER BY u.o) FROM unnest(p_offs, p_at) AS u(o, t)
              WHERE u.o > p_comm AND u.t > p_now AND NOT (u.o = ANY (coalesce(p_settled, '{}'::bigint[]))))
    END
$$;

-- Whether the first message a claim would start at (past the settled run
-- above p_comm) waits at p_now: then only a keyed claim may take the
-- partition (pop_ready, pop_claim).
CREATE OR REPLACE FUNCTION {{schema}}.head_waits(p_offs bigint[], p_at timestamptz[], p_comm bigint,
                                               p_settled bigint[], p_now timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_offs IS NOT NULL AND EXISTS (
        SELECT 1 FROM unnest(p_offs, p_at) AS u(o, t)
        WHERE u.o = {{schema}}.settled_advance(p_comm, p_settled) + 1 AND u.t > p_now)
$$;

-- A cursor's lease columns after a settle: all four cleared when
-- p_release (the lease ends), else as given. The one place that says what
-- releasing a lease clears; callers assign it with
-- UPDATE ... SET (batch_end, lease_id, lease_owner, lease_expires_at) =
-- (SELECT * FROM lease_after(...)). Set-returning and plain SQL, so the
-- planner inlines it there instead of calling a function per row.
CREATE OR REPLACE FUNCTION {{schema}}.lease_after(p_release boolean, p_batch_end bigint, p_lease_id uuid,
                                                p_lease_owner text, p_lease_expires_at timestamptz)
RETURNS TABLE (batch_end bigint, lease_id uuid, lease_owner text, lease_expires_at timestamptz)
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_release THEN NULL ELSE p_batch_end END,
           CASE WHEN p_release THEN NULL ELSE p_lease_id END,
           CASE WHEN p_release THEN NULL ELSE p_lease_owner END,
           CASE WHEN p_release THEN NULL ELSE p_lease_expires_at END
$$;

-- Whether a lease on group p_group's cursor of partition p_pid (of queue
-- p_qid) gives way at the end of its batch rather than staying on: the
-- group is paused, or another partition of the queue is in the ready set
-- or the group's backlog, so ready partitions take turns (the ranges are
-- pop_window's: only the partial indexes fit). The one rule of pop_ahead,
-- linger_ack and pop_linger. PL/pgSQL, whose plan is kept for the session:
-- as LANGUAGE sql its EXISTS subqueries kept the planner from inlining it,
-- and the SQL-function executor parsed and planned it again in every
-- transaction, most of a pop_linger's server time. STABLE: it reads with
-- its caller's snapshot, as the SQL function did. No SET clauses (each
-- would cost a save and restore per call): its callers' hold.
CREATE OR REPLACE FUNCTION {{schema}}.lease_yields(p_qid bigint, p_group text, p_pid bigint)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM {{schema}}.paused_groups g WHERE g.queue_id = p_qid AND g.group_name = p_group)
        OR EXISTS (SELECT 1 FROM {{schema}}.partitions p
                   WHERE p.queue_id BETWEEN p_qid AND p_qid AND p.pending AND p.id <> p_pid)
        OR EXISTS (SELECT 1 FROM {{schema}}.backlog b
                   WHERE b.queue_id BETWEEN p_qid AND p_qid
                     AND b.group_name BETWEEN p_group AND p_group AND b.partition_id <> p_pid);
END
$$;

-- The wait, in ms, before the next attempt after a message's p_n-th
-- charged failure (QueueOptions.RetryBackoff): uniform over the whole
-- milliseconds of [p_min, hi], hi = least(p_max, p_min * 2^p_n), for p_u
-- uniform in [0, 1) (the caller passes random(), so this stays pure and
-- testable). p_min <= 0 is no wait (RetryBackoff.Disabled). The one place
-- the schedule is written; settle_v2 calls it where it charges a failure.
CREATE OR REPLACE FUNCTION {{schema}}.retry_wait_ms(p_n integer, p_min bigint, p_max bigint, p_u double precision)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_min <= 0 THEN 0
        ELSE p_min + floor(least(greatest(coalesce(p_u, 0), 0), 0.999999999)
                           * (greatest(least(p_max::float8, p_min * power(2::float8, least(greatest(p_n, 1), 62))),
                                       p_min) - p_min + 1))::bigint
    END
$$;
