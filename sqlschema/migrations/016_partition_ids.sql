-- Partition ids derived from names: from here on a new partition's id is
-- partition_key(queue id, name, probe) (functions/push.sql), a 63-bit hash
-- the client computes too, so on the Citus layout (partitions distributed
-- by id) a partition's worker is known from its name before any lookup,
-- and two first pushes of one partition insert the same primary key, which
-- keeps (queue_id, name) unique where Citus cannot enforce that constraint.
-- Rows created before keep their ids (lookups fall back to the name). The
-- identity stops generating: an insert that names no id fails instead of
-- taking one outside the rule.
ALTER TABLE {{schema}}.partitions ALTER COLUMN id DROP IDENTITY IF EXISTS;

-- routed: the function layer writes one partition per statement, each
-- routed to the shard that holds it, where a set-based statement would
-- span shards (the Citus layout: sqlschema.Distribute sets it).
ALTER TABLE {{schema}}.settings ADD COLUMN routed boolean NOT NULL DEFAULT false;
