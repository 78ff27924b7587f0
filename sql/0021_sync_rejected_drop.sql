-- Undoes sql/0021_sync_rejected.sql (migration 0021 downgrade).
ALTER TABLE pm_vector.collections DROP CONSTRAINT IF EXISTS ck_collections_name_chars;
DROP TABLE IF EXISTS pm_vector.attach_rejected;
