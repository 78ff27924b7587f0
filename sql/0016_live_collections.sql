-- pm_vector: live collections (migration 0016; see sql/README.md).
--
-- pm_vector.pm_erased_raw_models(collection text) -> TABLE(model_id bigint, erased_at timestamptz)
--   the raw KAHM models of a collection that an erasure (delete_items) took out of service until
--   they are refit.

CREATE OR REPLACE FUNCTION pm_vector.pm_erased_raw_models(collection text)
RETURNS TABLE (model_id bigint, erased_at timestamptz)
LANGUAGE sql STABLE
AS $$
  SELECT m.id, m.erased_at FROM pm_vector.kahm_models m JOIN pm_vector.collections c ON c.id = m.collection_id
  WHERE c.name = collection AND m.kind = 'raw' AND m.erased_at IS NOT NULL ORDER BY m.id
$$;

-- ------------------------------------------------------------------------ attached tables
--
-- A collection can be a user's own table (pm_vector.db.attach_table, pm-vector attach, or
-- pm_vector.pm_attach_table below): collections.settings -> 'attached' records the table and its
-- columns; the items rows keep the key (external_id = the id column as text), the label and the
-- payload, and NO features (features and features_half NULL): pm_vector reads them from the table.
-- Triggers on the table queue every change in pm_vector.attach_changes; `pm-vector sync` (Python)
-- applies the queue in order, exactly once (it deletes the rows it applied in the same transaction).
--
--   pm_vector.pm_attach_table(name text, tbl regclass, id_column text, vector_column text,
--                             label_column text DEFAULT NULL, payload_columns text[] DEFAULT '{}',
--                             labels bigint[] DEFAULT NULL) -> jsonb {collection, items, skipped}
--   pm_vector.pm_detach_table(name text) -> void   (drops the triggers and the collection)

CREATE TABLE IF NOT EXISTS pm_vector.attach_changes (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  collection_id bigint NOT NULL REFERENCES pm_vector.collections (id) ON DELETE CASCADE,
  op text NOT NULL CHECK (op IN ('I', 'U', 'P', 'D')),
  key text NOT NULL,
  -- the row's vector before an update or a delete (text): what the item was built from, so that the
  -- erasure of the old item can remove its contributions; dropped with the queue row by the sync
  old_vector text,
  queued_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS ix_attach_changes_collection_seq ON pm_vector.attach_changes (collection_id, seq);

-- items of an attached collection carry no features (they are the table's)
ALTER TABLE pm_vector.items DROP CONSTRAINT ck_items_one_feature_column;
ALTER TABLE pm_vector.items ADD CONSTRAINT ck_items_one_feature_column CHECK (num_nonnulls(features, features_half) <= 1);

-- pm_check_item_rows (0001) with one more rule: a row without features is an attached collection's
CREATE OR REPLACE FUNCTION pm_vector.pm_check_item_rows_0015() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  bad record;
BEGIN
  SELECT n.id, n.label, c.name, c.feature_dim, c.feature_type,
         coalesce(vector_dims(n.features), vector_dims(n.features_half)) AS dims,
         (n.features IS NOT NULL) AS in_vector, (n.features IS NULL AND n.features_half IS NULL) AS bare,
         (c.settings ? 'attached') AS attached
    INTO bad
    FROM new_rows n JOIN pm_vector.collections c ON c.id = n.collection_id
   WHERE CASE WHEN n.features IS NULL AND n.features_half IS NULL THEN NOT (c.settings ? 'attached')
              ELSE coalesce(vector_dims(n.features), vector_dims(n.features_half)) <> c.feature_dim
                   OR (n.features IS NOT NULL) <> (c.feature_type = 'vector') OR (c.settings ? 'attached') END
      OR NOT (n.label = ANY (c.labels))
   LIMIT 1;
  IF FOUND THEN
    IF bad.bare AND NOT bad.attached THEN  -- (the check constraint's error before 0015: a CheckViolation)
      RAISE EXCEPTION USING ERRCODE = 'check_violation',
        MESSAGE = format('an item of collection %L has no features', bad.name);
    ELSIF NOT bad.bare AND bad.attached THEN
      RAISE EXCEPTION USING ERRCODE = 'PM012',
        MESSAGE = format('collection %L is an attached table: its features stay in the table', bad.name);
    ELSIF NOT bad.bare AND bad.dims <> bad.feature_dim THEN
      RAISE EXCEPTION USING ERRCODE = 'PM010',
        MESSAGE = format('an item of collection %L has %s features, but the collection has %s',
                         bad.name, bad.dims, bad.feature_dim);
    ELSIF NOT bad.bare AND bad.in_vector <> (bad.feature_type = 'vector') THEN
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

DROP TRIGGER pm_items_check_insert ON pm_vector.items;
DROP TRIGGER pm_items_check_update ON pm_vector.items;
CREATE TRIGGER pm_items_check_insert AFTER INSERT ON pm_vector.items
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_check_item_rows_0015();
CREATE TRIGGER pm_items_check_update AFTER UPDATE ON pm_vector.items
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_check_item_rows_0015();

-- The capture trigger on an attached table (statement level, transition tables): one queue row per
-- changed row. TG_ARGV: collection id, id column, vector column, label column ('' when none). An
-- UPDATE of the vector or the label (or of the key) is 'U' (the item is replaced), of anything else 'P'.
-- SECURITY DEFINER: the table's writers need no right on pm_vector's schema.
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_capture() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pm_vector, pg_catalog
AS $$
DECLARE
  cid bigint := TG_ARGV[0]::bigint;
  idc text := TG_ARGV[1];
  vc text := TG_ARGV[2];
  lc text := TG_ARGV[3];
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO pm_vector.attach_changes (collection_id, op, key)
      SELECT cid, 'I', to_jsonb(n) ->> idc FROM new_rows n WHERE to_jsonb(n) ->> idc IS NOT NULL;
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector)
      SELECT cid, 'D', to_jsonb(o) ->> idc, to_jsonb(o) ->> vc FROM old_rows o WHERE to_jsonb(o) ->> idc IS NOT NULL;
  ELSE
    -- old and new rows of one UPDATE statement, paired by key (a changed key: a delete and an insert)
    INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector)
      SELECT cid, CASE WHEN o.j IS NULL THEN 'I' WHEN nw.j IS NULL THEN 'D'
                       WHEN (o.j -> vc) IS DISTINCT FROM (nw.j -> vc)
                         OR (lc <> '' AND (o.j -> lc) IS DISTINCT FROM (nw.j -> lc)) THEN 'U' ELSE 'P' END,
             coalesce(nw.k, o.k), o.j ->> vc
      FROM (SELECT to_jsonb(n) AS j, to_jsonb(n) ->> idc AS k FROM new_rows n) nw
      FULL JOIN (SELECT to_jsonb(x) AS j, to_jsonb(x) ->> idc AS k FROM old_rows x) o ON o.k = nw.k
      WHERE coalesce(nw.k, o.k) IS NOT NULL;
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_table(name text, tbl regclass, id_column text, vector_column text,
                                                     label_column text DEFAULT NULL,
                                                     payload_columns text[] DEFAULT '{}',
                                                     labels bigint[] DEFAULT NULL, dim integer DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  typmod integer;
  vtype text;
  idtype text;
  cid bigint;
  lab text := CASE WHEN label_column IS NULL THEN '0::bigint' ELSE format('s.%I::bigint', label_column) END;
  pay text := 'NULL::jsonb';
  n_items bigint;
  n_skipped bigint;
  col text;
  trg text;
BEGIN
  SELECT a.atttypmod, format_type(a.atttypid, NULL) INTO typmod, vtype
    FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = vector_column AND NOT a.attisdropped;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('table %s has no column %L', tbl, vector_column);
  END IF;
  IF vtype NOT IN ('vector', 'halfvec') THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('column %I of %s must be a pgvector vector or halfvec column, not %s', vector_column, tbl, vtype);
  END IF;
  IF typmod > 0 AND dim IS NOT NULL AND dim <> typmod THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('column %I of %s is %s(%s), not %s dimensions', vector_column, tbl, vtype, typmod, dim);
  END IF;
  dim := coalesce(dim, nullif(typmod, -1));
  IF dim IS NULL OR dim < 1 OR dim > 16000 THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('column %I of %s has no dimension: give dim (the rows of another dimension are skipped)',
                       vector_column, tbl),
      HINT = 'Or ALTER TABLE ... ALTER COLUMN ... TYPE vector(384) gives the column its dimension.';
  END IF;
  SELECT format_type(a.atttypid, a.atttypmod) INTO idtype
    FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = id_column AND NOT a.attisdropped;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('table %s has no column %L', tbl, id_column);
  END IF;
  IF label_column IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = tbl
                                               AND a.attname = label_column AND NOT a.attisdropped) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('table %s has no column %L', tbl, label_column);
  END IF;
  IF cardinality(payload_columns) > 0 THEN
    pay := 'jsonb_build_object(';
    FOREACH col IN ARRAY payload_columns LOOP
      pay := pay || format('%L, s.%I, ', col, col);
    END LOOP;
    pay := left(pay, -2) || ')';
  END IF;
  IF labels IS NULL THEN
    EXECUTE format('SELECT coalesce(array_agg(DISTINCT %s ORDER BY %s), ''{0}'') FROM %s s WHERE %s IS NOT NULL',
                   lab, lab, tbl, lab) INTO labels;
  END IF;
  INSERT INTO pm_vector.collections (name, feature_dim, feature_type, metric, labels, settings)
  VALUES (name, dim, pm_vector.pm_vector_type(dim), 'l2', labels,
          jsonb_build_object('attached', jsonb_build_object('table', tbl::text, 'id_column', id_column,
                             'id_type', idtype, 'vector_column', vector_column, 'label_column', label_column,
                             'payload_columns', to_jsonb(payload_columns)),
                             'allow_raw_features', false))
  RETURNING id INTO cid;
  -- the rows with a vector of the table's dimension and a label of the set (pgvector refuses NaN/inf)
  EXECUTE format('INSERT INTO pm_vector.items (collection_id, external_id, label, payload) '
                 'SELECT %s, s.%I::text, %s, %s FROM %s s WHERE s.%I IS NOT NULL AND s.%I IS NOT NULL '
                 'AND vector_dims(s.%I) = %s AND %s = ANY (%L::bigint[])',
                 cid, id_column, lab, pay, tbl, id_column, vector_column, vector_column, dim, lab, labels);
  GET DIAGNOSTICS n_items = ROW_COUNT;
  EXECUTE format('SELECT count(*) FROM %s', tbl) INTO n_skipped;
  trg := 'pm_attach_' || cid;
  EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT '
                 'EXECUTE FUNCTION pm_vector.pm_attach_capture(%L, %L, %L, %L)',
                 trg || '_i', tbl, cid, id_column, vector_column, coalesce(label_column, ''));
  EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                 'FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_attach_capture(%L, %L, %L, %L)',
                 trg || '_u', tbl, cid, id_column, vector_column, coalesce(label_column, ''));
  EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT '
                 'EXECUTE FUNCTION pm_vector.pm_attach_capture(%L, %L, %L, %L)',
                 trg || '_d', tbl, cid, id_column, vector_column, coalesce(label_column, ''));
  RETURN jsonb_build_object('collection', name, 'collection_id', cid, 'items', n_items,
                            'skipped', n_skipped - n_items, 'dim', dim, 'labels', to_jsonb(labels));
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_detach_table(name text) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  c record;
  op text;
BEGIN
  SELECT co.id, co.settings -> 'attached' ->> 'table' AS tbl INTO c FROM pm_vector.collections co
   WHERE co.name = pm_detach_table.name AND co.settings ? 'attached';
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM001', MESSAGE = format('no attached collection %L', name);
  END IF;
  IF to_regclass(c.tbl) IS NOT NULL THEN
    FOREACH op IN ARRAY ARRAY['i', 'u', 'd'] LOOP
      EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', 'pm_attach_' || c.id || '_' || op, c.tbl);
    END LOOP;
  END IF;
END $$;
