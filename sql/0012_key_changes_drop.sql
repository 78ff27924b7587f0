-- Undo 0012_key_changes.sql (migration 0012 downgrade).
DROP TRIGGER IF EXISTS pm_keys_changed ON pm_vector_service.api_keys;
DROP FUNCTION IF EXISTS pm_vector_service.pm_keys_changed();
