-- pm_vector: views (installed by migration 0001; see sql/README.md).
--
--   pm_vector.pm_collections   one row per collection: dimensions, metric, labels, counts,
--                              active run, current anchor and dummy sets
--   pm_vector.pm_runs          one row per embedding run: status, whether it is active, whether
--                              its worker is alive (for 'running'), timings, tables present
--   pm_vector.pm_anchor_sets   one row per registered anchor/dummy set
--   pm_vector.pm_requests      the log of resolved requests (what clients released, no raw data)

CREATE OR REPLACE VIEW pm_vector.pm_collections AS
SELECT c.id,
       c.name,
       c.feature_dim,
       c.feature_type,
       c.metric,
       c.labels,
       coalesce((c.settings ->> 'allow_raw_features')::boolean, false) AS allow_raw_features,
       c.settings,
       (SELECT count(*) FROM pm_vector.items i WHERE i.collection_id = c.id) AS n_items,
       c.active_run_id,
       r.embedding_dim AS active_embedding_dim,
       r.finished_at AS active_since,
       a.id AS anchor_set_id,
       a.n_rows AS n_anchors,
       d.id AS dummy_set_id,
       d.n_rows AS n_dummies,
       c.created_at,
       c.updated_at
  FROM pm_vector.collections c
  LEFT JOIN pm_vector.embedding_runs r ON r.id = c.active_run_id
  LEFT JOIN LATERAL (SELECT s.id, s.n_rows FROM pm_vector.anchor_sets s
                      WHERE s.collection_id = c.id AND s.role = 'anchor' ORDER BY s.id DESC LIMIT 1) a ON true
  LEFT JOIN LATERAL (SELECT s.id, s.n_rows FROM pm_vector.anchor_sets s
                      WHERE s.collection_id = c.id AND s.role = 'dummy' ORDER BY s.id DESC LIMIT 1) d ON true;

CREATE OR REPLACE VIEW pm_vector.pm_runs AS
SELECT r.id AS run_id,
       c.name AS collection,
       r.collection_id,
       r.status,
       (c.active_run_id IS NOT DISTINCT FROM r.id) AS is_active,
       CASE WHEN r.status = 'running' THEN pm_vector.pm_lock_held(pm_vector.pm_lock_key(1, r.id)) END
         AS worker_alive,
       r.params,
       r.seed,
       r.embedding_dim,
       r.n_items,
       r.n_anchors,
       r.anchor_set_id,
       r.timings,
       r.error,
       r.worker,
       r.created_at,
       r.started_at,
       r.finished_at,
       r.finished_at - r.started_at AS duration,
       (to_regclass(pm_vector.pm_run_table(r.id, 'items')) IS NOT NULL) AS has_tables
  FROM pm_vector.embedding_runs r
  JOIN pm_vector.collections c ON c.id = r.collection_id;

CREATE OR REPLACE VIEW pm_vector.pm_anchor_sets AS
SELECT s.id AS anchor_set_id,
       c.name AS collection,
       s.collection_id,
       s.role,
       s.n_rows,
       s.description,
       s.created_at,
       (s.id = (SELECT max(t.id) FROM pm_vector.anchor_sets t
                 WHERE t.collection_id = s.collection_id AND t.role = s.role)) AS is_current
  FROM pm_vector.anchor_sets s
  JOIN pm_vector.collections c ON c.id = s.collection_id;

CREATE OR REPLACE VIEW pm_vector.pm_requests AS
SELECT l.id,
       l.collection_name AS collection,
       l.collection_id,
       l.run_id,
       l.status,
       l.row_count,
       l.received_at,
       l.finished_at,
       l.duration_ms,
       l.request,
       l.error
  FROM pm_vector.request_log l;
