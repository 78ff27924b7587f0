"""Who may do what in pm_vector's schemas: ONE declaration, the privilege matrix, applied by
migration 0022 (:func:`apply`) and read back against the catalog by ``tests/db/test_db_privileges.py``.

Three roles appear (docs/operations.md, "Database roles", shows the matrix as a table):

* **the owner**: owns the schemas ``pm_vector`` and ``pm_vector_service`` and every object in
  them, and holds every right on them as their owner. In the embedded default it is
  :data:`~pm_vector.db.postgres.config.OWNER_ROLE` (``pm_vector_owner``: NOSUPERUSER,
  NOCREATEDB, NOCREATEROLE, NOBYPASSRLS), which the service, the jobs, the sync and the CLI log
  in as once the migrations ran; on your own PostgreSQL it is ``PM_VECTOR_OWNER_ROLE`` when set,
  else the role that runs the migrations.
* **the query role** ``pm_vector_query`` (NOLOGIN; query keys' login role of migration 0017 is
  its member): what an answer reads, nothing else. :data:`QUERY_TABLES` (whole tables),
  :data:`QUERY_COLUMNS` (column privileges: ``items`` without its raw features, which only
  :data:`FEATURES_FUNCTIONS` return, and only for a collection with ``allow_raw_features``),
  :data:`QUERY_FUNCTIONS`, USAGE on the schema ``pm_vector``, and SELECT on a run's answer tables
  (:func:`pm_vector.db.runs.kinds.answer_tables`, from the registry of run table kinds, granted by the job where it creates them:
  :func:`pm_vector.db.runs.kinds.grant_answer_tables`).
* **the query role on a shard** (a cluster's shards: :data:`SHARD_QUERY_ROLE`, a login there that
  the coordinator's user mappings of the query role and its login role log in as, migration 0028):
  USAGE on the shard's schema ``pm_vector``, SELECT on the run tables a sharded answer reads there
  (:func:`shard_answer_tables`: the answer tables a sharded run keeps on its shards, granted at the
  job's switch by :func:`pm_vector.db.runs.kinds.grant_answer_tables`) and on
  :data:`SHARD_QUERY_TABLES`; EXECUTE on :data:`SHARD_QUERY_FUNCTIONS` only, of the functions
  ``pm_vector.pm_shard_install`` copies there (:func:`install_on_shards`, migration 0030: it revokes
  every function of the shard's schema from PUBLIC and the owner's future ones there too); nothing
  else (no CREATE, no partition, no default privilege).
* **PUBLIC**: nothing: no USAGE on the schemas, no EXECUTE on any function (also not by default
  on the owner's future functions: ``pg_default_acl``), no right on any relation.

Every relation and function of the two schemas is named here (:data:`RELATIONS`,
:data:`FUNCTIONS`), with the rights it gives, or in the run tables' pattern (:data:`RUN_TABLE`);
the test fails on any object that is not, so a new table or function cannot widen the matrix
silently: whoever adds one adds it here, and a migration that creates objects ends as migration
0022 does: :func:`apply`, then :func:`pm_vector.db.runs.kinds.grant_answer_tables` for every run
(:func:`apply` revokes the query role's rights on every relation, run tables included).
"""

from __future__ import annotations

import re

from psycopg import sql

from ..run_tables import KIND

QUERY_ROLE = "pm_vector_query"
SCHEMAS = ("pm_vector", "pm_vector_service")
#: the query role's rights on the schemas (the owner has USAGE and CREATE; PUBLIC nothing)
QUERY_SCHEMAS = {"pm_vector": ("USAGE",)}

#: relations the query role reads (or writes) whole: relation -> privileges
QUERY_TABLES: dict[str, tuple[str, ...]] = {
    "pm_vector.alembic_version": ("SELECT",),  # the schema revision: the query pool's readiness check
    "pm_vector.collections": ("SELECT",),
    "pm_vector.embedding_runs": ("SELECT",),
    "pm_vector.anchors": ("SELECT",),  # the public anchor's labels (the anchor document)
    "pm_vector.kahm_item_scores": ("SELECT",),  # stored class scores come back with resolved rows
    "pm_vector.request_log": ("INSERT",),  # a resolve logs itself; it never reads the log
    "pm_vector.request_log_id_seq": ("USAGE",),
    # the delta beside the runs' answers (sql/0023_delta.sql): an answer ranks base minus tombstones with it
    "pm_vector.delta_tombstones": ("SELECT",),
    "pm_vector.delta_entries": ("SELECT",),
}
#: the query role's login on a cluster's shards (the same name: a shard is a server of its own)
SHARD_QUERY_ROLE = QUERY_ROLE
#: its rights on a shard's schema, and on the shard's tables besides the run tables: the run's mirror
#: row (``id``, ``class_rows``: what the shard's statement reads of its run, pm_vector.db.runs.sharding)
SHARD_QUERY_SCHEMAS = {"pm_vector": ("USAGE",)}
SHARD_QUERY_TABLES: dict[str, tuple[str, ...]] = {"pm_vector.embedding_runs": ("SELECT",)}

#: relations the query role reads some columns of: relation -> (privilege, columns)
QUERY_COLUMNS: dict[str, tuple[str, tuple[str, ...]]] = {
    # not features / features_half: raw features only through FEATURES_FUNCTIONS
    "pm_vector.items": ("SELECT", ("id", "collection_id", "external_id", "label", "payload")),
    # which model's scores an answer carries; not the models themselves (weights, privacy records)
    "pm_vector.kahm_models": ("SELECT", ("id", "collection_id", "classes", "kind", "erased_at")),
    # a sharded answer finds each shard's foreign server (and names its address when it fails)
    "pm_vector.shards": ("SELECT", ("name", "server_name", "host", "port")),
}
#: the one way to an item's raw features for the query role (``sql/0022_privileges.sql``), by the
#: collection's feature type: NULL unless its collection allows raw features
FEATURES_FUNCTIONS = {"vector": "pm_vector.pm_item_features", "halfvec": "pm_vector.pm_item_features_half"}
#: functions the query role may execute (every overload of the name); the owner executes all
QUERY_FUNCTIONS: frozenset[str] = frozenset({
    *FEATURES_FUNCTIONS.values(),
    "pm_vector.pm_active_run", "pm_vector.pm_run_table", "pm_vector.pm_run_has_nbrs",
    "pm_vector.pm_check_queries", "pm_vector.pm_prepare_search", "pm_vector.pm_knn_batch",
    "pm_vector.pm_knn_sql", "pm_vector.pm_vector_type", "pm_vector.pm_distance_operator",
    "pm_vector.pm_prepare_prior_search", "pm_vector.pm_restore_prior_search", "pm_vector.pm_prior_weight",
    "pm_vector.pm_shortlist", "pm_vector.pm_shortlist_core", "pm_vector.pm_shortlist_core_sql",
    "pm_vector.pm_shortlist_sql", "pm_vector.pm_shortlist_sharded", "pm_vector.pm_class_rows_run",
    "pm_vector.pm_check_class_rows", "pm_vector.pm_shard_rows", "pm_vector.pm_shard_server",
    "pm_vector.pm_cell_shortlist", "pm_vector.pm_cell_shortlist_core", "pm_vector.pm_cell_shortlist_sql",
    "pm_vector.pm_cell_shortlist_sharded", "pm_vector.pm_shard_reset",
    "pm_vector.pm_location_shortlist", "pm_vector.pm_location_shortlist_core",
})
#: functions the query login on a shard may execute (every overload of the name; on a shard nobody
#: else but the owner, PUBLIC nothing): what the statements a sharded answer sends the shards call
#: there, ``pm_shortlist_core`` (``sql/0011_cluster.sql``) and ``pm_cell_shortlist_core``
#: (``sql/0013_cells.sql``), with every function they call (their statements' texts, the prior
#: search's settings, ``pm_prior_weight`` inside the class-rows statement); granted by
#: ``pm_vector.pm_shard_install`` (:func:`install_on_shards`, ``sql/0030_shard_functions.sql``)
SHARD_QUERY_FUNCTIONS: frozenset[str] = frozenset({
    "pm_vector.pm_shortlist_core", "pm_vector.pm_shortlist_core_sql", "pm_vector.pm_shortlist_sql",
    "pm_vector.pm_run_has_nbrs", "pm_vector.pm_run_table", "pm_vector.pm_prior_weight",
    "pm_vector.pm_prepare_prior_search", "pm_vector.pm_restore_prior_search",
    "pm_vector.pm_cell_shortlist_core", "pm_vector.pm_cell_shortlist_sql",
})

#: every relation of the two schemas besides the run tables (the owner's only unless named above)
RELATIONS: frozenset[str] = frozenset({
    "pm_vector.alembic_version", "pm_vector.anchor_sets", "pm_vector.anchor_sets_id_seq", "pm_vector.anchors",
    "pm_vector.attach_changes", "pm_vector.attach_changes_seq_seq", "pm_vector.attach_rejected",
    "pm_vector.attach_status", "pm_vector.delta_status",
    "pm_vector.collections", "pm_vector.collections_id_seq", "pm_vector.embedding_runs",
    "pm_vector.embedding_runs_id_seq", "pm_vector.ingests", "pm_vector.ingests_id_seq", "pm_vector.items",
    "pm_vector.items_id_seq", "pm_vector.kahm_audits", "pm_vector.kahm_audits_id_seq",
    "pm_vector.kahm_item_scores", "pm_vector.kahm_models", "pm_vector.kahm_models_id_seq",
    "pm_vector.pm_anchor_sets", "pm_vector.pm_collections", "pm_vector.pm_kahm_audits",
    "pm_vector.pm_kahm_models", "pm_vector.pm_requests", "pm_vector.pm_runs", "pm_vector.request_log",
    "pm_vector.request_log_id_seq", "pm_vector.shards",
    "pm_vector_service.api_keys", "pm_vector_service.api_keys_id_seq", "pm_vector_service.jobs",
    "pm_vector_service.query_login",
}) | frozenset(QUERY_TABLES) | frozenset(QUERY_COLUMNS)
#: every function of the two schemas (by name); the owner's only unless in QUERY_FUNCTIONS
FUNCTIONS: frozenset[str] = frozenset({
    # the attached tables' capture (sql/0020_capture.sql): the trigger and event-trigger functions fire,
    # nobody calls them; the rest are the owner's (attach, sync, resync)
    "pm_vector.pm_attach_capture", "pm_vector.pm_attach_capture_make", "pm_vector.pm_attach_check",
    "pm_vector.pm_attach_columns",
    "pm_vector.pm_attach_ddl", "pm_vector.pm_attach_drop_triggers", "pm_vector.pm_attach_dropped",
    "pm_vector.pm_attach_key", "pm_vector.pm_attach_key_types", "pm_vector.pm_attach_mark_broken",
    "pm_vector.pm_attach_readable", "pm_vector.pm_attach_resync", "pm_vector.pm_attach_rewrite",
    "pm_vector.pm_attach_triggers", "pm_vector.pm_attach_truncate_triggers", "pm_vector.pm_attach_table", "pm_vector.pm_build_class_rows_indexes",
    "pm_vector.pm_build_run_indexes", "pm_vector.pm_cells_table_ddl", "pm_vector.pm_check_active_run",
    "pm_vector.pm_check_anchor_rows", "pm_vector.pm_check_item_rows", "pm_vector.pm_check_item_rows_0015",
    "pm_vector.pm_check_run_status", "pm_vector.pm_class_scores", "pm_vector.pm_create_cells_table",
    "pm_vector.pm_create_class_rows_tables", "pm_vector.pm_create_codes_table",
    "pm_vector.pm_create_locations_table", "pm_vector.pm_create_run_tables", "pm_vector.pm_detach_table",
    "pm_vector.pm_drop_run_tables", "pm_vector.pm_drop_run_tables_0011", "pm_vector.pm_drop_run_tables_0013",
    "pm_vector.pm_erased_raw_models", "pm_vector.pm_index_locations_table", "pm_vector.pm_knn", "pm_vector.pm_knn_batch_explain",
    "pm_vector.pm_lock_held", "pm_vector.pm_lock_key", "pm_vector.pm_opclass", "pm_vector.pm_orphan_run_tables",
    "pm_vector.pm_register_shard", "pm_vector.pm_shard_exec", "pm_vector.pm_shard_install",
    "pm_vector.pm_shard_of", "pm_vector.pm_shard_partition", "pm_vector.pm_shard_partitions",
    "pm_vector.pm_shard_reset", "pm_vector.pm_shortlist_explain", "pm_vector.pm_shortlist_shard_explain",
    "pm_vector.pm_shortlist_sql_v1", "pm_vector.pm_unregister_shard", "pm_vector_service.pm_keys_changed",
    # a tombstone's version (sql/0033_tombstone_version.sql): a trigger function, it fires, nobody calls it
    "pm_vector.pm_tombstone_version",
}) | QUERY_FUNCTIONS

#: an attached collection's own capture function, ``pm_attach_capture_<collection id>``
#: (``pm_attach_capture_make``, ``sql/0032_capture_static.sql``): a trigger function, the owner's only
ATTACH_CAPTURE = re.compile(r"^pm_attach_capture_[0-9]+$")

#: a run's table (and a partition, or a shard's foreign table, of it): ``run_<id>_<kind>[_<k>|_at_<shard>]``,
#: a kind of the shape :data:`pm_vector.db.run_tables.KIND` (the kinds: the registry of
#: :mod:`pm_vector.db.runs.kinds`, above this module; which of them the query role reads is its
#: ``answer_tables()``, passed in)
RUN_TABLE = re.compile(rf"^run_(?P<run>[0-9]+)_(?P<kind>{KIND.pattern}?)(?P<part>_[0-9]+|_at_.+)?$")


def expected_relation_rights(schema: str, name: str, answer_tables, kinds) -> tuple[tuple[str, ...], dict | None] | None:
    """The query role's rights on ``schema.name`` as the matrix says: ``(table privileges,
    {privilege: columns} or None)``; None when the matrix does not know the relation (a failure).
    ``kinds``: the kinds of run tables (:data:`pm_vector.db.runs.kinds.KINDS`: a run's table of
    another kind is not in the matrix); ``answer_tables``: those an answer reads
    (:func:`pm_vector.db.runs.kinds.answer_tables`)."""
    q = f"{schema}.{name}"
    if q in RELATIONS:
        cols = QUERY_COLUMNS.get(q)
        return QUERY_TABLES.get(q, ()), ({cols[0]: tuple(sorted(cols[1]))} if cols else None)
    m = RUN_TABLE.match(name) if schema == "pm_vector" else None
    if m is None or m.group("kind") not in kinds:
        return None
    whole = m.group("kind") in answer_tables and m.group("part") is None
    return ("SELECT",) if whole else (), None


def shard_answer_tables(kinds) -> frozenset[str]:
    """The run table kinds a sharded answer reads on a shard: of ``kinds``
    (:data:`pm_vector.db.runs.kinds.KINDS`), those an answer reads that a sharded run keeps on its
    shards."""
    return frozenset(k for k, rt in kinds.items() if rt.answer and rt.where in ("shards", "both"))


def expected_shard_relation_rights(name: str, shard_tables) -> tuple[str, ...] | None:
    """The shard query role's rights on a relation of a shard's schema ``pm_vector`` as the matrix
    says (``shard_tables``: :func:`shard_answer_tables`); None for a relation the matrix does not know."""
    q = f"pm_vector.{name}"
    if q in SHARD_QUERY_TABLES:
        return SHARD_QUERY_TABLES[q]
    m = RUN_TABLE.match(name)
    if m is None or (m.group("part") or "").startswith("_at_"):
        return None
    return ("SELECT",) if m.group("kind") in shard_tables and m.group("part") is None else ()


#: on a shard (through pm_vector.pm_shard_exec, as the owner): SELECT to the shard's query login on
#: those of the named tables that exist there; nothing where the shard has no such role
_SHARD_GRANT = sql.SQL(
    "DO $grant$ DECLARE t text; BEGIN IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {role}) THEN "
    "FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = 'pm_vector' AND c.relname = ANY({names}::text[]) LOOP "
    "EXECUTE format('GRANT SELECT ON TABLE pm_vector.%I TO %I', t, {role}); END LOOP; END IF; END $grant$")


def grant_on_shards(conn, shards: list[str], names: list[str]) -> None:
    """``GRANT SELECT`` to each shard's query login (:data:`SHARD_QUERY_ROLE`) on those of the tables
    ``names`` (of the shard's schema ``pm_vector``) that exist there, in ``conn``'s transaction on the
    coordinator (:func:`_on_shards_as_owner`)."""
    stmt = _SHARD_GRANT.format(role=sql.Literal(SHARD_QUERY_ROLE), names=sql.Literal(list(names))).as_string(conn)
    _on_shards_as_owner(conn, shards, "SELECT pm_vector.pm_shard_exec(%s, %s)", [stmt])


def install_on_shards(conn, shards: list[str]) -> None:
    """``pm_vector.pm_shard_install`` on each shard (``sql/0030_shard_functions.sql``): every
    pm_vector function copied there, none executable by PUBLIC, the shard's query login
    (:data:`SHARD_QUERY_ROLE`) executing :data:`SHARD_QUERY_FUNCTIONS` only; in ``conn``'s
    transaction on the coordinator (:func:`_on_shards_as_owner`)."""
    _on_shards_as_owner(conn, shards, "SELECT pm_vector.pm_shard_install(%s, %s, %s)",
                        [SHARD_QUERY_ROLE, sorted(SHARD_QUERY_FUNCTIONS)])


def schema_owner(conn) -> str:
    """The owner of the schema ``pm_vector``: the role every pm_vector object belongs to (what a
    migration gives :func:`apply`)."""
    return conn.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'pm_vector'").fetchone()[0]


def _on_shards_as_owner(conn, shards: list[str], statement: str, args: list) -> None:
    """``statement`` (its first parameter the shard's name, then ``args``) once per shard, as the
    owner of the schema ``pm_vector``: the shards are reached through the owner's user mapping only
    (``sql/0025_cluster_owner.sql``), so a migration run by a superuser switches to the owner for
    these calls, and back."""
    owner, me, role = conn.execute("SELECT pg_get_userbyid(nspowner), current_user, current_setting('role') "
                                   "FROM pg_namespace WHERE nspname = 'pm_vector'").fetchone()
    if me != owner:
        conn.execute("SELECT set_config('role', %s, true)", [owner])
    try:
        for shard in shards:
            conn.execute(statement, [shard, *args])
    finally:
        if me != owner:
            conn.execute("SELECT set_config('role', %s, true)", [role])


def expected_function_rights(schema: str, name: str) -> tuple[str, ...] | None:
    """The query role's rights on a function as the matrix says; None when it is not in the matrix."""
    q = f"{schema}.{name}"
    if schema == "pm_vector" and ATTACH_CAPTURE.match(name):
        return ()
    if q not in FUNCTIONS:
        return None
    return ("EXECUTE",) if q in QUERY_FUNCTIONS else ()


def apply(conn, owner: str) -> None:
    """Make the catalog say what the matrix says, in ``conn``'s transaction (run by migration 0022
    as the owner or a superuser): every object of the two schemas owned by ``owner``; every right
    of PUBLIC and of the query role revoked, then granted from the matrix (the query role only when it
    exists); EXECUTE on the owner's future functions not granted to PUBLIC; the query role's
    default privileges in the schemas dropped. The run tables' grants are
    :func:`pm_vector.db.runs.kinds.grant_answer_tables`'s (per run, where the job creates them)."""
    ident = sql.Identifier
    own(conn, owner)
    has_query = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [QUERY_ROLE]).fetchone() is not None
    takers = [sql.SQL("PUBLIC")] + ([ident(QUERY_ROLE)] if has_query else [])
    for schema in SCHEMAS:
        for who in takers:
            conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(ident(schema), who))
    for schema, name, kind, _owner in _relations(conn):
        target = sql.SQL("{}.{}").format(ident(schema), ident(name))
        for who in takers:
            conn.execute(sql.SQL("REVOKE ALL ON {} {} FROM {}").format(
                sql.SQL("SEQUENCE" if kind == "S" else "TABLE"), target, who))
        cols = conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                            "AND attacl IS NOT NULL", [target.as_string(conn)]).fetchall()
        for (col,) in cols:
            for who in takers:
                conn.execute(sql.SQL("REVOKE ALL ({}) ON {} FROM {}").format(ident(col), target, who))
    for sig, _owner, prokind in _functions(conn):
        word = sql.SQL("PROCEDURE" if prokind == "p" else "FUNCTION")
        for who in takers:
            conn.execute(sql.SQL("REVOKE ALL ON {} {} FROM {}").format(word, sql.SQL(sig), who))
    _drop_default_grants(conn, owner)
    if not has_query:
        return
    q = ident(QUERY_ROLE)
    for schema, privs in QUERY_SCHEMAS.items():
        conn.execute(sql.SQL("GRANT {} ON SCHEMA {} TO {}").format(_privs(privs), ident(schema), q))
    for rel, privs in QUERY_TABLES.items():
        if conn.execute("SELECT to_regclass(%s) IS NULL", [rel]).fetchone()[0]:
            continue  # (made by a later migration, which applies the matrix again: 0023's delta tables)
        word = "SEQUENCE" if rel.endswith("_seq") else "TABLE"
        conn.execute(sql.SQL("GRANT {} ON {} {} TO {}").format(_privs(privs), sql.SQL(word), _qualified(rel), q))
    for rel, (priv, cols) in QUERY_COLUMNS.items():
        conn.execute(sql.SQL("GRANT {} ({}) ON TABLE {} TO {}").format(
            sql.SQL(priv), sql.SQL(", ").join(map(ident, cols)), _qualified(rel), q))
    for sig, name in conn.execute(
            "SELECT p.oid::regprocedure::text, n.nspname || '.' || p.proname FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ANY(%s)", [list(SCHEMAS)]).fetchall():
        if name in QUERY_FUNCTIONS:
            conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(sig), q))


def own(conn, owner: str) -> None:
    """Hand the two schemas and every relation and function in them to ``owner`` (those it does not
    own yet; a sequence owned by a column follows its table), in the caller's transaction. Never
    ``REASSIGN OWNED``: that would move the role's shared objects (its databases) too."""
    ident = sql.Identifier
    for schema in SCHEMAS:
        conn.execute(sql.SQL("ALTER SCHEMA {} OWNER TO {}").format(ident(schema), ident(owner)))
    for schema, name, kind, rel_owner in _relations(conn):
        if rel_owner != owner and not (kind == "S" and _owned_sequence(conn, schema, name)):
            word = {"v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE", "f": "FOREIGN TABLE"}.get(kind, "TABLE")
            conn.execute(sql.SQL("ALTER {} {}.{} OWNER TO {}").format(sql.SQL(word), ident(schema), ident(name),
                                                                      ident(owner)))
    for sig, fn_owner, prokind in _functions(conn):
        if fn_owner != owner:
            conn.execute(sql.SQL("ALTER {} {} OWNER TO {}").format(
                sql.SQL("PROCEDURE" if prokind == "p" else "FUNCTION"), sql.SQL(sig), ident(owner)))


def _relations(conn) -> list:
    """(schema, name, relkind, owner) of every table, view, sequence and foreign table of the schemas."""
    return conn.execute(
        "SELECT n.nspname, c.relname, c.relkind, pg_get_userbyid(c.relowner) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY(%s) "
        "AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') ORDER BY c.oid", [list(SCHEMAS)]).fetchall()


def _functions(conn) -> list:
    """(signature as regprocedure text, owner, prokind) of every function of the schemas."""
    return conn.execute(
        "SELECT p.oid::regprocedure::text, pg_get_userbyid(p.proowner), p.prokind FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ANY(%s) ORDER BY p.oid",
        [list(SCHEMAS)]).fetchall()


def _owned_sequence(conn, schema: str, name: str) -> bool:
    """A sequence owned by a table column (serial / identity): it follows its table's owner."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = %s::regclass "
                        "AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))",
                        [sql.Identifier(schema, name).as_string(conn)]).fetchone()[0]


def _drop_default_grants(conn, owner: str) -> None:
    """No default privilege on the schemas for anyone (migration 0006 gave the query role SELECT on
    future tables), and the owner's future functions not executable by PUBLIC (a global default:
    PostgreSQL's per-schema defaults can only add to it)."""
    kinds = {"r": "TABLES", "S": "SEQUENCES", "f": "FUNCTIONS", "T": "TYPES", "n": "SCHEMAS"}
    rows = conn.execute(
        "SELECT pg_get_userbyid(d.defaclrole), n.nspname, d.defaclobjtype, "
        "array(SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END "
        "      FROM aclexplode(d.defaclacl) a) FROM pg_default_acl d "
        "JOIN pg_namespace n ON n.oid = d.defaclnamespace WHERE n.nspname = ANY(%s)", [list(SCHEMAS)]).fetchall()
    for role, schema, objtype, grantees in rows:
        for g in set(grantees):
            conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} REVOKE ALL ON {} FROM {}").format(
                sql.Identifier(role), sql.Identifier(schema), sql.SQL(kinds[objtype]),
                sql.SQL("PUBLIC") if g == "PUBLIC" else sql.Identifier(g)))
    conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC").format(
        sql.Identifier(owner)))


def _privs(privs) -> object:
    return sql.SQL(", ").join(sql.SQL(p) for p in privs)


def _qualified(rel: str) -> object:
    schema, name = rel.split(".", 1)
    return sql.Identifier(schema, name)
