-- Undo 0004_kahm.sql (migration 0004 downgrade); the 0001 pm_anchor_sets view is re-created by the migration.
DROP FUNCTION IF EXISTS pm_vector.pm_class_scores(text, bigint[]);
DROP VIEW IF EXISTS pm_vector.pm_kahm_audits, pm_vector.pm_kahm_models, pm_vector.pm_anchor_sets;
