-- pm_vector: migration 0029 undone: the run indexes' functions as migration 0001 made them (an items
-- index built partial stays so; the statement then scans the run's items, which answers alike), and
-- embedding_runs.index_upto dropped.
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

ALTER TABLE pm_vector.embedding_runs DROP COLUMN IF EXISTS index_upto;
