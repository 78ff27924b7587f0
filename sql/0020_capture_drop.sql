-- undoes sql/0020_capture.sql. The triggers of the attached collections become 0016's again (the
-- collection id and the columns as trigger arguments); migration 0020's downgrade then runs
-- sql/0016_live_collections.sql once more, which puts back 0016's pm_attach_capture, pm_attach_table
-- and pm_detach_table (the same signatures), and sql/0019_attach_status.sql (the view without the
-- broken columns). The keys go back to ::text of the key column's type.
DROP EVENT TRIGGER IF EXISTS pm_vector_attach_ddl;
DROP EVENT TRIGGER IF EXISTS pm_vector_attach_dropped;
DROP EVENT TRIGGER IF EXISTS pm_vector_attach_rewrite;

DO $$
DECLARE
  c record;
  trg text;
  args text;
BEGIN
  FOR c IN SELECT id, settings -> 'attached' AS att FROM pm_vector.collections WHERE settings ? 'attached' LOOP
    PERFORM pm_vector.pm_attach_drop_triggers(c.id);
    IF to_regclass(c.att ->> 'table') IS NULL THEN
      CONTINUE;
    END IF;
    trg := 'pm_attach_' || c.id;
    args := format('%L, %L, %L, %L', c.id, c.att ->> 'id_column', c.att ->> 'vector_column',
                   coalesce(c.att ->> 'label_column', ''));
    EXECUTE format('CREATE TRIGGER %I AFTER INSERT ON %s REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT '
                   'EXECUTE FUNCTION pm_vector.pm_attach_capture(%s)', trg || '_i', c.att ->> 'table', args);
    EXECUTE format('CREATE TRIGGER %I AFTER UPDATE ON %s REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows '
                   'FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_attach_capture(%s)', trg || '_u', c.att ->> 'table', args);
    EXECUTE format('CREATE TRIGGER %I AFTER DELETE ON %s REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT '
                   'EXECUTE FUNCTION pm_vector.pm_attach_capture(%s)', trg || '_d', c.att ->> 'table', args);
    IF c.att ? 'id_type' THEN
      BEGIN
        EXECUTE format('UPDATE pm_vector.items SET external_id = (external_id::%1$s)::text WHERE collection_id = $1; ',
                       c.att ->> 'id_type') USING c.id;
        EXECUTE format('UPDATE pm_vector.attach_changes SET key = (key::%1$s)::text WHERE collection_id = $1',
                       c.att ->> 'id_type') USING c.id;
      EXCEPTION WHEN data_exception THEN
        NULL;
      END;
    END IF;
    UPDATE pm_vector.collections
       SET settings = (settings - 'broken') || jsonb_build_object('attached', (c.att - 'relid') - 'columns')
     WHERE id = c.id;
  END LOOP;
END $$;

DROP VIEW IF EXISTS pm_vector.attach_status;
DROP FUNCTION IF EXISTS pm_vector.pm_attach_resync(text);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_ddl();
DROP FUNCTION IF EXISTS pm_vector.pm_attach_dropped();
DROP FUNCTION IF EXISTS pm_vector.pm_attach_rewrite();
DROP FUNCTION IF EXISTS pm_vector.pm_attach_triggers(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_truncate_triggers(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_drop_triggers(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_mark_broken(bigint, text);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_check(jsonb, oid, boolean);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_readable(jsonb, oid);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_columns(regclass, text, text, text, text[]);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key_types();
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(smallint);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(integer);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(text);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(uuid);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(numeric);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(timestamptz);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(timestamp);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_key(date);
