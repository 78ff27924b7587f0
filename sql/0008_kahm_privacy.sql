-- pm_vector 0008: KAHM privacy records (issue #11)
--   pm_vector.pm_kahm_models   (replaced) + unit, epsilon, row_epsilon of each model's privacy record
--   pm_vector.pm_kahm_audits   (replaced) + n_repeats, configuration, unit, attack TPR at FPR 1 % and
--                              0.1 % (pooled over repeats) of the raw and the fabricated model
-- Columns are only appended (CREATE OR REPLACE VIEW keeps the existing ones in order).

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
       m.created_at,
       m.privacy ->> 'unit' AS unit,
       (m.privacy ->> 'epsilon')::float8 AS epsilon,
       (m.privacy ->> 'row_epsilon')::float8 AS row_epsilon
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
       a.created_at,
       (a.report ->> 'n_repeats')::int AS n_repeats,
       a.report -> 'configuration' AS configuration,
       a.params ->> 'unit' AS unit,
       (a.report -> 'tpr_at_fpr_0.01_raw' ->> 'tpr')::float8 AS tpr_at_fpr_1pct_raw,
       (a.report -> 'tpr_at_fpr_0.01_fab' ->> 'tpr')::float8 AS tpr_at_fpr_1pct_fabricated,
       (a.report -> 'tpr_at_fpr_0.001_raw' ->> 'tpr')::float8 AS tpr_at_fpr_0_1pct_raw,
       (a.report -> 'tpr_at_fpr_0.001_fab' ->> 'tpr')::float8 AS tpr_at_fpr_0_1pct_fabricated
  FROM pm_vector.kahm_audits a
  JOIN pm_vector.collections c ON c.id = a.collection_id;
