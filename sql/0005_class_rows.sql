-- pm_vector: class-rows requests (format "pm_vector.class-rows/1"), installed by migration 0005;
-- see sql/README.md.
--
-- The function you call:
--
--   pm_vector.pm_shortlist(collection text, rows float8[], sigmas float8[], k_prime integer,
--                          max_prior integer DEFAULT NULL)
--     -> TABLE(row_index integer, rank integer, item_id bigint, external_id text, label bigint,
--              score double precision)
--   (and the same with rows vector[]; pm_vector.pm_shortlist_explain(...) -> SETOF text)
--
-- rows: the request's C x d matrix (a 2-d array, row i = class frame i of the active run, in the
-- run's class order, d = the run's n_components); sigmas: the C noise standard deviations;
-- k_prime: candidates per row (1..1000); max_prior: prior items weighted one by one per row
-- (NULL: the run's stored max_prior, 1024 by default). All rows are answered by ONE statement.
--
-- The score (pm_vector.shortlist.PosteriorShortlist.scores, reproduced exactly): for row c with
-- released z and sigma, the prior is the run's items of class c with p_j their clipped frame-c
-- coordinates; the max_prior prior items nearest to z are retained; w_j = exp(-(d2_j - d2_min) /
-- (2 sigma^2)); w_far = the weight of the farthest retained item if the class has more than
-- max_prior items, else 0; score(i) = sum over retained j with i in N(j) of (w_j - w_far)
-- + w_far * hub_c(i). N(j): the graph_degree nearest other items of j by raw features (any
-- class); hub_c(i) = number of items j of class c with i in N(j). The shortlist is the top
-- k_prime by score desc, ties by item id (the run's item order).
--
-- Per run (created by the embedding job, dropped with the run):
--   run_<id>_prior(item_id, label, coords vector(d), coords8 float8[])  LIST-partitioned by label,
--       one partition per class (run_<id>_prior_<k>, k = class position), an HNSW index on coords
--       in every partition (one partitioned index), primary key (label, item_id). coords8 holds
--       the float64 coordinates: distances are computed from them (exactly as in memory); the
--       float32 coords only serve the index.
--   run_<id>_neighbors(item_id, neighbor_id)  primary key (item_id, neighbor_id)
--   run_<id>_hubs(label, item_id, hub)        primary key (label, item_id), index (label, hub DESC, item_id)
--   run_<id>_codes(item_id, code halfvec(m))  primary key (item_id): every item's published compact
--       code (pm_vector.manifold.codes.PublicProjection fit on the public anchor set, m <= 64
--       components; the projection document is embedding_runs.public_projection). Returned with
--       every candidate of every row when a client asks for codes (collections that do not hand
--       out raw features).
--
-- New error codes: PM006 the active run has no class rows (run a new embedding job).

-- ------------------------------------------------------------------------------------ helpers

-- Qualified name of a run's table: kind 'items', 'anchors', 'prior', 'neighbors', 'hubs' or 'codes'.
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

-- Drops all tables of a run (never those of an active run). Returns whether tables existed.
CREATE OR REPLACE FUNCTION pm_vector.pm_drop_run_tables(p_run_id bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
  existed boolean := to_regclass(pm_vector.pm_run_table(p_run_id, 'items')) IS NOT NULL
                  OR to_regclass(pm_vector.pm_run_table(p_run_id, 'anchors')) IS NOT NULL
                  OR to_regclass(pm_vector.pm_run_table(p_run_id, 'prior')) IS NOT NULL;
BEGIN
  IF EXISTS (SELECT 1 FROM pm_vector.collections c WHERE c.active_run_id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('run %s is the active run of its collection; its tables are not dropped', p_run_id);
  END IF;
  EXECUTE format('DROP TABLE IF EXISTS %s, %s, %s, %s, %s, %s',
                 pm_vector.pm_run_table(p_run_id, 'items'), pm_vector.pm_run_table(p_run_id, 'anchors'),
                 pm_vector.pm_run_table(p_run_id, 'prior'), pm_vector.pm_run_table(p_run_id, 'neighbors'),
                 pm_vector.pm_run_table(p_run_id, 'hubs'), pm_vector.pm_run_table(p_run_id, 'codes'));
  RETURN existed;
END $$;

-- ------------------------------------------------------------------ run tables (used by jobs)

-- Creates a run's class-rows tables: the prior (one partition per class of classes, in that
-- order), the raw-feature neighbour graph and the per-class hub counts. No index yet.
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
                 'coords8 float8[] NOT NULL, PRIMARY KEY (label, item_id)) PARTITION BY LIST (label)',
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

-- Creates a run's codes table (every item's published compact code, halfvec(m)). No index yet.
CREATE OR REPLACE FUNCTION pm_vector.pm_create_codes_table(p_run_id bigint, m integer)
RETURNS void
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs r WHERE r.id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  IF m IS NULL OR m < 1 OR m > 4000 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('the code dimension must be in 1..4000, got %s', m);
  END IF;
  EXECUTE format('CREATE TABLE %s (item_id bigint NOT NULL, code halfvec(%s) NOT NULL)',
                 pm_vector.pm_run_table(p_run_id, 'codes'), m);
END $$;

-- Indexes of a run's class-rows tables, then ANALYZE: HNSW (l2) on the prior's coords (a
-- partitioned index: one HNSW graph per class), primary keys of the graph and the hub counts,
-- (label, hub DESC, item_id) for the top hubs of a class, and the codes' primary key.
CREATE OR REPLACE FUNCTION pm_vector.pm_build_class_rows_indexes(p_run_id bigint, m integer DEFAULT 16,
                                                                 ef_construction integer DEFAULT 64)
RETURNS void
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
BEGIN
  EXECUTE format('CREATE INDEX %I ON %s USING hnsw (coords vector_l2_ops) WITH (m = %s, ef_construction = %s)',
                 'run_' || p_run_id || '_prior_hnsw', pm_vector.pm_run_table(p_run_id, 'prior'), m, ef_construction);
  EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (item_id, neighbor_id)',
                 pm_vector.pm_run_table(p_run_id, 'neighbors'), 'run_' || p_run_id || '_neighbors_pkey');
  EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (label, item_id)',
                 pm_vector.pm_run_table(p_run_id, 'hubs'), 'run_' || p_run_id || '_hubs_pkey');
  EXECUTE format('CREATE INDEX %I ON %s (label, hub DESC, item_id)',
                 'run_' || p_run_id || '_hubs_top', pm_vector.pm_run_table(p_run_id, 'hubs'));
  EXECUTE format('ANALYZE %s', pm_vector.pm_run_table(p_run_id, 'prior'));
  EXECUTE format('ANALYZE %s', pm_vector.pm_run_table(p_run_id, 'neighbors'));
  EXECUTE format('ANALYZE %s', pm_vector.pm_run_table(p_run_id, 'hubs'));
  IF to_regclass(pm_vector.pm_run_table(p_run_id, 'codes')) IS NOT NULL THEN
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (item_id)',
                   pm_vector.pm_run_table(p_run_id, 'codes'), 'run_' || p_run_id || '_codes_pkey');
    EXECUTE format('ANALYZE %s', pm_vector.pm_run_table(p_run_id, 'codes'));
  END IF;
END $$;

-- ------------------------------------------------------------------------- the active run

-- The active run of a collection and its class-rows metadata (embedding_runs.class_rows):
-- classes (row order), class_sizes, n_components, max_prior. PM001 / PM002 / PM006.
CREATE OR REPLACE FUNCTION pm_vector.pm_class_rows_run(collection text,
    OUT run_id bigint, OUT classes bigint[], OUT class_sizes bigint[], OUT n_components integer,
    OUT max_prior integer, OUT frames_digest text)
LANGUAGE plpgsql STABLE
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  a record;
  doc jsonb;
BEGIN
  SELECT * INTO a FROM pm_vector.pm_active_run(pm_class_rows_run.collection);
  SELECT r.class_rows INTO doc FROM pm_vector.embedding_runs r WHERE r.id = a.run_id;
  IF doc IS NULL OR doc ->> 'status' IS DISTINCT FROM 'ready' THEN
    RAISE EXCEPTION USING ERRCODE = 'PM006',
      MESSAGE = format('the active run %s of collection %L has no class rows (%s)', a.run_id,
                       pm_class_rows_run.collection,
                       coalesce(doc ->> 'error', 'it was built before class rows existed')),
      HINT = 'Run a new embedding job for the collection (it builds the class frames, prior, graph and hubs).';
  END IF;
  run_id := a.run_id;
  classes := ARRAY(SELECT jsonb_array_elements_text(doc -> 'classes')::bigint);
  class_sizes := ARRAY(SELECT jsonb_array_elements_text(doc -> 'class_sizes')::bigint);
  n_components := (doc ->> 'n_components')::integer;
  max_prior := (doc ->> 'max_prior')::integer;
  frames_digest := doc ->> 'frames_digest';
END $$;

-- Checks the arguments of pm_shortlist against the run (PM003 shape, PM004 values).
CREATE OR REPLACE FUNCTION pm_vector.pm_check_class_rows(n_classes integer, n_components integer, rows float8[],
                                                         sigmas float8[], k_prime integer, max_prior integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  IF rows IS NULL OR array_ndims(rows) IS DISTINCT FROM 2 OR array_lower(rows, 1) <> 1 OR array_lower(rows, 2) <> 1
     OR array_length(rows, 1) <> n_classes OR array_length(rows, 2) <> n_components THEN
    RAISE EXCEPTION USING ERRCODE = 'PM003',
      MESSAGE = format('rows must be a %s x %s array (one row per class of the active run, in its class order), '
                       'got %s', n_classes, n_components, coalesce(array_dims(rows), 'NULL')),
      HINT = 'pm_vector.pm_class_rows_run(collection) gives the classes and n_components.';
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(rows) x WHERE x IS NULL OR x = 'NaN'::float8 OR x IN ('Infinity', '-Infinity')) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = 'rows contain NULL, NaN or infinite values';
  END IF;
  IF sigmas IS NULL OR array_ndims(sigmas) IS DISTINCT FROM 1 OR array_lower(sigmas, 1) <> 1
     OR array_length(sigmas, 1) <> n_classes THEN
    RAISE EXCEPTION USING ERRCODE = 'PM003',
      MESSAGE = format('sigmas must hold %s numbers (one per row), got %s', n_classes,
                       coalesce(array_dims(sigmas), 'NULL'));
  END IF;
  IF EXISTS (SELECT 1 FROM unnest(sigmas) s WHERE s IS NULL OR NOT (s > 0) OR s = 'NaN'::float8 OR s = 'Infinity') THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = 'sigmas must be finite numbers > 0';
  END IF;
  IF k_prime IS NULL OR k_prime < 1 OR k_prime > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('k_prime must be between 1 and 1000, got %s', k_prime);
  END IF;
  IF max_prior IS NULL OR max_prior < 1 OR max_prior > 100000 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('max_prior must be between 1 and 100000, got %s', max_prior);
  END IF;
END $$;

-- The one statement answering all rows. Parameters: $1 rows float8[] (C x d), $2 sigmas
-- float8[], $3 classes bigint[], $4 class sizes bigint[], $5 k_prime, $6 max_prior.
-- Per row: the prior of its class read through the class's partition -- all of it when the
-- class has at most max_prior items (exact), else the max_prior nearest by the partition's HNSW
-- index (approximate, iterative scan); weights; neighbour lists by primary key; hub counts.
-- Candidates: items touched by a retained prior item, the k' top hubs of the class (when
-- w_far > 0) and the k' first items by id (the zero-score fill): every item outside them is
-- provably below the k'-th (see sql/README.md).
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist_sql(run_id bigint, n_components integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
  prior text := pm_vector.pm_run_table(run_id, 'prior');
  d2 text;
BEGIN
  -- squared distance in float64, summed left to right as numpy does for a short row
  SELECT string_agg(format('(a.coords8[%1$s] - q.z8[%1$s]) * (a.coords8[%1$s] - q.z8[%1$s])', i), ' + ' ORDER BY i)
    INTO d2 FROM generate_series(1, n_components) AS i;
  RETURN format(
    'WITH q AS MATERIALIZED ( '
    '  SELECT g.i AS row_index, ($3::bigint[])[g.i] AS label, ($4::bigint[])[g.i] AS n_class, '
    '         ($2::float8[])[g.i] AS sigma, z.z8, z.z8::vector AS zv '
    '  FROM generate_series(1, cardinality($3::bigint[])) AS g(i) '
    '  CROSS JOIN LATERAL (SELECT ARRAY(SELECT x FROM unnest(($1::float8[])[g.i:g.i][1:%4$s]) AS x) AS z8) AS z), '
    'p AS MATERIALIZED ( '
    '  SELECT q.row_index, s.item_id, s.d2 FROM q CROSS JOIN LATERAL ( '
    '    SELECT a.item_id, %2$s AS d2 FROM %1$s AS a WHERE a.label = q.label AND q.n_class <= $6 '
    '    UNION ALL '
    '    SELECT a.item_id, %2$s AS d2 FROM ( '
    '      SELECT c.item_id, c.coords8 FROM %1$s AS c WHERE c.label = q.label AND q.n_class > $6 '
    '      ORDER BY c.coords <-> q.zv LIMIT $6) AS a) AS s), '
    'rw AS MATERIALIZED ( '
    '  SELECT q.row_index, q.label, q.sigma, m.dmin, '
    '         CASE WHEN q.n_class > $6 AND m.dmax IS NOT NULL '
    '              THEN pm_vector.pm_prior_weight(m.dmax - m.dmin, q.sigma) ELSE 0::float8 END AS w_far '
    '  FROM q LEFT JOIN (SELECT p.row_index, min(p.d2) AS dmin, max(p.d2) AS dmax FROM p GROUP BY p.row_index) AS m '
    '    ON m.row_index = q.row_index), '
    'w AS MATERIALIZED ( '
    '  SELECT p.row_index, p.item_id, pm_vector.pm_prior_weight(p.d2 - rw.dmin, rw.sigma) - rw.w_far AS dw '
    '  FROM p JOIN rw ON rw.row_index = p.row_index), '
    't AS ( '
    '  SELECT w.row_index, n.neighbor_id AS item_id, sum(w.dw) AS base '
    '  FROM w JOIN %3$s AS n ON n.item_id = w.item_id '
    '  GROUP BY w.row_index, n.neighbor_id), '
    'cand AS ( '
    '  SELECT u.row_index, u.item_id, max(u.base) AS base FROM ( '
    '    SELECT t.row_index, t.item_id, t.base FROM t '
    '    UNION ALL '
    '    SELECT rw.row_index, h.item_id, 0::float8 FROM rw CROSS JOIN LATERAL ( '
    '      SELECT h.item_id FROM %5$s AS h WHERE h.label = rw.label AND rw.w_far > 0 '
    '      ORDER BY h.hub DESC, h.item_id LIMIT $5) AS h '
    '    UNION ALL '
    '    SELECT rw.row_index, f.item_id, 0::float8 FROM rw CROSS JOIN ( '
    '      SELECT e.item_id FROM %6$s AS e ORDER BY e.item_id LIMIT $5) AS f) AS u '
    '  GROUP BY u.row_index, u.item_id), '
    'sc AS ( '
    '  SELECT c.row_index, c.item_id, '
    '         CASE WHEN rw.w_far > 0 THEN c.base + rw.w_far * coalesce(h.hub, 0) ELSE c.base END AS score '
    '  FROM cand AS c JOIN rw ON rw.row_index = c.row_index '
    '  LEFT JOIN %5$s AS h ON rw.w_far > 0 AND h.label = rw.label AND h.item_id = c.item_id), '
    'r AS ( '
    '  SELECT sc.row_index, sc.item_id, sc.score, '
    '         row_number() OVER (PARTITION BY sc.row_index ORDER BY sc.score DESC, sc.item_id) AS rank '
    '  FROM sc) '
    'SELECT r.row_index::integer, r.rank::integer, r.item_id, i.external_id, i.label, r.score '
    'FROM r JOIN pm_vector.items AS i ON i.id = r.item_id '
    'WHERE r.rank <= $5 ORDER BY 1, 2',
    prior, d2, pm_vector.pm_run_table(run_id, 'neighbors'), n_components, pm_vector.pm_run_table(run_id, 'hubs'),
    pm_vector.pm_run_table(run_id, 'items'));
END $$;

-- exp(-delta / (2 sigma^2)) in float64 as numpy computes it; 0 where exp underflows (numpy's
-- result there is 0 or a subnormal; PostgreSQL's exp would raise an underflow error).
-- (A single expression, so that the planner inlines it.)
CREATE OR REPLACE FUNCTION pm_vector.pm_prior_weight(delta float8, sigma float8) RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
  SELECT CASE WHEN (-delta) / (2::float8 * (sigma * sigma)) < -745.0 THEN 0::float8
              ELSE exp((-delta) / (2::float8 * (sigma * sigma))) END
$$;

-- Sets hnsw.ef_search (to min(1000, max(max_prior, current))) and hnsw.iterative_scan
-- (relaxed_order, so that a class's HNSW scan can return more than ef_search rows),
-- transaction-local. Returns the previous values, for the caller to restore.
CREATE OR REPLACE FUNCTION pm_vector.pm_prepare_prior_search(max_prior integer) RETURNS text[]
LANGUAGE plpgsql
AS $$
DECLARE
  old text[] := ARRAY[current_setting('hnsw.ef_search', true), current_setting('hnsw.iterative_scan', true)];
BEGIN
  PERFORM set_config('hnsw.ef_search',
                     least(1000, greatest(max_prior, coalesce(old[1], '40')::integer))::text, true);
  BEGIN  -- pgvector >= 0.8; before, an HNSW scan returns at most ef_search (<= 1000) rows
    PERFORM set_config('hnsw.iterative_scan', 'relaxed_order', true);
  EXCEPTION WHEN OTHERS THEN
    NULL;
  END;
  RETURN old;
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_restore_prior_search(old text[]) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  PERFORM set_config('hnsw.ef_search', coalesce(old[1], '40'), true);
  IF old[2] IS NOT NULL OR current_setting('hnsw.iterative_scan', true) IS NOT NULL THEN
    PERFORM set_config('hnsw.iterative_scan', coalesce(old[2], 'off'), true);
  END IF;
END $$;

-- --------------------------------------------------------------------------- the shortlist

-- The k_prime candidates of every row of a class-rows request, in one statement.
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist(collection text, rows float8[], sigmas float8[], k_prime integer,
                                                  max_prior integer DEFAULT NULL)
RETURNS TABLE (row_index integer, rank integer, item_id bigint, external_id text, label bigint,
               score double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  r record;
  mp integer;
  old text[];
BEGIN
  SELECT * INTO r FROM pm_vector.pm_class_rows_run(pm_shortlist.collection);
  mp := coalesce(pm_shortlist.max_prior, r.max_prior, 1024);
  PERFORM pm_vector.pm_check_class_rows(cardinality(r.classes), r.n_components, pm_shortlist.rows,
                                        pm_shortlist.sigmas, pm_shortlist.k_prime, mp);
  old := pm_vector.pm_prepare_prior_search(mp);
  RETURN QUERY EXECUTE pm_vector.pm_shortlist_sql(r.run_id, r.n_components)
    USING pm_shortlist.rows, pm_shortlist.sigmas, r.classes, r.class_sizes, pm_shortlist.k_prime, mp;
  PERFORM pm_vector.pm_restore_prior_search(old);
END $$;

-- The same with the rows given as vectors (float32: the scores then differ from the client's
-- float64 rows in the last digits).
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist(collection text, rows vector[], sigmas float8[], k_prime integer,
                                                  max_prior integer DEFAULT NULL)
RETURNS TABLE (row_index integer, rank integer, item_id bigint, external_id text, label bigint,
               score double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  m float8[];
BEGIN
  IF rows IS NULL OR cardinality(rows) = 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM003', MESSAGE = 'rows must hold one vector per class';
  END IF;
  SELECT array_agg(x ORDER BY u.ord, e.k) INTO m
    FROM unnest(pm_shortlist.rows) WITH ORDINALITY AS u(v, ord)
    CROSS JOIN LATERAL unnest(u.v::real[]) WITH ORDINALITY AS e(x, k);
  IF array_length(m, 1) % cardinality(pm_shortlist.rows) <> 0 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM003', MESSAGE = 'the vectors of rows have different dimensions';
  END IF;
  -- 1-d -> (C x d)
  m := ARRAY(SELECT ARRAY(SELECT m[(i - 1) * (array_length(m, 1) / cardinality(pm_shortlist.rows)) + j]
                            FROM generate_series(1, array_length(m, 1) / cardinality(pm_shortlist.rows)) AS j)
               FROM generate_series(1, cardinality(pm_shortlist.rows)) AS i);
  RETURN QUERY SELECT * FROM pm_vector.pm_shortlist(pm_shortlist.collection, m, pm_shortlist.sigmas,
                                                    pm_shortlist.k_prime, pm_shortlist.max_prior);
END $$;

-- The plan of the statement pm_shortlist runs for these arguments (EXPLAIN, not executed).
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist_explain(collection text, rows float8[], sigmas float8[],
                                                          k_prime integer, max_prior integer DEFAULT NULL)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  r record;
  mp integer;
  line text;
BEGIN
  SELECT * INTO r FROM pm_vector.pm_class_rows_run(pm_shortlist_explain.collection);
  mp := coalesce(pm_shortlist_explain.max_prior, r.max_prior, 1024);
  PERFORM pm_vector.pm_check_class_rows(cardinality(r.classes), r.n_components, pm_shortlist_explain.rows,
                                        pm_shortlist_explain.sigmas, pm_shortlist_explain.k_prime, mp);
  PERFORM pm_vector.pm_prepare_prior_search(mp);
  FOR line IN EXECUTE 'EXPLAIN ' || pm_vector.pm_shortlist_sql(r.run_id, r.n_components)
      USING pm_shortlist_explain.rows, pm_shortlist_explain.sigmas, r.classes, r.class_sizes,
            pm_shortlist_explain.k_prime, mp LOOP
    RETURN NEXT line;
  END LOOP;
END $$;
