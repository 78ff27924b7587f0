-- pm_vector: the capture of attached tables bound to the table and to typed built-in values, canonical
-- keys, TRUNCATE, partitions, and the "broken" mark (migration 0020; see sql/README.md and
-- docs/guide/attach.md "What the capture runs, and as whom").
--
--   pm_vector.pm_attach_key(k)          -> text   the canonical text of a key (one overload per supported
--                                                 type; varchar takes the text one): what items.external_id
--                                                 and attach_changes.key hold, for the capture, the initial
--                                                 items and the sync alike
--   pm_vector.pm_attach_key_types()     -> regtype[]  the supported key types
--   pm_vector.pm_attach_columns(tbl, id_column, vector_column, label_column, payload_columns) -> jsonb
--        checks the columns' types (refusing, by name and type, what the capture may not touch) and
--        returns {"relid", "id_type", "columns": {name: {"attnum", "type", "typmod"}}}
--   pm_vector.pm_attach_check(att jsonb, rel oid, core_only boolean) -> text
--        NULL when the table still has every tracked column (core_only: the key, vector and label
--        columns, what the capture reads) with the recorded type; else the reason
--   pm_vector.pm_attach_mark_broken(collection_id, reason)   settings -> 'broken' = {reason, at}
--   pm_vector.pm_attach_triggers(collection_id) / pm_attach_drop_triggers(collection_id)
--   pm_vector.pm_attach_resync(name) -> jsonb   queues the whole table again, clears the mark
--
-- The capture (pm_attach_capture) is SECURITY DEFINER (the table's writers need nothing on pm_vector)
-- and therefore narrow: it ignores its arguments, finds its collection by the trigger's name AND the
-- table's oid (pg_partition_root(TG_RELID)), re-checks the tracked columns' types in pg_attribute,
-- and reads only the key (built-in types, through pm_attach_key), the vector (pgvector's output
-- function) and the label (built-in integer or text) -- never a whole row, never a cast or operator a
-- user could have made (a user can create casts only from or to types they own; none of these is).

-- ------------------------------------------------------------------------ canonical keys
-- SQL-standard bodies: parsed once, here, so nothing a caller's search_path holds can change them.
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k smallint) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE RETURN k::text;
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k integer) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE RETURN k::text;
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k bigint) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE RETURN k::text;
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE RETURN k;
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k uuid) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE RETURN k::text;
-- 1.0 and 1.00 are one key (numeric's equality), so one text
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k numeric) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE RETURN trim_scale(k)::text;
-- ISO 8601 in UTC with microseconds, whatever the session's TimeZone and DateStyle ('infinity' as is);
-- read back by ::timestamptz under any setting
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k timestamptz) RETURNS text
  LANGUAGE sql STABLE STRICT PARALLEL SAFE
  RETURN CASE WHEN isfinite(k) THEN to_char(k AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') ELSE k::text END;
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k timestamp) RETURNS text
  LANGUAGE sql STABLE STRICT PARALLEL SAFE
  RETURN CASE WHEN isfinite(k) THEN to_char(k, 'YYYY-MM-DD"T"HH24:MI:SS.US') ELSE k::text END;
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key(k date) RETURNS text
  LANGUAGE sql STABLE STRICT PARALLEL SAFE
  RETURN CASE WHEN isfinite(k) THEN to_char(k, 'YYYY-MM-DD') ELSE k::text END;

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_key_types() RETURNS regtype[]
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  RETURN ARRAY['smallint', 'integer', 'bigint', 'text', 'character varying', 'uuid', 'numeric',
               'timestamp with time zone', 'timestamp without time zone', 'date']::regtype[];

-- ------------------------------------------------------------------------ the columns and their check
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_columns(tbl regclass, id_column text, vector_column text,
                                                       label_column text, payload_columns text[])
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  cols jsonb := '{}';
  col text;
  role text;
  a record;
BEGIN
  FOR col, role IN SELECT id_column, 'key' UNION ALL SELECT vector_column, 'vector'
                   UNION ALL SELECT label_column, 'label' WHERE label_column IS NOT NULL
                   UNION ALL SELECT p, 'payload' FROM unnest(payload_columns) p LOOP
    SELECT at.attnum, at.atttypid, at.atttypmod, format_type(at.atttypid, at.atttypmod) AS tname INTO a
      FROM pg_attribute at WHERE at.attrelid = tbl AND at.attname = col AND at.attnum > 0 AND NOT at.attisdropped;
    IF NOT FOUND THEN
      RAISE EXCEPTION USING ERRCODE = 'PM004', MESSAGE = format('table %s has no column %L', tbl, col);
    END IF;
    IF role = 'key' AND NOT a.atttypid = ANY (pm_vector.pm_attach_key_types()) THEN
      RAISE EXCEPTION USING ERRCODE = 'PM004',
        MESSAGE = format('key column %I of %s is of type %s, which pm_vector does not take as a key', col, tbl, a.tname),
        HINT = 'The key types: smallint, integer, bigint, text, varchar, uuid, numeric, timestamptz, timestamp, date '
               '(each with one canonical text). Add such a column (e.g. bigint GENERATED ALWAYS AS IDENTITY) and attach by it.';
    ELSIF role = 'vector' AND NOT a.atttypid IN (to_regtype('@vector_schema@.vector'), to_regtype('@vector_schema@.halfvec')) THEN
      RAISE EXCEPTION USING ERRCODE = 'PM004',
        MESSAGE = format('column %I of %s must be a pgvector vector or halfvec column, not %s', col, tbl, a.tname);
    ELSIF role = 'label' AND NOT a.atttypid IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype,
                                                 'text'::regtype, 'character varying'::regtype) THEN
      RAISE EXCEPTION USING ERRCODE = 'PM004',
        MESSAGE = format('label column %I of %s is of type %s; a label column is an integer (or text of integers)',
                         col, tbl, a.tname);
    ELSIF role = 'payload' AND a.atttypid >= 16384 THEN  -- FirstNormalObjectId: enums, domains, composites, extensions' types
      RAISE EXCEPTION USING ERRCODE = 'PM004',
        MESSAGE = format('payload column %I of %s is of type %s, which is not a built-in type', col, tbl, a.tname),
        HINT = 'Payload columns are built-in types (text, numbers, jsonb, arrays of them, ...): a type of your own '
               'could carry code that pm_vector would run. Attach a column or a generated column of a built-in type.';
    END IF;
    cols := cols || jsonb_build_object(col, jsonb_build_object('attnum', a.attnum, 'type', a.atttypid::bigint,
                                                               'typmod', a.atttypmod));
  END LOOP;
  RETURN jsonb_build_object('relid', tbl::oid::bigint, 'columns', cols,
                            'id_type', (SELECT format_type(at.atttypid, at.atttypmod) FROM pg_attribute at
                                         WHERE at.attrelid = tbl AND at.attname = id_column));
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_check(att jsonb, rel oid, core_only boolean DEFAULT false)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  c record;
  a record;
BEGIN
  IF rel IS NULL OR NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = rel) THEN
    RETURN format('table %s was dropped', att ->> 'table');
  END IF;
  IF att -> 'columns' IS NULL THEN
    RETURN format('the columns of %s were never recorded (attached before migration 0020)', att ->> 'table');
  END IF;
  FOR c IN SELECT j.key AS name, (j.value ->> 'type')::oid AS typ, (j.value ->> 'typmod')::integer AS typmod
             FROM jsonb_each(att -> 'columns') j
            WHERE NOT core_only OR j.key IN (att ->> 'id_column', att ->> 'vector_column', att ->> 'label_column') LOOP
    SELECT at.atttypid, at.atttypmod INTO a FROM pg_attribute at
     WHERE at.attrelid = rel AND at.attname = c.name AND at.attnum > 0 AND NOT at.attisdropped;
    IF NOT FOUND THEN
      RETURN format('column %I of %s was dropped or renamed', c.name, att ->> 'table');
    END IF;
    IF a.atttypid <> c.typ OR a.atttypmod <> c.typmod THEN
      RETURN format('column %I of %s changed type from %s to %s', c.name, att ->> 'table',
                    format_type(c.typ, c.typmod), format_type(a.atttypid, a.atttypmod));
    END IF;
  END LOOP;
  RETURN NULL;
END $$;

-- are the key, vector and label columns (by name) still of the types attach takes?
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_readable(att jsonb, rel oid) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
  SELECT count(*) = 2 + (att ->> 'label_column' IS NOT NULL)::integer
    FROM pg_attribute a
   WHERE a.attrelid = rel AND a.attnum > 0 AND NOT a.attisdropped
     AND ((a.attname = att ->> 'id_column' AND a.atttypid = ANY (pm_vector.pm_attach_key_types()))
       OR (a.attname = att ->> 'vector_column'
           AND a.atttypid IN (to_regtype('@vector_schema@.vector'), to_regtype('@vector_schema@.halfvec')))
       OR (a.attname = att ->> 'label_column'
           AND a.atttypid IN ('smallint'::regtype, 'integer'::regtype, 'bigint'::regtype, 'text'::regtype,
                              'character varying'::regtype)))
$$;

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_mark_broken(cid bigint, reason text) RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pm_vector, pg_temp
-- a string body, not BEGIN ATOMIC: pm_shard_install copies every pm_vector function to the shards,
-- which have no collections table (a SQL-standard body is parsed at creation)
AS $$
  UPDATE pm_vector.collections
     SET settings = settings || jsonb_build_object('broken', jsonb_build_object('reason', reason, 'at', clock_timestamp()))
   WHERE id = cid AND settings ? 'attached' AND NOT settings ? 'broken';
$$;

-- ------------------------------------------------------------------------ the capture
-- Trigger names: pm_attach_<collection id>_<i|u|d|r|t>. A plain table: statement-level triggers with
-- transition tables (_i, _u, _d). A partitioned table: one FOR EACH ROW trigger (_r), which
-- PostgreSQL clones onto every partition, present and future, so statements run on a partition
-- directly are captured too. Every leaf table: BEFORE TRUNCATE (_t; statement triggers are not
-- cloned: the event trigger below, or pm_attach_triggers, puts it on partitions made later).
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_capture() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pm_vector, pg_temp
SET row_security = off
AS $$
DECLARE
  cid bigint := substring(TG_NAME FROM '^pm_attach_([0-9]{1,18})_[a-z]$')::bigint;
  att jsonb;
  changed boolean;
  bad text;
  idc text;
  vc text;
  lab_new text;
  lab_old text;
  k text; ok text; v text; ov text; l text; ol text;
BEGIN
  -- bound to the table: the collection whose recorded table is this trigger's (or its partition root)
  -- and its key, vector and label columns as recorded (one planned statement: this runs per row on a
  -- partitioned table; pm_attach_check says why when they are not)
  SELECT c.settings -> 'attached',
         EXISTS (SELECT 1 FROM jsonb_each(c.settings -> 'attached' -> 'columns') j
                   LEFT JOIN pg_attribute a ON a.attrelid = TG_RELID AND a.attname = j.key AND a.attnum > 0
                                           AND NOT a.attisdropped
                  WHERE j.key IN (c.settings -> 'attached' ->> 'id_column', c.settings -> 'attached' ->> 'vector_column',
                                  c.settings -> 'attached' ->> 'label_column')
                    AND (a.attname IS NULL OR a.atttypid <> (j.value ->> 'type')::oid
                         OR a.atttypmod <> (j.value ->> 'typmod')::integer))
    INTO att, changed
    FROM pm_vector.collections c
   WHERE c.id = cid AND (c.settings -> 'attached' ->> 'relid')::oid = coalesce(pg_partition_root(TG_RELID), TG_RELID);
  IF att IS NULL THEN
    RETURN NULL;  -- a trigger on any other table: nothing
  END IF;
  IF changed OR att -> 'columns' IS NULL THEN
    bad := coalesce(pm_vector.pm_attach_check(att, TG_RELID, true), 'the columns changed');
  END IF;
  IF bad IS NOT NULL THEN
    PERFORM pm_vector.pm_attach_mark_broken(cid, bad);
    -- still read when the columns are still of the types attach takes (e.g. vector -> halfvec): a
    -- delete keeps the vector its item was built from, which the resync's erasure needs
    IF NOT pm_vector.pm_attach_readable(att, TG_RELID) THEN
      RETURN NULL;
    END IF;
  END IF;
  idc := att ->> 'id_column';
  vc := att ->> 'vector_column';
  lab_new := CASE WHEN att ->> 'label_column' IS NULL THEN 'NULL::text' ELSE format('n.%I::text', att ->> 'label_column') END;
  lab_old := CASE WHEN att ->> 'label_column' IS NULL THEN 'NULL::text' ELSE format('x.%I::text', att ->> 'label_column') END;
  IF TG_OP = 'TRUNCATE' THEN  -- BEFORE: the rows (and the vectors their items were built from) are still there
    EXECUTE format('INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector) '
                   'SELECT $1, ''D'', k, v FROM (SELECT pm_vector.pm_attach_key(x.%I) AS k, x.%I::text AS v '
                   'FROM ONLY %s x) s WHERE k IS NOT NULL', idc, vc, TG_RELID::regclass) USING cid;
  ELSIF TG_LEVEL = 'ROW' THEN
    IF TG_OP <> 'INSERT' THEN
      EXECUTE format('SELECT pm_vector.pm_attach_key(x.%I), x.%I::text, %s FROM (SELECT ($1).*) x', idc, vc, lab_old)
        INTO ok, ov, ol USING OLD;
    END IF;
    IF TG_OP <> 'DELETE' THEN
      EXECUTE format('SELECT pm_vector.pm_attach_key(n.%I), n.%I::text, %s FROM (SELECT ($1).*) n', idc, vc, lab_new)
        INTO k, v, l USING NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND k IS NOT DISTINCT FROM ok THEN
      IF k IS NOT NULL THEN
        INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector)
        VALUES (cid, CASE WHEN v IS DISTINCT FROM ov OR l IS DISTINCT FROM ol THEN 'U' ELSE 'P' END, k, ov);
      END IF;
    ELSE  -- an insert, a delete, or an update of the key (a delete and an insert)
      IF ok IS NOT NULL THEN
        INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector) VALUES (cid, 'D', ok, ov);
      END IF;
      IF k IS NOT NULL THEN
        INSERT INTO pm_vector.attach_changes (collection_id, op, key) VALUES (cid, 'I', k);
      END IF;
    END IF;
  ELSIF TG_OP = 'INSERT' THEN
    EXECUTE format('INSERT INTO pm_vector.attach_changes (collection_id, op, key) '
                   'SELECT $1, ''I'', k FROM (SELECT pm_vector.pm_attach_key(n.%I) AS k FROM new_rows n) s '
                   'WHERE k IS NOT NULL', idc) USING cid;
  ELSIF TG_OP = 'DELETE' THEN
    EXECUTE format('INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector) '
                   'SELECT $1, ''D'', k, v FROM (SELECT pm_vector.pm_attach_key(x.%I) AS k, x.%I::text AS v '
                   'FROM old_rows x) s WHERE k IS NOT NULL', idc, vc) USING cid;
  ELSE
    -- old and new rows of one UPDATE statement, paired by key (a changed key: a delete and an insert)
    EXECUTE format('INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector) '
                   'SELECT $1, CASE WHEN o.k IS NULL THEN ''I'' WHEN nw.k IS NULL THEN ''D'' '
                   'WHEN o.v IS DISTINCT FROM nw.v OR o.l IS DISTINCT FROM nw.l THEN ''U'' ELSE ''P'' END, '
                   'coalesce(nw.k, o.k), o.v '
                   'FROM (SELECT pm_vector.pm_attach_key(n.%1$I) AS k, n.%2$I::text AS v, %3$s AS l FROM new_rows n) nw '
                   'FULL JOIN (SELECT pm_vector.pm_attach_key(x.%1$I) AS k, x.%2$I::text AS v, %4$s AS l FROM old_rows x) o '
                   'ON o.k = nw.k WHERE coalesce(nw.k, o.k) IS NOT NULL', idc, vc, lab_new, lab_old) USING cid;
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_drop_triggers(cid bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  rel oid;
  p oid;
  op text;
BEGIN
  SELECT coalesce((c.settings -> 'attached' ->> 'relid')::oid, to_regclass(c.settings -> 'attached' ->> 'table')::oid)
    INTO rel FROM pm_vector.collections c WHERE c.id = cid;
  IF rel IS NULL OR NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = rel) THEN
    RETURN;
  END IF;
  -- a table pm_vector's role does not own (it was granted TRIGGER, which creates but never drops a
  -- trigger): the triggers stay, said in a NOTICE; bound to the collection's oid, they queue nothing
  -- once the collection is gone (pm_attach_capture finds no collection for the table)
  FOREACH op IN ARRAY ARRAY['i', 'u', 'd', 'r', 't'] LOOP
    BEGIN
      EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', 'pm_attach_' || cid || '_' || op, rel::regclass);
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE NOTICE 'pm_vector: trigger % on % stays (only the table''s owner may drop it: DROP TRIGGER % ON %)',
        'pm_attach_' || cid || '_' || op, rel::regclass, quote_ident('pm_attach_' || cid || '_' || op), rel::regclass;
    END;
  END LOOP;
  FOR p IN SELECT t.relid FROM pg_partition_tree(rel) t WHERE t.relid <> rel LOOP
    BEGIN
      EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', 'pm_attach_' || cid || '_t', p::regclass);
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE NOTICE 'pm_vector: trigger % on % stays (only the table''s owner may drop it)',
        'pm_attach_' || cid || '_t', p::regclass;
    END;
  END LOOP;
END $$;

-- the BEFORE TRUNCATE trigger on every leaf of the table that lacks it (a plain table is its own leaf)
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_truncate_triggers(cid bigint) RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  rel oid;
  p oid;
  n integer := 0;
  trg text := 'pm_attach_' || cid || '_t';
BEGIN
  SELECT (c.settings -> 'attached' ->> 'relid')::oid INTO rel FROM pm_vector.collections c WHERE c.id = cid;
  FOR p IN SELECT r.oid FROM pg_class r
            WHERE (r.oid = rel OR r.oid IN (SELECT t.relid FROM pg_partition_tree(rel) t WHERE t.isleaf))
              AND r.relkind = 'r'
              AND NOT EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = r.oid AND g.tgname = trg) LOOP
    EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %s FOR EACH STATEMENT '
                   'EXECUTE FUNCTION pm_vector.pm_attach_capture()', trg, p::regclass);
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_triggers(cid bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  rel regclass;
  trg text := 'pm_attach_' || cid;
BEGIN
  SELECT (c.settings -> 'attached' ->> 'relid')::oid::regclass INTO rel FROM pm_vector.collections c WHERE c.id = cid;
  PERFORM pm_vector.pm_attach_drop_triggers(cid);
  IF (SELECT relkind FROM pg_class WHERE oid = rel) = 'p' THEN
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW '
                   'EXECUTE FUNCTION pm_vector.pm_attach_capture()', trg || '_r', rel);
  ELSE
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT '
                   'EXECUTE FUNCTION pm_vector.pm_attach_capture()', trg || '_i', rel);
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_attach_capture()', trg || '_u', rel);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT '
                   'EXECUTE FUNCTION pm_vector.pm_attach_capture()', trg || '_d', rel);
  END IF;
  PERFORM pm_vector.pm_attach_truncate_triggers(cid);
END $$;

-- ------------------------------------------------------------------------ attach, detach, resync
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_table(name text, tbl regclass, id_column text, vector_column text,
                                                     label_column text DEFAULT NULL,
                                                     payload_columns text[] DEFAULT '{}',
                                                     labels bigint[] DEFAULT NULL, dim integer DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pm_vector, @vector_schema@, pg_temp
AS $$
DECLARE
  typmod integer;
  vtype text;
  cols jsonb;
  cid bigint;
  lab text := CASE WHEN label_column IS NULL THEN '0::bigint' ELSE format('s.%I::bigint', label_column) END;
  pay text := 'NULL::jsonb';
  n_items bigint;
  n_skipped bigint;
  col text;
BEGIN
  cols := pm_vector.pm_attach_columns(tbl, id_column, vector_column, label_column, coalesce(payload_columns, '{}'));
  SELECT a.atttypmod, format_type(a.atttypid, NULL) INTO typmod, vtype
    FROM pg_attribute a WHERE a.attrelid = tbl AND a.attname = vector_column AND NOT a.attisdropped;
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
                             'vector_column', vector_column, 'label_column', label_column,
                             'payload_columns', to_jsonb(coalesce(payload_columns, '{}'))) || cols,
                             'allow_raw_features', false))
  RETURNING id INTO cid;
  -- the rows with a vector of the table's dimension and a label of the set (pgvector refuses NaN/inf)
  EXECUTE format('INSERT INTO pm_vector.items (collection_id, external_id, label, payload) '
                 'SELECT %s, pm_vector.pm_attach_key(s.%I), %s, %s FROM %s s WHERE s.%I IS NOT NULL AND s.%I IS NOT NULL '
                 'AND vector_dims(s.%I) = %s AND %s = ANY (%L::bigint[])',
                 cid, id_column, lab, pay, tbl, id_column, vector_column, vector_column, dim, lab, labels);
  GET DIAGNOSTICS n_items = ROW_COUNT;
  EXECUTE format('SELECT count(*) FROM %s', tbl) INTO n_skipped;
  PERFORM pm_vector.pm_attach_triggers(cid);
  RETURN jsonb_build_object('collection', name, 'collection_id', cid, 'items', n_items,
                            'skipped', n_skipped - n_items, 'dim', dim, 'labels', to_jsonb(labels));
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_detach_table(name text) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  cid bigint;
BEGIN
  SELECT co.id INTO cid FROM pm_vector.collections co
   WHERE co.name = pm_detach_table.name AND co.settings ? 'attached';
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM001', MESSAGE = format('no attached collection %L', name);
  END IF;
  PERFORM pm_vector.pm_attach_drop_triggers(cid);
END $$;

-- Rebuild from the table (pm-vector attach NAME --resync): the columns checked and recorded again,
-- the triggers made again, every row of the table queued as an update ('U': its item replaced) and
-- every item whose row is gone as a delete, the mark cleared; the sync then applies the queue.
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_resync(name text) RETURNS jsonb
LANGUAGE plpgsql
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  c record;
  att jsonb;
  cols jsonb;
  rel regclass;
  typmod integer;
  n_rows bigint;
  n_gone bigint;
  run record;
  n_lost bigint;
  lost text;
BEGIN
  SELECT co.id, co.feature_dim, co.settings INTO c FROM pm_vector.collections co
   WHERE co.name = pm_attach_resync.name AND co.settings ? 'attached' FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM001',
      MESSAGE = format('no attached collection %L (pm-vector sync-status lists them)', name);
  END IF;
  att := c.settings -> 'attached';
  SELECT r.oid INTO rel FROM pg_class r WHERE r.oid = (att ->> 'relid')::oid;  -- (the name may be unqualified)
  IF rel IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('the table %s of collection %L is gone: drop the collection (pm-vector drop %s), '
                       'then attach the table you have now', att ->> 'table', name, name);
  END IF;
  cols := pm_vector.pm_attach_columns(rel, att ->> 'id_column', att ->> 'vector_column', att ->> 'label_column',
                                      ARRAY(SELECT jsonb_array_elements_text(coalesce(att -> 'payload_columns', '[]'))));
  SELECT a.atttypmod INTO typmod FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = att ->> 'vector_column';
  IF typmod > 0 AND typmod <> c.feature_dim THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('column %I of %s now has %s dimensions, the collection %s: attach the table as a new collection',
                       att ->> 'vector_column', rel, typmod, c.feature_dim);
  END IF;
  -- an item of a run whose row is gone with the vector it was built from (deleted while the columns
  -- could not be read) cannot be erased from the run: say so, change nothing
  FOR run IN SELECT e.id FROM pm_vector.embedding_runs e
            WHERE e.collection_id = c.id AND to_regclass(format('pm_vector.%I', 'run_' || e.id || '_items')) IS NOT NULL LOOP
    EXECUTE format('SELECT count(*), string_agg(k, '', '') FROM (SELECT i.external_id AS k FROM pm_vector.items i '
                   'JOIN pm_vector.%I e ON e.item_id = i.id WHERE i.collection_id = $1 '
                   'AND NOT EXISTS (SELECT 1 FROM %s s WHERE pm_vector.pm_attach_key(s.%I) = i.external_id) '
                   'AND NOT EXISTS (SELECT 1 FROM pm_vector.attach_changes a WHERE a.collection_id = $1 '
                   'AND a.key = i.external_id AND a.old_vector IS NOT NULL) ORDER BY 1 LIMIT 5) x',
                   'run_' || run.id || '_items', rel, att ->> 'id_column') INTO n_lost, lost USING c.id;
    IF n_lost > 0 THEN
      RAISE EXCEPTION USING ERRCODE = 'PM004',
        MESSAGE = format('collection %L: the rows of items of run %s (keys %s) are gone together with the vectors '
                         'the run was built from, so the run cannot erase them; drop the collection and attach '
                         'the table again', name, run.id, lost);
    END IF;
  END LOOP;
  UPDATE pm_vector.collections SET settings = (settings - 'broken') || jsonb_build_object('attached', att || cols)
   WHERE id = c.id;
  EXECUTE format('INSERT INTO pm_vector.attach_changes (collection_id, op, key) '
                 'SELECT $1, ''U'', k FROM (SELECT pm_vector.pm_attach_key(s.%I) AS k FROM %s s) x WHERE k IS NOT NULL',
                 att ->> 'id_column', rel) USING c.id;
  GET DIAGNOSTICS n_rows = ROW_COUNT;
  EXECUTE format('INSERT INTO pm_vector.attach_changes (collection_id, op, key) '
                 'SELECT $1, ''D'', i.external_id FROM pm_vector.items i WHERE i.collection_id = $1 '
                 'AND NOT EXISTS (SELECT 1 FROM %s s WHERE pm_vector.pm_attach_key(s.%I) = i.external_id)',
                 rel, att ->> 'id_column') USING c.id;
  GET DIAGNOSTICS n_gone = ROW_COUNT;
  PERFORM pm_vector.pm_attach_triggers(c.id);
  RETURN jsonb_build_object('collection', name, 'rows', n_rows, 'gone', n_gone);
END $$;

-- ------------------------------------------------------------------------ the DDL watch (event triggers)
-- After DDL on an attached table (or a partition of one): a tracked column dropped, renamed or of
-- another type marks the collection broken; a new partition gets its BEFORE TRUNCATE trigger.
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_ddl() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  c record;
  bad text;
BEGIN
  FOR c IN SELECT co.id, co.settings -> 'attached' AS att FROM pm_vector.collections co
            WHERE co.settings ? 'attached' AND (co.settings -> 'attached' ->> 'relid')::oid IN (
                  SELECT coalesce(pg_partition_root(d.objid), d.objid) FROM pg_event_trigger_ddl_commands() d
                   WHERE d.classid = 'pg_class'::regclass) LOOP
    bad := pm_vector.pm_attach_check(c.att, (c.att ->> 'relid')::oid);
    IF bad IS NOT NULL THEN
      PERFORM pm_vector.pm_attach_mark_broken(c.id, bad);
    ELSE
      PERFORM pm_vector.pm_attach_truncate_triggers(c.id);
    END IF;
  END LOOP;
EXCEPTION WHEN OTHERS THEN  -- never the users' DDL refused for pm_vector's sake: the sync checks again
  RAISE WARNING 'pm_vector: the watch of attached tables failed (%): the next sync checks their columns', SQLERRM;
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_dropped() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  c record;
BEGIN
  FOR c IN SELECT co.id, co.settings -> 'attached' ->> 'table' AS tbl FROM pm_vector.collections co
            WHERE co.settings ? 'attached' AND (co.settings -> 'attached' ->> 'relid')::oid IN (
                  SELECT d.objid FROM pg_event_trigger_dropped_objects() d
                   WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.object_type = 'table') LOOP
    PERFORM pm_vector.pm_attach_mark_broken(c.id, format('table %s was dropped', c.tbl));
  END LOOP;
EXCEPTION WHEN OTHERS THEN  -- never the users' DDL refused for pm_vector's sake: the sync checks again
  RAISE WARNING 'pm_vector: the watch of attached tables failed (%): the next sync checks their columns', SQLERRM;
END $$;

-- ALTER TABLE rewriting a column's values (ALTER COLUMN ... TYPE ... USING: reason bit 4,
-- AT_REWRITE_COLUMN_REWRITE) of an attached table: the items may no longer be its rows
CREATE OR REPLACE FUNCTION pm_vector.pm_attach_rewrite() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  rel oid := pg_event_trigger_table_rewrite_oid();
  c record;
BEGIN
  IF pg_event_trigger_table_rewrite_reason() & 4 = 0 THEN
    RETURN;
  END IF;
  FOR c IN SELECT co.id, co.settings -> 'attached' ->> 'table' AS tbl FROM pm_vector.collections co
            WHERE co.settings ? 'attached'
              AND (co.settings -> 'attached' ->> 'relid')::oid = coalesce(pg_partition_root(rel), rel) LOOP
    PERFORM pm_vector.pm_attach_mark_broken(c.id, format('table %s was rewritten by %s (ALTER COLUMN ... TYPE ... USING '
                                                         'may have changed its rows)', c.tbl, tg_tag));
  END LOOP;
EXCEPTION WHEN OTHERS THEN  -- never the users' DDL refused for pm_vector's sake: the sync checks again
  RAISE WARNING 'pm_vector: the watch of attached tables failed (%): the next sync checks their columns', SQLERRM;
END $$;

DO $$
BEGIN
  IF (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
    DROP EVENT TRIGGER IF EXISTS pm_vector_attach_ddl;
    DROP EVENT TRIGGER IF EXISTS pm_vector_attach_dropped;
    DROP EVENT TRIGGER IF EXISTS pm_vector_attach_rewrite;
    CREATE EVENT TRIGGER pm_vector_attach_ddl ON ddl_command_end WHEN TAG IN ('ALTER TABLE', 'CREATE TABLE')
      EXECUTE FUNCTION pm_vector.pm_attach_ddl();
    CREATE EVENT TRIGGER pm_vector_attach_dropped ON sql_drop EXECUTE FUNCTION pm_vector.pm_attach_dropped();
    CREATE EVENT TRIGGER pm_vector_attach_rewrite ON table_rewrite EXECUTE FUNCTION pm_vector.pm_attach_rewrite();
  ELSE
    RAISE NOTICE 'pm_vector: not a superuser, so no event triggers watch the DDL of attached tables; '
                 'the sync checks the table''s columns before each batch instead (docs/guide/attach.md)';
  END IF;
END $$;

-- ------------------------------------------------------------------------ the attached collections of before
-- Their columns recorded (a column pm_vector may no longer touch: the collection is marked broken
-- instead), their keys in the canonical form, their triggers made again the new way.
DO $$
DECLARE
  c record;
  cols jsonb;
BEGIN
  FOR c IN SELECT id, settings -> 'attached' AS att FROM pm_vector.collections WHERE settings ? 'attached' LOOP
    IF to_regclass(c.att ->> 'table') IS NULL THEN
      PERFORM pm_vector.pm_attach_mark_broken(c.id, format('table %s was dropped', c.att ->> 'table'));
      CONTINUE;
    END IF;
    BEGIN
      cols := pm_vector.pm_attach_columns(to_regclass(c.att ->> 'table'), c.att ->> 'id_column', c.att ->> 'vector_column',
                                          c.att ->> 'label_column',
                                          ARRAY(SELECT jsonb_array_elements_text(coalesce(c.att -> 'payload_columns', '[]'))));
    EXCEPTION WHEN SQLSTATE 'PM004' THEN
      PERFORM pm_vector.pm_attach_drop_triggers(c.id);
      UPDATE pm_vector.collections SET settings = jsonb_set(settings, '{attached,relid}',
                                                            to_jsonb(to_regclass(c.att ->> 'table')::oid::bigint))
       WHERE id = c.id;
      PERFORM pm_vector.pm_attach_mark_broken(c.id, SQLERRM);
      CONTINUE;
    END;
    UPDATE pm_vector.collections SET settings = jsonb_set(settings, '{attached}', c.att || cols) WHERE id = c.id;
    PERFORM pm_vector.pm_attach_triggers(c.id);
    BEGIN  -- the keys of before (::text under the attaching session's settings) read back, written canonically
      EXECUTE format('UPDATE pm_vector.items SET external_id = pm_vector.pm_attach_key(external_id::%s) '
                     'WHERE collection_id = $1', cols ->> 'id_type') USING c.id;
      EXECUTE format('UPDATE pm_vector.attach_changes SET key = pm_vector.pm_attach_key(key::%s) '
                     'WHERE collection_id = $1', cols ->> 'id_type') USING c.id;
    EXCEPTION WHEN data_exception THEN
      PERFORM pm_vector.pm_attach_mark_broken(c.id, format('its keys could not be read as %s (%s): resync',
                                                           cols ->> 'id_type', SQLERRM));
    END;
  END LOOP;
END $$;

-- ------------------------------------------------------------------------ sync status with the mark
CREATE OR REPLACE VIEW pm_vector.attach_status AS
SELECT c.name AS collection,
       c.settings -> 'attached' ->> 'table' AS source_table,
       q.queued,
       o.queued_at AS oldest_queued_at,
       extract(epoch FROM clock_timestamp() - o.queued_at)::double precision AS lag_s,
       c.settings -> 'broken' ->> 'reason' AS broken,
       (c.settings -> 'broken' ->> 'at')::timestamptz AS broken_at
  FROM pm_vector.collections c
  LEFT JOIN LATERAL (SELECT f.queued_at
                       FROM (SELECT a.collection_id, a.queued_at FROM pm_vector.attach_changes a
                              WHERE a.collection_id >= c.id ORDER BY a.collection_id, a.seq LIMIT 1) f
                      WHERE f.collection_id = c.id) o ON true
 CROSS JOIN LATERAL (SELECT count(*) AS queued FROM pm_vector.attach_changes a
                      WHERE a.collection_id = c.id) q
 WHERE c.settings ? 'attached';

-- ------------------------------------------------------------------------ privileges
-- The capture is a trigger function (it cannot be called otherwise); the rest are the owner's (the
-- capture, SECURITY DEFINER, calls pm_attach_key as the owner).
REVOKE ALL ON FUNCTION pm_vector.pm_attach_capture() FROM PUBLIC;
DO $$
DECLARE
  f regprocedure;
BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
            WHERE p.pronamespace = 'pm_vector'::regnamespace AND p.proname IN ('pm_attach_key', 'pm_attach_key_types') LOOP
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
  END LOOP;
END $$;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_columns(regclass, text, text, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_check(jsonb, oid, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_readable(jsonb, oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_mark_broken(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_drop_triggers(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_truncate_triggers(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_triggers(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_resync(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_ddl() FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_dropped() FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_rewrite() FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_attach_table(text, regclass, text, text, text, text[], bigint[], integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pm_vector.pm_detach_table(text) FROM PUBLIC;
