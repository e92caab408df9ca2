-- Consumer group members: one row per running Consume call (and per Pop
-- caller that names itself, PopOptions.Member), so operators see who
-- consumes a group and a group that has lag and nobody to consume it.
-- A member's claims and lease renewals keep last_seen fresh (at most one
-- write a second, see member_seen); an idle one writes it every few
-- seconds; one that ends deletes its row, and maintenance deletes the rows
-- of crashed ones (expire_members). Readers treat a row older than the
-- member TTL as gone. Leases a member takes carry its id in lease_owner
-- (client '#' member id, see member_of), which ties a lease to its row.
CREATE TABLE {{schema}}.members (
    queue_id   bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    group_name text        NOT NULL,
    member_id  text        NOT NULL,
    -- The client's lease-owner name (host/pid/random), its host and pid.
    client     text        NOT NULL,
    host       text        NOT NULL,
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL,
    PRIMARY KEY (queue_id, group_name, member_id)
) WITH (fillfactor = 50); -- last_seen is not indexed: its updates stay HOT
