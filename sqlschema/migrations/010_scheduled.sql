-- Scheduled delivery (Item.DeliverAt): a message pushed for later is held
-- here, not in its partition (where it would block every later message),
-- and appended to the partition's log by move_scheduled once due, through
-- push_bundle like any push. One row per message.
CREATE TABLE {{schema}}.scheduled (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue_id       bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    partition_name text        NOT NULL,
    due_at         timestamptz NOT NULL,
    -- xxh3-128 of the transaction id: the dedup key while scheduled
    -- (scheduled_queue_hash_idx) and the hash row the move appends.
    hash           bytea       NOT NULL,
    message_id     uuid        NOT NULL,
    -- push_bundle's segment flags (1 encrypted, 2 keyed) and the lane count
    -- a keyed message was routed with (0: not routed).
    flags          integer     NOT NULL,
    lanes          integer     NOT NULL,
    -- The message as a push stores it: a raw-codec segment of one frame
    -- (ciphertext when the queue is encrypted).
    blob           bytea       NOT NULL,
    -- Set by a move that found the queue encrypted and the message not:
    -- it stays here (counted by Status) until cancelled.
    held           boolean     NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX scheduled_queue_hash_idx ON {{schema}}.scheduled (queue_id, hash);
CREATE INDEX scheduled_due_idx ON {{schema}}.scheduled (due_at, id) WHERE NOT held;
