-- pm_vector: downgrade of migration 0022 (see sql/0022_privileges.sql).
DROP FUNCTION IF EXISTS pm_vector.pm_item_features(bigint);
DROP FUNCTION IF EXISTS pm_vector.pm_item_features_half(bigint);
