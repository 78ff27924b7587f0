-- pm_vector: KAHM roles (installed by migration 0004; see sql/README.md).
--
--   pm_vector.pm_kahm_models      one row per stored KAHM classifier (without the model bytes):
--                                 kind, privacy parameters, classes, whether it is current
--   pm_vector.pm_kahm_audits      membership-inference audit reports, main figures as columns
--   pm_vector.pm_anchor_sets      (replaced) now also shows each set's provenance
--   pm_vector.pm_class_scores(collection, item_ids)
--                                 class-matching scores (Definition 8) of items under the
--                                 collection's current KAHM model

CREATE OR REPLACE VIEW pm_vector.pm_kahm_models AS
SELECT m.id AS model_id,
       c.name AS collection,
       m.collection_id,
       m.kind,
       m.classes,
       m.n_features,
       m.n_items,
       m.params,
       m.privacy,
       octet_length(m.model) AS model_bytes,
       (SELECT count(*) FROM pm_vector.kahm_item_scores s WHERE s.model_id = m.id) AS n_scored_items,
       (m.id = (SELECT max(t.id) FROM pm_vector.kahm_models t WHERE t.collection_id = m.collection_id))
         AS is_current,
       m.timings,
       m.created_at
  FROM pm_vector.kahm_models m
  JOIN pm_vector.collections c ON c.id = m.collection_id;

CREATE OR REPLACE VIEW pm_vector.pm_kahm_audits AS
SELECT a.id AS audit_id,
       c.name AS collection,
       a.collection_id,
       (a.params ->> 'epsilon')::float8 AS epsilon,
       (a.report ->> 'mis_raw')::float8 AS mis_raw,
       (a.report ->> 'mis_fab')::float8 AS mis_fabricated,
       (a.report ->> 'mis_reduction')::float8 AS mis_reduction,
       (a.report ->> 'auc_raw')::float8 AS auc_raw,
       (a.report ->> 'auc_fab')::float8 AS auc_fabricated,
       (a.report ->> 'accuracy_raw')::float8 AS accuracy_raw,
       (a.report ->> 'accuracy_fab')::float8 AS accuracy_fabricated,
       a.params,
       a.report,
       a.created_at
  FROM pm_vector.kahm_audits a
  JOIN pm_vector.collections c ON c.id = a.collection_id;

-- Same columns as the 0001 view, plus provenance at the end.
CREATE OR REPLACE VIEW pm_vector.pm_anchor_sets AS
SELECT s.id AS anchor_set_id,
       c.name AS collection,
       s.collection_id,
       s.role,
       s.n_rows,
       s.description,
       s.created_at,
       (s.id = (SELECT max(t.id) FROM pm_vector.anchor_sets t
                 WHERE t.collection_id = s.collection_id AND t.role = s.role)) AS is_current,
       s.provenance
  FROM pm_vector.anchor_sets s
  JOIN pm_vector.collections c ON c.id = s.collection_id;

-- Class-matching scores of the given items under the collection's current KAHM model, one row per
-- item that has scores (items ingested after the model was fitted have none until
-- `pm-vector kahm fit --new-items` scores them). Columns: item_id, label (stored), predicted
-- (Definition 7), scores (Definition 8, in the order of classes), classes, model_id.
CREATE OR REPLACE FUNCTION pm_vector.pm_class_scores(collection text, item_ids bigint[])
RETURNS TABLE (item_id bigint, label bigint, predicted bigint, scores real[], classes bigint[], model_id bigint)
LANGUAGE sql STABLE
SET search_path = pm_vector, pg_catalog
AS $$
  WITH m AS (
    SELECT k.id, k.classes
      FROM pm_vector.kahm_models k
      JOIN pm_vector.collections c ON c.id = k.collection_id
     WHERE c.name = pm_class_scores.collection
     ORDER BY k.id DESC LIMIT 1)
  SELECT s.item_id, i.label, s.predicted, s.scores, m.classes, m.id
    FROM m
    JOIN pm_vector.kahm_item_scores s ON s.model_id = m.id AND s.item_id = ANY (pm_class_scores.item_ids)
    JOIN pm_vector.items i ON i.id = s.item_id
   ORDER BY array_position(pm_class_scores.item_ids, s.item_id)
$$;
