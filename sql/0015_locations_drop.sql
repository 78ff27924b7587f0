-- Undoes sql/0015_locations.sql (migration 0015 downgrade): drops every run's locations table and
-- the functions; pm_drop_run_tables goes back to sql/0013_cells.sql's (renamed back by the migration).
DO $$
DECLARE t text;
BEGIN
  FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'pm_vector' AND c.relkind IN ('r', 'p') AND c.relname ~ '^run_[0-9]+_locations$'
  LOOP
    EXECUTE format('DROP TABLE IF EXISTS pm_vector.%I', t);
  END LOOP;
END $$;

DROP FUNCTION IF EXISTS pm_vector.pm_location_shortlist(text, integer, integer, float8, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_location_shortlist_core(bigint, integer, integer, float8, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_create_locations_table(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_drop_run_tables(bigint);

CREATE OR REPLACE FUNCTION pm_vector.pm_run_table(run_id bigint, kind text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  IF kind NOT IN ('items', 'anchors', 'prior', 'neighbors', 'hubs', 'codes', 'cells') THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('kind must be items, anchors, prior, neighbors, hubs, codes or cells, not %L', kind);
  END IF;
  RETURN 'pm_vector.' || quote_ident('run_' || run_id || '_' || kind);
END $$;
