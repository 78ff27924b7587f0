-- pm_vector: the location release (requests with release "location"), installed by migration 0015;
-- see sql/README.md.
--
-- A location request reports ONE public cell r in [0, M) of the whole collection at one level M
-- (pm_vector.privacy.location: M-ary randomized response, pure eps, no label, no dummy rows). The
-- cells are public: M k-means centroids of the whole public anchor (one class), fit by the
-- embedding job on the anchor set only and published with the class frames
-- (embedding_runs.public_locations; its digest and levels in embedding_runs.class_rows -> 'locations').
--
-- The function you call:
--
--   pm_vector.pm_location_shortlist(collection text, level integer, report integer, epsilon float8,
--                                   candidates integer)
--     -> TABLE(rank integer, item_id bigint, external_id text, score double precision)
--
-- The score (pm_vector.shortlist.location_list): for the report r at level M,
--   score(i) = h(i) + w * h_r(i),   w = min(e^eps - 1, 2^20)
-- where h(i) = number of items j with i in N(j) (N(j): the 32 nearest other items of j by raw
-- features), h_r(i) the same count over the j of cell r plus 1 when i itself lies in cell r. The
-- answer is the top `candidates` by score desc, ties by item id; it is a public function of
-- (run, level, report, eps, candidates), so any cache may hold it.
--
-- Per run (created by the embedding job, dropped with the run):
--   run_<id>_locations(level integer, cell integer, item_ids bigint[], hubs float8[], chubs float8[])
--       primary key (level, cell): one row per published level and cell, item_ids the items with
--       h_r(i) > 0 that an answer of at most 65,536 candidates can use, hubs their h_r(i), chubs
--       their h(i); and a row (level 0, cell 0) of the items by h desc, then id (the top hubs).
--   Kept on the coordinator of a sharded run, beside the run's codes.

-- Qualified name of a run's table: kind 'items', 'anchors', 'prior', 'neighbors', 'hubs', 'codes',
-- 'cells' or 'locations'.
CREATE OR REPLACE FUNCTION pm_vector.pm_run_table(run_id bigint, kind text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  IF kind NOT IN ('items', 'anchors', 'prior', 'neighbors', 'hubs', 'codes', 'cells', 'locations') THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('kind must be items, anchors, prior, neighbors, hubs, codes, cells or locations, not %L', kind);
  END IF;
  RETURN 'pm_vector.' || quote_ident('run_' || run_id || '_' || kind);
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

-- pm_drop_run_tables (sql/0013_cells.sql, renamed pm_drop_run_tables_0013 by migration 0015), now
-- also dropping the run's locations table.
CREATE OR REPLACE FUNCTION pm_vector.pm_drop_run_tables(p_run_id bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
  existed boolean := to_regclass(format('pm_vector.%I', 'run_' || p_run_id || '_locations')) IS NOT NULL;
BEGIN
  IF EXISTS (SELECT 1 FROM pm_vector.collections c WHERE c.active_run_id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('run %s is the active run of its collection; its tables are not dropped', p_run_id);
  END IF;
  EXECUTE format('DROP TABLE IF EXISTS pm_vector.%I', 'run_' || p_run_id || '_locations');
  RETURN pm_vector.pm_drop_run_tables_0013(p_run_id) OR existed;
END $$;

-- The ranking of one location report of run p_run_id (the same order as
-- pm_vector.shortlist.location_list): the row's items scored h + w h_r, the top hubs (level 0)
-- scored h, the top `candidates` by score desc, then id.
CREATE OR REPLACE FUNCTION pm_vector.pm_location_shortlist_core(p_run_id bigint, p_level integer, p_cell integer,
                                                                p_w float8, p_candidates integer)
RETURNS TABLE(rank integer, item_id bigint, score double precision)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
  RETURN QUERY EXECUTE format(
    'SELECT (row_number() OVER (ORDER BY u.s DESC, u.id))::integer, u.id, u.s FROM ( '
    '  SELECT c.id, max(c.s) AS s FROM ( '
    '    SELECT x.id, x.hc + $3 * x.h AS s FROM %1$s AS r, unnest(r.item_ids, r.hubs, r.chubs) AS x(id, h, hc) '
    '    WHERE r.level = $1 AND r.cell = $2 '
    '    UNION ALL '
    '    SELECT t.id, t.hc FROM %1$s AS r0, unnest(r0.item_ids[1:$4], r0.chubs[1:$4]) AS t(id, hc) '
    '    WHERE r0.level = 0 AND r0.cell = 0) AS c GROUP BY c.id) AS u '
    'ORDER BY u.s DESC, u.id LIMIT $4', 'pm_vector.' || quote_ident('run_' || p_run_id || '_locations'))
  USING p_level, p_cell, p_w, p_candidates;
END $$;

-- What a SQL user calls: the active run of a collection, eps as a number.
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
