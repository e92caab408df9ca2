-- Frames may carry headers (FlagHeaders, see internal/frame), which a binary
-- from before this version would reject as an unknown flag bit. This
-- version number is what stops such a binary (ErrSchemaTooNew) before it
-- meets one; the column and the functions themselves are in 001 and 003.
COMMENT ON COLUMN {{schema}}.dead_letters.message_headers IS
    'The message''s encoded headers (the frame''s headers field); NULL when it has none.';
