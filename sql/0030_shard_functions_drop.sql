-- Undoes sql/0030_shard_functions.sql (migration 0030 downgrade): pm_shard_install as
-- sql/0011_cluster.sql made it (a shard's copies keep the ACL the last install gave them).
DROP FUNCTION IF EXISTS pm_vector.pm_shard_install(text, text, text[]);

-- Installs (or refreshes) on a shard every pm_vector function, as defined on the coordinator, so
-- coordinator and shards never disagree on the statement (whatever helpers it calls). Bodies are
-- not checked there (check_function_bodies off): functions about the catalog are never called on
-- a shard.
CREATE OR REPLACE FUNCTION pm_vector.pm_shard_install(shard text) RETURNS integer
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
  PERFORM pm_vector.pm_shard_exec(shard, 'SET check_function_bodies = off; ' || defs
                                          || '; RESET check_function_bodies');
  RETURN n;
END $$;
