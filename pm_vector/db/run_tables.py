"""The ONE home of a run's table names (issue #37, build item 5): ``pm_vector.run_<id>_<kind>`` (and a
shard's foreign table ``pm_vector.run_<id>_<kind>_at_<shard>``) as a ``psycopg.sql.Identifier``, so a
statement that reads or writes a run's table is built from parts (``sql.SQL("... {} ...").format(
run_table(rid, "items"))``), never pasted. The kinds are the registry of
:data:`pm_vector.db.runs.kinds.KINDS` (the kinds of run tables); ``sql/``'s
plpgsql names them the same way (``pm_vector.pm_run_table``, ``format('%I')``).

A leaf below :mod:`pm_vector.db.store`, :mod:`pm_vector.db.runs`, :mod:`pm_vector.db.resolve` and the
benchmarks: it imports nothing of pm_vector."""

from __future__ import annotations

import re

from psycopg import sql

SCHEMA = "pm_vector"
#: the shape of a run table's kind (the kinds themselves: :data:`pm_vector.db.runs.kinds.KINDS`); the
#: SQL side's ``pm_vector.pm_run_table`` checks the same shape (migration 0026), the privilege
#: matrix reads a run's tables by it (:data:`pm_vector.db.postgres.privileges.RUN_TABLE`)
KIND = re.compile(r"[a-z][a-z0-9_]{0,39}")


def run_table_name(run_id: int, kind: str, shard: str | None = None) -> str:
    """The table's name in :data:`SCHEMA` (unquoted: a ``relname``, a SQLAlchemy table's name)."""
    if not KIND.fullmatch(kind):
        raise ValueError(f"not a run table kind: {kind!r}")
    name = f"run_{int(run_id)}_{kind}"
    return name if shard is None else f"{name}_at_{shard}"


class TableName(sql.Identifier):
    """A ``sql.Identifier`` that is hashable (equal names, equal hashes), so that what a process holds
    per table (:mod:`pm_vector.db.runs.deferral`'s rows, a cache) can be keyed by the table itself."""

    def __hash__(self) -> int:
        return hash(self._obj)

    @property
    def relname(self) -> sql.Identifier:
        """The table's name without its schema (as ``FOR UPDATE OF`` takes it)."""
        return sql.Identifier(self._obj[-1])


def run_table(run_id: int, kind: str, shard: str | None = None) -> TableName:
    """``pm_vector.run_<id>_<kind>`` (a shard's foreign table ``..._at_<shard>``) as an identifier."""
    return TableName(SCHEMA, run_table_name(run_id, kind, shard))


def run_index(run_id: int, name: str) -> sql.Identifier:
    """An index or constraint of a run's table, ``run_<id>_<name>`` (unqualified, as ``CREATE INDEX``
    and ``ADD CONSTRAINT`` take it)."""
    return sql.Identifier(run_table_name(run_id, name))


def run_table_exists(conn, run_id: int, kind: str, shard: str | None = None) -> bool:
    """Does the table exist (a foreign table of a shard included)?"""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                        "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s)",
                        [SCHEMA, run_table_name(run_id, kind, shard)]).fetchone()[0]


def drop_superseded_run(conn, coll_id: int, run_id: int) -> None:
    """Drop the tables of a run its collection no longer serves (``pm_vector.pm_drop_run_tables``), in
    the caller's transaction, holding the collection's row as a write does (``FOR NO KEY UPDATE``):
    a sync batch or a delete that read the collection's runs with tables (to tombstone or erase in
    each) finishes first, and the next reads them after the drop, so none reaches a table dropped
    under it (a sync pass failed so, ``UndefinedTable``, twice in ten minutes of a stream with merges).
    The writes wait for the drop only: a few tens of milliseconds."""
    conn.execute("SELECT 1 FROM pm_vector.collections WHERE id = %s FOR NO KEY UPDATE", [int(coll_id)])
    conn.execute("SELECT pm_vector.pm_drop_run_tables(%s)", [int(run_id)])


def create_foreign_table(conn, run_id: int, kind: str, shard: str, columns: sql.Composable,
                         batch_size: int | None = None, *, replace: bool = True) -> sql.Identifier:
    """The coordinator's foreign table of a shard's run table (``run_<id>_<kind>_at_<shard>`` on the
    shard's server ``pm_shard_<shard>``), in the caller's transaction: dropped first when ``replace``,
    else created only when missing. Returns its name."""
    ft = run_table(run_id, kind, shard)
    if replace:
        conn.execute(sql.SQL("DROP FOREIGN TABLE IF EXISTS {}").format(ft))
    opts = sql.SQL("schema_name {}, table_name {}").format(sql.Literal(SCHEMA), sql.Literal(run_table_name(run_id, kind)))
    if batch_size is not None:
        opts = sql.SQL("{}, batch_size {}").format(opts, sql.Literal(str(int(batch_size))))
    conn.execute(sql.SQL("CREATE FOREIGN TABLE {}{} ({}) SERVER {} OPTIONS ({})").format(
        sql.SQL("") if replace else sql.SQL("IF NOT EXISTS "), ft, columns, sql.Identifier(f"pm_shard_{shard}"), opts))
    return ft


def drop_foreign_table(conn, run_id: int, kind: str, shard: str) -> None:
    """Drop the coordinator's foreign table of a shard's run table, if any."""
    conn.execute(sql.SQL("DROP FOREIGN TABLE IF EXISTS {}").format(run_table(run_id, kind, shard)))


def on_shard(conn, statements: list[sql.Composable]) -> str:
    """Statements for ``pm_vector.pm_shard_exec`` (which takes one text), each built from parts."""
    return sql.SQL("; ").join(statements).as_string(conn)


def shard_names(conn) -> list[str]:
    """Registered shards in name order (empty on a single node)."""
    try:
        return [r[0] for r in conn.execute("SELECT name FROM pm_vector.shards ORDER BY name").fetchall()]
    except Exception:  # noqa: BLE001 - schema before 0011: no shards table, a single node
        conn.rollback()
        return []
