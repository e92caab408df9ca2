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
