-- The data model: queues, partitions (the per-partition allocator row),
-- segments (frames packed then zstd-compressed), the hash sidecar, consumer
-- cursors and leases, dead letters and group subscriptions.
--
-- {{schema}} is replaced by the quoted schema name, {{schema_name}} by the
-- bare name (for string literals). Every object lives in that schema.

CREATE TABLE {{schema}}.queues (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant                 uuid        NOT NULL,
    name                   text        NOT NULL,
    lease_time_ms          bigint      NOT NULL DEFAULT 300000,
    retry_limit            integer     NOT NULL DEFAULT 3,
    dead_letter            boolean     NOT NULL DEFAULT false,
    dedup_window_ms        bigint      NOT NULL DEFAULT 0,
    encryption             boolean     NOT NULL DEFAULT false,
    delayed_processing_ms  bigint      NOT NULL DEFAULT 0,
    window_buffer_ms       bigint      NOT NULL DEFAULT 0,
    retention_ms           bigint      NOT NULL DEFAULT 0,
    completed_retention_ms bigint      NOT NULL DEFAULT 0,
    -- 'pause': a failed message is redelivered in place and blocks the later
    -- messages of its partition until acked or dead-lettered (strict order).
    -- 'skip': it is re-enqueued at its partition's tail with its failure
    -- count and the cursor moves on (at-least-once).
    failure_policy         text        NOT NULL DEFAULT 'pause'
        CONSTRAINT queues_failure_policy_check CHECK (failure_policy IN ('pause', 'skip')),
    -- Keyed lanes: a message with a key and no partition goes to partition
    -- 'lane-<xxh3_64(key) mod lanes>'. Fixed once keyed is set.
    lanes                  integer     NOT NULL DEFAULT 64
        CONSTRAINT queues_lanes_check CHECK (lanes > 0),
    -- Set by the first push of a message with a key, never cleared: from
    -- then on lanes cannot change (keys would move lanes and lose order).
    keyed                  boolean     NOT NULL DEFAULT false,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queues_tenant_name_key UNIQUE (tenant, name)
);

-- One row per (queue, partition). last_offset is the allocator; its row lock
-- is the per-partition write serializer. Low fillfactor and a quantized
-- last_write_at keep the allocator UPDATE heap-only (HOT).
CREATE TABLE {{schema}}.partitions (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id      bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    name          text        NOT NULL,
    last_offset   bigint      NOT NULL DEFAULT -1,
    log_start     bigint      NOT NULL DEFAULT 0,
    txns_start    bigint      NOT NULL DEFAULT 0,
    last_write_at timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- The ready set: true while some subscribed group may have messages of
    -- the partition left. push_one sets it in its allocator update (already
    -- true: the update stays HOT); pop clears it in bounded steps.
    pending       boolean     NOT NULL DEFAULT true,
    CONSTRAINT partitions_queue_name_key UNIQUE (queue_id, name)
) WITH (fillfactor = 50, vacuum_truncate = false);

-- The partial index holds only pending rows, so a claim walks O(ready)
-- entries instead of every partition of the queue.
CREATE INDEX partitions_pending_idx ON {{schema}}.partitions (queue_id, id) WHERE pending;
-- No statistics on pending: sampled while a new queue's partitions were all
-- pending, they make the partial index look as big as the table and a cached
-- plan then filters every partition on every pop. Without them the planner
-- assumes half the rows are pending and the partial index always wins.
ALTER TABLE {{schema}}.partitions ALTER COLUMN pending SET STATISTICS 0;

-- No index on last_write_at: the allocator update changes it, and an index
-- on it would make that update non-HOT for every key written less than once
-- a second. Maintenance finds idle partitions by walking a window of ids.

-- A segment is a run of consecutive offsets [base_offset, end_offset] of one
-- partition, stored as one blob. No secondary index: it is addressed by its key.
CREATE TABLE {{schema}}.segments (
    partition_id bigint      NOT NULL,
    base_offset  bigint      NOT NULL,
    end_offset   bigint      NOT NULL,
    created_at   timestamptz NOT NULL,
    blob         bytea       NOT NULL,
    -- Explicit failures charged to the message of a re-enqueued segment
    -- (failure policy 'skip', one message per such segment); 0 when pushed.
    failures     integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (partition_id, base_offset)
) WITH (vacuum_truncate = false);
-- The blob is already compressed; do not let TOAST try again.
ALTER TABLE {{schema}}.segments ALTER COLUMN blob SET STORAGE EXTERNAL;

-- The hash sidecar: 16 bytes (xxh3_128 of the transaction id) per message in
-- frame order. Dedup probes it; ack-by-transaction-id resolves through it.
CREATE TABLE {{schema}}.txns (
    partition_id bigint      NOT NULL,
    base_offset  bigint      NOT NULL,
    end_offset   bigint      NOT NULL,
    created_at   timestamptz NOT NULL,
    hashes       bytea       NOT NULL,
    PRIMARY KEY (partition_id, base_offset)
) WITH (vacuum_truncate = false);
ALTER TABLE {{schema}}.txns ALTER COLUMN hashes SET STORAGE EXTERNAL;

-- The cursor and lease of one consumer group on one partition: the whole
-- coordination state. Updated on every pop and ack, so HOT-friendly: low
-- fillfactor and no index on the columns that change. The queue-mode group is
-- the reserved name '' (named groups must be non-empty).
CREATE TABLE {{schema}}.consumers (
    partition_id     bigint      NOT NULL REFERENCES {{schema}}.partitions (id) ON DELETE CASCADE,
    group_name       text        NOT NULL,
    committed        bigint      NOT NULL DEFAULT -1,
    batch_end        bigint,
    lease_id         uuid,
    lease_owner      text,
    lease_expires_at timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, group_name)
) WITH (fillfactor = 50, vacuum_truncate = false);

-- A group's subscription choice, applied on its first contact and kept so
-- partitions created later are seeded the same way.
CREATE TABLE {{schema}}.subscriptions (
    queue_id   bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    group_name text        NOT NULL,
    mode       text        NOT NULL CHECK (mode IN ('all', 'new', 'from')),
    from_time  timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, group_name)
);

-- Dead letters keep a snapshot of the payload so retention cannot lose it.
CREATE TABLE {{schema}}.dead_letters (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id           bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    partition_id       bigint      NOT NULL,
    partition_name     text        NOT NULL,
    group_name         text        NOT NULL,
    msg_offset         bigint      NOT NULL,
    message_id         uuid        NOT NULL,
    transaction_id     text        NOT NULL,
    -- The message's ordering key; NULL when it has none.
    message_key        text,
    -- The message's encoded headers (the frame's headers field, see
    -- internal/frame); NULL when it has none.
    message_headers    bytea,
    flags              integer     NOT NULL DEFAULT 0,
    payload            bytea,
    message_created_at timestamptz NOT NULL,
    attempts           integer     NOT NULL,
    reason             text,
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_queue_created_idx ON {{schema}}.dead_letters (queue_id, created_at);
