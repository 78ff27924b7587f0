-- pm_vector: raw features for the query role, installed by migration 0022; see sql/README.md.
--
-- The query role (pm_vector_query, and query keys' login role) may read pm_vector.items(id,
-- collection_id, external_id, label, payload) but not its raw features (features, features_half):
-- column privileges cannot say "only for a collection with allow_raw_features". These two
-- functions can: an item's raw features, or NULL unless its collection allows them.
--
--   SELECT pm_vector.pm_item_features(42);        -- vector, for collections of <= 2,000 dimensions
--   SELECT pm_vector.pm_item_features_half(42);   -- halfvec, above
--
-- SECURITY DEFINER (they read items as its owner), on a typed value only (a bigint id), with
-- search_path pinned to pg_catalog, pm_vector, pg_temp (PostgreSQL's advice for SECURITY DEFINER);
-- the types and tables they name are schema-qualified. Executable by the owner and pm_vector_query
-- only (pm_vector.db.postgres.privileges).

CREATE OR REPLACE FUNCTION pm_vector.pm_item_features(p_item_id bigint) RETURNS @vector_schema@.vector
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
  SELECT i.features FROM pm_vector.items AS i JOIN pm_vector.collections AS c ON c.id = i.collection_id
  WHERE i.id = p_item_id AND c.settings -> 'allow_raw_features' = 'true'::jsonb
$$;

CREATE OR REPLACE FUNCTION pm_vector.pm_item_features_half(p_item_id bigint) RETURNS @vector_schema@.halfvec
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pm_vector, pg_temp
AS $$
  SELECT i.features_half FROM pm_vector.items AS i JOIN pm_vector.collections AS c ON c.id = i.collection_id
  WHERE i.id = p_item_id AND c.settings -> 'allow_raw_features' = 'true'::jsonb
$$;
