-- Optional idempotency key for outbox events (package outbox, Event.IdempotencyKey).
-- `outboxd migrate` applies this file after 0001, with public.outbox replaced by
-- the configured postgres.table. Both statements are idempotent.
--
-- The unique index rejects a second event with the same key while the first
-- row is still in the table. With insert-then-delete (the row is deleted in
-- its own transaction) the key is gone once that transaction commits, so the
-- index only catches concurrent duplicates; keep rows (and delete them later)
-- if the key must hold over time. NULL keys are never in conflict.
--
-- The index name is fixed: two outbox tables in one schema need the second
-- index created by hand under another name.
ALTER TABLE public.outbox ADD COLUMN IF NOT EXISTS idempotency_key text;
CREATE UNIQUE INDEX IF NOT EXISTS outbox_idempotency_key_idx ON public.outbox (idempotency_key);
