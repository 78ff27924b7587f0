-- pm_vector: pm_run_table checks a kind's shape, not a list (migration 0026; issue #37, build item 1).
--
-- The kinds of run tables are ONE registry, pm_vector.db.runs.kinds.KINDS (Python): which kinds a
-- run has follows from the releases it serves. pm_run_table used to repeat the list (migrations
-- 0005, 0013 and 0015 each redefined it to add a kind), and the SQL side asks it for seven of the
-- eight kinds. It now names any kind of the shape pm_vector.db.run_tables.KIND checks
-- ([a-z][a-z0-9_]*, at most 40 characters), as the Python namer does: a new kind needs no migration.

CREATE OR REPLACE FUNCTION pm_vector.pm_run_table(run_id bigint, kind text) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  IF kind IS NULL OR kind !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('a run table kind is 1-40 lower-case letters, digits or _ starting with a letter, not %L', kind);
  END IF;
  RETURN 'pm_vector.' || quote_ident('run_' || run_id || '_' || kind);
END $$;
