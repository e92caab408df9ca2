-- Retry backoff under the skip failure policy: a failed message's copy
-- waits in scheduled until due, then move_scheduled appends it at its
-- partition's tail (see settle_rows). failures is what the copy carries
-- into its segment (segments.failures), so RetryLimit holds across
-- copies; a user's scheduled message has 0, a retry copy at least 1 (its
-- failure was charged).
ALTER TABLE {{schema}}.scheduled ADD COLUMN failures integer NOT NULL DEFAULT 0;

-- The transaction id is unique among a queue's user-scheduled messages
-- only. A retry copy repeats its original's hash (or the zero hash once
-- the dedup window passed, which any number of copies share), and a
-- user's DeliverAt of that transaction id is not a duplicate of a failed
-- message's retry: its dedup is decided at its move, as for a push then.
DROP INDEX {{schema}}.scheduled_queue_hash_idx;
CREATE UNIQUE INDEX scheduled_queue_hash_idx ON {{schema}}.scheduled (queue_id, hash) WHERE failures = 0;
