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
-- ones included: they are there until cancelled), in both tables (a
-- generation's rows above the watermark, read in the same snapshot);
-- then how many failed messages' retry copies wait in scheduled
-- (failures > 0), which the first two leave out.
WITH q AS (SELECT q.id FROM {{schema}}.queues q WHERE q.tenant = $1 AND q.name = $2),
r AS (SELECT count(*) FILTER (WHERE s.failures = 0) AS n, min(s.due_at) FILTER (WHERE s.failures = 0) AS due,
             count(*) FILTER (WHERE s.failures > 0) AS retries
      FROM {{schema}}.scheduled s WHERE s.queue_id IN (SELECT q.id FROM q)),
g AS (SELECT count(*) AS n, min(x.due_at) AS due
      FROM {{schema}}.scheduled_gen x CROSS JOIN {{schema}}.scheduled_state st
      WHERE x.queue_id IN (SELECT q.id FROM q) AND ROW(x.due_at, x.id) > ROW(st.wm_due, st.wm_id))
SELECT r.n + g.n, least(r.due, g.due), r.retries FROM r CROSS JOIN g
