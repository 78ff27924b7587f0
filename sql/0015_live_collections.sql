-- pm_vector: live collections (migration 0015; see sql/README.md).
--
-- pm_vector.pm_erased_raw_models(collection text) -> TABLE(model_id bigint, erased_at timestamptz)
--   the raw KAHM models of a collection that an erasure (delete_items) took out of service until
--   they are refit.

CREATE OR REPLACE FUNCTION pm_vector.pm_erased_raw_models(collection text)
RETURNS TABLE (model_id bigint, erased_at timestamptz)
LANGUAGE sql STABLE
AS $$
  SELECT m.id, m.erased_at FROM pm_vector.kahm_models m JOIN pm_vector.collections c ON c.id = m.collection_id
  WHERE c.name = collection AND m.kind = 'raw' AND m.erased_at IS NOT NULL ORDER BY m.id
$$;
