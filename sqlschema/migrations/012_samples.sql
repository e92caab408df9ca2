-- Throughput and lag samples for the console's charts: a ring of at most
-- one row per queue and slot. take_samples (functions/samples.sql), run by
-- the maintenance pass, writes the slot of the current time bucket (by
-- default a minute, 60 slots: the last hour) over whatever the slot held,
-- so the table never grows past queues x slots rows whatever the uptime.
-- Rows of a deleted queue go with it.
CREATE TABLE {{schema}}.samples (
    queue_id bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    slot     smallint    NOT NULL,
    -- Which bucket of the database clock the row is for (epoch / width).
    bucket   bigint      NOT NULL,
    taken_at timestamptz NOT NULL,
    -- Running totals, for rates between two rows: messages the queue's
    -- partitions were given (sum of last_offset + 1), and per group, in
    -- parallel arrays sorted by group name, what its cursors passed (sum of
    -- committed + 1) and its lag (lag_messages, summed). A purged idle
    -- partition or a reset group lowers a total: readers treat a drop as a
    -- reset, not as negative throughput.
    pushed   bigint      NOT NULL,
    groups   text[]      NOT NULL,
    consumed bigint[]    NOT NULL,
    lag      bigint[]    NOT NULL,
    PRIMARY KEY (queue_id, slot)
) WITH (fillfactor = 50); -- rewritten in place each round: updates stay HOT

-- The bucket the samples were last taken for: the first pass in a new
-- bucket moves it and writes the ring, every other pass in that bucket (of
-- this process or another that wins the maintenance lock later) finds it
-- moved and reads nothing else.
CREATE TABLE {{schema}}.samples_clock (
    id     boolean PRIMARY KEY DEFAULT true CHECK (id),
    bucket bigint  NOT NULL DEFAULT -1
);
INSERT INTO {{schema}}.samples_clock DEFAULT VALUES;
