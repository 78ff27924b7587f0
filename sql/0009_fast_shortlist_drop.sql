-- Undoes sql/0009_fast_shortlist.sql (migration 0009's downgrade runs it, then reinstalls
-- sql/0005_class_rows.sql's definitions). Runs built with neighbour lists in their prior keep
-- working: the 0005 statement reads the graph table, which every run still has.
DROP FUNCTION IF EXISTS pm_vector.pm_shortlist_sql_v1(bigint, integer);
DROP FUNCTION IF EXISTS pm_vector.pm_run_has_nbrs(bigint);
