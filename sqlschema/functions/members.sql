-- Consumer group members (the members table): heartbeats, leaving, who is
-- live, and the expiry of crashed members' rows.
-- Function layer: applied after the migrations by sqlschema.Migrate (see
-- the package doc); every definition is CREATE OR REPLACE.

-- The member id a lease owner carries: what follows its first '#'; NULL
-- for an owner without one (a Pop that named no member, or an older
-- client), whose leases cannot be tied to a member.
CREATE OR REPLACE FUNCTION {{schema}}.member_of(p_owner text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN strpos(p_owner, '#') > 0 THEN substr(p_owner, strpos(p_owner, '#') + 1) END
$$;

-- The heartbeat a member's claim (pop) or lease renewal carries: p_owner
-- is the lease owner it claims or renews with (client '#' member id).
-- Rate-limited so a busy member does not write its row on every claim:
-- a row seen within the last second is only read, and one locked by a
-- concurrent heartbeat is skipped. A missing row (expired while the member
-- was cut off, or a Pop member's first call) is created from the owner
-- string (host/pid/random), started now. Returns whether it wrote.
CREATE OR REPLACE FUNCTION {{schema}}.member_seen(p_qid bigint, p_group text, p_owner text, p_now timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_id     text := {{schema}}.member_of(p_owner);
    v_seen   timestamptz;
    v_client text;
BEGIN
    IF v_id IS NULL OR v_id = '' THEN
        RETURN false;
    END IF;
    SELECT m.last_seen INTO v_seen FROM {{schema}}.members m
    WHERE m.queue_id = p_qid AND m.group_name = p_group AND m.member_id = v_id;
    IF FOUND THEN
        IF v_seen >= p_now - interval '1 second' THEN
            RETURN false;
        END IF;
        PERFORM 1 FROM {{schema}}.members m
        WHERE m.queue_id = p_qid AND m.group_name = p_group AND m.member_id = v_id
        FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN false; -- a concurrent heartbeat of the member writes it
        END IF;
        UPDATE {{schema}}.members SET last_seen = greatest(last_seen, p_now)
        WHERE queue_id = p_qid AND group_name = p_group AND member_id = v_id;
        RETURN true;
    END IF;
    v_client := split_part(p_owner, '#', 1);
    BEGIN
        INSERT INTO {{schema}}.members (queue_id, group_name, member_id, client, host, pid, started_at, last_seen)
        VALUES (p_qid, p_group, v_id, v_client, split_part(v_client, '/', 1),
                CASE WHEN split_part(v_client, '/', 2) ~ '^[0-9]{1,9}$' THEN split_part(v_client, '/', 2)::integer ELSE 0 END,
                p_now, p_now)
        ON CONFLICT DO NOTHING;
    EXCEPTION WHEN foreign_key_violation THEN
        -- The queue was deleted meanwhile (its Delete committed while the
        -- foreign key waited for it): no member of it; the pop finds the
        -- queue gone next. Only this rare path pays for the subtransaction.
        RETURN false;
    END;
    RETURN true;
END
$$;

-- A member's own heartbeat (joining, or idle: no claim or renewal carried
-- one lately): its row created or its last_seen set. False when the queue
-- does not exist (yet): a later heartbeat creates the row.
CREATE OR REPLACE FUNCTION {{schema}}.member_beat(p_tenant uuid, p_queue text, p_group text, p_member text,
                                                p_client text, p_host text, p_pid integer, p_started timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    INSERT INTO {{schema}}.members AS m (queue_id, group_name, member_id, client, host, pid, started_at, last_seen)
    SELECT q.id, p_group, p_member, p_client, p_host, p_pid, p_started, v_now
    FROM {{schema}}.queues q WHERE q.tenant = p_tenant AND q.name = p_queue
    ON CONFLICT (queue_id, group_name, member_id) DO UPDATE
        SET last_seen = greatest(m.last_seen, EXCLUDED.last_seen), started_at = EXCLUDED.started_at;
    RETURN FOUND;
EXCEPTION WHEN foreign_key_violation THEN
    RETURN false; -- the queue's Delete committed while the foreign key waited for it
END
$$;

-- The live members of group p_group of queue p_qid: those seen within
-- p_ttl_ms (the member TTL, 30 s by default; rows older than that are
-- gone even before maintenance deletes them).
CREATE OR REPLACE FUNCTION {{schema}}.group_live_members(p_qid bigint, p_group text, p_ttl_ms bigint DEFAULT 30000)
RETURNS SETOF {{schema}}.members
LANGUAGE sql STABLE AS $$
    SELECT m.* FROM {{schema}}.members m
    WHERE m.queue_id = p_qid AND m.group_name = p_group
      AND m.last_seen > clock_timestamp() - p_ttl_ms * interval '1 millisecond'
    ORDER BY m.member_id
$$;

-- Deletes the rows of members not seen within p_ttl_ms (crashed, or cut
-- off from the database), at most p_max; returns how many.
CREATE OR REPLACE FUNCTION {{schema}}.expire_members(p_ttl_ms bigint, p_max integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_n integer;
BEGIN
    -- Read first: most passes find nothing, and a read takes no row lock.
    IF NOT EXISTS (SELECT 1 FROM {{schema}}.members x
                   WHERE x.last_seen <= clock_timestamp() - p_ttl_ms * interval '1 millisecond') THEN
        RETURN 0;
    END IF;
    DELETE FROM {{schema}}.members m
    USING (SELECT x.queue_id, x.group_name, x.member_id FROM {{schema}}.members x
           WHERE x.last_seen <= clock_timestamp() - p_ttl_ms * interval '1 millisecond'
           LIMIT p_max FOR UPDATE SKIP LOCKED) d
    WHERE m.queue_id = d.queue_id AND m.group_name = d.group_name AND m.member_id = d.member_id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
