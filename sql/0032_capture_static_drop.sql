-- Undoes sql/0032_capture_static.sql (migration 0032 downgrade): pm_attach_triggers and
-- pm_attach_drop_triggers as sql/0020_capture.sql made them (every trigger runs pm_attach_capture),
-- the attached collections' triggers made again that way, the collections' own capture functions and
-- pm_attach_capture_make dropped.
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

DO $$
DECLARE
  c record;
  f regprocedure;
BEGIN
  FOR c IN SELECT co.id FROM pm_vector.collections co
            WHERE co.settings ? 'attached'
              AND EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = (co.settings -> 'attached' ->> 'relid')::oid
                                                      AND r.relkind = 'r') LOOP
    PERFORM pm_vector.pm_attach_triggers(c.id);
  END LOOP;
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
            WHERE p.pronamespace = 'pm_vector'::regnamespace AND p.proname ~ '^pm_attach_capture_[0-9]+$' LOOP
    BEGIN
      EXECUTE format('DROP FUNCTION %s', f);
    EXCEPTION WHEN dependent_objects_still_exist THEN  -- (a trigger on a table pm_vector may not change)
      RAISE NOTICE 'pm_vector: % stays: a trigger pm_vector may not drop still runs it', f;
    END;
  END LOOP;
END $$;

DROP FUNCTION IF EXISTS pm_vector.pm_attach_capture_make(bigint);
