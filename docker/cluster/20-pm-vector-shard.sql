-- A shard's database for pm_vector's owner role (docs/operations.md, "Database roles"). The postgres
-- image runs this once on each shard, after initdb/10-pm-vector-owner.sql made the role, in the
-- database POSTGRES_DB as the superuser. The coordinator reaches the shard as pm_vector_owner
-- (the user mapping `pm-vector db shard-add` makes is that role's, with its password) and creates
-- the run tables and functions in the schema pm_vector through dblink: the database and the schema
-- are the owner's; pgvector is untrusted, so the superuser creates it here.
CREATE EXTENSION IF NOT EXISTS vector;
DO $$
BEGIN
  EXECUTE format('ALTER DATABASE %I OWNER TO pm_vector_owner', current_database());
END $$;
CREATE SCHEMA IF NOT EXISTS pm_vector AUTHORIZATION pm_vector_owner;
