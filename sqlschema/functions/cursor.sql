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
