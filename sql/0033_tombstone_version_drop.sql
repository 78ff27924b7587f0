-- Undoes sql/0033_tombstone_version.sql (migration 0033 downgrade): the trigger, its function, the
-- index and the column gone; a process reads a run's tombstones whole again at every version.
DROP TRIGGER IF EXISTS pm_tombstone_version ON pm_vector.delta_tombstones;
DROP FUNCTION IF EXISTS pm_vector.pm_tombstone_version();
DROP INDEX IF EXISTS pm_vector.delta_tombstones_by_version;
ALTER TABLE pm_vector.delta_tombstones DROP COLUMN IF EXISTS version;
