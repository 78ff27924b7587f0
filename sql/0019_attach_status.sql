-- pm_vector: how far behind the sync of attached tables is, installed by migration 0019; see
-- sql/README.md.
--
--   pm_vector.attach_status: one row per attached collection (collections.settings ? 'attached')
--     collection        text              the collection's name
--     source_table      text              the attached table, as stored in settings -> 'attached' -> 'table'
--                                         (pm_attach_table's tbl::text: schema-qualified, except a table in
--                                         pgvector's schema, usually public, which is its name alone)
--     queued            bigint            changes queued and not yet applied (0 when up to date)
--     oldest_queued_at  timestamptz       when the oldest of them was queued (NULL when nothing is queued)
--     lag_s             double precision  seconds from oldest_queued_at to clock_timestamp(): how long the
--                                         oldest change has waited for a sync (NULL when nothing is queued;
--                                         NULL, not 0, so that "up to date" is never averaged as a lag)
--
--   SELECT * FROM pm_vector.attach_status;                            -- every attached collection
--   SELECT lag_s FROM pm_vector.attach_status WHERE collection = 'docs';
--
-- "Oldest" is the lowest seq: the order in which `pm-vector sync` applies the queue. A change is
-- queued (seq and queued_at taken) when its statement runs, so the lag also counts the time the
-- writer's transaction stayed open before it committed. clock_timestamp(), not now(): a query in a
-- long transaction still sees the lag of the moment.
--
-- Cost: per attached collection, the oldest change is ONE row read through the index
-- ix_attach_changes_collection_seq (collection_id, seq), in a LATERAL subquery, never a walk of
-- the queue; `queued` is a count(*) of the collection's queued rows (a count reads what it counts).
-- A filter on collection is pushed into the collections scan, so asking for one collection reads
-- only its queue. Why `collection_id >= c.id ORDER BY collection_id, seq LIMIT 1` and then
-- `collection_id = c.id`, rather than `WHERE collection_id = c.id ORDER BY seq LIMIT 1`: for the
-- latter the planner may walk the primary key (seq) and filter on the collection -- cheap by its
-- estimate, but through every older change of the other collections (10,005 rows for a collection
-- queued behind another's backlog, tests/db/test_db_attach_status.py). The order (collection_id,
-- seq) only the two-column index gives; its first entry at or after c.id is the collection's oldest
-- change, or another collection's when it has none (filtered out: NULL).
--
-- Privileges: an operator's view. It names the users' tables and shows their change rates, so
-- it is the owner's (the migrating user, pm_vector's service user) only: PUBLIC and the query
-- role pm_vector_query (which 0006's default privileges would give SELECT on every new relation
-- of the schema) get nothing on it. Grant SELECT to a monitoring role of yours if you want one:
--   GRANT USAGE ON SCHEMA pm_vector TO monitor; GRANT SELECT ON pm_vector.attach_status TO monitor;
-- (a view reads its tables with its owner's rights: the monitoring role needs nothing else).

CREATE OR REPLACE VIEW pm_vector.attach_status AS
SELECT c.name AS collection,
       c.settings -> 'attached' ->> 'table' AS source_table,
       q.queued,
       o.queued_at AS oldest_queued_at,
       extract(epoch FROM clock_timestamp() - o.queued_at)::double precision AS lag_s
  FROM pm_vector.collections c
  LEFT JOIN LATERAL (SELECT f.queued_at
                       FROM (SELECT a.collection_id, a.queued_at FROM pm_vector.attach_changes a
                              WHERE a.collection_id >= c.id ORDER BY a.collection_id, a.seq LIMIT 1) f
                      WHERE f.collection_id = c.id) o ON true
 CROSS JOIN LATERAL (SELECT count(*) AS queued FROM pm_vector.attach_changes a
                      WHERE a.collection_id = c.id) q
 WHERE c.settings ? 'attached';

COMMENT ON VIEW pm_vector.attach_status IS
  'Attached collections and how far their sync is behind: changes queued, the oldest one''s time and '
  'lag_s (seconds it has waited; NULL when nothing is queued). Owner only (sql/0019_attach_status.sql).';

REVOKE ALL ON pm_vector.attach_status FROM PUBLIC;
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query') THEN
    REVOKE ALL ON pm_vector.attach_status FROM pm_vector_query;
  END IF;
END $$;
