-- pm_vector: shards (postgres_fdw) and replicas, installed by migration 0011; see sql/README.md.
--
-- A coordinator keeps pm_vector's catalog and the parent tables. A shard is another PostgreSQL
-- with pgvector, registered here as a postgres_fdw foreign server (async_capable, the vector
-- extension shippable, so distance operators, ORDER BY and LIMIT run on the shard); its user
-- mapping is also what dblink uses to create and index the shard's tables. A sharded table is a
-- partitioned table whose partitions are foreign tables, one per shard-resident table.
--
--   pm_vector.pm_register_shard(name, host, port, dbname, "user", password)  -> void
--   pm_vector.pm_unregister_shard(name)                                       -> void
--   pm_vector.pm_shard_exec(name, sql)         runs DDL on a shard (its own transaction)
--   pm_vector.pm_shard_partition(parent, partition, bound, shard, shard_ddl)
--       creates table pm_vector.<partition> on the shard (shard_ddl: its column list and
--       constraints) and attaches it to parent as a foreign partition FOR VALUES <bound>
--   pm_vector.pm_shard_of(k)                    the shard holding position k (round robin)
--
-- Error codes: PM007 unknown shard / no shard registered.

CREATE OR REPLACE FUNCTION pm_vector.pm_shard_server(name text) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT 'pm_shard_' || name $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_register_shard(name text, host text, port text, dbname text,
                                                       "user" text DEFAULT 'postgres', password text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  srv text := pm_vector.pm_shard_server(name);
BEGIN
  IF name IS NULL OR name !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('a shard name is 1-40 lower-case letters, digits or _ starting with a letter, got %L', name);
  END IF;
  CREATE EXTENSION IF NOT EXISTS postgres_fdw;
  CREATE EXTENSION IF NOT EXISTS dblink;
  IF EXISTS (SELECT 1 FROM pg_foreign_server s WHERE s.srvname = srv) THEN
    EXECUTE format('DROP SERVER %I CASCADE', srv);
  END IF;
  EXECUTE format('CREATE SERVER %I FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host %L, port %L, dbname %L, '
                 'async_capable %L, extensions %L, fetch_size %L, batch_size %L, connect_timeout %L)',
                 srv, host, port, dbname, 'true', 'vector', '10000', '1000', '5');
  IF password IS NULL THEN
    EXECUTE format('CREATE USER MAPPING FOR PUBLIC SERVER %I OPTIONS (user %L)', srv, "user");
  ELSE
    EXECUTE format('CREATE USER MAPPING FOR PUBLIC SERVER %I OPTIONS (user %L, password %L)', srv, "user", password);
  END IF;
  INSERT INTO pm_vector.shards (name, server_name, host, port, dbname)
  VALUES (name, srv, host, port::integer, dbname)
  ON CONFLICT ON CONSTRAINT pk_shards DO UPDATE
    SET server_name = EXCLUDED.server_name, host = EXCLUDED.host, port = EXCLUDED.port, dbname = EXCLUDED.dbname;
  -- the shard is usable: pgvector and the schema exist there
  PERFORM dblink_exec(srv, 'CREATE EXTENSION IF NOT EXISTS vector; CREATE SCHEMA IF NOT EXISTS pm_vector');
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_unregister_shard(name text) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
  DELETE FROM pm_vector.shards s WHERE s.name = pm_unregister_shard.name;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'PM007', MESSAGE = format('no shard %L is registered', name);
  END IF;
  EXECUTE format('DROP SERVER IF EXISTS %I CASCADE', pm_vector.pm_shard_server(name));
END $$;

-- The shard holding position k (0-based) of a sharded table's partitions: round robin over the
-- registered shards in name order. NULL when no shard is registered (the table stays local).
CREATE OR REPLACE FUNCTION pm_vector.pm_shard_of(k integer) RETURNS text
LANGUAGE sql STABLE
AS $$
  SELECT s.name FROM pm_vector.shards s ORDER BY s.name
  OFFSET (k % greatest(1, (SELECT count(*) FROM pm_vector.shards))::integer) LIMIT 1
$$;

CREATE OR REPLACE FUNCTION pm_vector.pm_shard_exec(shard text, statement text) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  srv text;
BEGIN
  SELECT s.server_name INTO srv FROM pm_vector.shards s WHERE s.name = shard;
  IF srv IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM007', MESSAGE = format('no shard %L is registered', shard);
  END IF;
  PERFORM dblink_exec(srv, statement);
END $$;

CREATE OR REPLACE FUNCTION pm_vector.pm_shard_partition(parent text, partition text, bound text, shard text,
                                                        shard_ddl text)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  srv text;
BEGIN
  SELECT s.server_name INTO srv FROM pm_vector.shards s WHERE s.name = shard;
  IF srv IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM007', MESSAGE = format('no shard %L is registered', shard);
  END IF;
  PERFORM dblink_exec(srv, format('DROP TABLE IF EXISTS pm_vector.%I; CREATE TABLE pm_vector.%I (%s)',
                                  partition, partition, shard_ddl));
  EXECUTE format('CREATE FOREIGN TABLE pm_vector.%I PARTITION OF %s FOR VALUES %s SERVER %I '
                 'OPTIONS (schema_name %L, table_name %L)', partition, parent, bound, srv, 'pm_vector', partition);
END $$;

-- The foreign partitions of a table: partition name, shard, remote table.
CREATE OR REPLACE FUNCTION pm_vector.pm_shard_partitions(parent text)
RETURNS TABLE (partition text, shard text, remote_table text)
LANGUAGE sql STABLE
AS $$
  SELECT c.relname::text, s.name, (SELECT o.option_value FROM pg_options_to_table(ft.ftoptions) o
                                   WHERE o.option_name = 'table_name')
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_foreign_table ft ON ft.ftrelid = c.oid
  JOIN pg_foreign_server fs ON fs.oid = ft.ftserver
  JOIN pm_vector.shards s ON s.server_name = fs.srvname
  WHERE i.inhparent = parent::regclass
  ORDER BY c.relname
$$;

-- ---------------------------------------------------------------- class-rows runs on shards
--
-- A sharded run (pm_vector.db.runs.sharding) records its placement in embedding_runs.class_rows ->
-- 'shards' ({shard: [class positions, 0-based]}). Every shard holds, for its classes, the run's
-- prior (in the single node's layout: neighbour lists and their hubs in the prior rows), graph and
-- hubs under the single-node names, and a mirror row of the run (pm_vector.embedding_runs(id,
-- class_rows) on the shard: what the statement reads of its run), so the single-node statement
-- answers a shard's rows there: pm_shortlist_core is that statement without the items join,
-- installed on the shards by pm_shard_install. pm_shortlist sends each shard its rows at once (dblink, async),
-- collects the per-row top k' and joins the items.
--
-- New error code: PM008 a shard did not answer (its name and address in the message; nothing is
-- written by a resolve, so retrying once the shard is back is safe).

-- The single-node statement's text without its final items join: (row_index, rank, item_id, score).
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist_core_sql(run_id bigint, n_components integer) RETURNS text
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
  full_sql text := pm_vector.pm_shortlist_sql(run_id, n_components);
  tail text := 'SELECT r.row_index::integer, r.rank::integer, r.item_id, i.external_id, i.label, r.score '
               'FROM r JOIN pm_vector.items AS i ON i.id = r.item_id ';
  pos integer := strpos(full_sql, tail);
BEGIN
  IF pos = 0 THEN  -- the statement changed shape: refuse rather than answer something else
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = 'pm_shortlist_core_sql does not recognise the end of pm_shortlist_sql; update sql/0011_cluster.sql';
  END IF;
  RETURN left(full_sql, pos - 1) || 'SELECT r.row_index::integer, r.rank::integer, r.item_id, r.score FROM r '
         || substr(full_sql, pos + length(tail));
END $$;

-- Runs the core statement for the given rows (on a shard, or on a single node).
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist_core(run_id bigint, n_components integer, rows float8[],
    sigmas float8[], classes bigint[], class_sizes bigint[], k_prime integer, max_prior integer)
RETURNS TABLE (row_index integer, rank integer, item_id bigint, score double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  old text[];
BEGIN
  old := pm_vector.pm_prepare_prior_search(max_prior);
  RETURN QUERY EXECUTE pm_vector.pm_shortlist_core_sql(run_id, n_components)
    USING rows, sigmas, classes, class_sizes, k_prime, max_prior;
  PERFORM pm_vector.pm_restore_prior_search(old);
END $$;

-- Installs (or refreshes) on a shard every pm_vector function, as defined on the coordinator, so
-- coordinator and shards never disagree on the statement (whatever helpers it calls). Bodies are
-- not checked there (check_function_bodies off): functions about the catalog are never called on
-- a shard.
CREATE OR REPLACE FUNCTION pm_vector.pm_shard_install(shard text) RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
  defs text;
  n integer;
BEGIN
  SELECT string_agg(pg_get_functiondef(p.oid), E';\n' ORDER BY p.proname, p.oid), count(*)
    INTO defs, n
    FROM pg_proc p JOIN pg_namespace ns ON ns.oid = p.pronamespace
   WHERE ns.nspname = 'pm_vector' AND p.prokind = 'f';
  PERFORM pm_vector.pm_shard_exec(shard, 'SET check_function_bodies = off; ' || defs
                                          || '; RESET check_function_bodies');
  RETURN n;
END $$;

-- The rows of a request a shard answers: positions (1-based) of its classes.
CREATE OR REPLACE FUNCTION pm_vector.pm_shard_rows(placement jsonb, shard text) RETURNS integer[]
LANGUAGE sql IMMUTABLE
AS $$ SELECT ARRAY(SELECT (x::integer) + 1 FROM jsonb_array_elements_text(placement -> shard) AS x ORDER BY 1) $$;

-- Fans a request out: every shard gets its rows in one query, sent to all shards before any result
-- is read (dblink_send_query), on a connection kept per session. Returns the merged per-row top k'
-- with global row indexes.
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist_sharded(run_id bigint, n_components integer, placement jsonb,
    rows float8[], sigmas float8[], classes bigint[], class_sizes bigint[], k_prime integer, max_prior integer)
RETURNS TABLE (row_index integer, rank integer, item_id bigint, score double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  s text;
  srv text;
  pos integer[];
  sent text[] := '{}';
  q text;
  addr text;
BEGIN
  FOR s IN SELECT jsonb_object_keys(placement) ORDER BY 1 LOOP
    pos := pm_vector.pm_shard_rows(placement, s);
    CONTINUE WHEN cardinality(pos) = 0;
    SELECT sh.server_name, sh.host || ':' || sh.port INTO srv, addr FROM pm_vector.shards sh WHERE sh.name = s;
    IF srv IS NULL THEN
      RAISE EXCEPTION USING ERRCODE = 'PM007',
        MESSAGE = format('run %s is placed on shard %L, which is not registered here', run_id, s),
        HINT = 'Register it again (pm-vector db shard-add) or run a new embedding job.';
    END IF;
    q := format('SELECT row_index, rank, item_id, score FROM pm_vector.pm_shortlist_core(%s, %s, %L::float8[], '
                '%L::float8[], %L::bigint[], %L::bigint[], %s, %s)', run_id, n_components,
                ARRAY(SELECT ARRAY(SELECT rows[p][j] FROM generate_series(1, n_components) AS j) FROM unnest(pos) AS p),
                ARRAY(SELECT sigmas[p] FROM unnest(pos) AS p), ARRAY(SELECT classes[p] FROM unnest(pos) AS p),
                ARRAY(SELECT class_sizes[p] FROM unnest(pos) AS p), k_prime, max_prior);
    BEGIN
      IF NOT coalesce(srv = ANY (dblink_get_connections()), false) THEN
        PERFORM dblink_connect(srv, srv);
      END IF;
      PERFORM dblink_send_query(srv, q);
    EXCEPTION WHEN OTHERS THEN
      PERFORM pm_vector.pm_shard_reset(sent || srv);
      RAISE EXCEPTION USING ERRCODE = 'PM008',
        MESSAGE = format('shard %s (%s) did not answer: %s', s, addr, SQLERRM),
        HINT = 'Nothing was written; retry once the shard is back (pm-vector db status shows the nodes).';
    END;
    sent := sent || srv;
  END LOOP;
  FOR s IN SELECT jsonb_object_keys(placement) ORDER BY 1 LOOP
    pos := pm_vector.pm_shard_rows(placement, s);
    CONTINUE WHEN cardinality(pos) = 0;
    SELECT sh.server_name, sh.host || ':' || sh.port INTO srv, addr FROM pm_vector.shards sh WHERE sh.name = s;
    BEGIN
      RETURN QUERY SELECT pos[t.row_index], t.rank, t.item_id, t.score
        FROM dblink_get_result(srv) AS t(row_index integer, rank integer, item_id bigint, score double precision);
      PERFORM * FROM dblink_get_result(srv) AS t(row_index integer, rank integer, item_id bigint,
                                                 score double precision);  -- the end of the result set
    EXCEPTION WHEN OTHERS THEN
      PERFORM pm_vector.pm_shard_reset(sent);
      RAISE EXCEPTION USING ERRCODE = 'PM008',
        MESSAGE = format('shard %s (%s) did not answer: %s', s, addr, SQLERRM),
        HINT = 'Nothing was written; retry once the shard is back (pm-vector db status shows the nodes).';
    END;
  END LOOP;
END $$;

-- Drops this session's dblink connections to the given servers (after a failure, their state is
-- unknown: the next request connects afresh).
CREATE OR REPLACE FUNCTION pm_vector.pm_shard_reset(servers text[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
  c text;
BEGIN
  FOR c IN SELECT unnest(servers) INTERSECT SELECT unnest(coalesce(dblink_get_connections(), '{}')) LOOP
    BEGIN
      PERFORM dblink_disconnect(c);
    EXCEPTION WHEN OTHERS THEN
      NULL;
    END;
  END LOOP;
END $$;

-- The plan each shard runs for its rows of a request (EXPLAIN VERBOSE of pm_shortlist_core's
-- statement, executed on the shard): shard name, plan line.
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist_shard_explain(collection text, rows float8[], sigmas float8[],
    k_prime integer, max_prior integer DEFAULT NULL)
RETURNS TABLE (shard text, line text)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  r record;
  doc jsonb;
  mp integer;
  s text;
  pos integer[];
  q text;
BEGIN
  SELECT * INTO r FROM pm_vector.pm_class_rows_run(pm_shortlist_shard_explain.collection);
  SELECT er.class_rows INTO doc FROM pm_vector.embedding_runs er WHERE er.id = r.run_id;
  IF doc -> 'shards' IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = 'PM007', MESSAGE = format('the active run of %L is not sharded', collection);
  END IF;
  mp := coalesce(pm_shortlist_shard_explain.max_prior, r.max_prior, 1024);
  PERFORM pm_vector.pm_check_class_rows(cardinality(r.classes), r.n_components, rows, sigmas, k_prime, mp);
  FOR s IN SELECT jsonb_object_keys(doc -> 'shards') ORDER BY 1 LOOP
    pos := pm_vector.pm_shard_rows(doc -> 'shards', s);
    CONTINUE WHEN cardinality(pos) = 0;
    q := format('SELECT pm_vector.pm_prepare_prior_search(%s); EXPLAIN (VERBOSE, COSTS OFF) ', mp)
         || replace(replace(replace(replace(replace(replace(
              pm_vector.pm_shortlist_core_sql(r.run_id, r.n_components),
              '$1', quote_literal(ARRAY(SELECT ARRAY(SELECT rows[p][j] FROM generate_series(1, r.n_components) AS j)
                                        FROM unnest(pos) AS p)) || '::float8[]'),
              '$2', quote_literal(ARRAY(SELECT sigmas[p] FROM unnest(pos) AS p)) || '::float8[]'),
              '$3', quote_literal(ARRAY(SELECT r.classes[p] FROM unnest(pos) AS p)) || '::bigint[]'),
              '$4', quote_literal(ARRAY(SELECT r.class_sizes[p] FROM unnest(pos) AS p)) || '::bigint[]'),
              '$5', k_prime::text), '$6', mp::text);
    RETURN QUERY SELECT s, t.l FROM dblink(pm_vector.pm_shard_server(s), 'BEGIN; ' || q) AS t(l text);
  END LOOP;
END $$;

-- pm_shortlist (sql/0005_class_rows.sql), now also for sharded runs: same arguments, same rows.
CREATE OR REPLACE FUNCTION pm_vector.pm_shortlist(collection text, rows float8[], sigmas float8[], k_prime integer,
                                                  max_prior integer DEFAULT NULL)
RETURNS TABLE (row_index integer, rank integer, item_id bigint, external_id text, label bigint,
               score double precision)
LANGUAGE plpgsql
SET search_path = pm_vector, @vector_schema@, pg_catalog
AS $$
DECLARE
  r record;
  mp integer;
  old text[];
  placement jsonb;
BEGIN
  SELECT * INTO r FROM pm_vector.pm_class_rows_run(pm_shortlist.collection);
  mp := coalesce(pm_shortlist.max_prior, r.max_prior, 1024);
  PERFORM pm_vector.pm_check_class_rows(cardinality(r.classes), r.n_components, pm_shortlist.rows,
                                        pm_shortlist.sigmas, pm_shortlist.k_prime, mp);
  SELECT er.class_rows -> 'shards' INTO placement FROM pm_vector.embedding_runs er WHERE er.id = r.run_id;
  IF placement IS NOT NULL THEN
    RETURN QUERY
      SELECT s.row_index, s.rank, s.item_id, i.external_id, i.label, s.score
      FROM pm_vector.pm_shortlist_sharded(r.run_id, r.n_components, placement, pm_shortlist.rows,
                                          pm_shortlist.sigmas, r.classes, r.class_sizes, pm_shortlist.k_prime, mp) AS s
      JOIN pm_vector.items AS i ON i.id = s.item_id
      ORDER BY 1, 2;
    RETURN;
  END IF;
  old := pm_vector.pm_prepare_prior_search(mp);
  RETURN QUERY EXECUTE pm_vector.pm_shortlist_sql(r.run_id, r.n_components)
    USING pm_shortlist.rows, pm_shortlist.sigmas, r.classes, r.class_sizes, pm_shortlist.k_prime, mp;
  PERFORM pm_vector.pm_restore_prior_search(old);
END $$;

-- pm_drop_run_tables (sql/0005_class_rows.sql), now also dropping a sharded run's tables on its
-- shards and the job's write-side foreign tables. A shard that cannot be reached keeps its copy
-- (nothing points at it; `pm-vector db cleanup` retries) and is named in a WARNING.
CREATE OR REPLACE FUNCTION pm_vector.pm_drop_run_tables(p_run_id bigint) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
  existed boolean := to_regclass(pm_vector.pm_run_table(p_run_id, 'items')) IS NOT NULL
                  OR to_regclass(pm_vector.pm_run_table(p_run_id, 'anchors')) IS NOT NULL
                  OR to_regclass(pm_vector.pm_run_table(p_run_id, 'prior')) IS NOT NULL;
  s text;
  ft text;
BEGIN
  IF EXISTS (SELECT 1 FROM pm_vector.collections c WHERE c.active_run_id = p_run_id) THEN
    RAISE EXCEPTION USING ERRCODE = 'PM004',
      MESSAGE = format('run %s is the active run of its collection; its tables are not dropped', p_run_id);
  END IF;
  EXECUTE format('DROP TABLE IF EXISTS %s, %s, %s, %s, %s, %s',
                 pm_vector.pm_run_table(p_run_id, 'items'), pm_vector.pm_run_table(p_run_id, 'anchors'),
                 pm_vector.pm_run_table(p_run_id, 'prior'), pm_vector.pm_run_table(p_run_id, 'neighbors'),
                 pm_vector.pm_run_table(p_run_id, 'hubs'), pm_vector.pm_run_table(p_run_id, 'codes'));
  FOR ft IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'pm_vector' AND c.relkind = 'f' AND c.relname LIKE 'run\_' || p_run_id || '\_%\_at\_%' LOOP
    EXECUTE format('DROP FOREIGN TABLE IF EXISTS pm_vector.%I', ft);
  END LOOP;
  FOR s IN SELECT jsonb_object_keys(er.class_rows -> 'shards') FROM pm_vector.embedding_runs er
           WHERE er.id = p_run_id AND er.class_rows ? 'shards'
           UNION SELECT sh.name FROM pm_vector.shards sh
             WHERE NOT EXISTS (SELECT 1 FROM pm_vector.embedding_runs er WHERE er.id = p_run_id AND er.class_rows ? 'shards')
               AND EXISTS (SELECT 1 FROM pm_vector.embedding_runs er WHERE er.id = p_run_id) LOOP
    BEGIN
      PERFORM pm_vector.pm_shard_exec(s, format('DROP TABLE IF EXISTS pm_vector.%I, pm_vector.%I, pm_vector.%I, '
                                                 'pm_vector.%I; DO $d$ BEGIN IF to_regclass(%L) IS NOT NULL THEN '
                                                 'DELETE FROM pm_vector.embedding_runs WHERE id = %s; END IF; END $d$',
                                                 'run_' || p_run_id || '_prior',
                                                 'run_' || p_run_id || '_neighbors', 'run_' || p_run_id || '_hubs',
                                                 'run_' || p_run_id || '_items', 'pm_vector.embedding_runs', p_run_id));
      existed := true;
    EXCEPTION WHEN OTHERS THEN
      RAISE WARNING 'run %: shard % could not be reached; its copy of the run stays until the next cleanup', p_run_id, s;
    END;
  END LOOP;
  RETURN existed;
END $$;
