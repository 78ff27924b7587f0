-- Undo 0014_cell_statement.sql (migration 0014 downgrade): 0013's statement again.
-- The statement ranking every row of a cell request (without the items join; on a single node and
-- on a shard alike). Parameters: $1 level (K), $2 the rows' classes bigint[], $3 their reported
-- cells integer[], $4 w (float8, the weight of the reported cell), $5 k_prime.
-- Returns (row_index, rank, item_id, score); score = h_c + w h_{c,K,r}.
CREATE OR REPLACE FUNCTION pm_vector.pm_cell_shortlist_sql(run_id bigint) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
  RETURN format(
    'WITH q AS MATERIALIZED ( '
    '  SELECT g.i AS row_index, ($2::bigint[])[g.i] AS label, ($3::integer[])[g.i] AS cell '
    '  FROM generate_series(1, cardinality($2::bigint[])) AS g(i)), '
    'cand AS ( '
    '  SELECT u.row_index, u.item_id, max(u.h) AS h, max(u.hc) AS hc FROM ( '
    '    SELECT q.row_index, x.item_id, x.h, x.hc FROM q CROSS JOIN LATERAL ( '
    '      SELECT unnest(c.item_ids) AS item_id, unnest(c.hubs) AS h, unnest(c.chubs) AS hc '
    '      FROM %1$s AS c WHERE c.level = $1::integer AND c.label = q.label AND c.cell = q.cell) AS x '
    '    UNION ALL '
    '    SELECT q.row_index, t.item_id, 0::float8, t.hub FROM q CROSS JOIN LATERAL ( '
    '      SELECT unnest(c0.item_ids[1:$5::integer]) AS item_id, unnest(c0.chubs[1:$5::integer]) AS hub '
    '      FROM %1$s AS c0 WHERE c0.level = 0 AND c0.label = q.label AND c0.cell = 0) AS t '
    '    UNION ALL '
    '    SELECT q.row_index, f.item_id, 0::float8, 0::float8 FROM q CROSS JOIN ( '
    '      SELECT e.item_id FROM %2$s AS e ORDER BY e.item_id LIMIT $5::integer) AS f) AS u '
    '  GROUP BY u.row_index, u.item_id), '
    'r AS ( '
    '  SELECT c.row_index, c.item_id, c.hc + $4::float8 * c.h AS score, '
    '         row_number() OVER (PARTITION BY c.row_index ORDER BY c.hc + $4::float8 * c.h DESC, c.item_id) AS rank '
    '  FROM cand AS c) '
    'SELECT r.row_index::integer, r.rank::integer, r.item_id, r.score FROM r WHERE r.rank <= $5::integer '
    'ORDER BY 1, 2',
    pm_vector.pm_run_table(run_id, 'cells'), pm_vector.pm_run_table(run_id, 'items'));
END $$;
