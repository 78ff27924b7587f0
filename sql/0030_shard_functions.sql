-- pm_vector: no role gets EXECUTE on pm_vector's functions on a shard but the matrix's (migration
-- 0030); see sql/README.md and docs/operations.md ("Database roles").
--
-- pm_shard_install (sql/0011_cluster.sql) copies every pm_vector function to a shard with
-- pg_get_functiondef, which carries no ACL: a function created there had PostgreSQL's default ACL,
-- EXECUTE for PUBLIC (the SECURITY DEFINER ones too), and the shard's query login could run every
-- one of them. It now also, in the same transaction on the shard (one dblink_exec):
--   * sets the shard login's default privileges (ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON
--     FUNCTIONS FROM PUBLIC, before the copies are made: as on the coordinator, migration 0022);
--   * revokes EXECUTE on every function of the shard's schema pm_vector from PUBLIC, and from the
--     query login query_role (when that role exists there);
--   * grants the query login EXECUTE on every overload of the functions named in query_functions
--     (pm_vector.db.postgres.privileges.SHARD_QUERY_FUNCTIONS, passed in by
--     privileges.install_on_shards: what the statements a sharded answer sends the shards call).
-- The signature changes (shard, query_role, query_functions): the one-argument function is dropped.

DROP FUNCTION IF EXISTS pm_vector.pm_shard_install(text);

CREATE OR REPLACE FUNCTION pm_vector.pm_shard_install(shard text, query_role text, query_functions text[])
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
  defs text;
  n integer;
BEGIN
  SELECT string_agg(pg_get_functiondef(p.oid), E';\n' ORDER BY p.proname, p.oid), count(*)
    INTO defs, n
    FROM pg_proc p JOIN pg_namespace ns ON ns.oid = p.pronamespace
   WHERE ns.nspname = 'pm_vector' AND p.prokind = 'f';
  PERFORM pm_vector.pm_shard_exec(shard,
    'ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC; SET check_function_bodies = off; '
    || defs || '; RESET check_function_bodies; REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pm_vector FROM PUBLIC; '
    || format($g$DO $grant$ DECLARE f text; BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %1$L) THEN
  EXECUTE format('REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pm_vector FROM %%I', %1$L);
  FOR f IN SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace ns ON ns.oid = p.pronamespace
            WHERE ns.nspname = 'pm_vector' AND p.prokind = 'f' AND ns.nspname || '.' || p.proname = ANY (%2$L::text[]) LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %%s TO %%I', f, %1$L);
  END LOOP;
END IF; END $grant$ $g$, query_role, coalesce(query_functions, '{}'::text[])));
  RETURN n;
END $$;
