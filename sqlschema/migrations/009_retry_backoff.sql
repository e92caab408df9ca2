-- QueueOptions.RetryBackoff: the wait after a charged failure is drawn
-- from [min, least(max, min * 2^n)] ms (retry_wait_ms); both 0: no wait.
-- Existing queues and queues a first push creates get the defaults
-- (DefaultRetryBackoffMin, DefaultRetryBackoffMax).
ALTER TABLE {{schema}}.queues
    ADD COLUMN retry_backoff_min_ms bigint NOT NULL DEFAULT 1000,
    ADD COLUMN retry_backoff_max_ms bigint NOT NULL DEFAULT 300000;

-- A cursor whose head message failed under the pause policy is not claimed
-- before retry_at (NULL: no wait). Written by the settle that charges the
-- failure, with the lease released; a claim after it leaves it in the past.
ALTER TABLE {{schema}}.consumers ADD COLUMN retry_at timestamptz;
