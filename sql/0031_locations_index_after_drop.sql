-- Undoes sql/0031_locations_index_after.sql (migration 0031 downgrade): pm_create_locations_table
-- as sql/0018_location_parts.sql made it (the indexes with the table), pm_index_locations_table
-- gone. The tables of runs built since keep the indexes it built, with the same names.
CREATE OR REPLACE FUNCTION pm_vector.pm_create_locations_table(p_run_id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs r WHERE r.id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  EXECUTE format('CREATE TABLE pm_vector.%I (level integer NOT NULL, cell integer NOT NULL, '
                 'part integer NOT NULL DEFAULT 0, item_ids bigint[] NOT NULL, hubs float8[] NOT NULL, '
                 'chubs float8[] NOT NULL, PRIMARY KEY (level, cell, part))', 'run_' || p_run_id || '_locations');
  EXECUTE format('CREATE INDEX %I ON pm_vector.%I (part)', 'run_' || p_run_id || '_locations_by_part',
                 'run_' || p_run_id || '_locations');
END $$;

DROP FUNCTION IF EXISTS pm_vector.pm_index_locations_table(bigint);
