-- A least-privilege Postgres role for outboxd: LOGIN and REPLICATION, SELECT
-- on the outbox table and nothing else. Not superuser, owns nothing, cannot
-- write. outboxd's start-up check names any privilege that is missing.
--
-- Run it with psql as the outbox table's owner (or a superuser), in the
-- outbox's database:
--
--   psql "$ADMIN_DSN" -v ON_ERROR_STOP=1 \
--        -v role=outboxd -v table=public.outbox -v schema=public -v publication=outboxd \
--        -v password="$(cat /run/secrets/outboxd-pg-password)" \
--        -f migrations/roles/least_privilege.sql
--
-- Leave out -v password=... to keep the role's current password (or set it
-- later with \password, which keeps it out of the shell history and ps).
-- It is safe to run again.
--
-- Then run outboxd as that role with
--
--   postgres:
--     create_publication: false   # created below, by the owner
--     create_slot: true           # REPLICATION is enough to create the slot
--
-- This file is not applied by 'outboxd migrate': only files directly in
-- migrations/ are.

\set ON_ERROR_STOP 1

-- LOGIN: outboxd connects. REPLICATION: outboxd creates the logical slot
-- (pg_create_logical_replication_slot) and streams from it over a
-- replication connection (START_REPLICATION). Everything else is off
-- explicitly, so that running this on an existing role also takes away
-- what it should not have.
SELECT format('CREATE ROLE %I', :'role')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
ALTER ROLE :"role" WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
\if :{?password}
ALTER ROLE :"role" WITH PASSWORD :'password';
\endif

-- CONNECT on the database: PUBLIC has it by default; granted explicitly for
-- databases where it was revoked from PUBLIC.
GRANT CONNECT ON DATABASE :"DBNAME" TO :"role";

-- USAGE on the outbox's schema and SELECT on the outbox table: the read
-- access Postgres' own logical replication asks of a subscriber's role on a
-- published table, and what outboxd checks at start-up. No INSERT, UPDATE,
-- DELETE or TRUNCATE: outboxd never writes to the table.
GRANT USAGE ON SCHEMA :"schema" TO :"role";
GRANT SELECT ON TABLE :table TO :"role";

-- The publication: CREATE PUBLICATION ... FOR TABLE needs ownership of the
-- table, which outboxd's role must not have, so the owner creates it here.
-- It publishes inserts (the events) and updates (which outboxd reports), as
-- the one outboxd creates does: with insert-then-delete, published deletes
-- would make Postgres decode and send one more change per event. With
-- publish_via_partition_root, a partitioned outbox's rows come under its own
-- name (outboxd refuses a partitioned outbox's publication without it).
SELECT format('CREATE PUBLICATION %I FOR TABLE %s WITH (publish = ''insert, update'', publish_via_partition_root = true)', :'publication', :'table')
 WHERE NOT EXISTS (SELECT FROM pg_publication WHERE pubname = :'publication') \gexec

-- pg_hba.conf must let the role in. outboxd's replication connection is a
-- logical one (replication=database), which pg_hba.conf matches with the
-- database's lines, not with the "replication" keyword (that is for physical
-- replication). For example, with TLS required:
--
--   hostssl  app  outboxd  10.0.0.0/8  scram-sha-256
