-- Undo 0005_class_rows.sql (migration 0005 downgrade): drop every run's class-rows tables and the
-- functions, and put back pm_run_table / pm_drop_run_tables as 0001_functions.sql installed them.
DO $$
DECLARE t text;
BEGIN
  FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'pm_vector' AND c.relkind IN ('r', 'p') AND c.relname ~ '^run_[0-9]+_(prior|neighbors|hubs|codes)$'
  LOOP
    EXECUTE format('DROP TABLE IF EXISTS pm_vector.%I', t);
  END LOOP;
END $$;

DROP FUNCTION IF EXISTS pm_vector.pm_shortlist_explain(text, float8[], float8[], integer, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_shortlist(text, vector[], float8[], integer, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_shortlist(text, float8[], float8[], integer, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_restore_prior_search(text[]);
DROP FUNCTION IF EXISTS pm_vector.pm_prepare_prior_search(integer);
DROP FUNCTION IF EXISTS pm_vector.pm_prior_weight(float8, float8);
DROP FUNCTION IF EXISTS pm_vector.pm_shortlist_sql(bigint, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_check_class_rows(integer, integer, float8[], float8[], integer, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_class_rows_run(text);
DROP FUNCTION IF EXISTS pm_vector.pm_build_class_rows_indexes(bigint, integer, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_create_codes_table(bigint, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_create_class_rows_tables(bigint, integer, bigint[]);

CREATE OR REPLACE FUNCTION pm_vector.pm_run_table(run_id bigint, kind text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  IF kind NOT IN ('items', 'anchors') THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('kind must be items or anchors, not %L', kind);
  END IF;
  RETURN 'pm_vector.' || quote_ident('run_' || run_id || '_' || kind);
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_drop_run_tables(p_run_id bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
  existed boolean := to_regclass(pm_vector.pm_run_table(p_run_id, 'items')) IS NOT NULL
                  OR to_regclass(pm_vector.pm_run_table(p_run_id, 'anchors')) IS NOT NULL;
BEGIN
  IF EXISTS (SELECT 1 FROM pm_vector.collections c WHERE c.active_run_id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('run %s is the active run of its collection; its tables are not dropped', p_run_id);
  END IF;
  EXECUTE format('DROP TABLE IF EXISTS %s, %s',
                 pm_vector.pm_run_table(p_run_id, 'items'), pm_vector.pm_run_table(p_run_id, 'anchors'));
  RETURN existed;
END $$;
