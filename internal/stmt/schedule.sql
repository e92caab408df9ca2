-- Scheduled delivery: holding items until due, moving them, cancelling.
-- Statements, one per "-- name: Field" block (the field of stmt.Set or
-- stmt.Consume it fills); {{schema}} is the quoted schema name.

-- name: Schedule
SELECT ord, status, dup_id FROM {{schema}}.schedule_items($1, $2, $3, $4, $5, $6, $7, $8, $9)

-- name: MoveScheduled
SELECT moved, dropped, held, woke_tenants, woke_queues, woke_parts, next_in_ms
FROM {{schema}}.move_scheduled($1, $2)

-- name: CancelScheduled
SELECT {{schema}}.cancel_scheduled($1, $2, $3)

-- name: ScheduledStatus
-- The queue's scheduled messages: how many, and the earliest due (held
-- ones included: they are there until cancelled); then how many failed
-- messages' retry copies wait there (failures > 0), which the first two
-- leave out.
SELECT count(*) FILTER (WHERE s.failures = 0), min(s.due_at) FILTER (WHERE s.failures = 0),
       count(*) FILTER (WHERE s.failures > 0)
FROM {{schema}}.scheduled s
JOIN {{schema}}.queues q ON q.id = s.queue_id
WHERE q.tenant = $1 AND q.name = $2
