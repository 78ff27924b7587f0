"""An attached table receiving a stream of changes during ``pm-vector bench load`` (``--changes-rate``).

:class:`ChangeStream` makes a user's table of ``items`` rows with a ``vector(dim)`` column, attaches
it as a collection of its own (anchor sets registered, the default job run), and while the load runs
commits ``rate`` changes a second to it, one by one (the mix of
:class:`pm_vector.bench.attach_bench.Changes`: inserts, vector updates, payload updates, deletes).
The service's sync worker applies them; nothing here syncs. Meanwhile a sampler reads the collection's
``lag_s`` from :func:`pm_vector.db.sync_status` every ``sample_s`` seconds (0 when nothing is queued)
and its queue length, from which each change's delay from its commit to the sync that applied it
(the sync's commit: from then on answers carry it) follows, to within ``sample_s``: changes are
applied in order, so when ``n`` changes were committed and ``q`` are queued, the first ``n - q`` are
applied (``n`` read before ``q``: a change committed in between only makes the count smaller).
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
import uuid
from typing import Any, Callable

import numpy as np
from psycopg import sql

import pm_vector.db as db
from ..db.runs.jobs import anchor_frame_embed_fn
from ..db.store.attach import sync_status
from .attach_bench import Changes
from .latency import N_FINE, clustered


def _pct(v: list[float], q: float) -> float | None:
    return round(float(np.percentile(v, q)), 2) if v else None


class ChangeStream:
    """``with ChangeStream(items, dim, rate) as cs: cs.warm(); cs.start(); ...; cs.stop()`` (module doc;
    ``with`` is :meth:`prepare`, then :meth:`close`)."""

    def __init__(self, items: int = 20_000, dim: int = 128, rate: float = 5.0, *, sample_s: float = 0.25,
                 seed: int = 0, say: Callable[[str], None] = lambda m: None):
        if int(items) < 100 or int(dim) < 2 or float(rate) <= 0 or float(sample_s) <= 0:
            raise ValueError("the attached table needs at least 100 items, 2 dimensions, a positive rate of "
                             "changes and a positive sampling period.")
        self.items, self.dim, self.rate, self.sample_s = int(items), int(dim), float(rate), float(sample_s)
        self.seed, self.say = int(seed), say
        tag = uuid.uuid4().hex[:8]
        self.table, self.name = f"public.bench_load_docs_{tag}", f"bench_load_attached_{tag}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.commits: list[float] = []  # each change's commit (perf_counter)
        self.samples: list[tuple[float, float, int]] = []  # (when, lag_s or 0, queued)
        self.errors: list[str] = []
        self.prepare_s: float | None = None
        self._conn = None
        self._t0 = time.perf_counter()

    # ----------------------------------------------------------------------------- set-up
    def __enter__(self) -> "ChangeStream":
        return self.prepare()

    def __exit__(self, *exc) -> None:
        self.close()

    def prepare(self) -> "ChangeStream":
        """The table made, filled and attached, its anchor sets registered and the default job run."""
        t0 = time.perf_counter()
        classes = 10
        X, y = clustered(self.items + 20_000, self.dim, N_FINE, seed=self.seed + 2)
        y = y // (N_FINE // classes)
        vec = lambda v: "[" + ",".join(f"{x:.6f}" for x in v) + "]"  # noqa: E731
        self._conn = db.connect(autocommit=True)
        table = sql.Identifier(*self.table.split("."))
        self._conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding vector({}), category int, "
                                   "title text)").format(table, sql.Literal(int(self.dim))))
        with self._conn.cursor().copy(sql.SQL("COPY {} (id, embedding, category, title) FROM STDIN").format(table)) as cp:
            for i in range(self.items):
                cp.write_row((i + 1, vec(X[i]), int(y[i]), f"doc {i + 1}"))
        db.attach_table(self.name, table=self.table, id_column="id", vector_column="embedding",
                        label_column="category", payload_columns=["title"])
        Xa, ya = clustered(1000, self.dim, N_FINE, seed=self.seed + 1)
        db.register_anchor_set(self.name, Xa, ya // (N_FINE // classes))
        db.register_anchor_set(self.name, Xa[:300], ya[:300] // (N_FINE // classes), role="dummy")
        db.run_embedding_job(self.name, {"n_components": 16}, self.seed, embed_fn=anchor_frame_embed_fn)
        self._changes = Changes(self.table, X, y, self.items, np.random.default_rng(self.seed + 5), vec)
        self.prepare_s = round(time.perf_counter() - t0, 1)
        self.say(f"attached table {self.table} ({self.items} rows of vector({self.dim})) as {self.name}, "
                 f"embedded in {self.prepare_s:.1f} s")
        return self

    def close(self) -> None:
        """The stream stopped, the collection and the table dropped."""
        self.stop()
        if getattr(self, "_conn", None) is None:
            return
        try:
            db.drop_collection(self.name, missing_ok=True)
            self._conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(*self.table.split("."))))
        finally:
            self._conn.close()

    def _status(self) -> dict[str, Any]:
        return sync_status(self.name)

    def warm(self, timeout: float = 600.0) -> float:
        """One change, then wait until the service's sync worker applied it (its first sync reads the
        run's items; the stream should not time that). Returns the seconds it took."""
        t0 = time.perf_counter()
        self._changes.one(self._conn)
        while self._status()["queued"]:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"the service did not sync {self.name} within {timeout:g} s: is its sync worker on "
                                   "(PM_VECTOR_SERVICE_SYNC_INTERVAL_S > 0)?")
            time.sleep(0.2)
        return round(time.perf_counter() - t0, 2)

    # ----------------------------------------------------------------------------- the stream
    def _writer(self) -> None:
        w = db.connect(autocommit=True)
        try:
            t_start, k = time.perf_counter(), 0
            while not self._stop.is_set():
                due = t_start + k / self.rate
                if time.perf_counter() < due:
                    self._stop.wait(due - time.perf_counter())
                    continue
                k += 1
                try:
                    self._changes.one(w)
                    self.commits.append(time.perf_counter())
                except Exception as exc:  # noqa: BLE001 - counted
                    self.errors.append(f"write: {exc}")
        finally:
            w.close()

    def _sampler(self) -> None:
        while not self._stop.wait(self.sample_s):
            self._sample()

    def _sample(self) -> None:
        n = len(self.commits)  # before the status: a change committed in between only adds to the queue
        try:
            st = self._status()
        except Exception as exc:  # noqa: BLE001 - counted
            self.errors.append(f"status: {exc}")
            return
        self.samples.append((time.perf_counter(), float(st["lag_s"] or 0.0), max(0, n - int(st["queued"]))))

    def start(self) -> None:
        """Start the writer and the sampler (a new stream: the figures of the last one are dropped)."""
        self._stop.clear()
        self.commits, self.samples, self.errors = [], [], []
        self._t0 = time.perf_counter()
        self._threads = [threading.Thread(target=self._writer, name="bench-load-writer", daemon=True),
                         threading.Thread(target=self._sampler, name="bench-load-lag", daemon=True)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)
        self._threads = []

    def drain(self, timeout: float = 120.0) -> None:
        """After :meth:`stop`: keep sampling until the queue is empty (the last changes' delays)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            self._sample()
            if self.samples and self.samples[-1][2] >= len(self.commits):
                return
            time.sleep(self.sample_s)

    def report(self) -> dict[str, Any]:
        """``changes``, ``lag_s`` (p50 / p99 / max of the samples during the stream), ``delay_s`` (each
        change's commit to its sync, p50 / p99 / max; ``unapplied``: changes still queued at the end),
        ``errors``."""
        during = [lag for t, lag, _ in self.samples if t <= (self.commits[-1] if self.commits else self._t0)]
        delays, j = [], 0
        for i, c in enumerate(self.commits):
            while j < len(self.samples) and (self.samples[j][2] <= i or self.samples[j][0] < c):
                j += 1
            if j < len(self.samples):
                delays.append(self.samples[j][0] - c)
        return {"collection": self.name, "items": self.items, "dim": self.dim, "rate": self.rate,
                "changes": len(self.commits), "samples": len(during), "sample_s": self.sample_s,
                "lag_s": {"p50": _pct(during, 50), "p99": _pct(during, 99), "max": _pct(during, 100)},
                "delay_s": {"p50": _pct(delays, 50), "p99": _pct(delays, 99), "max": _pct(delays, 100),
                            "unapplied": len(self.commits) - len(delays)},
                "errors": len(self.errors), "error_samples": self.errors[:3]}


def _spin(stop) -> None:
    """Pure Python until ``stop``: a busy service thread (holding the GIL) or process."""
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i * i


def pass_beside(items: int = 20_000, dim: int = 128, changes: int = 5, rounds: int = 3,
                say: Callable[[str], None] = lambda m: None) -> list[dict[str, Any]]:
    """One sync of ``changes`` changes timed three ways in turn, ``rounds`` times: alone, beside a
    thread of this process spinning Python (the GIL shared: a sync thread in a busy service
    process), beside a process spinning Python (the CPU shared only). Each row: the wall seconds
    and the syncing thread's CPU seconds. Why the service's sync passes run in a process of their
    own (:class:`pm_vector.service.sync_worker.SyncProcess`)."""
    ctx = mp.get_context("spawn")
    rows = []
    with ChangeStream(items, dim, 5.0, say=say) as cs:
        cs._changes.one(cs._conn)
        db.sync(cs.name)  # warm: the run's items kept
        for rnd in range(int(rounds)):
            for mode in ("alone", "beside_a_thread", "beside_a_process"):
                stop = threading.Event() if mode == "beside_a_thread" else ctx.Event()
                bg = (threading.Thread(target=_spin, args=(stop,)) if mode == "beside_a_thread" else
                      ctx.Process(target=_spin, args=(stop,)) if mode == "beside_a_process" else None)
                if bg is not None:
                    bg.start()
                    time.sleep(1.0)
                for _ in range(int(changes)):
                    cs._changes.one(cs._conn)
                w, c = time.perf_counter(), time.thread_time()
                got = db.sync(cs.name)
                rows.append({"round": rnd + 1, "mode": mode, "applied": got["applied"],
                             "wall_s": round(time.perf_counter() - w, 3), "cpu_s": round(time.thread_time() - c, 3)})
                if bg is not None:
                    stop.set()
                    bg.join()
                say(str(rows[-1]))
    return rows


if __name__ == "__main__":  # python -m pm_vector.bench.load_changes [ITEMS [ROUNDS]]
    import json
    import sys

    args = [int(a) for a in sys.argv[1:3]]
    print(json.dumps(pass_beside(args[0] if args else 20_000, rounds=args[1] if len(args) > 1 else 3,
                                 say=lambda m: print(m, file=sys.stderr))))
