"""Plain pgvector, the system ``pm-vector bench writes`` compares pm_vector with
(:mod:`pm_vector.bench.writes_targets` drives pm_vector): a plain table ``(id bigint PRIMARY KEY, v
vector(dim))`` with an HNSW index (``vector_l2_ops``), single-row commits; its check of a change is
``ORDER BY v <-> q LIMIT k`` with the item's own vector ``q``.
"""

from __future__ import annotations

import time

import numpy as np
from psycopg import sql

import pm_vector.db as db
from . import writes_reuse
from ..db.runs.jobs import index_build_mem_mb
from .writes_targets import Change, copy_rows, vector_text

#: the items of the plain pgvector check's answer (``LIMIT k``), as the private queries' k
K = 8


class PgvectorTarget:
    """Plain pgvector (module doc): the same first ``items`` rows as keys 1..items."""

    system = "pgvector_hnsw"

    def __init__(self, tag: str, X: np.ndarray, items: int, say, source: sql.Composable | None = None):
        self.X, self.items, self.reuse = X, int(items), source is not None
        self.table = sql.Identifier("public", f"bench_writes_pgv_{tag}")
        self._conn = db.connect(autocommit=True)
        self.knn = sql.SQL("SELECT id FROM {} ORDER BY v <-> %s::vector LIMIT {}").format(self.table, sql.Literal(K))
        if self.reuse and self._conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                             [self.table.as_string(self._conn)]).fetchone()[0]:
            t = time.perf_counter()
            got = writes_reuse.align_pgvector(self._conn, self.table, source)
            say(f"pgvector: reusing {self.table.as_string(self._conn)} (--reuse), brought to pm_vector's table: "
                f"{got['deleted']} deleted, {got['written']} written")
            self.setup = {"reused": True, "align_s": round(time.perf_counter() - t, 2), "k": K, **got}
            return
        say(f"pgvector: table and HNSW index on {items:,} rows")
        t = time.perf_counter()
        self._conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, v vector({}))").format(
            self.table, sql.Literal(X.shape[1])))
        if self.reuse:  # (the attached table's rows as they are now: both systems start from them)
            self._conn.execute(sql.SQL("INSERT INTO {} (id, v) SELECT id, embedding FROM {}").format(self.table, source))
        else:
            copy_rows(self._conn, self.table, "v", X[:items])
        load = time.perf_counter() - t
        t = time.perf_counter()
        self._conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(
            sql.Literal(f"{index_build_mem_mb(items, X.shape[1])}MB")))
        self._conn.execute(sql.SQL("CREATE INDEX ON {} USING hnsw (v vector_l2_ops)").format(self.table))
        self._conn.execute(sql.SQL("ANALYZE {}").format(self.table))
        self.setup = {"reused": False, "load_s": round(load, 2), "index_s": round(time.perf_counter() - t, 1), "k": K}

    def start(self) -> None:
        pass

    #: one change a transaction, whatever the stream's batch
    single_row = True

    def stamp(self, batch: list[Change]) -> None:
        pass

    def statements(self) -> dict[str, str]:
        return {"insert": sql.SQL("INSERT INTO {} (id, v) VALUES (%s, %s::vector)").format(self.table).as_string(self._conn),
                "update": sql.SQL("UPDATE {} SET v = %s::vector WHERE id = %s").format(self.table).as_string(self._conn),
                "delete": sql.SQL("DELETE FROM {} WHERE id = %s").format(self.table).as_string(self._conn)}

    def params(self, c: Change) -> list:
        if c.kind == "insert":
            return [c.key, vector_text(self.X[c.row])]
        if c.kind == "update":
            return [vector_text(self.X[c.row]), c.key]
        return [c.key]

    def observe(self, conn, pending: list[Change], n_committed: int) -> list[Change]:
        """One check per pending change: the k nearest of its vector (the new one; a delete's old
        one) hold its key (insert, update) or no longer do (delete)."""
        seen = []
        for c in sorted(pending, key=lambda c: c.commit_t):
            ids = {r[0] for r in conn.execute(self.knn, [vector_text(self.X[c.row])], prepare=True).fetchall()}
            if (c.key not in ids) if c.kind == "delete" else (c.key in ids):
                c.seen_t = time.perf_counter()
                seen.append(c)
        conn.commit()
        return seen

    def query_client(self, seed: int):
        return None

    def query(self, conn, client, x) -> None:
        conn.execute(self.knn, [vector_text(x)], prepare=True).fetchall()
        conn.commit()

    def vacuum(self) -> None:
        """Its table vacuumed now (an HNSW index's vacuum repairs the graph: a minute of a core
        after a stream), so that autovacuum does not pay it in the other system's phase."""
        self._conn.execute(sql.SQL("VACUUM {}").format(self.table))

    def settled(self) -> bool:
        return True

    def status(self) -> dict[str, Any]:
        return {}

    def rows(self) -> int:
        """Its table's rows now."""
        with db.connect() as conn:
            return int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self.table)).fetchone()[0])

    def processes(self) -> list[tuple[int, str, str | None]]:
        """None of its own: its writes are the writer's sessions'."""
        return []

    def busy_spans(self, start: float, end: float) -> list[tuple[float, float]]:
        """No merges: its index takes each change in the writer's own commit."""
        return []

    def engine_figures(self, samples: list[dict]) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        try:
            if not self.reuse:
                self._conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
        finally:
            self._conn.close()
