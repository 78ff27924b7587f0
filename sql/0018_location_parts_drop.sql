-- Undoes sql/0018_location_parts.sql (migration 0018 downgrade): each run's location rows are
-- joined again into one row per (level, cell) (parts in order; the level -1 rows go), the part
-- column goes, and the functions go back to sql/0015_locations.sql's.
DO $$
DECLARE t text;
BEGIN
  FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'pm_vector' AND c.relkind = 'r' AND c.relname ~ '^run_[0-9]+_locations$'
  LOOP
    EXECUTE format('CREATE TEMP TABLE pm_joined ON COMMIT DROP AS SELECT r.level, r.cell, '
                   'array_agg(u.i ORDER BY r.part, u.k) AS item_ids, array_agg(u.h ORDER BY r.part, u.k) AS hubs, '
                   'array_agg(u.c ORDER BY r.part, u.k) AS chubs FROM pm_vector.%I AS r, '
                   'unnest(r.item_ids, r.hubs, r.chubs) WITH ORDINALITY AS u(i, h, c, k) WHERE r.level >= 0 '
                   'GROUP BY r.level, r.cell', t);
    EXECUTE format('TRUNCATE pm_vector.%I', t);
    EXECUTE format('DROP INDEX IF EXISTS pm_vector.%I', t || '_by_part');
    EXECUTE format('ALTER TABLE pm_vector.%I DROP CONSTRAINT IF EXISTS %I', t, t || '_pkey');
    EXECUTE format('ALTER TABLE pm_vector.%I DROP COLUMN part', t);
    EXECUTE format('ALTER TABLE pm_vector.%I ADD PRIMARY KEY (level, cell)', t);
    EXECUTE format('INSERT INTO pm_vector.%I (level, cell, item_ids, hubs, chubs) '
                   'SELECT level, cell, item_ids, hubs, chubs FROM pm_joined', t);
    DROP TABLE pm_joined;
  END LOOP;
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_create_locations_table(p_run_id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs r WHERE r.id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  EXECUTE format('CREATE TABLE pm_vector.%I (level integer NOT NULL, cell integer NOT NULL, '
                 'item_ids bigint[] NOT NULL, hubs float8[] NOT NULL, chubs float8[] NOT NULL, '
                 'PRIMARY KEY (level, cell))', 'run_' || p_run_id || '_locations');
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_location_shortlist(p_collection text, p_level integer, p_report integer,
                                                           p_epsilon float8, p_candidates integer)
RETURNS TABLE(rank integer, item_id bigint, external_id text, score double precision)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  rid bigint;
  cid bigint;
  w float8;
BEGIN
  SELECT c.id, c.active_run_id INTO cid, rid FROM pm_vector.collections c WHERE c.name = p_collection;
  IF cid IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM001', MESSAGE = format('unknown collection %L', p_collection);
  END IF;
  IF rid IS NULL OR to_regclass(format('pm_vector.%I', 'run_' || rid || '_locations')) IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM009', MESSAGE = format(
      'the active run of collection %L publishes no location cells; run a full embedding job', p_collection);
  END IF;
  IF p_epsilon IS NULL OR NOT p_epsilon > 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = 'epsilon must be > 0 (or infinity)';
  END IF;
  IF p_candidates IS NULL OR p_candidates < 1 OR p_candidates > 65536 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = 'candidates must be in 1..65536';
  END IF;
  w := CASE WHEN p_epsilon >= ln(2.0 ^ 20 + 1) THEN 2.0 ^ 20 ELSE least(exp(p_epsilon) - 1, 2.0 ^ 20) END;
  RETURN QUERY SELECT s.rank, s.item_id, i.external_id, s.score
    FROM pm_vector.pm_location_shortlist_core(rid, p_level, p_report, w, p_candidates) AS s
    JOIN pm_vector.items i ON i.id = s.item_id ORDER BY s.rank;
END $$;
