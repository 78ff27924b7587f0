"""The two systems ``pm-vector bench writes`` drives (:mod:`pm_vector.bench.writes_bench`), each set
up on the same vectors and given the same changes:

* :class:`PmVectorTarget`: a pm_vector collection queried by the location release (its default,
  which uses no label), written through an attached table and the service's sync worker (``path
  "attached"``: the user's table ``(id, embedding, category)`` changed by SQL,
  :class:`~pm_vector.service.sync_worker.SyncWorker` applying the queue in a process of its own
  every ``sync_interval_s``; an attached table needs a label column for the job's frame, so the
  data's 10 cluster groups are its ``category``) or through the Python API (``path "api"``: a
  collection without labels, :func:`pm_vector.db.ingest` then :func:`pm_vector.db.embed_new_items`,
  :func:`pm_vector.db.update_items`, :func:`pm_vector.db.delete_items`); its check of a change
  (:meth:`PmVectorTarget.observe`) is a resolve of the location request of the item's own cell at
  the finest published level with the plan's candidates;
* :class:`~pm_vector.bench.writes_pgvector.PgvectorTarget` (its own module): a plain table ``(id
  bigint PRIMARY KEY, v vector(dim))`` with an HNSW index (``vector_l2_ops``), single-row commits;
  its check is ``ORDER BY v <-> q LIMIT k`` with the item's own vector ``q``.

A change is a :class:`Change`; a target's ``statements`` and ``params`` are the SQL the writer
process commits (:mod:`pm_vector.bench.writes_writer`; ``apply`` commits a batch from this process,
the API path's way), ``stamp`` reads what a change's check needs before its commit, ``observe`` runs
one round of checks over the pending ones and returns those now seen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from psycopg import sql

from ..db.run_tables import run_table
import pm_vector.db as db
from . import writes_reuse
from .._validation import normalize_rows
from ..client.location import PrivateLocationKNN
from ..db.resolve.resolution import public_anchor, resolve
from ..db.runs import delta as _delta
from ..db.core.collection import collection_row
from ..db.runs.jobs import anchor_frame_embed_fn, anchor_frame_extend_fn, index_build_mem_mb
from ..db.runs.merge import rule_of
from ..manifold.public_cells import PublicCells
from ..privacy import secure_generator
from ..privacy.location import plan as location_plan
from ..protocol.location import LocationRequest
from ..protocol.published_codes import unpack
from ..service.settings import ServiceSettings
from ..service.sync_worker import SyncWorker
from .writes_writer import APPLICATION_NAME as WRITER_APP



@dataclass
class Change:
    """One change of the stream: ``kind`` (insert, update or delete), the user's ``key``, ``row`` (the
    data row of its new vector; the old one's for a checked delete, None for an unchecked one),
    ``old_row`` (the vector it replaces or deletes, known for a checked change; None otherwise). Stamped by the systems: ``commit_t`` (``perf_counter`` when its
    transaction's commit returned), ``seen_t`` (when the check that saw it returned), ``old_id`` /
    ``new_id`` (pm_vector's item ids before and after), ``cell`` (the cell its check asks) and ``seq``
    (its place in the stream's commit order); ``checked``: whether its delay is measured (a stream
    checks an even sample of its changes); ``outside_t``: when a check found its new item placed in
    the run and its cell's answer without it (``not_in_answer``: it ranks outside that answer)."""

    kind: str
    key: int
    row: int | None
    old_row: int | None = None
    commit_t: float | None = None
    seen_t: float | None = None
    old_id: int | None = None
    new_id: int | None = None
    cell: int | None = None
    seq: int | None = None
    checked: bool = True
    outside_t: float | None = None


def job_progress(say, t0: float):
    """A job's ``progress(stage, done, total)`` that says each stage as it starts, and when it ends the
    seconds since ``t0`` (the job says nothing else for minutes at 100,000 items)."""
    def report(stage: str, done: int, total: int) -> None:
        if done == 0:
            say(f"  job: {stage} ({time.perf_counter() - t0:.0f} s)")

    return report


def vector_text(v) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


def copy_rows(conn, table: sql.Composable, column: str, X: np.ndarray, y: np.ndarray | None = None) -> None:
    """``X``'s rows into ``table`` as keys 1..n, with ``y`` as ``category`` when given (text COPY:
    the vectors as pgvector text)."""
    cols = [sql.Identifier("id"), sql.Identifier(column)] + ([sql.Identifier("category")] if y is not None else [])
    with conn.cursor().copy(sql.SQL("COPY {} ({}) FROM STDIN").format(table, sql.SQL(", ").join(cols))) as cp:
        for i in range(X.shape[0]):
            cp.write_row((i + 1, vector_text(X[i])) + ((int(y[i]),) if y is not None else ()))


class PmVectorTarget:
    """pm_vector (module doc). ``X``, ``y``: every data row and its group (the first ``items`` are
    the collection's, keys 1..items; ``y`` is the attached table's label column); ``anchor``,
    ``anchor_y``: the public anchor set; ``epsilon``: the plan's and the queries'."""

    system = "pm_vector"
    single_row = False  # (the stream's batch a transaction)

    def __init__(self, tag: str, X: np.ndarray, y: np.ndarray, items: int, anchor: np.ndarray, anchor_y: np.ndarray,
                 *, path: str, epsilon: float, seed: int, sync_interval_s: float, say, reuse: bool = False):
        self.X, self.y, self.items, self.path = X, y, int(items), path
        self.epsilon, self.seed = float(epsilon), int(seed)
        self.sync_interval_s, self.say, self.reuse = float(sync_interval_s), say, bool(reuse)
        self.name = f"bench_writes_{tag}"
        self.table = sql.Identifier("public", f"bench_writes_docs_{tag}")
        self.worker, self.merge_after = None, True
        self.setup: dict[str, Any] = {"path": path, "reused": False}
        self._conn = db.connect(autocommit=True)
        if reuse and writes_reuse.prepared(self._conn, self.name):
            say(f"pm_vector ({path}): reusing the prepared collection {self.name} (--reuse)")
            self.setup["reused"] = True
        else:
            if reuse:
                say(f"pm_vector ({path}): preparing {self.name}, kept for the next run with the same flags (--reuse)")
                db.drop_collection(self.name, missing_ok=True)  # (a set-up cut before its job ended)
                self._conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
            self._build(X, y, items, anchor, anchor_y, path, seed, say)
        self._plan()
        self.ids = {int(k): int(i) for k, i in self._conn.execute(
            "SELECT external_id::bigint, id FROM pm_vector.items WHERE collection_id = %s", [self.cid]).fetchall()}
        self._answers: dict[int, set] = {}  # cell -> the ids of its answer, as read at set-up
        t = time.perf_counter()
        if path == "attached" and self.setup["reused"]:
            self.state = writes_reuse.state(self._conn, self.table, X, items)
            self.setup["state_s"] = round(time.perf_counter() - t, 2)
        else:  # (just built from the first ``items`` rows: nothing to read)
            self.state = writes_reuse.fresh(items)
        self.setup["rows"] = self.state["keys"]
        if self.setup["reused"]:
            say(f"pm_vector: {self.state['keys']:,} rows, {len(self.state['untouched']):,} initial items unchanged")

    def _build(self, X, y, items, anchor, anchor_y, path, seed, say) -> None:
        """The collection set up (module doc), its job run."""
        t = time.perf_counter()
        if path == "attached":
            self._conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding vector({}), category int)"
                                       ).format(self.table, sql.Literal(X.shape[1])))
            copy_rows(self._conn, self.table, "embedding", X[:items], y[:items])
            db.attach_table(self.name, table=self.table.as_string(self._conn), id_column="id",
                            vector_column="embedding", label_column="category")
            labels = anchor_y
        else:
            db.create_collection(self.name, X.shape[1], None)  # no labels: public partitions, fit on the anchor
            labels = None
        db.register_anchor_set(self.name, anchor, labels)
        db.register_anchor_set(self.name, anchor[:300], None if labels is None else labels[:300], role="dummy")
        if path == "api":
            db.ingest(self.name, X[:items], None, external_ids=[str(k) for k in range(1, items + 1)],
                      batch_size=50_000)
        self.setup["load_s"] = round(time.perf_counter() - t, 2)
        say(f"pm_vector ({path}): embedding job on {items:,} items")
        t = time.perf_counter()
        info = db.run_embedding_job(self.name, {"n_components": 16}, seed, embed_fn=anchor_frame_embed_fn,
                                    progress=job_progress(say, t))
        self.setup["job_s"] = round(time.perf_counter() - t, 1)
        self.setup["job_stages_s"] = {k: round(float(v), 1) for k, v in (info.get("timings") or {}).items()
                                      if k.endswith("_s")}

    def _plan(self) -> None:
        """The public location cells and codes, and the check's plan: the finest published level,
        the candidates and code width the public rule gives there (50 kB, no payloads)."""
        info = public_anchor(self.name)[1]
        self.cells = PublicCells.from_dict(info["public_locations"])
        self.widths = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"]).widths_
        self.level = int(max(self.cells.levels_))
        p = location_plan(self.epsilon, n_items=self.items, levels=self.cells.levels_, widths=self.widths,
                          level=self.level)
        self.candidates, self.code_bytes = int(p.candidates), int(p.code_bytes)
        self.cid = int(db.collection_info(self.name)["id"])
        self.setup.update({"level": self.level, "candidates": self.candidates, "code_bytes": self.code_bytes})

    # ------------------------------------------------------------------ the cells and their answers
    def cell_of(self, rows) -> np.ndarray:
        """The cell at the check's level of each data row (the client's :meth:`locate`)."""
        return np.asarray(self.cells.assign(normalize_rows(np.asarray(self.X[rows], np.float64)), 0, self.level))

    def _answer(self, conn, cell: int) -> set:
        """The ids of the answer to the location request of ``cell`` (the check's plan), unlogged."""
        req = LocationRequest(report=int(cell), level=self.level, epsilon=self.epsilon,
                              locations_digest=self.cells.digest(), candidates=self.candidates,
                              code_bytes=self.code_bytes, collection=self.name)
        return set(np.asarray(resolve(self.name, req, conn=conn, log=False)["item_ids"]).astype(np.int64).tolist())

    def answerable(self, keys) -> list[int]:
        """Of ``keys`` (initial items), those whose own cell's answer holds them now: the victims of
        updates and deletes are drawn from these, so that a change's check can see it happen."""
        keys = np.asarray(list(keys), np.int64)
        cells = self.cell_of(keys - 1)
        out = []
        with db.connect() as conn:
            for k, c in zip(keys.tolist(), cells.tolist()):
                if c not in self._answers:
                    self._answers[c] = self._answer(conn, c)
                if self.ids.get(k) in self._answers[c]:
                    out.append(k)
        return out

    # ------------------------------------------------------------------ writes
    def start(self) -> None:
        """The attached path: the service's sync worker started (its background CPUs the service's
        settings: ``PM_VECTOR_SERVICE_BACKGROUND_CPUS``, ``PM_VECTOR_SERVICE_MERGE_CPUS`` and
        ``PM_VECTOR_SERVICE_SYNC_NICE``, recorded in the setup), and warmed by one change (a
        vector set to itself, on a key no stream changes) applied before any stream; again after
        :meth:`quiet` stopped it."""
        if self.path != "attached" or self.worker is not None:
            return

        svc = ServiceSettings.from_env()
        self.worker = SyncWorker(db.database_url(), self.sync_interval_s, background_cpus=svc.background_cpus,
                                 merge_cpus=svc.merge_cpus, sync_nice=svc.sync_nice).start()
        warm = self.items  # the last initial key: never a victim (writes_bench draws them below it)
        self._conn.execute(sql.SQL("UPDATE {} SET embedding = embedding WHERE id = %s").format(self.table), [warm])
        t = time.perf_counter()
        while db.sync_status(self.name)["queued"]:
            if time.perf_counter() - t > 600:
                raise TimeoutError("the sync worker did not apply the warm-up change within 600 s")
            time.sleep(0.2)
        self.setup["warm_sync_s"] = round(time.perf_counter() - t, 2)
        self.setup["sync_worker_leads"] = bool(self.worker.leader)
        self.setup["service"] = {"background_cpus": svc.background_cpus, "merge_cpus": svc.merge_cpus,
                                 "sync_nice": svc.sync_nice}

    def writer(self):
        return db.connect(application_name=WRITER_APP)

    def stamp(self, batch: list[Change]) -> None:
        """What a change's check needs, read before its commit: the key's item now, and the cell of a
        checked change (only a check asks one: no client work for the others)."""
        for c in batch:
            c.old_id = self.ids.get(c.key) if c.kind != "insert" else None
        checked = [c for c in batch if c.checked]
        if checked:
            for c, cell in zip(checked, self.cell_of([c.row for c in checked]).tolist()):
                c.cell = int(cell)

    def statements(self) -> dict[str, str] | None:
        """The SQL of each kind of change on the attached table (None on the API path: the writer
        calls pm_vector itself); :meth:`params` gives a change's parameters."""
        if self.path != "attached":
            return None
        return {"insert": sql.SQL("INSERT INTO {} (id, embedding, category) VALUES (%s, %s::vector, %s)").format(
                    self.table).as_string(self._conn),
                "update": sql.SQL("UPDATE {} SET embedding = %s::vector, category = %s WHERE id = %s").format(
                    self.table).as_string(self._conn),
                "delete": sql.SQL("DELETE FROM {} WHERE id = %s").format(self.table).as_string(self._conn)}

    def params(self, c: Change) -> list:
        if c.kind == "insert":
            return [c.key, vector_text(self.X[c.row]), int(self.y[c.row])]
        if c.kind == "update":
            return [vector_text(self.X[c.row]), int(self.y[c.row]), c.key]
        return [c.key]

    def apply(self, conn, batch: list[Change]) -> None:
        """Commit ``batch`` from this process: one transaction on the attached table; through the API
        one call per kind (ingest, update_items, delete_items), each its own transaction."""
        self.stamp(batch)
        if self.path == "attached":
            todo = self.statements()
            for c in batch:
                conn.execute(todo[c.kind], self.params(c))
            conn.commit()
            now = time.perf_counter()
            for c in batch:
                c.commit_t = now
            return
        self._apply_api(batch)

    def _apply_api(self, batch: list[Change]) -> None:
        ins = [c for c in batch if c.kind == "insert"]
        if ins:
            # the new items are placed in the active run's delta after their commit (its extension)
            got = db.ingest(self.name, self.X[[c.row for c in ins]], None, external_ids=[str(c.key) for c in ins],
                            embed_fn_extend=anchor_frame_extend_fn)
            now = time.perf_counter()
            for c, i in zip(ins, got["item_ids"]):
                c.commit_t, c.new_id = now, int(i)
        upd = [c for c in batch if c.kind == "update"]
        if upd:
            got = db.update_items(self.name, external_ids=[str(c.key) for c in upd],
                                  features=self.X[[c.row for c in upd]])
            now = time.perf_counter()
            for c in upd:
                c.commit_t, c.new_id = now, int(got["item_ids"][c.old_id])
        dele = [c for c in batch if c.kind == "delete"]
        if dele:
            db.delete_items(self.name, external_ids=[str(c.key) for c in dele])
            now = time.perf_counter()
            for c in dele:
                c.commit_t = now

    # ------------------------------------------------------------------ checks and queries
    def observe(self, conn, pending: list[Change], n_committed: int) -> list[Change]:
        """One round of checks (oldest cell first): an insert or update is seen when its new item is in
        its cell's answer (on the attached path its item id is read from ``pm_vector.items``: the key's
        item that is not the old one), a delete when its old item is no longer in its cell's answer.
        Each seen change is stamped with the end of the resolve that saw it.

        On the attached path only the changes the sync has applied are checked: the queue is applied
        in commit order, so of the ``n_committed`` changes (counted before the queue is read) the
        first ``n_committed - queued`` are (:meth:`queued`). The others' answers
        cannot have changed, and building their cells' answers again after every sync would take
        the checks' time (and the machine's) from the sync they wait for."""
        if self.path == "attached":
            applied = n_committed - self.queued(conn)
            pending = [c for c in pending if c.seq < applied]
        need = [c for c in pending if c.kind != "delete" and c.new_id is None]
        if need:
            for key, i in conn.execute("SELECT external_id::bigint, id FROM pm_vector.items WHERE collection_id = %s "
                                       "AND external_id = ANY(%s)", [self.cid, [str(c.key) for c in need]]).fetchall():
                for c in need:
                    if c.key == key and i != c.old_id:
                        c.new_id = int(i)
            conn.commit()
        by_cell: dict[int, list[Change]] = {}
        for c in sorted(pending, key=lambda c: c.commit_t):
            if c.kind == "delete" or c.new_id is not None:
                by_cell.setdefault(c.cell, []).append(c)
        placed = self._placed(conn, [c.new_id for cs in by_cell.values() for c in cs if c.kind != "delete"])
        seen = []
        for cell, cs in by_cell.items():
            ids = self._answer(conn, cell)
            now = time.perf_counter()
            for c in cs:
                if (c.old_id not in ids) if c.kind == "delete" else (c.new_id in ids):
                    c.seen_t = now
                    seen.append(c)
                elif c.kind != "delete" and c.new_id in placed:
                    c.outside_t = now  # placed before this answer was built, and not in it: not_in_answer
                    seen.append(c)
        return seen

    def _placed(self, conn, new_ids: list) -> set:
        """Of ``new_ids``, the items the active run holds now (its items table: placed by the sync, in
        its delta or, after a merge, in its base), read before the answers they are checked in."""
        if not new_ids:
            return set()
        rid = conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE id = %s", [self.cid]).fetchone()[0]
        got = {int(r[0]) for r in conn.execute(sql.SQL("SELECT item_id FROM {} WHERE item_id = ANY(%s)").format(
            run_table(rid, "items")), [[int(i) for i in new_ids]]).fetchall()}
        conn.commit()
        return got

    def query_client(self, seed: int):
        """A private client of the location release (the default plan: 50 kB, the collection's size)."""
        client = PrivateLocationKNN(self.cells, self.epsilon, n_items=self.items, widths=self.widths,
                                    collection=self.name)
        return client._inject_generator(secure_generator(seed))

    def query(self, conn, client, x) -> None:
        """One private query: the client's report of ``x``, resolved (and logged) as the service does."""
        resolve(self.name, client.request(x), conn=conn, log=True)

    def quiet(self, say, timeout_s: float = 3600.0) -> float:
        """Wait until pm_vector does nothing in the background -- its queue applied and no merge
        building (a job of the collection with a live worker) -- then stop its sync worker (which
        would start the next merge: one is due again at once when the changes made during a merge
        reach its threshold), so that the other system's phase has the machine to itself;
        :meth:`start` starts it again. Returns the seconds waited."""
        t = time.perf_counter()
        said = t
        while True:
            busy = self._conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pm_vector.pm_runs WHERE collection = %s AND status = 'running' "
                "AND worker_alive)", [self.name]).fetchone()[0]
            if not busy and self.settled():
                if self.worker is not None:
                    self.worker.stop()
                    self.worker = None
                return round(time.perf_counter() - t, 1)
            if time.perf_counter() - t > timeout_s:
                raise TimeoutError(f"pm_vector was still busy (its merge or its queue) after {timeout_s:g} s")
            if time.perf_counter() - said > 30:
                said = time.perf_counter()
                say(f"pm_vector: waiting for its merge and queue before the other system's phase "
                    f"({said - t:.0f} s)")
            time.sleep(1.0)

    def vacuum(self) -> None:
        """The tables pm_vector's writes churn vacuumed now (the attached table, its queue, the items,
        the delta and the active run's items and codes), so that their debt is not paid by
        autovacuum in the other system's phase."""
        rid = self._conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE id = %s",
                                 [self.cid]).fetchone()[0]
        names = [self.table] + [sql.Identifier("pm_vector", t) for t in
                                ("attach_changes", "items", "delta_entries", "delta_tombstones")]
        if rid is not None:
            names += [run_table(rid, "items"), run_table(rid, "codes")]
        for t in names:
            if self._conn.execute("SELECT to_regclass(%s) IS NOT NULL", [t.as_string(self._conn)]).fetchone()[0]:
                self._conn.execute(sql.SQL("VACUUM {}").format(t))

    def queued(self, conn) -> int:
        """The changes queued and not yet applied (``pm_vector.attach_status``), read on ``conn``: a
        check round asks it each time, and :func:`pm_vector.db.sync_status` opens a connection per
        call (40 a second from two checkers: a server process forked for each, on the cores the
        writer and the sync need)."""
        n = conn.execute("SELECT queued FROM pm_vector.attach_status WHERE collection = %s", [self.name]).fetchone()
        conn.commit()
        return int(n[0]) if n else 0

    def settled(self) -> bool:
        """Whether every committed change is applied: the queue empty on the attached path."""
        return self.path != "attached" or db.sync_status(self.name)["queued"] == 0

    def status(self) -> dict[str, Any]:
        """A sample of what the engine says of its pending writes: today
        :func:`pm_vector.db.sync_status` on the attached path (nothing on the API path)."""
        if self.path != "attached":
            return {}
        s = db.sync_status(self.name)
        return {"queued": s["queued"], "lag_s": s["lag_s"] or 0.0}

    def rows(self) -> int:
        """The collection's items now (``pm_vector.items``: on the attached path, the table's rows its
        sync has applied)."""
        with db.connect() as conn:
            return int(conn.execute("SELECT count(*) FROM pm_vector.items WHERE collection_id = %s",
                                    [self.cid]).fetchone()[0])

    def processes(self) -> list[tuple[int, str, str | None]]:
        """The processes of its own that run beside the bench's, for :meth:`pm_vector.bench.machine.CpuParts.process`:
        the sync worker's process, the merges it starts below it."""
        pid = self.worker.process_pid if self.worker is not None else None
        return [] if pid is None else [(pid, "sync", "merge")]

    def busy_spans(self, start: float, end: float) -> list[tuple[float, float]]:
        """The collection's runs (its merges, and any job) that were building between the epoch
        seconds ``start`` and ``end``, each ``(started_at, finished_at)`` in epoch seconds (a run
        still building ends now)."""
        with db.connect() as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM r.started_at), extract(epoch FROM coalesce(r.finished_at, clock_timestamp())) "
                "FROM pm_vector.embedding_runs r JOIN pm_vector.collections c ON c.id = r.collection_id "
                "WHERE c.name = %s AND r.started_at < to_timestamp(%s) "
                "AND coalesce(r.finished_at, clock_timestamp()) > to_timestamp(%s) ORDER BY r.started_at",
                [self.name, end, start]).fetchall()
        return [(float(a), float(b)) for a, b in rows]

    def engine_figures(self, samples: list[dict]) -> dict[str, Any]:
        """pm_vector's own figures of a stream, from its status samples: ``delta_size``, the delta's
        rows when the stream ends (new items' entries and tombstones,
        :func:`pm_vector.db.runs.delta.status`), and ``merge_s``, the bulk merge of that delta
        (:func:`pm_vector.db.merge`, timed here; queries keep running on the previous base); and
        ``merge_rule``, the collection's rule in force (``pm-vector db merge-rule``)."""
        with db.connect() as conn:
            st = _delta.status(conn, self.name)
            rule = rule_of(collection_row(conn, self.name)["settings"])
        delta_size = None if st is None else int(st["delta_items"] or 0) + int(st["pending_purge"] or 0)
        merge_s = None
        if self.merge_after:  # (--no-merge: none; the service's worker merges when it is due)
            t = time.perf_counter()
            db.merge(self.name, embed_fn=anchor_frame_embed_fn, embed_fn_extend=anchor_frame_extend_fn)
            merge_s = round(time.perf_counter() - t, 2)
        out: dict[str, Any] = {"merge_s": merge_s, "delta_size": delta_size, "merge_rule": rule}
        if samples and self.path == "attached":
            q = [s["queued"] for s in samples]
            lag = [s["lag_s"] for s in samples]
            out["sync_status"] = {"queued_max": int(max(q)), "queued_end": int(q[-1]),
                                  "lag_s_p50": round(float(np.median(lag)), 2),
                                  "lag_s_p99": round(float(np.percentile(lag, 99)), 2)}
        return out

    def close(self) -> None:
        try:
            if self.worker is not None:
                self.worker.stop()
            if self.reuse:
                return  # kept for the next run with the same flags (writes_reuse)
            db.drop_collection(self.name, missing_ok=True)
            self._conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self.table))
        finally:
            self._conn.close()
