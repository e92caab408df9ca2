-- QueueOptions.DeadLetterRetention: the maintenance pass deletes a queue's
-- dead letters older than this; 0 keeps them. It reads them through
-- dead_letters_queue_created_idx (queue_id, created_at).
ALTER TABLE {{schema}}.queues ADD COLUMN dead_letter_retention_ms bigint NOT NULL DEFAULT 0;
