-- pm_vector: the shards' foreign servers belong to pm_vector's owner role, installed by migration
-- 0025; see sql/README.md and docs/operations.md ("Database roles").
--
-- pm_register_shard (sql/0011_cluster.sql) made a user mapping FOR PUBLIC, so every role of the
-- coordinator reached the shard as the URL's user. Now the foreign server and its one user
-- mapping are the owner's (the owner of the schema pm_vector): only the owner's sessions (the
-- service, the jobs, the sync) reach the shard, as the URL's user with its password --
-- postgres_fdw and dblink let a non-superuser connect only with a password the shard asked for.
-- Run by a superuser (the first registration creates the untrusted extensions postgres_fdw and
-- dblink; the owner is granted USAGE on the wrapper), or by the owner itself once it has that.
-- The shard is checked through the owner's own mapping (the caller's role switched to the owner
-- for that call, and back).

CREATE OR REPLACE FUNCTION pm_vector.pm_register_shard(name text, host text, port text, dbname text,
                                                       "user" text DEFAULT 'postgres', password text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  srv text := pm_vector.pm_shard_server(name);
  owner text := (SELECT pg_get_userbyid(n.nspowner) FROM pg_namespace n WHERE n.nspname = 'pm_vector');
  caller text := current_setting('role');
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
  INSERT INTO pm_vector.shards (name, server_name, host, port, dbname)
  VALUES (name, srv, host, port::integer, dbname)
  ON CONFLICT ON CONSTRAINT pk_shards DO UPDATE
    SET server_name = EXCLUDED.server_name, host = EXCLUDED.host, port = EXCLUDED.port, dbname = EXCLUDED.dbname;
  -- the shard is usable by the owner: pgvector and the schema exist there
  PERFORM set_config('role', owner, true);
  PERFORM dblink_exec(srv, 'CREATE EXTENSION IF NOT EXISTS vector; CREATE SCHEMA IF NOT EXISTS pm_vector');
  PERFORM set_config('role', caller, true);
END $$;
