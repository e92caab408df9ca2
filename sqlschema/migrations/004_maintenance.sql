-- Maintenance's stored settings (its steps and the consumer_lag view are in
-- functions/maintenance.sql).

-- Settings every process of the schema follows. maintenance: pushes go to
-- each process's disk spool (reported Buffered) and spool drains pause.
CREATE TABLE {{schema}}.settings (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),
    maintenance boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO {{schema}}.settings DEFAULT VALUES;
