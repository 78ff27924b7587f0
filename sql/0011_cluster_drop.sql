-- Undoes sql/0011_cluster.sql (migration 0011 downgrade).
DROP FUNCTION IF EXISTS pm_vector.pm_shard_partitions(text);
DROP FUNCTION IF EXISTS pm_vector.pm_shard_partition(text, text, text, text, text);
DROP FUNCTION IF EXISTS pm_vector.pm_shard_exec(text, text);
DROP FUNCTION IF EXISTS pm_vector.pm_shard_of(integer);
DROP FUNCTION IF EXISTS pm_vector.pm_unregister_shard(text);
DROP FUNCTION IF EXISTS pm_vector.pm_register_shard(text, text, text, text, text, text);
DROP FUNCTION IF EXISTS pm_vector.pm_shard_server(text);
DROP FUNCTION IF EXISTS pm_vector.pm_shortlist_shard_explain(text, float8[], float8[], integer, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_shard_reset(text[]);
DROP FUNCTION IF EXISTS pm_vector.pm_shortlist_sharded(bigint, integer, jsonb, float8[], float8[], bigint[], bigint[], integer, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_shard_rows(jsonb, text);
DROP FUNCTION IF EXISTS pm_vector.pm_shard_install(text);
DROP FUNCTION IF EXISTS pm_vector.pm_shortlist_core(bigint, integer, float8[], float8[], bigint[], bigint[], integer, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_shortlist_core_sql(bigint, integer);
-- pm_shortlist and pm_drop_run_tables go back to their 0005 definitions
