-- pm_vector: the attached tables' rejected changes, and the one collection-name rule in the
-- database too (migration 0021; see sql/README.md).
--
--   pm_vector.attach_rejected: one row per key of an attached table whose last change the sync
--   could not apply (pm_vector.db.store.sync_rows):
--     collection_id  bigint       the collection (ON DELETE CASCADE)
--     key            text         the row's key, as the change queue holds it (attach_changes.key)
--     reason         text         why: a label that is not an integer or not in the label set, a NULL
--                                 vector or one of another dimension, a payload over the bounds of
--                                 ingest (depth, numbers, max_payload_bytes), a vector the active run
--                                 cannot place
--     rejected_at    timestamptz  when the sync rejected it
--
-- A rejected key has no item (its old item, if any, is erased: the table is the truth), and the rest
-- of its batch, deletes included, is applied. The next change of that key (the writer corrects the
-- row, or deletes it) is applied as any other, and its row here goes. pm_vector.db.sync_status and
-- pm-vector sync-status count them; pm_vector.db.sync_rejected lists them.
--
-- Privileges: the role that runs the sync (pm_vector's owner) reads and writes it; PUBLIC and the
-- query role pm_vector_query get nothing (it names the users' keys).

CREATE TABLE IF NOT EXISTS pm_vector.attach_rejected (
  collection_id bigint NOT NULL REFERENCES pm_vector.collections (id) ON DELETE CASCADE,
  key text NOT NULL,
  reason text NOT NULL,
  rejected_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (collection_id, key)
);

REVOKE ALL ON pm_vector.attach_rejected FROM PUBLIC;
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query') THEN
    REVOKE ALL ON pm_vector.attach_rejected FROM pm_vector_query;
  END IF;
END $$;

-- Collection names: the rule of pm_vector/db/store/_names.py (NAME_PATTERN, whole names), for every
-- way a collection is made, pm_vector.pm_attach_table called from SQL included. NOT VALID: a
-- collection made before this migration under another name keeps working (and is printed escaped).
-- tests/db/test_sync_names.py checks that this pattern is NAME_PATTERN.
ALTER TABLE pm_vector.collections ADD CONSTRAINT ck_collections_name_chars
  CHECK (name ~ '^(?:[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127})$') NOT VALID;
