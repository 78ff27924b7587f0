-- Undoes sql/0019_attach_status.sql (migration 0019 downgrade).
DROP VIEW IF EXISTS pm_vector.attach_status;
