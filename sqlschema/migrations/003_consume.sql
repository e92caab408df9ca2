-- The consumption side's columns, tables and types: what pop (claim +
-- lease + segment read in one round trip) and settle (ack / fail / retry /
-- dead-letter for many cursors in one call) need. Their code is in
-- functions/pop.sql, subscribe.sql, cursor.sql, settle.sql and
-- deadletter.sql; the lock order is in DESIGN.md.

-- deliveries: leases started at committed + 1 since the cursor last moved
-- (Message.Attempt on redelivery). delivered_max: the highest offset ever
-- leased, so a message above it is known to be on its first delivery.
-- attempts (from 001) is the retry budget spent by the message at
-- committed + 1: explicit failures only, never lease expiries.
ALTER TABLE {{schema}}.consumers
    ADD COLUMN deliveries    integer NOT NULL DEFAULT 0,
    ADD COLUMN delivered_max bigint  NOT NULL DEFAULT -1;

CREATE INDEX dead_letters_queue_id_idx ON {{schema}}.dead_letters (queue_id, id);

-- Out-of-order settlement (per-key parallel Consume, KeyConcurrency > 1).
-- committed stays the contiguous settled prefix; what was settled above it
-- is kept here so a later holder skips it: settled, sorted offsets above
-- committed (never committed + 1: the cursor moves past a contiguous run);
-- fail_offs / fail_counts, parallel and sorted, the explicit failures
-- spent by messages above committed + 1 (attempts keeps the head's). Every
-- entry comes from a lease, so lies in (committed, committed + that
-- lease's batch]: at most one Batch (MaxBatch) of entries. NULL when empty,
-- which is all the other paths ever see unless such a consumer ran.
ALTER TABLE {{schema}}.consumers
    ADD COLUMN settled     bigint[],
    ADD COLUMN fail_offs   bigint[],
    ADD COLUMN fail_counts integer[];

-- Paused consumer groups (Queue.Pause): a pop of a paused (queue, group)
-- claims nothing; leases already held run to their end. Empty unless an
-- operator paused something: pop's check is one index probe that finds
-- nothing (one buffer hit, microseconds).
CREATE TABLE {{schema}}.paused_groups (
    queue_id   bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    group_name text        NOT NULL,
    paused_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, group_name)
);

-- One row per delivered segment; the lease columns repeat per segment.
CREATE TYPE {{schema}}.pop_row AS (
    partition_id     bigint,
    partition_name   text,
    lease_id         uuid,
    lease_expires_at timestamptz,
    lease_ms         bigint,
    first_offset     bigint,
    last_offset      bigint,
    deliveries       integer,
    delivered_max    bigint,
    base_offset      bigint,
    end_offset       bigint,
    created_at       timestamptz,
    blob             bytea,
    failures         integer,
    -- On a partition's first row only: the cursor's settled offsets and
    -- failure entries (see settled above), for the client to skip and count.
    settled          bigint[],
    fail_offs        bigint[],
    fail_counts      integer[]
);

ALTER TABLE {{schema}}.subscriptions
    -- The partition name the next seed_chunk step starts at (inclusive);
    -- NULL once every partition that existed at first contact is covered.
    ADD COLUMN seed_after text;

-- The per-group part of the ready set. partitions.pending is the shared
-- part: set by every push (HOT while already set), so it holds what was
-- pushed since some pop last looked. A pop that has consumed a pending
-- partition takes it out of the shared part and gives each subscribed group
-- still behind there a row here (clear_pending), so a group that lags does
-- not keep partitions in the set every other group reads: a pop reads a
-- window of the shared part and one of its own group's rows, never another
-- group's backlog. Pushes never touch this table, so they cost the same
-- whatever the number of groups. Rows of a partition are written only under
-- its row lock (FOR NO KEY UPDATE), so writers never wait on each other's
-- rows here.
CREATE TABLE {{schema}}.backlog (
    queue_id     bigint NOT NULL,
    group_name   text   NOT NULL,
    partition_id bigint NOT NULL REFERENCES {{schema}}.partitions (id) ON DELETE CASCADE,
    PRIMARY KEY (queue_id, group_name, partition_id)
) WITH (vacuum_truncate = false);
-- For the cascade when a partition is forgotten or its queue deleted.
CREATE INDEX backlog_partition_idx ON {{schema}}.backlog (partition_id);

-- One verdict per settle input. status: 0 applied, 1 below the cursor (no
-- op), 2 lease lost, 3 applied and the message was dead-lettered, 4 applied
-- and the exhausted message was dropped, 5 no such cursor.
CREATE TYPE {{schema}}.settle_result AS (
    ord       integer,
    status    smallint,
    committed bigint
);

