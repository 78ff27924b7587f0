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
-- The shard's login for query keys (docs/operations.md, "Query keys on a cluster"): the
-- coordinator's user mappings of the query role and of query keys' login role log in as it
-- (`pm-vector db shard-add ... --query-url`); it may use the schema, and each embedding job grants
-- it SELECT on the run tables a sharded answer reads here, nothing else. Change the password (here
-- and in compose.cluster.yaml) before using this beyond a laptop.
DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query') THEN
    CREATE ROLE pm_vector_query LOGIN PASSWORD 'pm_vector_query'
      NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS NOREPLICATION NOINHERIT;
  END IF;
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO pm_vector_query', current_database());
END $$;
GRANT USAGE ON SCHEMA pm_vector TO pm_vector_query;
