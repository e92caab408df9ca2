-- Operator actions on a group's offsets (functions/offsets.sql): each one
-- call, so one transaction.

-- name: ResetGroup
SELECT partition_name, before, after, created, lease_ended
FROM {{schema}}.reset_group($1::uuid, $2::text, $3::text, $4::text, $5::timestamptz, $6::text[], $7::int8[], $8::boolean)

-- name: DeleteGroup
SELECT cursors, leases FROM {{schema}}.delete_group($1::uuid, $2::text, $3::text, $4::boolean)

-- name: ReleaseLease
SELECT {{schema}}.release_lease($1::uuid, $2::text, $3::text, $4::text)
