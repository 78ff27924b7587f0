-- pm_vector: a run's HNSW index on its items holds the items it was built with; the items placed
-- after it (the delta's new items, a merge's catch-up) are scanned exactly (migration 0029; see
-- sql/README.md and docs/operations.md, "The delta and the merge").
--
--   pm_vector.embedding_runs.index_upto   the largest item id the run's items index holds (the index is
--                                         partial: WHERE item_id <= index_upto); NULL: the index holds
--                                         every row (a run built before this migration)
--   pm_vector.pm_build_run_indexes(run_id, m, ef_construction)   the items index built that way
--   pm_vector.pm_knn_sql(run_id, vtype, metric, batch)            the k nearest of the index's items and
--                                         of the items above it (a range scan of the primary key, each
--                                         distance computed), merged by (distance, item_id)
--
-- Why: an item placed in a run's delta was also inserted into the run's HNSW index, in the sync's
-- transaction: at 100,000 items that insertion was about three quarters of a sync batch's time.
-- Item ids grow with every new item (pm_vector.items' sequence; an update makes a new item), so the
-- items above index_upto are exactly those placed after the build, and the next merge indexes them.

ALTER TABLE pm_vector.embedding_runs ADD COLUMN IF NOT EXISTS index_upto bigint;

-- HNSW indexes on both tables of a run (operator class from the collection's metric), then ANALYZE.
-- The items' index is partial: the rows the table holds now (their largest id is recorded as
-- embedding_runs.index_upto); rows added later are not inserted into it.
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
  upto bigint;
BEGIN
  SELECT r.embedding_dim, c.metric INTO d, met
    FROM pm_vector.embedding_runs r JOIN pm_vector.collections c ON c.id = r.collection_id
   WHERE r.id = p_run_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM005', MESSAGE = format('unknown embedding run %s', p_run_id);
  END IF;
  EXECUTE format('SELECT coalesce(max(item_id), 0) FROM %s', pm_vector.pm_run_table(p_run_id, 'items')) INTO upto;
  EXECUTE format('CREATE INDEX %I ON %s USING hnsw (embedding %s) WITH (m = %s, ef_construction = %s) '
                 'WHERE item_id <= %s',
                 'run_' || p_run_id || '_items_hnsw', pm_vector.pm_run_table(p_run_id, 'items'),
                 pm_vector.pm_opclass(pm_vector.pm_vector_type(d), met), m, ef_construction, upto);
  EXECUTE format('CREATE INDEX %I ON %s USING hnsw (embedding %s) WITH (m = %s, ef_construction = %s)',
                 'run_' || p_run_id || '_anchors_hnsw', pm_vector.pm_run_table(p_run_id, 'anchors'),
                 pm_vector.pm_opclass(pm_vector.pm_vector_type(d), met), m, ef_construction);
  UPDATE pm_vector.embedding_runs SET index_upto = upto WHERE id = p_run_id;
  FOREACH kind IN ARRAY ARRAY['items', 'anchors'] LOOP
    EXECUTE format('ANALYZE %s', pm_vector.pm_run_table(p_run_id, kind));
  END LOOP;
END $$;

-- The k-NN statement over a run's item table. batch = false: parameters ($1 vector, $2 k);
-- batch = true: ($1 vector[], $2 k), one LATERAL search per query vector. A run whose index holds
-- the items up to index_upto: the index's k nearest and the k nearest of the items above it (each
-- distance computed), the k nearest of both by (distance, item_id).
CREATE OR REPLACE FUNCTION pm_vector.pm_knn_sql(run_id bigint, vtype text, metric text, batch boolean)
RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  tbl text := pm_vector.pm_run_table(run_id, 'items');
  op text := pm_vector.pm_distance_operator(metric);
  q text := CASE WHEN batch THEN 'q.vec' ELSE '$1' END;
  upto bigint := (SELECT r.index_upto FROM pm_vector.embedding_runs r WHERE r.id = pm_knn_sql.run_id);
  nearest text;
BEGIN
  IF upto IS NULL THEN  -- the index holds every row
    nearest := format('SELECT e.item_id, (e.embedding %2$s %4$s::%3$s) AS distance '
                      'FROM %1$s AS e ORDER BY e.embedding %2$s %4$s::%3$s LIMIT $2', tbl, op, vtype, q);
  ELSE
    nearest := format(
      'SELECT u.item_id, u.distance FROM ('
      '(SELECT e.item_id, (e.embedding %2$s %4$s::%3$s) AS distance FROM %1$s AS e WHERE e.item_id <= %5$s::bigint '
      'ORDER BY e.embedding %2$s %4$s::%3$s LIMIT $2) UNION ALL '
      '(SELECT t.item_id, (t.embedding %2$s %4$s::%3$s) AS distance FROM %1$s AS t WHERE t.item_id > %5$s::bigint '
      'ORDER BY 2, 1 LIMIT $2)) AS u ORDER BY u.distance, u.item_id LIMIT $2', tbl, op, vtype, q, upto);
  END IF;
  IF NOT batch THEN
    RETURN format(
      'SELECT (row_number() OVER (ORDER BY n.distance, n.item_id))::integer AS rank, '
      '       n.item_id, i.external_id, i.label, n.distance '
      'FROM (%s) AS n '
      'JOIN pm_vector.items AS i ON i.id = n.item_id '
      'ORDER BY 1', nearest);
  END IF;
  RETURN format(
    'SELECT q.ord::integer AS query_index, '
    '       (row_number() OVER (PARTITION BY q.ord ORDER BY n.distance, n.item_id))::integer AS rank, '
    '       n.item_id, i.external_id, i.label, n.distance '
    'FROM unnest($1) WITH ORDINALITY AS q(vec, ord) '
    'CROSS JOIN LATERAL (%s) AS n '
    'JOIN pm_vector.items AS i ON i.id = n.item_id '
    'ORDER BY 1, 2', nearest);
END $$;
