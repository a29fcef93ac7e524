-- meridian's two ClickHouse users, for a server with SQL access control (ClickHouse
-- 20.4 and later: the official clickhouse/clickhouse-server image, a managed service).
-- A server configured by users.xml (Debian 12's clickhouse-server 18.16 has no GRANT)
-- takes users.d/meridian.xml instead. Run as an administrator, the hashes filled in
-- from the password files by render.sh:
--   deploy/clickhouse/render.sh deploy/clickhouse/grants.sql clickhouse-password \
--     clickhouse-reader-password | clickhouse-client --multiquery
-- Running it again changes nothing (IF NOT EXISTS; a GRANT held is granted again).

CREATE DATABASE IF NOT EXISTS meridian;

-- The agent (meridian sentinel, clickhouse.user): at every start it runs
-- CREATE DATABASE IF NOT EXISTS meridian and CREATE TABLE IF NOT EXISTS for its six
-- tables, adds the ALIAS columns of docs/requirements/sentinel.md a table lacks (ALTER
-- ADD COLUMN), sets the timed tables' TTL from clickhouse.retention_days when it
-- differs (ALTER MODIFY TTL,
-- which the server applies to the rows it has: MATERIALIZE TTL); then it INSERTs
-- batches and, after an insert that had no answer, SELECTs the batch's id. Nothing
-- else: no DROP, no ALTER DELETE, no other database.
CREATE USER IF NOT EXISTS meridian
    IDENTIFIED WITH sha256_hash BY '@MERIDIAN_PASSWORD_SHA256@'
    DEFAULT DATABASE meridian;
GRANT CREATE DATABASE, CREATE TABLE, ALTER ADD COLUMN, ALTER MODIFY TTL,
    ALTER MATERIALIZE TTL, INSERT, SELECT ON meridian.* TO meridian;

-- `meridian sentinel query` (--clickhouse-user meridian_reader): SELECT only, and
-- readonly = 1, so no query of it changes a setting either.
CREATE USER IF NOT EXISTS meridian_reader
    IDENTIFIED WITH sha256_hash BY '@READER_PASSWORD_SHA256@'
    DEFAULT DATABASE meridian
    SETTINGS readonly = 1;
GRANT SELECT ON meridian.* TO meridian_reader;
