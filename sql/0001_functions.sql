-- pm_vector: SQL functions and triggers (installed by migration 0001; see sql/README.md).
--
-- Everything lives in schema pm_vector. The functions you call:
--
--   pm_vector.pm_knn(collection text, query vector, k integer, ef_search integer DEFAULT NULL)
--     -> TABLE(rank integer, item_id bigint, external_id text, label bigint, distance double precision)
--   pm_vector.pm_knn_batch(collection text, queries vector[], k integer, ef_search integer DEFAULT NULL)
--     -> TABLE(query_index integer, rank integer, item_id bigint, external_id text, label bigint,
--              distance double precision)
--   pm_vector.pm_knn_batch_explain(collection text, queries vector[], k integer) -> SETOF text
--   pm_vector.pm_active_run(collection text)
--     -> (collection_id bigint, run_id bigint, embedding_dim integer, vtype text, metric text)
--
-- Queries are points of the collection's *embedding* space (the active run's dimension), not
-- raw features. "distance" is the collection's metric: l2 (<->), cosine (<=>), or ip (<#>,
-- the negative inner product, so smaller is closer in every case).
--
-- Errors carry SQLSTATEs of class PM: PM001 unknown collection, PM002 no active run,
-- PM003 dimension mismatch, PM004 bad argument, PM005 unknown run, PM010 wrong feature
-- dimension, PM011 label not in the collection's label set, PM012 wrong feature column.
--
-- "@vector_schema@" is replaced at install time by the schema of the pgvector extension.

-- ------------------------------------------------------------------------------------ helpers

-- Storage type of a vector of dim dimensions: vector up to 2,000 (HNSW's limit for vector),
-- halfvec above (HNSW supports halfvec up to 4,000 dimensions).
CREATE OR REPLACE FUNCTION pm_vector.pm_vector_type(dim integer) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN dim <= 2000 THEN 'vector' ELSE 'halfvec' END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_distance_operator(metric text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE metric WHEN 'l2' THEN '<->' WHEN 'cosine' THEN '<=>' WHEN 'ip' THEN '<#>' END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_opclass(vtype text, metric text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT vtype || CASE metric WHEN 'l2' THEN '_l2_ops' WHEN 'cosine' THEN '_cosine_ops'
                                  WHEN 'ip' THEN '_ip_ops' END $$;

-- Qualified name of a run's embedding table: kind 'items' or 'anchors'.
CREATE OR REPLACE FUNCTION pm_vector.pm_run_table(run_id bigint, kind text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  IF kind NOT IN ('items', 'anchors') THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('kind must be items or anchors, not %L', kind);
  END IF;
  RETURN 'pm_vector.' || quote_ident('run_' || run_id || '_' || kind);
END $$;

-- Advisory-lock key of a worker: kind 1 = embedding run, 2 = ingest. "PM" in the top 16 bits.
CREATE OR REPLACE FUNCTION pm_vector.pm_lock_key(kind integer, id bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (20557::bigint << 48) | ((kind::bigint & 255) << 40) | (id & 1099511627775) $$;

-- Is the advisory lock with this key held by some session of this database? A job holds its
-- run's lock on its own connection for its whole life; when the process dies, PostgreSQL ends
-- that session and the lock goes with it. No side effect (reads pg_locks).
CREATE OR REPLACE FUNCTION pm_vector.pm_lock_held(key bigint) RETURNS boolean
LANGUAGE sql STABLE
AS $$
  SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
      AND l.classid::text::bigint = (key >> 32)
      AND l.objid::text::bigint = (key & 4294967295))
$$;

-- ------------------------------------------------------------------------------ active run

CREATE OR REPLACE FUNCTION pm_vector.pm_active_run(collection text,
    OUT collection_id bigint, OUT run_id bigint, OUT embedding_dim integer, OUT vtype text, OUT metric text)
LANGUAGE plpgsql STABLE
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  c record;
BEGIN
  SELECT co.id, co.active_run_id, co.metric AS m INTO c
    FROM pm_vector.collections co WHERE co.name = pm_active_run.collection;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM001',
      MESSAGE = format('unknown collection %L', pm_active_run.collection),
      HINT = 'SELECT name FROM pm_vector.pm_collections lists the collections.';
  END IF;
  IF c.active_run_id IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM002',
      MESSAGE = format('collection %L has no active embedding run yet, so there is nothing to search',
                       pm_active_run.collection),
      HINT = 'Run an embedding job (pm_vector.db.run_embedding_job) for it first.';
  END IF;
  SELECT r.embedding_dim INTO embedding_dim FROM pm_vector.embedding_runs r WHERE r.id = c.active_run_id;
  collection_id := c.id;
  run_id := c.active_run_id;
  metric := c.m;
  vtype := pm_vector.pm_vector_type(embedding_dim);
END $$;

-- Sets hnsw.ef_search (transaction-local) to at least k, so that the index returns k rows.
-- Returns the previous value, for the caller to restore.
CREATE OR REPLACE FUNCTION pm_vector.pm_prepare_search(k integer, ef_search integer) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
  old text := current_setting('hnsw.ef_search', true);
  want integer;
BEGIN
  IF k IS NULL OR k < 1 OR k > 1000 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('k must be between 1 and 1000, got %s', k);
  END IF;
  IF ef_search IS NOT NULL AND (ef_search < 1 OR ef_search > 1000) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('ef_search must be between 1 and 1000, got %s', ef_search);
  END IF;
  want := least(1000, greatest(k, coalesce(ef_search, 0), coalesce(old, '40')::integer));
  PERFORM set_config('hnsw.ef_search', want::text, true);
  RETURN old;
END $$;

-- The k-NN statement over a run's item table. batch = false: parameters ($1 vector, $2 k);
-- batch = true: ($1 vector[], $2 k), one LATERAL index scan per query vector.
CREATE OR REPLACE FUNCTION pm_vector.pm_knn_sql(run_id bigint, vtype text, metric text, batch boolean)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
  tbl text := pm_vector.pm_run_table(run_id, 'items');
  op text := pm_vector.pm_distance_operator(metric);
BEGIN
  IF NOT batch THEN
    RETURN format(
      'SELECT (row_number() OVER (ORDER BY n.distance, n.item_id))::integer AS rank, '
      '       n.item_id, i.external_id, i.label, n.distance '
      'FROM (SELECT e.item_id, (e.embedding %2$s $1::%3$s) AS distance '
      '      FROM %1$s AS e ORDER BY e.embedding %2$s $1::%3$s LIMIT $2) AS n '
      'JOIN pm_vector.items AS i ON i.id = n.item_id '
      'ORDER BY 1', tbl, op, vtype);
  END IF;
  RETURN format(
    'SELECT q.ord::integer AS query_index, '
    '       (row_number() OVER (PARTITION BY q.ord ORDER BY n.distance, n.item_id))::integer AS rank, '
    '       n.item_id, i.external_id, i.label, n.distance '
    'FROM unnest($1) WITH ORDINALITY AS q(vec, ord) '
    'CROSS JOIN LATERAL ( '
    '  SELECT e.item_id, (e.embedding %2$s q.vec::%3$s) AS distance '
    '  FROM %1$s AS e ORDER BY e.embedding %2$s q.vec::%3$s LIMIT $2) AS n '
    'JOIN pm_vector.items AS i ON i.id = n.item_id '
    'ORDER BY 1, 2', tbl, op, vtype);
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_check_queries(run_id bigint, embedding_dim integer, queries vector[])
RETURNS void
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  bad record;
BEGIN
  SELECT u.ord, u.v IS NULL AS isnull, CASE WHEN u.v IS NULL THEN NULL ELSE vector_dims(u.v) END AS dims
    INTO bad
    FROM unnest(queries) WITH ORDINALITY AS u(v, ord)
   WHERE u.v IS NULL OR vector_dims(u.v) <> pm_check_queries.embedding_dim
   ORDER BY u.ord LIMIT 1;
  IF FOUND THEN
    IF bad.isnull THEN
      RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('query %s is NULL', bad.ord);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'PM003',
      MESSAGE = format('query %s has %s dimensions, but the active run %s of this collection embeds in %s '
                       'dimensions', bad.ord, bad.dims, pm_check_queries.run_id, pm_check_queries.embedding_dim),
      HINT = 'Queries are points of the embedding space of the active run (see pm_vector.pm_collections).';
  END IF;
END $$;

-- ------------------------------------------------------------------------------ k-NN search

-- The k items of the collection's active run nearest to query (HNSW index scan).
CREATE OR REPLACE FUNCTION pm_vector.pm_knn(collection text, query vector, k integer,
                                            ef_search integer DEFAULT NULL)
RETURNS TABLE (rank integer, item_id bigint, external_id text, label bigint, distance double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  r record;
  old text;
BEGIN
  SELECT * INTO r FROM pm_vector.pm_active_run(pm_knn.collection);
  PERFORM pm_vector.pm_check_queries(r.run_id, r.embedding_dim, ARRAY[pm_knn.query]);
  old := pm_vector.pm_prepare_search(pm_knn.k, pm_knn.ef_search);
  RETURN QUERY EXECUTE pm_vector.pm_knn_sql(r.run_id, r.vtype, r.metric, false) USING pm_knn.query, pm_knn.k;
  PERFORM set_config('hnsw.ef_search', coalesce(old, '40'), true);
END $$;

-- Many queries in one statement: for each element of queries (query_index = its 1-based
-- subscript) the k nearest items, each query answered by its own HNSW index scan (LATERAL).
CREATE OR REPLACE FUNCTION pm_vector.pm_knn_batch(collection text, queries vector[], k integer,
                                                  ef_search integer DEFAULT NULL)
RETURNS TABLE (query_index integer, rank integer, item_id bigint, external_id text, label bigint,
               distance double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  r record;
  old text;
BEGIN
  SELECT * INTO r FROM pm_vector.pm_active_run(pm_knn_batch.collection);
  IF pm_knn_batch.queries IS NULL OR cardinality(pm_knn_batch.queries) = 0 THEN
    RETURN;
  END IF;
  PERFORM pm_vector.pm_check_queries(r.run_id, r.embedding_dim, pm_knn_batch.queries);
  old := pm_vector.pm_prepare_search(pm_knn_batch.k, pm_knn_batch.ef_search);
  RETURN QUERY EXECUTE pm_vector.pm_knn_sql(r.run_id, r.vtype, r.metric, true)
    USING pm_knn_batch.queries, pm_knn_batch.k;
  PERFORM set_config('hnsw.ef_search', coalesce(old, '40'), true);
END $$;

-- The plan of the statement pm_knn_batch runs for these arguments (EXPLAIN, not executed).
CREATE OR REPLACE FUNCTION pm_vector.pm_knn_batch_explain(collection text, queries vector[], k integer)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  r record;
  line text;
BEGIN
  SELECT * INTO r FROM pm_vector.pm_active_run(pm_knn_batch_explain.collection);
  PERFORM pm_vector.pm_check_queries(r.run_id, r.embedding_dim, pm_knn_batch_explain.queries);
  PERFORM pm_vector.pm_prepare_search(pm_knn_batch_explain.k, NULL);
  FOR line IN EXECUTE 'EXPLAIN ' || pm_vector.pm_knn_sql(r.run_id, r.vtype, r.metric, true)
      USING pm_knn_batch_explain.queries, pm_knn_batch_explain.k LOOP
    RETURN NEXT line;
  END LOOP;
END $$;

-- ------------------------------------------------------------------ run tables (used by jobs)

-- Creates the run's embedding tables, typed vector(k) (halfvec(k) above 2,000 dimensions).
CREATE OR REPLACE FUNCTION pm_vector.pm_create_run_tables(p_run_id bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  d integer;
  t text;
BEGIN
  SELECT r.embedding_dim INTO d FROM pm_vector.embedding_runs r WHERE r.id = p_run_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  IF d IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('embedding_dim of run %s is not set', p_run_id);
  END IF;
  t := pm_vector.pm_vector_type(d);
  EXECUTE format('CREATE TABLE %s (item_id bigint PRIMARY KEY, embedding %s(%s) NOT NULL)',
                 pm_vector.pm_run_table(p_run_id, 'items'), t, d);
  EXECUTE format('CREATE TABLE %s (position integer PRIMARY KEY, embedding %s(%s) NOT NULL)',
                 pm_vector.pm_run_table(p_run_id, 'anchors'), t, d);
END $$;

-- HNSW indexes on both tables of a run (operator class from the collection's metric), then ANALYZE.
CREATE OR REPLACE FUNCTION pm_vector.pm_build_run_indexes(p_run_id bigint, m integer DEFAULT 16,
                                                          ef_construction integer DEFAULT 64)
RETURNS void
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  d integer;
  met text;
  kind text;
BEGIN
  SELECT r.embedding_dim, c.metric INTO d, met
    FROM pm_vector.embedding_runs r JOIN pm_vector.collections c ON c.id = r.collection_id
   WHERE r.id = p_run_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  FOREACH kind IN ARRAY ARRAY['items', 'anchors'] LOOP
    EXECUTE format('CREATE INDEX %I ON %s USING hnsw (embedding %s) WITH (m = %s, ef_construction = %s)',
                   'run_' || p_run_id || '_' || kind || '_hnsw', pm_vector.pm_run_table(p_run_id, kind),
                   pm_vector.pm_opclass(pm_vector.pm_vector_type(d), met), m, ef_construction);
    EXECUTE format('ANALYZE %s', pm_vector.pm_run_table(p_run_id, kind));
  END LOOP;
END $$;

-- Drops a run's tables (never those of an active run). Returns whether tables existed.
CREATE OR REPLACE FUNCTION pm_vector.pm_drop_run_tables(p_run_id bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
  existed boolean := to_regclass(pm_vector.pm_run_table(p_run_id, 'items')) IS NOT NULL
                  OR to_regclass(pm_vector.pm_run_table(p_run_id, 'anchors')) IS NOT NULL;
BEGIN
  IF EXISTS (SELECT 1 FROM pm_vector.collections c WHERE c.active_run_id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('run %s is the active run of its collection; its tables are not dropped', p_run_id);
  END IF;
  EXECUTE format('DROP TABLE IF EXISTS %s, %s',
                 pm_vector.pm_run_table(p_run_id, 'items'), pm_vector.pm_run_table(p_run_id, 'anchors'));
  RETURN existed;
END $$;

-- -------------------------------------------------------------------------------- triggers

-- Rows written into items (INSERT, COPY, UPDATE) must match their collection: dimension,
-- storage column (vector up to 2,000 dims, halfvec above) and label set. One set-based check
-- per statement (transition table), so bulk COPY stays fast.
CREATE OR REPLACE FUNCTION pm_vector.pm_check_item_rows() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  bad record;
BEGIN
  SELECT n.id, n.label, c.name, c.feature_dim, c.feature_type,
         coalesce(vector_dims(n.features), vector_dims(n.features_half)) AS dims,
         (n.features IS NOT NULL) AS in_vector
    INTO bad
    FROM new_rows n JOIN pm_vector.collections c ON c.id = n.collection_id
   WHERE coalesce(vector_dims(n.features), vector_dims(n.features_half)) <> c.feature_dim
      OR (n.features IS NOT NULL) <> (c.feature_type = 'vector')
      OR NOT (n.label = ANY (c.labels))
   LIMIT 1;
  IF FOUND THEN
    IF bad.dims <> bad.feature_dim THEN
      RAISE EXCEPTION USING ERRCODE = 'PM010',
        MESSAGE = format('an item of collection %L has %s features, but the collection has %s',
                         bad.name, bad.dims, bad.feature_dim);
    ELSIF bad.in_vector <> (bad.feature_type = 'vector') THEN
      RAISE EXCEPTION USING ERRCODE = 'PM012',
        MESSAGE = format('collection %L stores its features in column %s', bad.name,
                         CASE WHEN bad.feature_type = 'vector' THEN 'features' ELSE 'features_half' END);
    ELSE
      RAISE EXCEPTION USING ERRCODE = 'PM011',
        MESSAGE = format('label %s is not in the label set of collection %L', bad.label, bad.name);
    END IF;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER pm_items_check_insert AFTER INSERT ON pm_vector.items
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_check_item_rows();
CREATE TRIGGER pm_items_check_update AFTER UPDATE ON pm_vector.items
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_check_item_rows();

CREATE OR REPLACE FUNCTION pm_vector.pm_check_anchor_rows() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  bad record;
BEGIN
  SELECT n.position, n.label, c.name, c.feature_dim, c.feature_type,
         coalesce(vector_dims(n.features), vector_dims(n.features_half)) AS dims,
         (n.features IS NOT NULL) AS in_vector
    INTO bad
    FROM new_rows n JOIN pm_vector.anchor_sets s ON s.id = n.anchor_set_id
                    JOIN pm_vector.collections c ON c.id = s.collection_id
   WHERE coalesce(vector_dims(n.features), vector_dims(n.features_half)) <> c.feature_dim
      OR (n.features IS NOT NULL) <> (c.feature_type = 'vector')
      OR NOT (n.label = ANY (c.labels))
   LIMIT 1;
  IF FOUND THEN
    IF bad.dims <> bad.feature_dim THEN
      RAISE EXCEPTION USING ERRCODE = 'PM010',
        MESSAGE = format('an anchor of collection %L has %s features, but the collection has %s',
                         bad.name, bad.dims, bad.feature_dim);
    ELSIF bad.in_vector <> (bad.feature_type = 'vector') THEN
      RAISE EXCEPTION USING ERRCODE = 'PM012',
        MESSAGE = format('collection %L stores its features in column %s', bad.name,
                         CASE WHEN bad.feature_type = 'vector' THEN 'features' ELSE 'features_half' END);
    ELSE
      RAISE EXCEPTION USING ERRCODE = 'PM011',
        MESSAGE = format('anchor label %s is not in the label set of collection %L', bad.label, bad.name);
    END IF;
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER pm_anchors_check_insert AFTER INSERT ON pm_vector.anchors
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_check_anchor_rows();
CREATE TRIGGER pm_anchors_check_update AFTER UPDATE ON pm_vector.anchors
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_check_anchor_rows();

-- Only a succeeded run of the same collection whose tables exist can become the active run.
CREATE OR REPLACE FUNCTION pm_vector.pm_check_active_run() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  IF NEW.active_run_id IS NOT NULL AND NEW.active_run_id IS DISTINCT FROM OLD.active_run_id THEN
    IF NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs r
                    WHERE r.id = NEW.active_run_id AND r.collection_id = NEW.id AND r.status = 'succeeded'
                      AND to_regclass(pm_vector.pm_run_table(r.id, 'items')) IS NOT NULL) THEN
      RAISE EXCEPTION USING ERRCODE = 'PM004',
        MESSAGE = format('run %s cannot become the active run of collection %L: only a succeeded run of that '
                         'collection whose embedding tables exist can', NEW.active_run_id, NEW.name);
    END IF;
  END IF;
  NEW.updated_at := now();
  RETURN NEW;
END $$;

CREATE TRIGGER pm_collections_check_active_run BEFORE UPDATE ON pm_vector.collections
  FOR EACH ROW EXECUTE FUNCTION pm_vector.pm_check_active_run();

-- The active run stays 'succeeded'.
CREATE OR REPLACE FUNCTION pm_vector.pm_check_run_status() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  IF NEW.status IS DISTINCT FROM OLD.status AND NEW.status <> 'succeeded'
     AND EXISTS (SELECT 1 FROM pm_vector.collections c WHERE c.active_run_id = OLD.id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('run %s is the active run of its collection; its status stays succeeded', OLD.id);
  END IF;
  RETURN NEW;
END $$;

CREATE TRIGGER pm_embedding_runs_check_status BEFORE UPDATE OF status ON pm_vector.embedding_runs
  FOR EACH ROW EXECUTE FUNCTION pm_vector.pm_check_run_status();
