-- A least-privilege Postgres role for outboxd: LOGIN and REPLICATION, SELECT
-- on the outbox table and nothing else. Not superuser, owns nothing, cannot
-- write. outboxd's start-up check names any privilege that is missing.
--
-- Run it with psql as a superuser (on Amazon RDS and Aurora, as the master
-- user, a member of rds_superuser), in the outbox's database:
--
--   psql "$ADMIN_DSN" -v ON_ERROR_STOP=1 \
--        -v role=outboxd -v table=public.outbox -v schema=public -v publication=outboxd \
--        -v password="$(cat /run/secrets/outboxd-pg-password)" \
--        -f migrations/roles/least_privilege.sql
--
-- On PostgreSQL 15, only a superuser may give a role REPLICATION or take
-- SUPERUSER or BYPASSRLS away (or change the password of a role with
-- REPLICATION), so the script changes only the attributes that differ: run
-- again without -v password on a role that is already right, it needs only
-- ownership of the table, of the schema or grant options on them, and the
-- right to grant CONNECT on the database. Where the
-- role rds_replication exists (Amazon RDS and Aurora), the role is made a
-- member of it instead of being given REPLICATION, which RDS does not let
-- anyone give.
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

-- LOGIN: outboxd connects. REPLICATION (or, on RDS, membership of
-- rds_replication): outboxd creates the logical slot
-- (pg_create_logical_replication_slot) and streams from it over a
-- replication connection (START_REPLICATION). Everything else is taken away
-- when the role has it, so that running this on an existing role also takes
-- away what it should not have.
SELECT format('CREATE ROLE %I', :'role')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
SELECT format('ALTER ROLE %I WITH %s', rolname, a.attrs)
  FROM pg_roles,
       LATERAL (SELECT concat_ws(' ',
           CASE WHEN NOT rolcanlogin THEN 'LOGIN' END,
           CASE WHEN NOT rolreplication AND NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'rds_replication') THEN 'REPLICATION' END,
           CASE WHEN rolsuper THEN 'NOSUPERUSER' END,
           CASE WHEN rolcreatedb THEN 'NOCREATEDB' END,
           CASE WHEN rolcreaterole THEN 'NOCREATEROLE' END,
           CASE WHEN rolbypassrls THEN 'NOBYPASSRLS' END) AS attrs) a
 WHERE rolname = :'role' AND a.attrs <> '' \gexec
SELECT format('GRANT rds_replication TO %I', :'role')
 WHERE CASE WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = 'rds_replication')
            THEN NOT pg_has_role(:'role', 'rds_replication', 'MEMBER') END \gexec
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
-- table (or superuser) and CREATE on the database, which outboxd's role must
-- not have, so it is created here.
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
