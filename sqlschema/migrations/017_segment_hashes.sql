-- A segment's transaction-id hashes (16 bytes a message, frame order) in
-- its own row: a push writes one row instead of a segment and a hash row.
-- NULL on the rows written before, whose hashes stay in txns, and on rows
-- an earlier release's client still writes during a rolling upgrade.
-- Retention copies the hashes a deleted segment still owes the dedup
-- window into txns (functions/maintenance.sql, head_trim).
ALTER TABLE {{schema}}.segments ADD COLUMN hashes bytea;
-- Random bytes: compressing them is wasted work, as for txns.hashes.
ALTER TABLE {{schema}}.segments ALTER COLUMN hashes SET STORAGE EXTERNAL;
