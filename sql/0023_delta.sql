-- pm_vector: the delta beside a run's precomputed answers, installed by migration 0023; see sql/README.md
-- and pm_vector/db/runs/delta.py (the one home of the delta in Python).
--
--   pm_vector.delta_tombstones(run_id, item_id, created_at)   primary key (run_id, item_id)
--     an item of run run_id deleted (or replaced by an update or a sync) since the run's rows were
--     built: from the delete's commit on, no answer of the run holds it; the merge purges its rows
--     from every derived table and the tombstone with them.
--   pm_vector.delta_entries(run_id, level, cell, item_id, h, h_r, created_at)
--     a new item of run run_id placed in its location cell at every published level (h: the estimate
--     of its hub count, h_r: of its count in that cell); an answer ranks them with the row's entries.
--   pm_vector.embedding_runs.delta_version   + 1 by every write of the delta: a cached answer's key holds it.
--   pm_vector.delta_status                   per collection's active run: the pending purge and its age.
--
-- Shared tables keyed by run id (not run_<id>_ tables): one schema made here, the SQL functions name
-- them statically, a run's rows go with the run row (ON DELETE CASCADE), the query role's SELECT is
-- granted once by the privilege matrix.

ALTER TABLE pm_vector.embedding_runs ADD COLUMN IF NOT EXISTS delta_version bigint NOT NULL DEFAULT 0;

CREATE TABLE pm_vector.delta_tombstones (
  run_id bigint NOT NULL REFERENCES pm_vector.embedding_runs(id) ON DELETE CASCADE,
  item_id bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, item_id));

CREATE TABLE pm_vector.delta_entries (
  run_id bigint NOT NULL REFERENCES pm_vector.embedding_runs(id) ON DELETE CASCADE,
  level integer NOT NULL,
  cell integer NOT NULL,
  item_id bigint NOT NULL,
  h double precision NOT NULL,
  h_r double precision NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, level, cell, item_id));
CREATE INDEX delta_entries_by_item ON pm_vector.delta_entries (run_id, item_id);

-- The ranking of one location report of run p_run_id (pm_vector.shortlist.location_list on the base
-- minus the tombstones and the cell's delta entries): the row's items scored h + w h_r with the cell's
-- delta entries, the first p_candidates live top hubs (level 0) scored h; no tombstoned item; the top
-- p_candidates by score desc, then id. The top hubs row is read up to p_candidates + the run's
-- tombstones (so that p_candidates live ones remain).
CREATE OR REPLACE FUNCTION pm_vector.pm_location_shortlist_core(p_run_id bigint, p_level integer, p_cell integer,
                                                                p_w float8, p_candidates integer)
RETURNS TABLE(rank integer, item_id bigint, score double precision)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
  nt integer := (SELECT count(*) FROM pm_vector.delta_tombstones z WHERE z.run_id = p_run_id);
BEGIN
  RETURN QUERY EXECUTE format(
    'SELECT (row_number() OVER (ORDER BY u.s DESC, u.id))::integer, u.id, u.s FROM ( '
    '  SELECT c.id, max(c.s) AS s FROM ( '
    '    SELECT x.id, x.hc + $3 * x.h AS s FROM %1$s AS r, unnest(r.item_ids, r.hubs, r.chubs) AS x(id, h, hc) '
    '    WHERE r.level = $1 AND r.cell = $2 '
    '    UNION ALL '
    '    SELECT d.item_id, d.h + $3 * d.h_r FROM pm_vector.delta_entries AS d '
    '    WHERE d.run_id = $5 AND d.level = $1 AND d.cell = $2 '
    '    UNION ALL '
    '    SELECT t.id, t.hc FROM (SELECT t0.id, t0.hc FROM %1$s AS r0, '
    '        unnest(r0.item_ids[1:$4 + $6], r0.chubs[1:$4 + $6]) WITH ORDINALITY AS t0(id, hc, k) '
    '      WHERE r0.level = 0 AND r0.cell = 0 AND NOT EXISTS (SELECT 1 FROM pm_vector.delta_tombstones AS z0 '
    '        WHERE z0.run_id = $5 AND z0.item_id = t0.id) ORDER BY t0.k LIMIT $4) AS t) AS c '
    '  WHERE NOT EXISTS (SELECT 1 FROM pm_vector.delta_tombstones AS z WHERE z.run_id = $5 AND z.item_id = c.id) '
    '  GROUP BY c.id) AS u '
    'ORDER BY u.s DESC, u.id LIMIT $4', 'pm_vector.' || quote_ident('run_' || p_run_id || '_locations'))
  USING p_level, p_cell, p_w, p_candidates, p_run_id, nt;
END $$;

-- Per collection with an active run: the delta of that run. pending_purge: tombstones not merged yet
-- (items deleted whose rows the derived tables still hold, never answered), oldest_purge_at / purge_age_s:
-- the oldest of them (NULL when none), delta_entries: new items answered from the delta.
CREATE OR REPLACE VIEW pm_vector.delta_status AS
SELECT c.name AS collection,
       r.id AS run_id,
       r.delta_version,
       t.pending_purge,
       t.oldest_purge_at,
       extract(epoch FROM clock_timestamp() - t.oldest_purge_at)::double precision AS purge_age_s,
       (SELECT count(DISTINCT d.item_id) FROM pm_vector.delta_entries d WHERE d.run_id = r.id) AS delta_items
  FROM pm_vector.collections c
  JOIN pm_vector.embedding_runs r ON r.id = c.active_run_id
 CROSS JOIN LATERAL (SELECT count(*) AS pending_purge, min(z.created_at) AS oldest_purge_at
                       FROM pm_vector.delta_tombstones z WHERE z.run_id = r.id) t;

COMMENT ON VIEW pm_vector.delta_status IS
  'Per collection: the delta of its active run: tombstones not merged yet (pending_purge) and the age of '
  'the oldest (purge_age_s), new items answered from the delta. Owner only (sql/0023_delta.sql).';

-- (an attached collection's sync-status reads the pending purge beside its queue)
CREATE OR REPLACE VIEW pm_vector.attach_status AS
SELECT c.name AS collection,
       c.settings -> 'attached' ->> 'table' AS source_table,
       q.queued,
       o.queued_at AS oldest_queued_at,
       extract(epoch FROM clock_timestamp() - o.queued_at)::double precision AS lag_s,
       c.settings -> 'broken' ->> 'reason' AS broken,
       (c.settings -> 'broken' ->> 'at')::timestamptz AS broken_at,
       coalesce(ds.pending_purge, 0) AS pending_purge,
       ds.purge_age_s
  FROM pm_vector.collections c
  LEFT JOIN LATERAL (SELECT f.queued_at
                       FROM (SELECT a.collection_id, a.queued_at FROM pm_vector.attach_changes a
                              WHERE a.collection_id >= c.id ORDER BY a.collection_id, a.seq LIMIT 1) f
                      WHERE f.collection_id = c.id) o ON true
 CROSS JOIN LATERAL (SELECT count(*) AS queued FROM pm_vector.attach_changes a
                      WHERE a.collection_id = c.id) q
  LEFT JOIN pm_vector.delta_status ds ON ds.collection = c.name
 WHERE c.settings ? 'attached';
