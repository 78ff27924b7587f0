-- Undoes sql/0013_cells.sql (migration 0013 downgrade): drops every run's cells table and the
-- functions; pm_drop_run_tables goes back to sql/0011_cluster.sql's (renamed back by the
-- migration) and pm_run_table to sql/0005_class_rows.sql's.
DO $$
DECLARE t text;
BEGIN
  FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'pm_vector' AND c.relkind IN ('r', 'p') AND c.relname ~ '^run_[0-9]+_cells$'
  LOOP
    EXECUTE format('DROP TABLE IF EXISTS pm_vector.%I', t);
  END LOOP;
END $$;

DROP FUNCTION IF EXISTS pm_vector.pm_cell_shortlist(text, integer, integer[], float8, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_cell_shortlist_sharded(bigint, jsonb, integer, bigint[], integer[], float8, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_cell_shortlist_core(bigint, integer, bigint[], integer[], float8, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_cell_shortlist_sql(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_create_cells_table(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_cells_table_ddl(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_drop_run_tables(bigint);

CREATE OR REPLACE FUNCTION pm_vector.pm_run_table(run_id bigint, kind text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  IF kind NOT IN ('items', 'anchors', 'prior', 'neighbors', 'hubs', 'codes') THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('kind must be items, anchors, prior, neighbors, hubs or codes, not %L', kind);
  END IF;
  RETURN 'pm_vector.' || quote_ident('run_' || run_id || '_' || kind);
END $$;
