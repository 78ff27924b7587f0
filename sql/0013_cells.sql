-- pm_vector: the cell release (requests with release "cells"), installed by migration 0013; see
-- sql/README.md.
--
-- A cell request names one level K and reports one cell r_c in [0, K) per class c, in the run's
-- class order (pm_vector.privacy.cells: K-ary randomized response for the real row, a uniform cell
-- for every other row). The cells are public: per class, K centroids of the class's public anchor
-- rows (pm_vector.manifold.cells.PublicCells, fit by the embedding job on the anchor set only and
-- published with the class frames: embedding_runs.public_cells, its digest and levels in
-- embedding_runs.class_rows -> 'cells').
--
-- The function you call:
--
--   pm_vector.pm_cell_shortlist(collection text, n_cells integer, reports integer[], epsilon float8,
--                               k_prime integer)
--     -> TABLE(row_index integer, rank integer, item_id bigint, external_id text, label bigint,
--              score double precision)
--
-- The score (pm_vector.shortlist.CellShortlist.scores): for row c reporting cell r at level K,
--   score(i) = h_c(i) + w * h_{c,K,r}(i),   w = min(e^eps - 1, 2^20)
-- (pm_vector.privacy.cells.cell_weight: proportional to the RR likelihood q h_c + (p - q) h_{c,K,r};
-- capped so that eps = inf ranks by (h_{c,K,r}, h_c)), where h_c(i) = number of items j of class c
-- with i in N(j) (the class hub count), h_{c,K,r}(i) = the same count over the j of class c in
-- cell r (cell_K(j) = the nearest centroid of class c at level K by raw features), N(j) the cell
-- release's graph: the graph_degree (pm_vector.shortlist.CELL_GRAPH_DEGREE, 32) nearest other
-- items of j by raw features (any class). The shortlist is the top k' by score desc, ties by item
-- id. (resolve passes w as Python computes it, so both sides rank with the same float64 numbers;
-- pm_cell_shortlist computes it from eps with PostgreSQL's exp, which may differ from Python's
-- expm1 in the last bit: that matters only for exact ties.)
--
-- Per run (created by the embedding job, dropped with the run):
--   run_<id>_cells(level integer, label bigint, cell integer, item_ids bigint[], hubs float8[],
--                  chubs float8[])  primary key (level, label, cell): one row per published level,
--       class and cell (empty arrays for a cell no item falls in); item_ids the items i with
--       h_{c,K,r}(i) > 0 (ascending), hubs their h_{c,K,r}(i), chubs their h_c(i); and per class a
--       row (level 0, cell 0) of the items with h_c(i) > 0 by h_c desc, then id (its first k' are
--       the class's top hubs). On a sharded
--       run, each shard holds the rows of its classes (the class is the shard key).
--
-- Candidates of a row: the items of its cell's row, the k' top hubs of its class (the first k' of
-- its level-0 row) and the k' first item ids (the zero-score fill). Every other item has h_{c,K,r} = 0, so its score is h_c(i), and
-- the k' top hubs (h_c desc, id) each rank before it: it cannot enter (see sql/README.md).
--
-- New error code: PM009 the active run publishes no ready cells (built before them, or an anchor
-- set that gives none).

-- ------------------------------------------------------------------------------------ helpers

-- Qualified name of a run's table: kind 'items', 'anchors', 'prior', 'neighbors', 'hubs', 'codes'
-- or 'cells'.
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

-- The DDL of a run's cells table (the same on a single node and on a shard).
CREATE OR REPLACE FUNCTION pm_vector.pm_cells_table_ddl(p_run_id bigint) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
  SELECT format('CREATE TABLE %s (level integer NOT NULL, label bigint NOT NULL, cell integer NOT NULL, '
                'item_ids bigint[] NOT NULL, hubs float8[] NOT NULL, chubs float8[] NOT NULL, '
                'PRIMARY KEY (level, label, cell))', pm_vector.pm_run_table(p_run_id, 'cells'))
$$;

-- Creates a run's cells table (used by the embedding job, before the run switches on).
CREATE OR REPLACE FUNCTION pm_vector.pm_create_cells_table(p_run_id bigint) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs r WHERE r.id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  EXECUTE pm_vector.pm_cells_table_ddl(p_run_id);
END $$;

-- pm_drop_run_tables (sql/0011_cluster.sql, renamed pm_drop_run_tables_0011 by migration 0013), now
-- also dropping the run's cells table, here and on its shards.
CREATE OR REPLACE FUNCTION pm_vector.pm_drop_run_tables(p_run_id bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
  existed boolean := to_regclass(pm_vector.pm_run_table(p_run_id, 'cells')) IS NOT NULL;
  s text;
BEGIN
  IF EXISTS (SELECT 1 FROM pm_vector.collections c WHERE c.active_run_id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('run %s is the active run of its collection; its tables are not dropped', p_run_id);
  END IF;
  EXECUTE format('DROP TABLE IF EXISTS %s', pm_vector.pm_run_table(p_run_id, 'cells'));
  -- the run's shards; a run that failed before recording its placement: every registered shard
  FOR s IN SELECT jsonb_object_keys(er.class_rows -> 'shards') FROM pm_vector.embedding_runs er
           WHERE er.id = p_run_id AND er.class_rows ? 'shards'
           UNION SELECT sh.name FROM pm_vector.shards sh
             WHERE NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs er WHERE er.id = p_run_id AND er.class_rows ? 'shards')
               AND EXISTS (SELECT 1 FROM pm_vector.embedding_runs er WHERE er.id = p_run_id) LOOP
    BEGIN
      PERFORM pm_vector.pm_shard_exec(s, format('DROP TABLE IF EXISTS pm_vector.%I', 'run_' || p_run_id || '_cells'));
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'run %: shard % could not be reached; its cells stay until the next cleanup', p_run_id, s;
    END;
  END LOOP;
  RETURN pm_vector.pm_drop_run_tables_0011(p_run_id) OR existed;
END $$;

-- ------------------------------------------------------------------------------ the statement

-- The statement ranking every row of a cell request (without the items join; on a single node and
-- on a shard alike). Parameters: $1 level (K), $2 the rows' classes bigint[], $3 their reported
-- cells integer[], $4 w (float8, the weight of the reported cell), $5 k_prime.
-- Returns (row_index, rank, item_id, score); score = h_c + w h_{c,K,r}.
CREATE OR REPLACE FUNCTION pm_vector.pm_cell_shortlist_sql(run_id bigint) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  RETURN format(
    'WITH q AS MATERIALIZED ( '
    '  SELECT g.i AS row_index, ($2::bigint[])[g.i] AS label, ($3::integer[])[g.i] AS cell '
    '  FROM generate_series(1, cardinality($2::bigint[])) AS g(i)), '
    'cand AS ( '
    '  SELECT u.row_index, u.item_id, max(u.h) AS h, max(u.hc) AS hc FROM ( '
    '    SELECT q.row_index, x.item_id, x.h, x.hc FROM q CROSS JOIN LATERAL ( '
    '      SELECT unnest(c.item_ids) AS item_id, unnest(c.hubs) AS h, unnest(c.chubs) AS hc '
    '      FROM %1$s AS c WHERE c.level = $1::integer AND c.label = q.label AND c.cell = q.cell) AS x '
    '    UNION ALL '
    '    SELECT q.row_index, t.item_id, 0::float8, t.hub FROM q CROSS JOIN LATERAL ( '
    '      SELECT unnest(c0.item_ids[1:$5::integer]) AS item_id, unnest(c0.chubs[1:$5::integer]) AS hub '
    '      FROM %1$s AS c0 WHERE c0.level = 0 AND c0.label = q.label AND c0.cell = 0) AS t '
    '    UNION ALL '
    '    SELECT q.row_index, f.item_id, 0::float8, 0::float8 FROM q CROSS JOIN ( '
    '      SELECT e.item_id FROM %2$s AS e ORDER BY e.item_id LIMIT $5::integer) AS f) AS u '
    '  GROUP BY u.row_index, u.item_id), '
    'r AS ( '
    '  SELECT c.row_index, c.item_id, c.hc + $4::float8 * c.h AS score, '
    '         row_number() OVER (PARTITION BY c.row_index ORDER BY c.hc + $4::float8 * c.h DESC, c.item_id) AS rank '
    '  FROM cand AS c) '
    'SELECT r.row_index::integer, r.rank::integer, r.item_id, r.score FROM r WHERE r.rank <= $5::integer '
    'ORDER BY 1, 2',
    pm_vector.pm_run_table(run_id, 'cells'), pm_vector.pm_run_table(run_id, 'items'));
END $$;

-- Runs the statement for the given rows (on a shard, or on a single node).
CREATE OR REPLACE FUNCTION pm_vector.pm_cell_shortlist_core(run_id bigint, level integer, classes bigint[],
    reports integer[], w float8, k_prime integer)
RETURNS TABLE (row_index integer, rank integer, item_id bigint, score double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
BEGIN
  RETURN QUERY EXECUTE pm_vector.pm_cell_shortlist_sql(run_id) USING level, classes, reports, w, k_prime;
END $$;

-- Fans a cell request out over a sharded run's shards (as pm_shortlist_sharded: every shard gets
-- its rows in one query, sent to all shards before any result is read). Returns the merged per-row
-- top k' with global row indexes. A dblink connection this session kept from before a shard
-- restarted fails on first use: the shard's query is then sent once more on a new connection.
CREATE OR REPLACE FUNCTION pm_vector.pm_cell_shortlist_sharded(run_id bigint, placement jsonb, level integer,
    classes bigint[], reports integer[], w float8, k_prime integer)
RETURNS TABLE (row_index integer, rank integer, item_id bigint, score double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  s text;
  srv text;
  pos integer[];
  sent text[] := '{}';
  q text;
  qs text[] := '{}';
  addr text;
BEGIN
  FOR s IN SELECT jsonb_object_keys(placement) ORDER BY 1 LOOP
    pos := pm_vector.pm_shard_rows(placement, s);
    CONTINUE WHEN cardinality(pos) = 0;
    SELECT sh.server_name, sh.host || ':' || sh.port INTO srv, addr FROM pm_vector.shards sh WHERE sh.name = s;
    IF srv IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'PM007',
        MESSAGE = format('run %s is placed on shard %L, which is not registered here', run_id, s),
        HINT = 'Register it again (pm-vector db shard-add) or run a new embedding job.';
    END IF;
    q := format('SELECT row_index, rank, item_id, score FROM pm_vector.pm_cell_shortlist_core(%s, %s, %L::bigint[], '
                '%L::integer[], %L::float8, %s)', run_id, level, ARRAY(SELECT classes[p] FROM unnest(pos) AS p),
                ARRAY(SELECT reports[p] FROM unnest(pos) AS p), w, k_prime);
    qs := qs || q;
    BEGIN
      IF NOT coalesce(srv = ANY (dblink_get_connections()), false) THEN
        PERFORM dblink_connect(srv, srv);
      END IF;
      PERFORM dblink_send_query(srv, q);
    EXCEPTION WHEN OTHERS THEN
      BEGIN  -- once more, on a new connection
        PERFORM pm_vector.pm_shard_reset(ARRAY[srv]);
        PERFORM dblink_connect(srv, srv);
        PERFORM dblink_send_query(srv, q);
      EXCEPTION WHEN OTHERS THEN
        PERFORM pm_vector.pm_shard_reset(sent || srv);
        RAISE EXCEPTION USING ERRCODE = 'PM008',
          MESSAGE = format('shard %s (%s) did not answer: %s', s, addr, SQLERRM),
          HINT = 'Nothing was written; retry once the shard is back (pm-vector db status shows the nodes).';
      END;
    END;
    sent := sent || srv;
  END LOOP;
  FOR i IN 1 .. cardinality(sent) LOOP
    srv := sent[i];
    SELECT sh.name, sh.host || ':' || sh.port INTO s, addr FROM pm_vector.shards sh WHERE sh.server_name = srv;
    pos := pm_vector.pm_shard_rows(placement, s);
    BEGIN
      RETURN QUERY SELECT pos[t.row_index], t.rank, t.item_id, t.score
        FROM dblink_get_result(srv) AS t(row_index integer, rank integer, item_id bigint, score double precision);
      PERFORM * FROM dblink_get_result(srv) AS t(row_index integer, rank integer, item_id bigint,
                                                 score double precision);  -- the end of the result set
    EXCEPTION WHEN OTHERS THEN
      BEGIN  -- once more, on a new connection, synchronously (no rows of this shard were returned)
        PERFORM pm_vector.pm_shard_reset(ARRAY[srv]);
        PERFORM dblink_connect(srv, srv);
        RETURN QUERY SELECT pos[t.row_index], t.rank, t.item_id, t.score
          FROM dblink(srv, qs[i]) AS t(row_index integer, rank integer, item_id bigint, score double precision);
      EXCEPTION WHEN OTHERS THEN
        PERFORM pm_vector.pm_shard_reset(sent);
        RAISE EXCEPTION USING ERRCODE = 'PM008',
          MESSAGE = format('shard %s (%s) did not answer: %s', s, addr, SQLERRM),
          HINT = 'Nothing was written; retry once the shard is back (pm-vector db status shows the nodes).';
      END;
    END;
  END LOOP;
END $$;

-- --------------------------------------------------------------------------- the shortlist

-- The k_prime candidates of every row of a cell request, in one statement (SQL callers; resolve
-- runs the same statement). Checks: the run publishes cells (PM009), n_cells among its levels
-- (PM004), one report per class in [0, n_cells) (PM003 / PM004), epsilon > 0 (PM004), k_prime in
-- 1..1000 (PM004).
CREATE OR REPLACE FUNCTION pm_vector.pm_cell_shortlist(collection text, n_cells integer, reports integer[],
                                                       epsilon float8, k_prime integer)
RETURNS TABLE (row_index integer, rank integer, item_id bigint, external_id text, label bigint,
               score double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  r record;
  doc jsonb;
  w float8;
BEGIN
  SELECT * INTO r FROM pm_vector.pm_class_rows_run(pm_cell_shortlist.collection);
  SELECT er.class_rows INTO doc FROM pm_vector.embedding_runs er WHERE er.id = r.run_id;
  IF doc -> 'cells' IS NULL OR doc -> 'cells' ->> 'status' IS DISTINCT FROM 'ready' THEN
    RAISE EXCEPTION USING ERRCODE = 'PM009',
      MESSAGE = format('the active run %s of collection %L publishes no cells (%s)', r.run_id, collection,
                       coalesce(doc -> 'cells' ->> 'error', 'it was built before cells existed')),
      HINT = 'Run a new embedding job for the collection (pm-vector embed COLLECTION).';
  END IF;
  IF n_cells IS NULL OR NOT (doc -> 'cells' -> 'levels') @> to_jsonb(n_cells) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('n_cells must be one of the published levels %s, got %s', doc -> 'cells' -> 'levels', n_cells);
  END IF;
  IF reports IS NULL OR array_ndims(reports) IS DISTINCT FROM 1 OR array_lower(reports, 1) <> 1
     OR cardinality(reports) <> cardinality(r.classes) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM003',
      MESSAGE = format('reports must hold %s cells (one per class of the active run, in its class order), got %s',
                       cardinality(r.classes), coalesce(array_dims(reports), 'NULL'));
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(reports) x WHERE x IS NULL OR x < 0 OR x >= n_cells) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('every report must be a cell in [0, %s)', n_cells);
  END IF;
  IF epsilon IS NULL OR NOT (epsilon > 0) OR epsilon = 'NaN'::float8 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('epsilon must be > 0 (or infinity), got %s', epsilon);
  END IF;
  IF k_prime IS NULL OR k_prime < 1 OR k_prime > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('k_prime must be between 1 and 1000, got %s', k_prime);
  END IF;
  -- pm_vector.privacy.cells.cell_weight: min(e^eps - 1, 2^20)
  w := CASE WHEN epsilon >= ln(1048577::float8) THEN 1048576::float8 ELSE least(exp(epsilon) - 1, 1048576::float8) END;
  IF doc ? 'shards' THEN
    RETURN QUERY
      SELECT s.row_index, s.rank, s.item_id, i.external_id, i.label, s.score
      FROM pm_vector.pm_cell_shortlist_sharded(r.run_id, doc -> 'shards', n_cells, r.classes, reports, w, k_prime) AS s
      JOIN pm_vector.items AS i ON i.id = s.item_id
      ORDER BY 1, 2;
    RETURN;
  END IF;
  RETURN QUERY
    SELECT s.row_index, s.rank, s.item_id, i.external_id, i.label, s.score
    FROM pm_vector.pm_cell_shortlist_core(r.run_id, n_cells, r.classes, reports, w, k_prime) AS s
    JOIN pm_vector.items AS i ON i.id = s.item_id
    ORDER BY 1, 2;
END $$;
