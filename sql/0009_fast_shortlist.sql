-- pm_vector: a faster pm_shortlist (same arguments, same scores), installed by migration 0009;
-- see sql/README.md.
--
-- Where the time went (20k items, C = 10, max_prior 1024; the statement cut after each CTE and
-- timed): the prior read ~15 %, aggregating the C x max_prior x graph_degree (164k) neighbour
-- contributions ~60-80 %, then the candidates' hub counts (a hash of the whole hubs table; one
-- index probe per candidate instead, 14k of them, cost ~25 % when tried). EXPLAIN ANALYZE blames
-- the graph's merge join, but without its per-row instrumentation the join and an unnest cost
-- about the same: the aggregation is the bound. Same run, same requests, interleaved (loaded
-- 2-core machine): the 0005 statement 196 ms (max_prior 1024) / 126 ms (512), this one 157 / 88 ms.
--
-- What changes:
--   * runs built from now on store each prior item's neighbour list in its prior row
--     (run_<id>_prior.nbrs bigint[], graph_degree ids, nearest first): the prior read that
--     retains an item also brings its neighbours -- no second lookup, no join with the graph;
--   * beside the list, the hub count of each neighbour in the item's class (run_<id>_prior.nhub
--     float8[]): a candidate's hub comes with it, no join with the hubs table (a hash of the whole
--     table, or one index probe per candidate: 14k probes cost more than the aggregation);
--   * runs built before (no nbrs column; sharded runs use the new layout on their shards) keep
--     the statement of sql/0005_class_rows.sql, now named pm_shortlist_sql_v1: they keep working,
--     a new embedding job moves them to the fast layout.
-- The scores are the same numbers (pm_vector.shortlist.PosteriorShortlist.scores). The retained
-- prior rows are summed in a fixed order (row, distance, item id), not in the order an index scan
-- returns them: two builds of a class's HNSW index (a rebuild, or the same class on a shard)
-- return the same prior in another order, and float8 sums in another order can differ in the last
-- bit and swap two near-equal candidates. In that order every node ranks the same prior alike.
--
-- The per-run table layout (new runs):
--   run_<id>_prior(item_id, label, coords vector(d), coords8 float8[], nbrs bigint[], nhub float8[])
--   nhub is kept exact when new items are added (pm_vector.db.runs.class_rows.extend recomputes the
--   rows whose neighbours' hub counts changed, in the same transaction).
--   (run_<id>_neighbors and run_<id>_hubs as before; the graph table is kept for new items and tools)


-- Creates a run's class-rows tables (as sql/0005_class_rows.sql) with the neighbour list of every
-- prior item in its prior row (nbrs bigint[]) and, beside it, the hub count of each neighbour in
-- the row's class (nhub float8[]: nhub[k] = hub_label(nbrs[k])).
CREATE OR REPLACE FUNCTION pm_vector.pm_create_class_rows_tables(p_run_id bigint, n_components integer,
                                                                 classes bigint[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  k integer;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs r WHERE r.id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  IF n_components IS NULL OR n_components < 1 OR n_components > 2000 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('n_components must be in 1..2000, got %s', n_components);
  END IF;
  IF classes IS NULL OR cardinality(classes) = 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = 'classes must list at least one class';
  END IF;
  EXECUTE format('CREATE TABLE %s (item_id bigint NOT NULL, label bigint NOT NULL, coords vector(%s) NOT NULL, '
                 'coords8 float8[] NOT NULL, nbrs bigint[] NOT NULL, nhub float8[] NOT NULL, '
                 'PRIMARY KEY (label, item_id)) '
                 'PARTITION BY LIST (label)',
                 pm_vector.pm_run_table(p_run_id, 'prior'), n_components);
  FOR k IN 1 .. cardinality(classes) LOOP
    EXECUTE format('CREATE TABLE pm_vector.%I PARTITION OF %s FOR VALUES IN (%s)',
                   'run_' || p_run_id || '_prior_' || (k - 1), pm_vector.pm_run_table(p_run_id, 'prior'),
                   classes[k]);
  END LOOP;
  EXECUTE format('CREATE TABLE %s (item_id bigint NOT NULL, neighbor_id bigint NOT NULL)',
                 pm_vector.pm_run_table(p_run_id, 'neighbors'));
  EXECUTE format('CREATE TABLE %s (label bigint NOT NULL, item_id bigint NOT NULL, hub double precision NOT NULL)',
                 pm_vector.pm_run_table(p_run_id, 'hubs'));
END $$;

-- Whether a run's prior holds the neighbour lists (the layout of runs built after migration 0009).
CREATE OR REPLACE FUNCTION pm_vector.pm_run_has_nbrs(run_id bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                 WHERE a.attrelid = to_regclass(pm_vector.pm_run_table(run_id, 'prior'))
                   AND a.attname = 'nbrs' AND NOT a.attisdropped)
$$;


-- pm_shortlist_sql_v1(run_id, n_components): the statement of sql/0005_class_rows.sql (runs without
-- neighbour lists in their prior). Not redefined here: migration 0009 renames 0005's
-- pm_shortlist_sql to it before this file installs the new pm_shortlist_sql.

-- The one statement answering all rows (parameters as pm_shortlist_sql_v1). Runs with neighbour
-- lists in the prior: the prior read gives each retained item's list, unnested in place, only for
-- retained items whose excess weight w_j - w_far reaches the run's min_weight (class_rows
-- parameter, 0 = all; pm_vector.shortlist.PosteriorShortlist.min_weight), unnested in the select
-- list (one ProjectSet node: ~10 % faster than a LATERAL unnest per prior row). Hub counts come with the
-- lists (nhub) or with the class's top hubs; a fill item (the first k' ids) gets hub 0 unless one
-- of those gave it: an item neither touched nor among the k' top hubs of the class ranks below
-- all k' top hubs whatever its hub (lower hub, or equal hub and higher id), so it cannot enter. Other runs: pm_shortlist_sql_v1. The statement ends with the same items
-- join as before (sql/0011_cluster.sql cuts it off for the shards).
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist_sql(run_id bigint, n_components integer) RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  prior text := pm_vector.pm_run_table(run_id, 'prior');
  d2 text;
  mw float8;
BEGIN
  IF NOT pm_vector.pm_run_has_nbrs(run_id) THEN
    RETURN pm_vector.pm_shortlist_sql_v1(run_id, n_components);
  END IF;
  -- the run's min_weight (embedding_runs.class_rows): a constant of the run, so written into the text
  SELECT (r.class_rows ->> 'min_weight')::float8 INTO mw FROM pm_vector.embedding_runs r
   WHERE r.id = pm_shortlist_sql.run_id;
  mw := coalesce(mw, 0);
  SELECT string_agg(format('(a.coords8[%1$s] - q.z8[%1$s]) * (a.coords8[%1$s] - q.z8[%1$s])', i), ' + ' ORDER BY i)
    INTO d2 FROM generate_series(1, n_components) AS i;
  RETURN format(
    'WITH q AS MATERIALIZED ( '
    '  SELECT g.i AS row_index, ($3::bigint[])[g.i] AS label, ($4::bigint[])[g.i] AS n_class, '
    '         ($2::float8[])[g.i] AS sigma, z.z8, z.z8::vector AS zv '
    '  FROM generate_series(1, cardinality($3::bigint[])) AS g(i) '
    '  CROSS JOIN LATERAL (SELECT ARRAY(SELECT x FROM unnest(($1::float8[])[g.i:g.i][1:%4$s]) AS x) AS z8) AS z), '
    'p AS MATERIALIZED ( '
    '  SELECT q.row_index, s.item_id, s.d2, s.nbrs, s.nhub FROM q CROSS JOIN LATERAL ( '
    '    SELECT a.item_id, %2$s AS d2, a.nbrs, a.nhub FROM %1$s AS a WHERE a.label = q.label AND q.n_class <= $6 '
    '    UNION ALL '
    '    SELECT a.item_id, %2$s AS d2, a.nbrs, a.nhub FROM ( '
    '      SELECT c.item_id, c.coords8, c.nbrs, c.nhub FROM %1$s AS c WHERE c.label = q.label AND q.n_class > $6 '
    '      ORDER BY c.coords <-> q.zv LIMIT $6) AS a) AS s), '
    'rw AS MATERIALIZED ( '
    '  SELECT q.row_index, q.label, q.sigma, m.dmin, '
    '         CASE WHEN q.n_class > $6 AND m.dmax IS NOT NULL '
    '              THEN pm_vector.pm_prior_weight(m.dmax - m.dmin, q.sigma) ELSE 0::float8 END AS w_far '
    '  FROM q LEFT JOIN (SELECT p.row_index, min(p.d2) AS dmin, max(p.d2) AS dmax FROM p GROUP BY p.row_index) AS m '
    '    ON m.row_index = q.row_index), '
    't AS ( '
    '  SELECT y.row_index, y.item_id, sum(y.dw) AS base, max(y.hub) AS hub FROM ( '
    '    SELECT x.row_index, x.dw, unnest(x.nbrs) AS item_id, unnest(x.nhub) AS hub FROM ( '
    '      SELECT p.row_index, p.nbrs, p.nhub, '
    '             pm_vector.pm_prior_weight(p.d2 - rw.dmin, rw.sigma) - rw.w_far AS dw '
    '      FROM p JOIN rw ON rw.row_index = p.row_index '
    '      ORDER BY p.row_index, p.d2, p.item_id) AS x '
    '    WHERE x.dw >= %7$s::float8) AS y '
    '  GROUP BY y.row_index, y.item_id), '
    'cand AS ( '
    '  SELECT u.row_index, u.item_id, max(u.base) AS base, max(u.hub) AS hub FROM ( '
    '    SELECT t.row_index, t.item_id, t.base, t.hub FROM t '
    '    UNION ALL '
    '    SELECT rw.row_index, h.item_id, 0::float8, h.hub FROM rw CROSS JOIN LATERAL ( '
    '      SELECT h.item_id, h.hub FROM %5$s AS h WHERE h.label = rw.label AND rw.w_far > 0 '
    '      ORDER BY h.hub DESC, h.item_id LIMIT $5) AS h '
    '    UNION ALL '
    '    SELECT rw.row_index, f.item_id, 0::float8, 0::float8 FROM rw CROSS JOIN ( '
    '      SELECT e.item_id FROM %6$s AS e ORDER BY e.item_id LIMIT $5) AS f) AS u '
    '  GROUP BY u.row_index, u.item_id), '
    'sc AS ( '
    '  SELECT c.row_index, c.item_id, '
    '         CASE WHEN rw.w_far > 0 THEN c.base + rw.w_far * c.hub ELSE c.base END AS score '
    '  FROM cand AS c JOIN rw ON rw.row_index = c.row_index), '
    'r AS ( '
    '  SELECT sc.row_index, sc.item_id, sc.score, '
    '         row_number() OVER (PARTITION BY sc.row_index ORDER BY sc.score DESC, sc.item_id) AS rank '
    '  FROM sc) '
    'SELECT r.row_index::integer, r.rank::integer, r.item_id, i.external_id, i.label, r.score '
    'FROM r JOIN pm_vector.items AS i ON i.id = r.item_id '
    'WHERE r.rank <= $5 ORDER BY 1, 2',
    prior, d2, pm_vector.pm_run_table(run_id, 'neighbors'), n_components, pm_vector.pm_run_table(run_id, 'hubs'),
    pm_vector.pm_run_table(run_id, 'items'), quote_literal(mw::text));
END $$;
