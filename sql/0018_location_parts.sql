-- pm_vector: location rows in parts, installed by migration 0018; see sql/README.md.
--
-- A run's location row (level, cell) is stored in PARTS: the entries of item i sit in the part
-- part(i) = the cell of i at the run's part level (class_rows -> 'locations' -> 'part_level', one of
-- the published levels, chosen by the job from the number of items). The rows of level -1,
-- (level -1, cell p, part p), list the items of part p: where each item's entries are.
--
--   run_<id>_locations(level integer, cell integer, part integer, item_ids bigint[], hubs float8[],
--                      chubs float8[])   primary key (level, cell, part), index on part
--
-- An item's entries lie near it (a location row lists the items of its cell and their nearest
-- neighbours), so the rows of one part are few: erasing an item, or placing a new one, reads and
-- writes the parts of the items it concerns, not the whole rows (a coarse level's row holds up to
-- 65,536 entries). The top hubs row is (0, 0, 0), one part, in rank order. An answer reads every
-- part of its row: pm_location_shortlist_core ranks the union, as before.
--
-- A run built before keeps one part (0) per row and no level -1 rows; it is served and changed as
-- before (an erasure reads the rows that list an erased item).

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

-- What a SQL user calls (as in sql/0015_locations.sql), now refusing a level below 1 (the rows of
-- level -1 and 0 are the run's own bookkeeping, not a published level).
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
  IF p_level IS NULL OR p_level < 1 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = 'level must be one of the published levels (at least 1)';
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

-- The location tables of runs built before: one part (0) per row.
DO $$
DECLARE t text;
BEGIN
  FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'pm_vector' AND c.relkind = 'r' AND c.relname ~ '^run_[0-9]+_locations$'
  LOOP
    EXECUTE format('ALTER TABLE pm_vector.%I ADD COLUMN IF NOT EXISTS part integer NOT NULL DEFAULT 0', t);
  END LOOP;
END $$;
