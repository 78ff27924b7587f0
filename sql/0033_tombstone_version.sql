-- pm_vector: each tombstone records the run's delta_version its write makes visible, so that a process
-- holding a run's tombstones at one version reads only those of the later versions (migration 0033;
-- see sql/README.md and docs/operations.md, "The delta and the merge").
--
--   pm_vector.delta_tombstones.version     the run's delta_version + 1 as its inserting transaction saw
--                                          it, holding the run's row (NULL: written before 0033)
--   delta_tombstones_by_version            (run_id, version): the later versions' read is a range scan
--   pm_vector.pm_tombstone_version()       the BEFORE INSERT row trigger that sets it, whatever wrote it
--
-- Why: a location answer ranks a cell's row less the run's tombstones, which a resolving process holds
-- per delta_version (pm_vector.db.resolve.location_cache). Under a stream of writes the version moves
-- several times a second, and each move read every tombstone again: about 35 ms of the server's CPU at
-- 324,000 tombstones, most of a private query's CPU under the stream (docs/benchmarks.md).
--
-- The rule, kept by the database (the trigger, not the writer's code): the trigger locks the run's row
-- (FOR NO KEY UPDATE; the write's own bump of delta_version updates that row later in the transaction)
-- and records v + 1, v its delta_version then. From that lock to the commit no other transaction
-- changes the row, so every version committed by another transaction is <= v or >= the one this
-- transaction commits (at least v + 1, since a write of tombstones bumps the version). So a set read at
-- a committed version h lacks a tombstone only if the tombstone's version is > h: a read of
-- "version > h" in a snapshot at version V, joined to the set at h, is the set at V.

ALTER TABLE pm_vector.delta_tombstones ADD COLUMN IF NOT EXISTS version bigint;
CREATE INDEX IF NOT EXISTS delta_tombstones_by_version ON pm_vector.delta_tombstones (run_id, version);

CREATE OR REPLACE FUNCTION pm_vector.pm_tombstone_version() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
BEGIN
  SELECT r.delta_version + 1 INTO NEW.version FROM pm_vector.embedding_runs r WHERE r.id = NEW.run_id
     FOR NO KEY UPDATE;
  RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION pm_vector.pm_tombstone_version() FROM PUBLIC;

DROP TRIGGER IF EXISTS pm_tombstone_version ON pm_vector.delta_tombstones;
CREATE TRIGGER pm_tombstone_version BEFORE INSERT ON pm_vector.delta_tombstones
  FOR EACH ROW EXECUTE FUNCTION pm_vector.pm_tombstone_version();
