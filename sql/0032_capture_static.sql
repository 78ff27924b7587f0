-- pm_vector: the capture of a plain attached table with its columns written in (migration 0032; see
-- sql/README.md and docs/guide/attach.md "What the capture runs, and as whom").
--
--   pm_vector.pm_attach_capture_make(collection_id) -> text   makes (again) the collection's own capture
--        function, pm_vector.pm_attach_capture_<collection id>(), and returns its name
--   pm_vector.pm_attach_triggers(collection_id)       a plain table's statement triggers (_i, _u, _d) run
--        the collection's own function; a partitioned table's row trigger and TRUNCATE's, as before,
--        pm_attach_capture
--   pm_vector.pm_attach_drop_triggers(collection_id)  drops the collection's own function too
--
-- pm_attach_capture reads the key, the vector and the label of the rows by EXECUTE: a statement
-- built from the recorded column names (format('%I')) and planned again at every call, 0.2 ms of a
-- single-row commit's 0.63 ms on the writer's backend (docs/benchmarks.md, "The sync below the
-- writers"). The collection's own function is pm_attach_capture's text, with one block put in before
-- its statement-level reads: when the columns are still as recorded (the same check, the same
-- "broken" mark and fallback) and the recorded names are the ones written in, the same INSERT ...
-- SELECT statements with the column names written in (format('%I'), at the function's making), so
-- PL/pgSQL plans them once a session. Anything else (the columns changed, another name recorded)
-- goes on to pm_attach_capture's own reads, unchanged. It is SECURITY DEFINER as pm_attach_capture,
-- with the same settings (search_path pinned, row_security off), owned by pm_attach_capture's owner,
-- and executable by nobody (a trigger function: it fires, nobody calls it).

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_capture_make(cid bigint) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  att jsonb;
  fname text := 'pm_attach_capture_' || cid;
  src text;
  at integer;
  lab text;
  owner name;
  fast text;
  anchor text := E'  IF TG_OP = ''TRUNCATE'' THEN';
BEGIN
  SELECT c.settings -> 'attached' INTO att FROM pm_vector.collections c WHERE c.id = cid AND c.settings ? 'attached';
  IF att IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM001', MESSAGE = format('no attached collection with id %s', cid);
  END IF;
  SELECT p.prosrc, p.proowner::regrole::name INTO src, owner FROM pg_proc p
   WHERE p.oid = 'pm_vector.pm_attach_capture()'::regprocedure;
  at := strpos(src, anchor);
  IF at = 0 OR strpos(substr(src, at + 1), anchor) > 0 THEN  -- (once, exactly)
    RAISE EXCEPTION 'pm_vector: pm_attach_capture has no single statement-level branch to put the static reads before';
  END IF;
  lab := att ->> 'label_column';
  fast := format($b$  -- (made by pm_attach_capture_make: the columns written in, planned once a session)
  IF bad IS NULL AND TG_LEVEL = 'STATEMENT' AND idc = %1$L AND vc = %2$L
     AND att ->> 'label_column' IS NOT DISTINCT FROM %3$L THEN
    IF TG_OP = 'INSERT' THEN
      INSERT INTO pm_vector.attach_changes (collection_id, op, key)
      SELECT cid, 'I', s.pm_k FROM (SELECT pm_vector.pm_attach_key(n.%4$I) AS pm_k FROM new_rows n) s
       WHERE s.pm_k IS NOT NULL;
      RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
      INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector)
      SELECT cid, 'D', s.pm_k, s.pm_v
        FROM (SELECT pm_vector.pm_attach_key(x.%4$I) AS pm_k, x.%5$I::text AS pm_v FROM old_rows x) s
       WHERE s.pm_k IS NOT NULL;
      RETURN NULL;
    ELSIF TG_OP = 'UPDATE' THEN
      INSERT INTO pm_vector.attach_changes (collection_id, op, key, old_vector)
      SELECT cid, CASE WHEN o.pm_k IS NULL THEN 'I' WHEN nw.pm_k IS NULL THEN 'D'
                       WHEN o.pm_v IS DISTINCT FROM nw.pm_v OR o.pm_l IS DISTINCT FROM nw.pm_l THEN 'U' ELSE 'P' END,
             coalesce(nw.pm_k, o.pm_k), o.pm_v
        FROM (SELECT pm_vector.pm_attach_key(n.%4$I) AS pm_k, n.%5$I::text AS pm_v, %6$s AS pm_l FROM new_rows n) nw
        FULL JOIN (SELECT pm_vector.pm_attach_key(x.%4$I) AS pm_k, x.%5$I::text AS pm_v, %7$s AS pm_l
                     FROM old_rows x) o ON o.pm_k = nw.pm_k
       WHERE coalesce(nw.pm_k, o.pm_k) IS NOT NULL;
      RETURN NULL;
    END IF;
  END IF;
$b$, att ->> 'id_column', att ->> 'vector_column', lab, att ->> 'id_column', att ->> 'vector_column',
     CASE WHEN lab IS NULL THEN 'NULL::text' ELSE format('n.%I::text', lab) END,
     CASE WHEN lab IS NULL THEN 'NULL::text' ELSE format('x.%I::text', lab) END);
  EXECUTE format('CREATE OR REPLACE FUNCTION pm_vector.%I() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER '
                 'SET search_path = pg_catalog, pm_vector, pg_temp SET row_security = off AS %L',
                 fname, left(src, at - 1) || fast || substr(src, at));
  EXECUTE format('REVOKE ALL ON FUNCTION pm_vector.%I() FROM PUBLIC', fname);
  IF (SELECT p.proowner::regrole::name FROM pg_proc p WHERE p.oid = format('pm_vector.%I()', fname)::regprocedure)
     <> owner THEN  -- (made by a superuser: pm_vector's owner's rights, no more)
    EXECUTE format('ALTER FUNCTION pm_vector.%I() OWNER TO %I', fname, owner);
  END IF;
  RETURN 'pm_vector.' || fname;
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
  IF rel IS NOT NULL AND EXISTS (SELECT 1 FROM pg_class WHERE oid = rel) THEN
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
  END IF;
  -- the collection's own capture function, unless a trigger that stays still runs it
  BEGIN
    EXECUTE format('DROP FUNCTION IF EXISTS pm_vector.%I()', 'pm_attach_capture_' || cid);
  EXCEPTION WHEN dependent_objects_still_exist THEN
    NULL;
  END;
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_attach_triggers(cid bigint) RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
DECLARE
  rel regclass;
  trg text := 'pm_attach_' || cid;
  fn text;
BEGIN
  SELECT (c.settings -> 'attached' ->> 'relid')::oid::regclass INTO rel FROM pm_vector.collections c WHERE c.id = cid;
  PERFORM pm_vector.pm_attach_drop_triggers(cid);
  IF (SELECT relkind FROM pg_class WHERE oid = rel) = 'p' THEN
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW '
                   'EXECUTE FUNCTION pm_vector.pm_attach_capture()', trg || '_r', rel);
  ELSE
    fn := pm_vector.pm_attach_capture_make(cid);
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT '
                   'EXECUTE FUNCTION %s()', trg || '_i', rel, fn);
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION %s()', trg || '_u', rel, fn);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT '
                   'EXECUTE FUNCTION %s()', trg || '_d', rel, fn);
  END IF;
  PERFORM pm_vector.pm_attach_truncate_triggers(cid);
END $$;

REVOKE ALL ON FUNCTION pm_vector.pm_attach_capture_make(bigint) FROM PUBLIC;

-- the attached collections of before: their plain tables' triggers made again, on their own functions
DO $$
DECLARE
  c record;
BEGIN
  FOR c IN SELECT co.id FROM pm_vector.collections co
            WHERE co.settings ? 'attached'
              AND EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = (co.settings -> 'attached' ->> 'relid')::oid
                                                      AND r.relkind = 'r') LOOP
    PERFORM pm_vector.pm_attach_triggers(c.id);
  END LOOP;
END $$;
