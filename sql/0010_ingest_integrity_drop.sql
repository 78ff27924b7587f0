-- Undo 0010_ingest_integrity.sql (migration 0010 downgrade).
DROP FUNCTION IF EXISTS pm_vector.pm_orphan_run_tables();
