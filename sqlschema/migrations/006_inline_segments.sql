-- Segment blobs up to a page stay in the row: above the default 2 KB
-- target, EXTERNAL storage moved every mid-size segment (a few dozen
-- messages) out of line, one TOAST row and index entry per 2 KB chunk,
-- written by every push and read back by every pop.
ALTER TABLE {{schema}}.segments SET (toast_tuple_target = 8160);
