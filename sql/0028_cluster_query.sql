-- pm_vector: query keys reach the shards as a read-only login of their own, installed by migration
-- 0028; see sql/README.md and docs/operations.md ("Database roles").
--
-- sql/0025_cluster_owner.sql mapped only pm_vector's owner on a shard's foreign server: a query
-- key's session (the query role pm_vector_query under SET ROLE, or its login role of migration
-- 0017) had no mapping, so the service ran query keys' resolves as the owner on a cluster. Now
-- pm_register_shard takes the shard's query login too (query_user, query_password: a role on the
-- shard that may read only what a sharded answer reads there, pm_vector.privileges.SHARD_QUERY_*)
-- and gives the query role USAGE on the foreign server and a user mapping to that login, for
-- pm_vector_query and for the query login role of pm_vector_service.query_login (a mapping is
-- looked up by the session's current user, never through role membership). Without query_user
-- the shard is registered as 0025 did: query keys then resolve as the owner (the service warns).

DROP FUNCTION IF EXISTS pm_vector.pm_register_shard(text, text, text, text, text, text);

CREATE OR REPLACE FUNCTION pm_vector.pm_register_shard(name text, host text, port text, dbname text,
                                                       "user" text DEFAULT 'postgres', password text DEFAULT NULL,
                                                       query_user text DEFAULT NULL,
                                                       query_password text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  srv text := pm_vector.pm_shard_server(name);
  owner text := (SELECT pg_get_userbyid(n.nspowner) FROM pg_namespace n WHERE n.nspname = 'pm_vector');
  caller text := current_setting('role');
  r text;
BEGIN
  IF name IS NULL OR name !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('a shard name is 1-40 lower-case letters, digits or _ starting with a letter, got %L', name);
  END IF;
  CREATE EXTENSION IF NOT EXISTS postgres_fdw;
  CREATE EXTENSION IF NOT EXISTS dblink;
  IF current_user <> owner THEN
    EXECUTE format('GRANT USAGE ON FOREIGN DATA WRAPPER postgres_fdw TO %I', owner);
  END IF;
  IF EXISTS (SELECT 1 FROM pg_foreign_server s WHERE s.srvname = srv) THEN
    EXECUTE format('DROP SERVER %I CASCADE', srv);
  END IF;
  EXECUTE format('CREATE SERVER %I FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host %L, port %L, dbname %L, '
                 'async_capable %L, extensions %L, fetch_size %L, batch_size %L, connect_timeout %L)',
                 srv, host, port, dbname, 'true', 'vector', '10000', '1000', '5');
  IF current_user <> owner THEN
    EXECUTE format('ALTER SERVER %I OWNER TO %I', srv, owner);
  END IF;
  IF password IS NULL THEN
    EXECUTE format('CREATE USER MAPPING FOR %I SERVER %I OPTIONS (user %L)', owner, srv, "user");
  ELSE
    EXECUTE format('CREATE USER MAPPING FOR %I SERVER %I OPTIONS (user %L, password %L)', owner, srv, "user",
                   password);
  END IF;
  -- the query role's way to the shard: USAGE, and a mapping per role a query key's session runs as
  IF query_user IS NOT NULL AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query') THEN
    EXECUTE format('GRANT USAGE ON FOREIGN SERVER %I TO %I', srv, 'pm_vector_query');
    FOR r IN SELECT 'pm_vector_query' UNION
             SELECT q.role_name FROM pm_vector_service.query_login q
              WHERE to_regclass('pm_vector_service.query_login') IS NOT NULL
                AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = q.role_name) LOOP
      IF query_password IS NULL THEN
        EXECUTE format('CREATE USER MAPPING FOR %I SERVER %I OPTIONS (user %L)', r, srv, query_user);
      ELSE
        EXECUTE format('CREATE USER MAPPING FOR %I SERVER %I OPTIONS (user %L, password %L)', r, srv, query_user,
                       query_password);
      END IF;
    END LOOP;
  END IF;
  INSERT INTO pm_vector.shards (name, server_name, host, port, dbname)
  VALUES (name, srv, host, port::integer, dbname)
  ON CONFLICT ON CONSTRAINT pk_shards DO UPDATE
    SET server_name = EXCLUDED.server_name, host = EXCLUDED.host, port = EXCLUDED.port, dbname = EXCLUDED.dbname;
  -- the shard is usable by the owner: pgvector and the schema exist there
  PERFORM set_config('role', owner, true);
  PERFORM dblink_exec(srv, 'CREATE EXTENSION IF NOT EXISTS vector; CREATE SCHEMA IF NOT EXISTS pm_vector');
  PERFORM set_config('role', caller, true);
END $$;
