-- Undoes sql/0025_cluster_owner.sql (migration 0025 downgrade): pm_register_shard as sql/0011_cluster.sql made it
-- (a user mapping FOR PUBLIC). Registered shards keep the servers and mappings they have.


CREATE OR REPLACE FUNCTION pm_vector.pm_register_shard(name text, host text, port text, dbname text,
                                                       "user" text DEFAULT 'postgres', password text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  srv text := pm_vector.pm_shard_server(name);
BEGIN
  IF name IS NULL OR name !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('a shard name is 1-40 lower-case letters, digits or _ starting with a letter, got %L', name);
  END IF;
  CREATE EXTENSION IF NOT EXISTS postgres_fdw;
  CREATE EXTENSION IF NOT EXISTS dblink;
  IF EXISTS (SELECT 1 FROM pg_foreign_server s WHERE s.srvname = srv) THEN
    EXECUTE format('DROP SERVER %I CASCADE', srv);
  END IF;
  EXECUTE format('CREATE SERVER %I FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host %L, port %L, dbname %L, '
                 'async_capable %L, extensions %L, fetch_size %L, batch_size %L, connect_timeout %L)',
                 srv, host, port, dbname, 'true', 'vector', '10000', '1000', '5');
  IF password IS NULL THEN
    EXECUTE format('CREATE USER MAPPING FOR PUBLIC SERVER %I OPTIONS (user %L)', srv, "user");
  ELSE
    EXECUTE format('CREATE USER MAPPING FOR PUBLIC SERVER %I OPTIONS (user %L, password %L)', srv, "user", password);
  END IF;
  INSERT INTO pm_vector.shards (name, server_name, host, port, dbname)
  VALUES (name, srv, host, port::integer, dbname)
  ON CONFLICT ON CONSTRAINT pk_shards DO UPDATE
    SET server_name = EXCLUDED.server_name, host = EXCLUDED.host, port = EXCLUDED.port, dbname = EXCLUDED.dbname;
  -- the shard is usable: pgvector and the schema exist there
  PERFORM dblink_exec(srv, 'CREATE EXTENSION IF NOT EXISTS vector; CREATE SCHEMA IF NOT EXISTS pm_vector');
END $$;

