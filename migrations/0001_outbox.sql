-- The outbox table outboxd streams from. `outboxd migrate` applies this file,
-- with public.outbox replaced by the configured postgres.table.
--
-- Write each event in the same transaction as the business change it
-- describes. To keep the table empty, delete the row in that same transaction:
--
--   BEGIN;
--   UPDATE orders SET status = 'placed' WHERE id = 42;
--   INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload)
--     VALUES ('order', '42', 'OrderPlaced', '{"id": 42}') RETURNING id;
--   DELETE FROM public.outbox WHERE id = '<the id returned above>';
--   COMMIT;
--
-- The WAL keeps the INSERT, which outboxd delivers; the DELETE is ignored.
CREATE TABLE IF NOT EXISTS public.outbox (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb,
    created_at     timestamptz NOT NULL DEFAULT now()
);
