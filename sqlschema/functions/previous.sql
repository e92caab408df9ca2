-- The previous release's entry points, kept so it runs beside this one
-- during a rolling upgrade: settle, settle_keyed, requeue_dead_letters and
-- pop with the signatures that release calls, and requeue_one with the one
-- its function layer had. They encode frames in SQL (raw_segment, uvarint)
-- only for that release's callers: each builds the re-enqueue's segment
-- from the message's fields and calls its successor (settle_v2,
-- settle_keyed_v2, requeue_dead_letters_v2, requeue_one with the segment),
-- so the rules live once; the current client builds the segment in Go and
-- calls the successors itself. Nothing outside this file calls
-- raw_segment. A migration drops these once no supported release calls
-- them.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- The minimal unsigned LEB128 varint of p_n (the frame format's uvarint).
CREATE OR REPLACE FUNCTION {{schema}}.uvarint(p_n bigint)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_n   bigint := p_n;
    v_var bytea := '\x'::bytea;
BEGIN
    LOOP
        IF v_n >= 128 THEN
            v_var := v_var || set_byte('\x00'::bytea, 0, ((v_n & 127) | 128)::integer);
            v_n := v_n >> 7;
        ELSE
            RETURN v_var || set_byte('\x00'::bytea, 0, v_n::integer);
        END IF;
    END LOOP;
END
$$;

-- The raw-codec segment blob (codec byte 0, see internal/segment) holding
-- one frame (see internal/frame), as the client's requeueSegment builds it
-- (TestRequeueSegmentMatchesRawSegment compares the two): u32 LE body
-- length, flags, 16-byte id, uvarint transaction-id length, transaction id,
-- the key (uvarint length and bytes) when there is one, the encoded headers
-- when there are any (passed through as Go encoded them), payload.
CREATE OR REPLACE FUNCTION {{schema}}.raw_segment(p_id uuid, p_flags integer, p_txn text, p_payload bytea,
                                        p_key text DEFAULT NULL, p_headers bytea DEFAULT NULL)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_txn  bytea := convert_to(coalesce(p_txn, ''), 'UTF8');
    v_key  bytea := convert_to(coalesce(p_key, ''), 'UTF8');
    v_flag integer := coalesce(p_flags, 0) & 1;
    v_body bytea;
    v_len  bigint;
BEGIN
    -- The frame's key (FlagKey, bit 2) follows the transaction id, present
    -- exactly when non-empty (see internal/frame).
    IF octet_length(v_key) > 0 THEN
        v_flag := v_flag | 4;
        v_txn := v_txn || {{schema}}.uvarint(octet_length(v_key)) || v_key;
    END IF;
    -- The headers (FlagHeaders, bit 1) follow the key, present exactly when
    -- non-empty.
    IF octet_length(coalesce(p_headers, '\x'::bytea)) > 0 THEN
        v_flag := v_flag | 2;
        v_txn := v_txn || p_headers;
    END IF;
    v_body := set_byte('\x00'::bytea, 0, v_flag) || uuid_send(p_id)
              || {{schema}}.uvarint(octet_length(convert_to(coalesce(p_txn, ''), 'UTF8'))) || v_txn
              || coalesce(p_payload, '\x'::bytea);
    v_len := octet_length(v_body);
    RETURN '\x00'::bytea
        || set_byte(set_byte(set_byte(set_byte('\x00000000'::bytea,
               0, (v_len & 255)::integer), 1, ((v_len >> 8) & 255)::integer),
               2, ((v_len >> 16) & 255)::integer), 3, ((v_len >> 24) & 255)::integer)
        || v_body;
END
$$;

-- requeue_one with the message's fields, as the previous release's
-- function layer defined it (no release calls it from outside): the
-- segment built here, then requeue_one with the segment.
CREATE OR REPLACE FUNCTION {{schema}}.requeue_one(
    p_pid      bigint,
    p_off      bigint,
    p_id       uuid,
    p_flags    integer,
    p_txn      text,
    p_payload  bytea,
    p_failures integer,
    p_key      text DEFAULT NULL,
    p_headers  bytea DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN {{schema}}.requeue_one(p_pid, p_off,
        {{schema}}.raw_segment(p_id, p_flags, p_txn, p_payload, p_key, p_headers), p_failures);
END
$$;

-- The segments the previous release's settle and settle_keyed pass on:
-- per input, a failure's (action 1) built from its fields, NULL otherwise.
CREATE OR REPLACE FUNCTION {{schema}}.raw_segments(p_act smallint[], p_ids uuid[], p_flags integer[],
                                                 p_txns text[], p_payloads bytea[], p_keys text[],
                                                 p_headers bytea[])
RETURNS bytea[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT ARRAY(SELECT CASE WHEN x.act = 1 THEN {{schema}}.raw_segment(x.id, x.fl, x.txn, x.pl, x.k, x.h) END
                 FROM unnest(p_act, p_ids, p_flags, p_txns, p_payloads, p_keys, p_headers)
                      WITH ORDINALITY AS x(act, id, fl, txn, pl, k, h, o)
                 ORDER BY x.o)
$$;

-- The previous release's settle: settle_v2 with each failure's segment
-- (p_act 1) built here from its fields, NULL for the other actions.
CREATE OR REPLACE FUNCTION {{schema}}.settle(
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
    p_dl_keys    text[] DEFAULT NULL,
    p_dl_headers bytea[] DEFAULT NULL
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM {{schema}}.settle_v2(p_pids, p_groups, p_leases, p_ok, p_act, p_act_off, p_release,
        p_reasons, p_dl_ids, p_dl_txns, p_dl_flags, p_dl_payload, p_dl_created, p_dl_keys, p_dl_headers,
        {{schema}}.raw_segments(p_act, p_dl_ids, p_dl_flags, p_dl_txns, p_dl_payload, p_dl_keys, p_dl_headers),
        NULL);
END
$$;

-- The previous release's settle_keyed: settle_keyed_v2, segments built as
-- in settle.
CREATE OR REPLACE FUNCTION {{schema}}.settle_keyed(
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
    p_dl_keys    text[] DEFAULT NULL,
    p_dl_headers bytea[] DEFAULT NULL
) RETURNS SETOF {{schema}}.settle_result
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM {{schema}}.settle_keyed_v2(p_pids, p_groups, p_leases, p_offs, p_act, p_release,
        p_reasons, p_dl_ids, p_dl_txns, p_dl_flags, p_dl_payload, p_dl_created, p_dl_keys, p_dl_headers,
        {{schema}}.raw_segments(p_act, p_dl_ids, p_dl_flags, p_dl_txns, p_dl_payload, p_dl_keys, p_dl_headers),
        NULL);
END
$$;

-- The previous release's requeue_dead_letters: requeue_dead_letters_v2
-- with each dead letter's segment built here from its stored fields,
-- p_payloads[i] / p_flags[i], when not NULL, replacing the stored payload
-- and flags (a plaintext dead letter of a queue encrypted since, sealed by
-- the client). Read without a lock: a dead letter is never updated, and
-- one requeued meanwhile is skipped by requeue_dead_letters_v2.
CREATE OR REPLACE FUNCTION {{schema}}.requeue_dead_letters(
    p_qid      bigint,
    p_ids      bigint[],
    p_hashes   bytea[],
    p_payloads bytea[],
    p_flags    integer[]
) RETURNS TABLE (part_name text, requeued integer)
LANGUAGE plpgsql AS $$
DECLARE
    n integer := coalesce(cardinality(p_ids), 0);
BEGIN
    IF coalesce(cardinality(p_hashes), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR coalesce(cardinality(p_flags), 0) <> n THEN
        RAISE EXCEPTION 'queen: requeue_dead_letters arrays are not aligned';
    END IF;
    RETURN QUERY SELECT * FROM {{schema}}.requeue_dead_letters_v2(p_qid, p_ids, p_hashes, p_payloads, p_flags,
        ARRAY(SELECT {{schema}}.raw_segment(d.message_id, coalesce(x.fl, d.flags), d.transaction_id,
                                            coalesce(x.pl, d.payload), d.message_key, d.message_headers)
              FROM unnest(p_ids, p_payloads, p_flags) WITH ORDINALITY AS x(id, pl, fl, o)
              LEFT JOIN {{schema}}.dead_letters d ON d.id = x.id AND d.queue_id = p_qid
              ORDER BY x.o));
END
$$;

-- The previous release's pop: pop_v2 for a claim that is not keyed.
CREATE OR REPLACE FUNCTION {{schema}}.pop(
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
    p_part_batch integer
) RETURNS SETOF {{schema}}.pop_row
LANGUAGE sql AS $$
    SELECT * FROM {{schema}}.pop_v2(p_tenant, p_queue, p_group, p_partition, p_hints, p_batch, p_partitions,
                                    p_lease_ms, p_auto_ack, p_owner, p_mode, p_from, p_part_batch, false)
$$;
