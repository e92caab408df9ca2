-- Retry backoff under per-key Consume (KeyConcurrency > 1) and the pause
-- policy: a failed message waits, not its lane. Beside fail_offs (see
-- 003), per offset above the cursor: wait_offs / wait_at, parallel and
-- sorted, the time before which that message is not delivered again
-- (written by the keyed settle that charged its failure; entries whose
-- time passed, or that the cursor or settled passed, mean nothing and
-- are dropped by the next keyed settle). A keyed claim returns them, so
-- the client starts neither the waiting message nor its key's later ones;
-- any other claim ends before the first of them. While a key waits, the
-- other keys settle past it, so settled (003) may hold more than one
-- Batch of entries: claims reach at most claim_reach past the cursor
-- (functions/cursor.sql), which bounds it.
--
-- held_offs (sorted): messages a keyed holder left unstarted behind a
-- waiting message of their key. While some wait holds, a claim does not
-- count them (nor the waiting messages) toward its Batch, so a waiting
-- key that keeps receiving messages does not fill the claims of its
-- lane's other keys. Dropped with the last wait.
--
-- idle_until / idle_seen park a partition whose keyed holder was left
-- with waiting keys only: it is not claimed again before idle_until
-- unless the partition's last offset passes idle_seen (messages the
-- parked claim could not see; NULL: none can help). Written at the
-- release, cleared by the next claim.
ALTER TABLE {{schema}}.consumers
    ADD COLUMN wait_offs  bigint[],
    ADD COLUMN wait_at    timestamptz[],
    ADD COLUMN held_offs  bigint[],
    ADD COLUMN idle_until timestamptz,
    ADD COLUMN idle_seen  bigint;

-- A keyed claim's waits, on a partition's first row (as settled).
ALTER TYPE {{schema}}.pop_row
    ADD ATTRIBUTE wait_offs bigint[],
    ADD ATTRIBUTE wait_at   timestamptz[];
