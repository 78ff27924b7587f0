"""THE registry of the kinds of per-run tables (``run_<id>_<kind>``), the one list of them.

:data:`KINDS` registers every kind: where a sharded run keeps it (``coordinator``, ``shards`` or
``both``), how an erased item leaves it (:mod:`pm_vector.db.runs.erase`), whether a private answer
reads it (granted to the query role, :func:`grant_answer_tables`), and for a kind a sharded run
keeps on its shards the columns of the coordinator's foreign table and, where the sharded
class-rows write creates it, the shard's DDL. Which kinds a run has follows from the releases it
serves: the kinds their ``derived_tables`` name (:func:`run_kinds`; :mod:`pm_vector.protocol.releases`).
A new kind is one :func:`register_kind` call and a release naming it.

Every list of kinds reads this registry: the erasure and its foreign tables
(:mod:`pm_vector.db.runs.erase`), the shards' DDL, write-side foreign tables, drop and ANALYZE
lists (:mod:`pm_vector.db.runs.sharding`, :func:`written_on_shards`), the cells' foreign table
(:mod:`pm_vector.db.runs.cell_data`) and the grants. It sits below both erase and sharding (erase
reads sharding's fill size), importing neither. The SQL side names a run's table by
``pm_vector.pm_run_table(run_id, kind)``, which checks a kind's shape (:data:`pm_vector.db.run_tables.KIND`,
migration 0026), not a list: the SQL side asks it for seven of the kinds, so a list there was a
second registry that each new kind had to migrate (0005, 0013, 0015 did). The privilege matrix
reads a run's tables by the same shape. The SQL functions that create, index
and drop a run's tables (``pm_create_run_tables``, ``pm_drop_run_tables``, ...) name the tables
they handle one by one, as the Python writers of those tables do.

Tests: ``tests/test_run_kinds.py`` (a release naming an unknown kind is refused; a test-only kind
reaches the erasure, the grants and the shards' table list), ``tests/service/test_release_registry.py``
(a test-only kind erased and granted end to end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from psycopg import sql

from ...protocol.releases import RELEASES
from ..postgres.privileges import QUERY_ROLE, SHARD_QUERY_TABLES, grant_on_shards, shard_answer_tables
from ..run_tables import run_table_name, shard_names


@dataclass(frozen=True)
class RunTable:
    """A kind of per-run table (``run_<id>_<kind>``), named by the releases that need it
    (:attr:`pm_vector.protocol.releases.Release.derived_tables`).

    ``where``: where a sharded run keeps it. ``erase``: how the erased items leave it, a function
    ``(conn, place, plan)`` or the name of one in :mod:`pm_vector.db.runs.erase` (the built-in
    kinds: this module imports nothing of the erasure); None: it holds no items. ``answer``: a
    private answer reads it (the query role gets SELECT on it at the job's switch).
    ``shard_columns``: for a kind kept on shards, the columns of the coordinator's foreign table of
    a shard's table (``{d}``: the run's ``n_components``). ``shard_ddl``: the body of the shard's
    ``CREATE TABLE`` (``{d}`` as above) when the sharded class-rows write creates it
    (:func:`pm_vector.db.runs.sharding.create_tables`; None: another writer creates it, as the
    cells' ``pm_cells_table_ddl``). ``by_class``: on a shard the table is partitioned by label, one
    partition per class the shard holds (``run_<id>_<kind>_<class position>``)."""

    kind: str
    where: str  # "coordinator" | "shards" | "both" (a sharded run's coordinator and its shards)
    erase: Callable[..., None] | str | None
    answer: bool = False
    shard_columns: str | None = None
    shard_ddl: str | None = None
    by_class: bool = False


#: THE registry of the kinds of run tables. Order matters only where the erasure of one reads
#: another: the prior reads the hub counts as they were, so it comes before them. ``anchors``: the
#: public frame (no items); ``items`` (the embeddings): the paper's release and, on a shard, the
#: class rows' fill list; ``prior`` / ``hubs``: the class rows (``neighbors`` too, for runs built
#: before the prior kept its lists); ``codes``: every compact answer; ``cells`` / ``locations``:
#: the cell and location releases.
KINDS: dict[str, RunTable] = {}


def register_kind(rt: RunTable, *, replace: bool = False) -> RunTable:
    """Add a kind of run table to :data:`KINDS` (a test registers its own); its kind must be new
    unless ``replace``."""
    if rt.kind in KINDS and not replace:
        raise ValueError(f"a run table kind {rt.kind!r} is already registered.")
    if rt.where not in ("coordinator", "shards", "both"):
        raise ValueError(f"where must be coordinator, shards or both, not {rt.where!r}.")
    if (rt.shard_columns is None) != (rt.where == "coordinator"):
        raise ValueError(f"run table kind {rt.kind!r}: a kind kept on shards has shard_columns, "
                         "a coordinator's kind none.")
    if rt.shard_ddl is not None and rt.shard_columns is None or rt.by_class and rt.shard_ddl is None:
        raise ValueError(f"run table kind {rt.kind!r}: shard_ddl (and by_class) only for a kind kept on shards.")
    KINDS[rt.kind] = rt
    return rt


def unregister_kind(kind: str) -> None:
    KINDS.pop(kind, None)


for _rt in (
    RunTable("anchors", "coordinator", None, answer=True),
    RunTable("items", "both", "_erase_items", answer=True, shard_columns="item_id bigint",
             shard_ddl="(item_id bigint PRIMARY KEY)"),
    RunTable("codes", "coordinator", "_erase_codes", answer=True),
    RunTable("prior", "shards", "_erase_prior", answer=True,
             shard_columns="item_id bigint, label bigint, coords vector({d}), coords8 float8[], nbrs bigint[], "
                           "nhub float8[]",
             # the single node's layout (migration 0009): each prior row carries its neighbour list and their hubs
             shard_ddl="(item_id bigint NOT NULL, label bigint NOT NULL, coords vector({d}) NOT NULL, "
                       "coords8 float8[] NOT NULL, nbrs bigint[] NOT NULL, nhub float8[] NOT NULL, "
                       "PRIMARY KEY (label, item_id)) PARTITION BY LIST (label)", by_class=True),
    RunTable("neighbors", "shards", "_erase_neighbors", answer=True, shard_columns="item_id bigint, neighbor_id bigint",
             shard_ddl="(item_id bigint NOT NULL, neighbor_id bigint NOT NULL)"),
    RunTable("hubs", "shards", "_erase_hubs", answer=True, shard_columns="label bigint, item_id bigint, hub float8",
             shard_ddl="(label bigint NOT NULL, item_id bigint NOT NULL, hub double precision NOT NULL)"),
    RunTable("cells", "shards", "_erase_cells", answer=True,  # on shards: created by pm_cells_table_ddl (cell_data)
             shard_columns="level integer, label bigint, cell integer, item_ids bigint[], hubs float8[], "
                           "chubs float8[]"),
    RunTable("locations", "coordinator", "_erase_locations", answer=True),
):
    register_kind(_rt)


def _filled(text: str, n_components: int | None) -> sql.Composed:
    return sql.SQL(text).format(**({} if n_components is None else {"d": sql.Literal(int(n_components))}))


def shard_columns(kind: str, n_components: int | None = None) -> sql.Composed:
    """The columns of the coordinator's foreign table of a shard's ``kind`` table (``n_components``:
    the run's, for a kind whose columns have the dimension)."""
    return _filled(KINDS[kind].shard_columns, n_components)


def shard_table_ddl(kind: str, n_components: int) -> sql.Composed:
    """The body of the shard's ``CREATE TABLE`` of ``kind`` (after its name)."""
    return _filled(KINDS[kind].shard_ddl, n_components)


def written_on_shards() -> list[str]:
    """The kinds the sharded class-rows write creates on every shard (those with ``shard_ddl``)."""
    return [k for k, rt in KINDS.items() if rt.shard_ddl is not None]


def run_kinds(doc: Mapping[str, Any] | None) -> list[str]:
    """The kinds of run tables a run with the ``class_rows`` document ``doc`` has: those the releases
    it serves name (:meth:`~pm_vector.protocol.releases.Release.served_by`), in :data:`KINDS`' order.
    Raises ValueError for a kind a release names that :data:`KINDS` does not know."""
    named = {k for rel in RELEASES.values() if rel.served_by(doc) for k in rel.derived_tables}
    unknown = named - set(KINDS)
    if unknown:
        raise ValueError(f"a release names run table kinds the registry does not know: {sorted(unknown)}.")
    return [k for k in KINDS if k in named]


def answer_tables() -> frozenset[str]:
    """The kinds of run tables a private answer reads (:data:`KINDS` with ``answer``): the query
    role (:data:`pm_vector.db.postgres.privileges.QUERY_ROLE`) gets SELECT on these at the job's
    switch (:func:`grant_answer_tables`), never by a default privilege."""
    return frozenset(k for k, rt in KINDS.items() if rt.answer)


def grant_answer_tables(conn, run_id: int) -> list[str]:
    """``GRANT SELECT`` to the query role on the run's :func:`answer_tables` that exist on this node
    (a partition is read through its parent and gets nothing), in the caller's transaction; nothing
    when the role does not exist; on a cluster also each shard's query login's SELECT on the run's
    tables a sharded answer reads there (:func:`~pm_vector.db.postgres.privileges.shard_answer_tables`)
    and on :data:`~pm_vector.db.postgres.privileges.SHARD_QUERY_TABLES`. Returns the tables granted
    on this node."""
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [QUERY_ROLE]).fetchone() is None:
        return []
    names = [run_table_name(run_id, kind) for kind in sorted(answer_tables())]
    found = [r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'pm_vector' AND c.relname = ANY(%s) ORDER BY 1", [names]).fetchall()]
    for name in found:
        conn.execute(sql.SQL("GRANT SELECT ON TABLE {} TO {}").format(sql.Identifier("pm_vector", name),
                                                                       sql.Identifier(QUERY_ROLE)))
    shards = shard_names(conn)  # a cluster: each shard's query login reads what a sharded answer reads there
    if shards:
        grant_on_shards(conn, shards, [run_table_name(run_id, k) for k in sorted(shard_answer_tables(KINDS))] +
                        [rel.split(".", 1)[1] for rel in sorted(SHARD_QUERY_TABLES)])
    return found
