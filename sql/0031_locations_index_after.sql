-- pm_vector: a run's locations table gets its indexes after its rows (migration 0031).
--
-- pm_create_locations_table made the table with its primary key and its index on part, so the job's
-- COPY of its rows (871,000 rows at 100,000 items) kept both B-trees row by row: 100 MB of the WAL
-- (401 MB against 302 MB) and a second of the write. It now makes the bare table; the job fills it,
-- in the same transaction, and pm_index_locations_table builds the two indexes at once, with the
-- names they had. A run built before keeps its indexes.

CREATE OR REPLACE FUNCTION pm_vector.pm_create_locations_table(p_run_id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs r WHERE r.id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  EXECUTE format('CREATE TABLE pm_vector.%I (level integer NOT NULL, cell integer NOT NULL, '
                 'part integer NOT NULL DEFAULT 0, item_ids bigint[] NOT NULL, hubs float8[] NOT NULL, '
                 'chubs float8[] NOT NULL)', 'run_' || p_run_id || '_locations');
END $$;

-- The primary key (level, cell, part) and the index on part of a run's locations table, once its
-- rows are in.
CREATE OR REPLACE FUNCTION pm_vector.pm_index_locations_table(p_run_id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs r WHERE r.id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  EXECUTE format('ALTER TABLE pm_vector.%I ADD CONSTRAINT %I PRIMARY KEY (level, cell, part)',
                 'run_' || p_run_id || '_locations', 'run_' || p_run_id || '_locations_pkey');
  EXECUTE format('CREATE INDEX %I ON pm_vector.%I (part)', 'run_' || p_run_id || '_locations_by_part',
                 'run_' || p_run_id || '_locations');
END $$;
