-- The push path's stored type: a segment's verdict, as push_bundle and
-- push_segment return it (their code is in functions/push.sql).

-- One segment's verdict. status: 0 queued, 1 duplicate (nothing written;
-- dup_idx/dup_off pair incoming frame indexes with the stored offsets they
-- repeat), 2 rejected because the queue is encrypted and the segment is not,
-- 3 rejected because the client routed keys to lanes with a lane count that
-- is not the queue's (its cached settings were stale), 4 not taken by
-- push_segment (see there): send it with push_bundle.
CREATE TYPE {{schema}}.push_result AS (
    ord          integer,
    status       smallint,
    partition_id bigint,
    base_offset  bigint,
    created_at   timestamptz,
    dup_idx      integer[],
    dup_off      bigint[]
);

