-- What a client knows of a message it dead-letters, and why: the fields a
-- dead_letters row keeps of the message (the partition, group, offset and
-- attempts come from the cursor). Settling and pop's dead-lettering pass
-- it in parallel arrays at the statement boundary and convert them once,
-- with dead_letter_snapshots; inside the function layer it is one value.
CREATE TYPE {{schema}}.dead_letter_snapshot AS (
    message_id         uuid,
    transaction_id     text,
    flags              integer,
    payload            bytea,
    message_created_at timestamptz,
    message_key        text,  -- '' or NULL: none
    message_headers    bytea, -- empty or NULL: none
    reason             text
);
