-- Migration 0010 (ingest integrity): finding what dead processes left behind.
--
-- pm_orphan_run_tables(): the run tables (run_<id>_items|anchors|prior|neighbors|hubs|codes) whose
-- run failed or no longer exists, and that no collection has as its active run. A crashed job,
-- or a run row deleted by hand, can leave them; `pm-vector db cleanup` drops them with
-- pm_drop_run_tables(run_id). The partitions of a prior (run_<id>_prior_<k>) go with their table.
CREATE OR REPLACE FUNCTION pm_vector.pm_orphan_run_tables()
RETURNS TABLE (run_id bigint, table_name text, run_status text)
LANGUAGE sql STABLE
AS $$
  SELECT t.run_id, t.relname::text, r.status
  FROM (SELECT c.relname,
               (regexp_match(c.relname, '^run_([0-9]+)_(items|anchors|prior|neighbors|hubs|codes)$'))[1]::bigint
                 AS run_id
        FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'pm_vector' AND c.relkind IN ('r', 'p')) t
  LEFT JOIN pm_vector.embedding_runs r ON r.id = t.run_id
  WHERE t.run_id IS NOT NULL
    AND (r.id IS NULL OR r.status = 'failed')
    AND NOT EXISTS (SELECT 1 FROM pm_vector.collections c WHERE c.active_run_id = t.run_id)
  ORDER BY 1, 2
$$;

COMMENT ON FUNCTION pm_vector.pm_orphan_run_tables() IS
  'Run tables whose run failed or is gone (never an active run): what pm-vector db cleanup drops.';
