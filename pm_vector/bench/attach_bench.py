"""The attached-table benchmark: a user's table of ``items`` rows with a ``vector(dim)`` column.

``python -m pm_vector.bench.attach_bench --items 100000 --dim 128 --rate 100 --seconds 60`` (``--rate 10,20,40``: a
stream at each rate, one after the other)

* ``attach_s``, ``job_s``, ``first_answer_s``: from ``attach_table`` to the first private answer
  (the anchor set registered in between, the default job);
* ``sizes``: the user's table and pm_vector's items rows of the collection (no feature column set);
* with ``--batch-sizes``: ``batch_s``, one sync of that many changes timed (``--repeats`` times, the
  median), the cost of a batch apart from the stream's rhythm; with ``--compare-kept-rows``, each
  beside a batch of the same size synced without the rows kept from the batch before
  (``without_kept_rows``), and each stream run twice, first without them (``kept_rows``);
* then, per rate of ``--rate`` (several, comma-separated: one stream after the other, on the same
  table), ``rate`` changes a second (inserts, vector updates, payload updates and deletes, mixed) for
  ``seconds`` seconds, committed one by one by a writer thread, while a sync loop applies the queue
  and private queries are answered; in ``streams``, each stream's ``delay_s`` p50 / p99 from each
  change's commit to the commit of the sync that applied it (the first sync that started after
  it), ``sync_s`` (the syncs that applied changes: seconds p50 and max, changes p50), ``queries``
  (the private queries answered meanwhile, in the same process, and their p50 / p99 ms), ``errors``,
  and the count check (items = valid rows of the table, queue empty, no external id twice).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import threading
import time
import uuid

import numpy as np
from psycopg import sql

import pm_vector.db as db
from ..client.query import PrivateKNN
from ..db.resolve.resolution import class_frames, resolve
from ..db.runs import row_cache
from ..db.runs.jobs import anchor_frame_embed_fn
from ..db.store.attach import sync_status
from ..privacy import secure_generator
from .latency import N_FINE, clustered


def _sizes_mb(conn, table: str, name: str) -> dict:
    """The user's table and pm_vector's item rows (MB), and how many items' features pm_vector stores."""
    return {
        "user_table": round(conn.execute("SELECT pg_total_relation_size(%s::regclass)", [table]).fetchone()[0]
                            / 2**20, 1),
        "pm_vector_items_rows": round(conn.execute(
            "SELECT sum(pg_column_size(i.*)) FROM pm_vector.items i JOIN pm_vector.collections c ON "
            "c.id = i.collection_id WHERE c.name = %s", [name]).fetchone()[0] / 2**20, 1),
        "features_stored_by_pm_vector": int(conn.execute(
            "SELECT count(*) FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
            "WHERE c.name = %s AND num_nonnulls(i.features, i.features_half) > 0", [name]).fetchone()[0])}


class Changes:
    """The mix of changes to the user's table: 30 % inserts, 30 % vector updates, 20 % payload
    updates, 20 % deletes, of live rows chosen at random."""

    def __init__(self, table: str, X, y, items: int, rng, vec):
        self.ident = table_ident(table)
        self.table, self.X, self.y, self.items, self.rng, self.vec = table, X, y, items, rng, vec
        self.nxt, self.live = items, list(range(1, items + 1))

    def one(self, w) -> None:
        r, t, rng = self.rng.random(), self.ident, self.rng
        if r < 0.3:
            w.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s::vector, %s, 'new')").format(t),
                      [self.nxt + 1, self.vec(self.X[self.nxt]), int(self.y[self.nxt])])
            self.nxt += 1
            self.live.append(self.nxt)
        elif r < 0.6:
            i = self.live[int(rng.integers(len(self.live)))]
            w.execute(sql.SQL("UPDATE {} SET embedding = %s::vector WHERE id = %s").format(t),
                      [self.vec(self.X[int(rng.integers(self.items))]), i])
        elif r < 0.8:
            i = self.live[int(rng.integers(len(self.live)))]
            w.execute(sql.SQL("UPDATE {} SET title = 'edited' WHERE id = %s").format(t), [i])
        else:
            i = self.live.pop(int(rng.integers(len(self.live))))
            w.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(t), [i])


def table_ident(table: str) -> sql.Identifier:
    """The benchmark's table ``schema.name`` (a name it made: no dot or quote inside a part) as an identifier."""
    return sql.Identifier(*table.split("."))


def _batches(name: str, stream: Changes, sizes: list[int], repeats: int, say, compare_kept: bool = False) -> dict:
    """Each batch size ``repeats`` times: that many changes committed, then one ``db.sync`` timed
    (the first sync warms the process's caches and is not counted). Returns size -> seconds.
    ``compare_kept``: each timed sync follows one of the same size timed without the rows the
    process kept from its batch before (:mod:`pm_vector.db.runs.row_cache` emptied first), given
    beside as ``without_kept_rows``."""
    w = db.connect(autocommit=True)
    out: dict = {}

    def timed(n: int) -> float:
        for _ in range(n):
            stream.one(w)
        t = time.perf_counter()
        got = db.sync(name)
        s = round(time.perf_counter() - t, 2)
        if got["applied"] != n:
            raise RuntimeError(f"a batch of {n} changes applied {got['applied']}")
        return s

    try:
        stream.one(w)
        db.sync(name)  # warm: the run's items cached, the anchor frame fit
        for n in sizes:
            runs, cold = [], []
            for _ in range(repeats):
                if compare_kept:
                    row_cache.forget()
                    cold.append(timed(n))
                runs.append(timed(n))
            out[str(n)] = {"median_s": float(np.median(runs)), "runs": runs}
            say(f"batch of {n:>4} changes: median {np.median(runs):.2f} s  {runs}")
            if compare_kept:
                out[str(n)]["without_kept_rows"] = {"median_s": float(np.median(cold)), "runs": cold}
                say(f"  without the kept rows: median {np.median(cold):.2f} s  {cold}")
    finally:
        w.close()
    return out


def _make_client(name: str, anchor_X, anchor_y, seed: int):
    """The bench's private client (a class-rows release at eps 4) of the collection's public anchor."""
    return PrivateKNN(class_frames(name), np.asarray(anchor_X, np.float64), np.asarray(anchor_y), epsilon=4.0,
                      collection=name)._inject_generator(secure_generator(seed))


def _ask(name: str, client, X, y, rng, stop, answered: list, errors: list) -> None:
    """Private queries of random rows of ``X``, one every 50 ms after the last answer, until ``stop``."""
    while not stop.is_set():
        try:
            i = int(rng.integers(X.shape[0]))
            t = time.perf_counter()
            resolve(name, client.request(np.asarray(X[i], np.float64), int(y[i]))[0], log=False)
            answered.append(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - counted
            errors.append(f"query: {exc}")
        time.sleep(0.05)


def _query_process(name: str, anchor_X, anchor_y, X, y, seed: int, stop, ready, out) -> None:
    """The querier in a process of its own (``queries_in="process"``): as the service answers while
    ``pm-vector sync`` applies the changes in another process."""
    answered: list = []
    errors: list = []
    try:
        client = _make_client(name, anchor_X, anchor_y, seed)
    except Exception as exc:  # noqa: BLE001 - counted
        ready.set()
        out.put(([], [f"query client: {exc}"]))
        return
    ready.set()
    _ask(name, client, X, y, np.random.default_rng(seed), stop, answered, errors)
    out.put((answered, errors))


def _change_stream(name: str, stream: Changes, rate: float, seconds: float, client, X, y, items: int, rng,
                   queries_in: str = "thread", anchor=None, seed: int = 0):
    """For ``seconds``: a writer changing the user's table at ``rate`` changes/s (inserts, embedding
    and title updates, deletes), a querier resolving requests (a thread of this process, or with
    ``queries_in="process"`` a process of its own, with ``anchor``'s client), and this thread syncing
    the collection until the writer stops and nothing is pending. Returns (the commits, the syncs'
    (start, end, changes applied), the errors, the changes applied, each answered query's seconds)."""
    commits: list[tuple[float, str]] = []
    syncs: list[tuple[float, float, int]] = []  # (start, end, changes applied) of each sync
    errors: list[str] = []
    answered: list[float] = []  # each query's seconds
    stop = threading.Event()

    def writer():
        w = db.connect(autocommit=True)
        t_start = time.perf_counter()
        k = 0
        while time.perf_counter() - t_start < seconds:
            due = t_start + k / rate
            if time.perf_counter() < due:
                time.sleep(due - time.perf_counter())
            k += 1
            try:
                stream.one(w)
                commits.append((time.perf_counter(), "ok"))
            except Exception as exc:  # noqa: BLE001 - counted
                errors.append(f"write: {exc}")
        w.close()
        stop.set()

    th = [threading.Thread(target=writer)]
    proc = None
    if queries_in == "process":
        ctx = multiprocessing.get_context("spawn")
        p_stop, p_ready, p_out = ctx.Event(), ctx.Event(), ctx.Queue()
        sample = rng.choice(items, size=min(items, 2_000), replace=False)
        proc = ctx.Process(target=_query_process, args=(name, anchor[0], anchor[1], X[sample], y[sample], seed + 7,
                                                        p_stop, p_ready, p_out), daemon=True)
        proc.start()
        p_ready.wait(120)
    else:
        th.append(threading.Thread(target=_ask, args=(name, client, X[:items], y[:items], rng, stop, answered,
                                                      errors)))
    for x in th:
        x.start()
    n_applied = 0
    while not stop.is_set() or sync_status(name)["queued"]:
        s, got = time.perf_counter(), 0
        try:
            got = db.sync(name)["applied"]
        except Exception as exc:  # noqa: BLE001 - counted
            errors.append(f"sync: {exc}")
        n_applied += got
        syncs.append((s, time.perf_counter(), got))
        if time.perf_counter() - s < 0.2:
            time.sleep(0.2)
    for x in th:
        x.join()
    if proc is not None:
        p_stop.set()
        got_answered, got_errors = p_out.get(timeout=120)
        proc.join(30)
        answered += got_answered
        errors += got_errors
    return commits, syncs, errors, n_applied, answered


def _summarise_changes(conn, name: str, table: str, commits: list, syncs: list, errors: list,
                       n_applied: int, answered: list) -> dict:
    """The change stream's figures: changes, syncs, each change's delay to the end of the first sync
    that started after it, errors, and the count check of the table against the collection."""
    out: dict = {}
    delays = []
    for c, _ in commits:
        end = next((e for s, e, _ in syncs if s > c), None)
        if end is not None:
            delays.append(end - c)
    out["changes"] = len(commits)
    out["applied"] = n_applied
    out["syncs"] = len(syncs)
    busy = [(e - s, n) for s, e, n in syncs if n]  # the syncs that applied changes: seconds, changes
    out["sync_s"] = ({"p50": round(float(np.median([d for d, _ in busy])), 2), "max": round(max(d for d, _ in busy), 2),
                      "changes_p50": int(np.median([n for _, n in busy]))} if busy else None)
    out["queries"] = ({"answered": len(answered), "p50_ms": round(1000 * float(np.median(answered)), 1),
                       "p99_ms": round(1000 * float(np.percentile(answered, 99)), 1)} if answered else {"answered": 0})
    out["delay_s"] = ({"p50": round(float(np.percentile(delays, 50)), 2),
                       "p99": round(float(np.percentile(delays, 99)), 2), "max": round(max(delays), 2)}
                      if delays else None)
    out["errors"] = len(errors)
    out["error_samples"] = errors[:3]
    valid = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE embedding IS NOT NULL").format(table_ident(table))).fetchone()[0]
    have, distinct = conn.execute(
        "SELECT count(*), count(DISTINCT external_id) FROM pm_vector.items i JOIN pm_vector.collections c "
        "ON c.id = i.collection_id WHERE c.name = %s", [name]).fetchone()
    out["count_check"] = {"table_rows": int(valid), "items": int(have), "distinct_keys": int(distinct),
                          "queue_left": sync_status(name)["queued"], "applied_equals_changes":
                          n_applied == len(commits)}
    return out


def run(items: int = 100_000, dim: int = 128, rate=100.0, seconds: float = 60.0, seed: int = 0,
        say=lambda m: None, batch_sizes=(), repeats: int = 3, queries_in: str = "thread",
        compare_kept: bool = False) -> dict:
    """The benchmark (module doc); ``rate``: changes a second, or several (a stream each, in turn);
    ``queries_in``: "thread" (the private queries answered in the syncing process, as the service's
    own sync worker does) or "process" (in a process of their own)."""
    if queries_in not in ("thread", "process"):
        raise ValueError(f"queries_in must be 'thread' or 'process', not {queries_in!r}")

    classes = 10
    tag = uuid.uuid4().hex[:8]
    table, name = f"public.bench_docs_{tag}", f"bench_attach_{tag}"
    X, y = clustered(items + 20_000, dim, N_FINE, seed=seed + 2)
    y = y // (N_FINE // classes)
    vec = lambda v: "[" + ",".join(f"{x:.6f}" for x in v) + "]"  # noqa: E731
    rates = [float(r) for r in (rate if isinstance(rate, (list, tuple)) else [rate])]
    out: dict = {"items": items, "dim": dim, "rates": rates, "seconds": seconds, "queries_in": queries_in}
    conn = db.connect(autocommit=True)
    try:
        t = table_ident(table)
        conn.execute(sql.SQL("CREATE TABLE {} (id bigint PRIMARY KEY, embedding vector({}), category int, title text)").format(
            t, sql.Literal(int(dim))))
        with conn.cursor().copy(sql.SQL("COPY {} (id, embedding, category, title) FROM STDIN").format(t)) as cp:
            for i in range(items):
                cp.write_row((i + 1, vec(X[i]), int(y[i]), f"doc {i + 1}"))
        say("attach")
        t0 = time.perf_counter()
        att = db.attach_table(name, table=table, id_column="id", vector_column="embedding", label_column="category",
                              payload_columns=["title"])
        out["attach_s"] = round(time.perf_counter() - t0, 2)
        Xa, ya = clustered(1000, dim, N_FINE, seed=seed + 1)
        db.register_anchor_set(name, Xa, ya // (N_FINE // classes))
        db.register_anchor_set(name, Xa[:300], ya[:300] // (N_FINE // classes), role="dummy")
        say("job")
        t = time.perf_counter()
        db.run_embedding_job(name, {"n_components": 16}, seed, embed_fn=anchor_frame_embed_fn)
        out["job_s"] = round(time.perf_counter() - t, 1)
        anchor = (Xa[:300], ya[:300] // (N_FINE // classes))
        client = _make_client(name, anchor[0], anchor[1], seed)
        resolve(name, client.request(X[0].astype(np.float64), int(y[0]))[0], log=False)
        out["first_answer_s"] = round(time.perf_counter() - t0, 1)
        out["attached_rows"], out["skipped_rows"] = att["items"], att["skipped"]
        out["sizes_mb"] = _sizes_mb(conn, table, name)
        # timed batches, then the change stream
        rng = np.random.default_rng(seed + 5)
        stream = Changes(table, X, y, items, rng, vec)
        if batch_sizes:
            say("batches")
            out["batch_s"] = _batches(name, stream, list(batch_sizes), int(repeats), say, compare_kept)
        if seconds > 0:
            out["streams"] = []
            for r in rates:
                for kept in ((False, True) if compare_kept else (True,)):
                    say(f"changes: {r:g} a second" + ("" if kept else " (without the kept rows)"))
                    cap = row_cache.MAX_BYTES
                    row_cache.MAX_BYTES = cap if kept else 0  # (0: no batch keeps a row)
                    row_cache.forget()
                    try:
                        got = _change_stream(name, stream, r, seconds, client, X, y, items, rng, queries_in, anchor,
                                             seed)
                    finally:
                        row_cache.MAX_BYTES = cap
                    out["streams"].append({"rate": r, **({} if not compare_kept else {"kept_rows": kept}),
                                           **_summarise_changes(conn, name, table, *got)})
                    say(json.dumps(out["streams"][-1]))
    finally:
        db.drop_collection(name, missing_ok=True)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table_ident(table)))
        conn.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--rate", default="100", help="changes a second; several, comma-separated: a stream each")
    ap.add_argument("--seconds", type=float, default=60.0, help="the change stream's length (0: no stream)")
    ap.add_argument("--batch-sizes", default="", help="comma-separated: time one sync of this many changes each "
                    "(before the stream), e.g. 20,100,400")
    ap.add_argument("--repeats", type=int, default=3, help="syncs timed per batch size")
    ap.add_argument("--queries-in", choices=("thread", "process"), default="thread",
                    help="where the private queries are answered during a stream: a thread of the syncing process "
                         "(as the service's own sync worker) or a process of their own (as the service beside "
                         "`pm-vector sync`)")
    ap.add_argument("--compare-kept-rows", action="store_true",
                    help="time each batch also without the rows kept from the batch before, side by side, and "
                         "run each stream first without them")
    a = ap.parse_args()
    sizes = [int(v) for v in a.batch_sizes.split(",") if v.strip()]
    rates = [float(v) for v in a.rate.split(",") if v.strip()]
    print(json.dumps(run(a.items, a.dim, rates, a.seconds, say=lambda m: print(m, file=sys.stderr, flush=True),
                         batch_sizes=sizes, repeats=a.repeats, queries_in=a.queries_in,
                         compare_kept=a.compare_kept_rows)))


if __name__ == "__main__":
    main()
