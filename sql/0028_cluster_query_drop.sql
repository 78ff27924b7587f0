-- Undoes sql/0028_cluster_query.sql (migration 0028 downgrade): the query roles' user mappings and
-- USAGE on the registered shards' foreign servers go, and the query role's SELECT on pm_vector.shards
-- and EXECUTE on pm_shard_reset (the matrix of 0025), and pm_register_shard loses its query login
-- (migration 0025_cluster_owner's function is installed again by the migration, from its own file).

DO $$
DECLARE
  srv text;
  r text;
BEGIN
  FOR srv IN SELECT s.srvname FROM pg_foreign_server s JOIN pm_vector.shards sh ON sh.server_name = s.srvname LOOP
    FOR r IN SELECT u.usename FROM pg_user_mappings u
              WHERE u.srvname = srv AND u.usename IN (
                SELECT 'pm_vector_query' UNION
                SELECT q.role_name FROM pm_vector_service.query_login q
                 WHERE to_regclass('pm_vector_service.query_login') IS NOT NULL) LOOP
      EXECUTE format('DROP USER MAPPING IF EXISTS FOR %I SERVER %I', r, srv);
    END LOOP;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query') THEN
      EXECUTE format('REVOKE USAGE ON FOREIGN SERVER %I FROM %I', srv, 'pm_vector_query');
    END IF;
  END LOOP;
  -- the query role's rights migration 0028 added to the privilege matrix
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query') THEN
    REVOKE SELECT (name, server_name, host, port) ON pm_vector.shards FROM pm_vector_query;
    REVOKE EXECUTE ON FUNCTION pm_vector.pm_shard_reset(text[]) FROM pm_vector_query;
  END IF;
END $$;

DROP FUNCTION IF EXISTS pm_vector.pm_register_shard(text, text, text, text, text, text, text, text);
