-- Undoes sql/0023_delta.sql (migration 0023 downgrade): the views and the ranking as before
-- (sql/0020_capture.sql, sql/0015_locations.sql), the delta's tables and column go.
DROP VIEW IF EXISTS pm_vector.attach_status;
CREATE VIEW pm_vector.attach_status AS
SELECT c.name AS collection,
       c.settings -> 'attached' ->> 'table' AS source_table,
       q.queued,
       o.queued_at AS oldest_queued_at,
       extract(epoch FROM clock_timestamp() - o.queued_at)::double precision AS lag_s,
       c.settings -> 'broken' ->> 'reason' AS broken,
       (c.settings -> 'broken' ->> 'at')::timestamptz AS broken_at
  FROM pm_vector.collections c
  LEFT JOIN LATERAL (SELECT f.queued_at
                       FROM (SELECT a.collection_id, a.queued_at FROM pm_vector.attach_changes a
                              WHERE a.collection_id >= c.id ORDER BY a.collection_id, a.seq LIMIT 1) f
                      WHERE f.collection_id = c.id) o ON true
 CROSS JOIN LATERAL (SELECT count(*) AS queued FROM pm_vector.attach_changes a
                      WHERE a.collection_id = c.id) q
 WHERE c.settings ? 'attached';
DROP VIEW IF EXISTS pm_vector.delta_status;

CREATE OR REPLACE FUNCTION pm_vector.pm_location_shortlist_core(p_run_id bigint, p_level integer, p_cell integer,
                                                                p_w float8, p_candidates integer)
RETURNS TABLE(rank integer, item_id bigint, score double precision)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
  RETURN QUERY EXECUTE format(
    'SELECT (row_number() OVER (ORDER BY u.s DESC, u.id))::integer, u.id, u.s FROM ( '
    '  SELECT c.id, max(c.s) AS s FROM ( '
    '    SELECT x.id, x.hc + $3 * x.h AS s FROM %1$s AS r, unnest(r.item_ids, r.hubs, r.chubs) AS x(id, h, hc) '
    '    WHERE r.level = $1 AND r.cell = $2 '
    '    UNION ALL '
    '    SELECT t.id, t.hc FROM %1$s AS r0, unnest(r0.item_ids[1:$4], r0.chubs[1:$4]) AS t(id, hc) '
    '    WHERE r0.level = 0 AND r0.cell = 0) AS c GROUP BY c.id) AS u '
    'ORDER BY u.s DESC, u.id LIMIT $4', 'pm_vector.' || quote_ident('run_' || p_run_id || '_locations'))
  USING p_level, p_cell, p_w, p_candidates;
END $$;

DROP TABLE IF EXISTS pm_vector.delta_entries;
DROP TABLE IF EXISTS pm_vector.delta_tombstones;
ALTER TABLE pm_vector.embedding_runs DROP COLUMN IF EXISTS delta_version;
