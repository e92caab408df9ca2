-- Scheduled messages due within the hour are held in generations, not in
-- scheduled: a move reads them past a watermark and never deletes them
-- one by one, and a generation is truncated whole once the watermark
-- passed its last row (see DESIGN.md, "Scheduled delivery"). The per-row
-- table scheduled keeps the rest: messages due further ahead, retry
-- copies (failures > 0), held plaintext, and items that came due while
-- their schedule waited for a move.
--
-- One generation receives every schedule (scheduled_state.cur_gen); the
-- mover closes it after a while, recording its last (due_at, id), and
-- opens a free one. A generation's unique (queue_id, hash) serves dedup at
-- schedule time: every schedule in flight writes the same generation (the
-- mover switches it only while it holds the state row FOR UPDATE, which
-- waits for the schedules' FOR SHARE), and the closed ones are probed
-- for rows not yet moved.
CREATE TABLE {{schema}}.scheduled_gen (
    gen            integer     NOT NULL,
    -- From scheduled's sequence: (due_at, id) orders both tables' rows
    -- together, ties in schedule order.
    id             bigint      NOT NULL,
    queue_id       bigint      NOT NULL REFERENCES {{schema}}.queues (id) ON DELETE CASCADE,
    partition_name text        NOT NULL,
    due_at         timestamptz NOT NULL,
    hash           bytea       NOT NULL,
    message_id     uuid        NOT NULL,
    flags          integer     NOT NULL,
    lanes          integer     NOT NULL,
    blob           bytea       NOT NULL
) PARTITION BY LIST (gen);
CREATE UNIQUE INDEX scheduled_gen_key_idx ON {{schema}}.scheduled_gen (queue_id, hash, gen);
CREATE INDEX scheduled_gen_due_idx ON {{schema}}.scheduled_gen (due_at, id);
CREATE TABLE {{schema}}.scheduled_g0 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (0);
CREATE TABLE {{schema}}.scheduled_g1 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (1);
CREATE TABLE {{schema}}.scheduled_g2 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (2);
CREATE TABLE {{schema}}.scheduled_g3 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (3);
CREATE TABLE {{schema}}.scheduled_g4 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (4);
CREATE TABLE {{schema}}.scheduled_g5 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (5);
CREATE TABLE {{schema}}.scheduled_g6 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (6);
CREATE TABLE {{schema}}.scheduled_g7 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (7);
CREATE TABLE {{schema}}.scheduled_g8 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (8);
CREATE TABLE {{schema}}.scheduled_g9 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (9);
CREATE TABLE {{schema}}.scheduled_g10 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (10);
CREATE TABLE {{schema}}.scheduled_g11 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (11);
CREATE TABLE {{schema}}.scheduled_g12 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (12);
CREATE TABLE {{schema}}.scheduled_g13 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (13);
CREATE TABLE {{schema}}.scheduled_g14 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (14);
CREATE TABLE {{schema}}.scheduled_g15 PARTITION OF {{schema}}.scheduled_gen FOR VALUES IN (15);

-- One row. The watermark (wm_due, wm_id): every generation row at or
-- below it has been moved (or, held, copied to scheduled); a row above it
-- is scheduled. Only a move raises it, holding this row FOR UPDATE;
-- schedule_items and cancel_scheduled hold it FOR SHARE, so none of them
-- runs beside a move and each reads the watermark of the last move
-- committed. cur_gen: the generation schedules write.
CREATE TABLE {{schema}}.scheduled_state (
    one     boolean     PRIMARY KEY DEFAULT true CHECK (one),
    wm_due  timestamptz NOT NULL DEFAULT '-infinity',
    wm_id   bigint      NOT NULL DEFAULT 0,
    cur_gen integer     NOT NULL DEFAULT 0
);
INSERT INTO {{schema}}.scheduled_state DEFAULT VALUES;

-- The generations' lifecycle, written by the mover only: opened is when a
-- generation became current (NULL: free, truncated); once closed, last_due
-- and last_id are its last row (NULL: it had none), and it is truncated
-- when the watermark reaches them.
CREATE TABLE {{schema}}.scheduled_gens (
    gen      integer     PRIMARY KEY,
    opened   timestamptz,
    closed   boolean     NOT NULL DEFAULT false,
    last_due timestamptz,
    last_id  bigint
);
INSERT INTO {{schema}}.scheduled_gens (gen) SELECT g FROM generate_series(0, 15) AS g;
UPDATE {{schema}}.scheduled_gens SET opened = now() WHERE gen = 0;
