-- undoes sql/0016_live_collections.sql: attached collections go first (their triggers on the users'
-- tables, then the collections: their items have no features, which the 0001 rules refuse)
DO $$ DECLARE n text; BEGIN
  FOR n IN SELECT name FROM pm_vector.collections WHERE settings ? 'attached' LOOP
    PERFORM pm_vector.pm_detach_table(n);
  END LOOP;
END $$;
DELETE FROM pm_vector.collections WHERE settings ? 'attached';
DROP FUNCTION IF EXISTS pm_vector.pm_detach_table(text);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_table(text, regclass, text, text, text, text[], bigint[], integer);
DROP FUNCTION IF EXISTS pm_vector.pm_attach_capture() CASCADE;
DROP TABLE IF EXISTS pm_vector.attach_changes;
DROP TRIGGER pm_items_check_insert ON pm_vector.items;
DROP TRIGGER pm_items_check_update ON pm_vector.items;
CREATE TRIGGER pm_items_check_insert AFTER INSERT ON pm_vector.items
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_check_item_rows();
CREATE TRIGGER pm_items_check_update AFTER UPDATE ON pm_vector.items
  REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pm_vector.pm_check_item_rows();
DROP FUNCTION IF EXISTS pm_vector.pm_check_item_rows_0015();
ALTER TABLE pm_vector.items DROP CONSTRAINT ck_items_one_feature_column;
ALTER TABLE pm_vector.items ADD CONSTRAINT ck_items_one_feature_column CHECK (num_nonnulls(features, features_half) = 1);
DROP FUNCTION IF EXISTS pm_vector.pm_erased_raw_models(text);
