"""`pm-vector bench cluster`, the default release: location requests on one node, on the cluster's
coordinator and on its replica, before and after a stream of writes.

On the same collection in both deployments (built by :mod:`pm_vector.bench.cluster`), for each eps of
``epsilons`` the client's requests under the ``max_bytes`` plan
(:class:`~pm_vector.client.location.PrivateLocationKNN`: reports drawn from the release's law, one
per query) are resolved through :func:`pm_vector.db.resolve.resolution.resolve` on a kept
connection, the process's answer cache emptied before each (:data:`~pm_vector.db.resolve.location_cache.CACHE`):
every timed answer is built from the node's rows, as a first request of its report is. A sharded
run keeps its location rows and codes on the coordinator
(:mod:`pm_vector.db.resolve.location_resolution`), so the coordinator's p50 against the single
node's is the cost of the cluster on this release (the target is at most 1.2); the two are timed
interleaved, request by request (:func:`timed_side_by_side`). The replica answers from its copy
(``read_conn``), the log written on the primary.

``location_same_answers``: every report gets the same candidates in the same order, by external id,
from the single node, the coordinator and the replica. Then ``changes`` writes through the public
API (:func:`pm_vector.db.ingest`, :func:`pm_vector.db.update_items`, :func:`pm_vector.db.delete_items`),
one call per change, the same stream on both deployments; the check and the timing again, and no
deleted item (nor the old item id of an updated one) in any answer, on any node.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

import pm_vector.db as db
from ..client.location import PrivateLocationKNN
from ..db.postgres import cluster
from ..db.postgres.adapt import Int8Array, configure
from ..db.resolve.location_cache import CACHE
from ..db.resolve.resolution import public_anchor, resolve
from ..manifold.public_cells import PublicCells
from ..privacy import secure_generator
from ..protocol.published_codes import unpack
import psycopg

#: the eps of the timed reports (coarse, middle, fine levels)
EPSILONS = (1.0, 4.0, 16.0)


def _pct(v, q) -> float:
    return round(float(np.percentile(np.asarray(v, dtype=np.float64), q)), 3)


def requests(name: str, Xq: np.ndarray, epsilons, max_bytes: int, seed: int) -> tuple[list, dict]:
    """The location requests of the queries ``Xq`` at each eps (built on the current database's
    published cells, seeded: the same reports for every node), and each eps's plan."""
    _, info = public_anchor(name)
    pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
    cells = PublicCells.from_dict(info["public_locations"])
    reqs, plans = [], {}
    for j, eps in enumerate(epsilons):
        c = PrivateLocationKNN(cells, float(eps), n_items=int(info["class_rows"]["n_items"]), widths=pc.widths_,
                               max_bytes=max_bytes, collection=name)
        c._inject_generator(secure_generator(seed + 101 + j))
        p = c.plan_
        plans[str(float(eps))] = {"level": p.level, "candidates": p.candidates, "code_bytes": p.code_bytes}
        reqs += [(float(eps), c.request(x)) for x in Xq]
    return reqs, plans


def timed(name: str, reqs: list, url: str, warmup: int, replica: str | None = None) -> tuple[dict, list]:
    """Every request resolved on a kept connection to ``url`` (with ``replica``: read there, logged
    on ``url``), the answer cache emptied before each. Returns ({p50_ms, p95_ms, by_eps: {eps:
    p50_ms}}, every answer's candidates by external id)."""
    res, answers = timed_side_by_side(name, reqs, {"node": (url, replica)}, warmup)
    return res["node"], answers["node"]


def timed_side_by_side(name: str, reqs: list, nodes: dict[str, tuple], warmup: int) -> tuple[dict, dict]:
    """:func:`timed` on several nodes (``{node: (url, replica or None)}``) at once, interleaved: each
    request resolved on every node in turn (the order turning with the request), so that every node
    sees the machine as the others do (one node after the other, a load that came and went favoured
    one of them). Returns ({node: timings}, {node: answers}), as :func:`timed` per node."""
    names = list(nodes)
    ms: dict[str, list] = {n: [] for n in names}
    by: dict[str, dict] = {n: {} for n in names}
    ids: dict[str, list] = {n: [] for n in names}
    conns, reads = {}, {}
    try:
        for n, (url, replica) in nodes.items():
            conns[n] = psycopg.connect(url)
            configure(conns[n])
            if replica:
                reads[n] = psycopg.connect(replica)
                configure(reads[n])
        for i, (eps, req) in enumerate(reqs):
            for n in names[i % len(names):] + names[:i % len(names)]:
                CACHE.clear()
                t = time.perf_counter()
                res = resolve(name, req, conn=conns[n], read_conn=reads.get(n))
                d = (time.perf_counter() - t) * 1e3
                if i >= warmup:
                    ms[n].append(d)
                    by[n].setdefault(str(eps), []).append(d)
                ids[n].append(np.asarray(res["item_ids"], np.int64))
        ext = {n: _external_ids(conns[n], ids[n]) for n in names}
    finally:
        for c in list(conns.values()) + list(reads.values()):
            c.close()
    return ({n: {"p50_ms": _pct(ms[n], 50), "p95_ms": _pct(ms[n], 95),
                 "by_eps": {e: _pct(v, 50) for e, v in by[n].items()}} for n in names},
            {n: [[ext[n][int(i)] for i in a] for a in ids[n]] for n in names})


def _external_ids(conn, answers: list) -> dict[int, str | None]:
    """Item id -> external id for every id of ``answers`` (a deleted item, absent from the items: ``None``
    stands out against every external id)."""
    every = np.unique(np.concatenate(answers + [np.zeros(0, np.int64)]))
    got = dict(conn.execute("SELECT id, external_id FROM pm_vector.items WHERE id = ANY(%s::bigint[])",
                            [Int8Array(every)]).fetchall())
    return {int(i): got.get(int(i)) for i in every}


def wait_for_replica(coord: str, replica: str, timeout: float = 120.0) -> None:
    with psycopg.connect(coord, autocommit=True) as c:
        lsn = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    deadline = time.monotonic() + timeout
    while cluster.replica_lag_bytes(replica, lsn) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)


def compare(answers: dict[str, list], gone: set[str]) -> dict[str, Any]:
    """The nodes' answers against the single node's: whether all are identical, how many reports
    differ per node (and the first such report), and how many answered candidates are deleted items
    or the old item of an updated one (``None``: an item id no longer in the items) per node."""
    base = answers["single"]
    out: dict[str, Any] = {"same_answers": True, "reports_differing": {}, "deleted_in_answers": {}}
    for node, ans in answers.items():
        diff = [i for i, (a, b) in enumerate(zip(base, ans)) if a != b]
        if node != "single":
            out["reports_differing"][node] = len(diff)
            if diff:
                out["same_answers"] = False
                i = diff[0]
                out.setdefault("first_difference", {})[node] = {
                    "report": i, "only_single": sorted(set(base[i]) - set(ans[i]), key=str)[:10],
                    f"only_{node}": sorted(set(ans[i]) - set(base[i]), key=str)[:10]}
        out["deleted_in_answers"][node] = sum(1 for a in ans for e in a if e is None or e in gone)
    return out


def change_stream(n: int, C: int, dim: int, ext_live: list[str], seed: int,
                  feature_updates: bool = True) -> list[tuple]:
    """``n`` changes, one public call each: 40% inserts (a new external id, random unit features),
    20% feature and label updates (``feature_updates`` false: payload updates instead), 10% payload
    updates, 30% deletes, interleaved; a deleted or updated item is never touched again.
    Deterministic in ``seed``: the same stream for both deployments."""
    rng = np.random.default_rng(seed + 7)
    kinds = rng.choice(["insert", "update" if feature_updates else "payload", "payload", "delete"], size=n,
                       p=[0.4, 0.2, 0.1, 0.3])
    pool = list(rng.permutation(ext_live))
    out = []
    for j, kind in enumerate(kinds):
        if kind == "insert":
            x = rng.normal(size=dim)
            out.append(("insert", f"new{j}", x / np.linalg.norm(x), int(rng.integers(C))))
        elif kind == "update":
            x = rng.normal(size=dim)
            out.append(("update", pool.pop(), x / np.linalg.norm(x), int(rng.integers(C))))
        elif kind == "payload":
            out.append(("payload", pool.pop(), {"v": j}, None))
        else:
            out.append(("delete", pool.pop(), None, None))
    return out


def apply_changes(name: str, stream: list[tuple]) -> dict[str, Any]:
    """The stream through the public write API on the current database (one call a change). Returns
    counts, seconds, updates not placed in the active run (a sharded run of a collection without the
    delta: the next full job; 0 with the delta, on one node and on the cluster), and the
    external ids whose items left (deleted)."""
    t = time.perf_counter()
    counts: dict[str, int] = {}
    unplaced: list[str] = []
    for kind, ext, a, b in stream:
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "insert":
            db.ingest(name, np.asarray([a], np.float32), [b], external_ids=[ext])
        elif kind == "update":
            r = db.update_items(name, external_ids=[ext], features=np.asarray([a], np.float32), labels=[b])
            if r.get("placed") is False:
                unplaced.append(ext)
        elif kind == "payload":
            db.update_items(name, external_ids=[ext], payloads=[a])
        else:
            db.delete_items(name, external_ids=[ext])
    return {"counts": counts, "seconds": round(time.perf_counter() - t, 3), "updates_not_placed": len(unplaced),
            "deleted": [e for k, e, _, _ in stream if k == "delete"]}


def delta_entries(url: str, name: str) -> set[tuple]:
    """The active run's delta entries of collection ``name`` at ``url`` as ``(level, cell, external id,
    h_r)``: what two deployments compare by external id (their item ids differ)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT d.level, d.cell, i.external_id, d.h_r FROM pm_vector.delta_entries d "
                            "JOIN pm_vector.collections c ON c.active_run_id = d.run_id AND c.name = %s "
                            "JOIN pm_vector.items i ON i.id = d.item_id", [name]).fetchall()
    return {(int(a), int(b), e, round(float(h), 6)) for a, b, e, h in rows}


def run_location(cfg, name: str, C: int, urls: dict[str, str], replica: str | None, Xq: np.ndarray,
                 ext_live: list[str], use: Callable[[str], None], say) -> dict[str, Any]:
    """The location part (module doc) on collection ``name``, built on both deployments (``urls``:
    ``single``, ``cluster``). Returns ``{"plans", "requests", "before", "changes", "after"}``; each
    phase has per node ``{p50_ms, p95_ms, by_eps}``, ``ratio_coordinator_single_p50`` and the
    :func:`compare` of the answers."""
    use(urls["single"])
    reqs, plans = requests(name, Xq, cfg.location_epsilons, cfg.location_max_bytes, cfg.seed)
    out: dict[str, Any] = {"plans": plans, "requests": len(reqs), "epsilons": list(cfg.location_epsilons),
                           "max_bytes": cfg.location_max_bytes}

    def phase(label: str, gone: set[str]) -> dict[str, Any]:
        say(f"location {label}: {len(reqs)} resolves on the single node and the coordinator, interleaved")
        res, answers = timed_side_by_side(name, reqs, {"single": (urls["single"], None), "cluster": (urls["cluster"], None)},
                                          cfg.warmup)
        if replica:
            wait_for_replica(urls["cluster"], replica)
            say(f"location {label}: {len(reqs)} resolves on the replica")
            res["replica"], answers["replica"] = timed(name, reqs, urls["cluster"], cfg.warmup, replica=replica)
        res["ratio_coordinator_single_p50"] = round(res["cluster"]["p50_ms"] / res["single"]["p50_ms"], 3)
        res.update(compare(answers, gone))
        return res

    out["before"] = phase("before changes", set())
    if cfg.changes > 0:
        stream = change_stream(cfg.changes, C, cfg.dim, ext_live, cfg.seed, cfg.feature_updates)
        out["changes"] = {}
        for node in ("single", "cluster"):
            use(urls[node])
            say(f"location: {cfg.changes} changes on {node}")
            out["changes"][node] = apply_changes(name, stream)
        # the new items' estimated counts (delta.estimate: their nearest run items by each node's own
        # HNSW index, two builds of which may differ) compared: where they differ, so may the answers
        ents = {node: delta_entries(urls[node], name) for node in ("single", "cluster")}
        out["changes"]["delta_entries"] = len(ents["single"])
        out["changes"]["delta_entries_differing"] = len(ents["single"] ^ ents["cluster"])
        gone = set(out["changes"]["single"].pop("deleted"))
        out["changes"]["cluster"].pop("deleted")
        out["after"] = phase("after changes", gone)
    return out
