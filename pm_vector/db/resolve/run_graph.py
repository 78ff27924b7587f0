"""A run's class-rows graph in the resolving process's memory, and the per-request k-NN.

Resolving a class-rows request has two parts of very different cost:

* **finding** each row's retained prior -- the ``max_prior`` items of its class nearest to the
  released row -- is a k-NN search, and PostgreSQL does it: one statement for all the rows, a
  pgvector HNSW scan of each large class's partition of ``run_<id>_prior``, or a sequential
  top-N where the planner prefers it (:data:`PRIOR_KNN`; a class of at most ``max_prior`` items
  is retained whole, no search);
* **scoring**: every retained item adds its weight to its ``graph_degree`` neighbours
  (:func:`pm_vector.shortlist.rank_retained`). In PostgreSQL's executor that aggregation of
  C x max_prior x graph_degree rows (82k at C = 10) was most of a resolve: the SQL function's
  statement took 47.7 ms of 51.0 (`pm-vector bench latency --items 20000 --rows 10`, before);
  on arrays, distances, weights and the top k' included, 3.0 ms (the same bench, "score").

:class:`RunGraph` holds what the scoring reads: each prior item's frame coordinates, neighbour
list and those neighbours' hub counts (the columns the embedding job wrote into the prior since
migration 0009), each class's top hubs and the run's first item ids. It is read once per
process and run by binary COPY and kept (:func:`run_graph`), keyed by the database, run id,
run creation time and the run's ``graph_version`` (which ``embed --new-items`` increases in the
transaction that changes the graph), read in the request's own snapshot: a request never
scores with a graph other than the one its snapshot sees.

Runs without those columns (built before 0009) and sharded runs are answered by the SQL
function ``pm_vector.pm_shortlist`` instead (:func:`supports`), with the same scores.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Any, Mapping

import numpy as np
from psycopg import sql

from ...protocol.bounds import MAX_K_PRIME  # top hubs kept per class: k' is at most this
from .. import _binary
from ..postgres.config import settings
from ..run_tables import run_table
from ..runs.class_rows import prior_has_nbrs

#: memory for the graphs a process keeps, least recently used first out, is the database settings'
#: ``run_graph_cache_mb`` (``PM_VECTOR_RUN_GRAPH_CACHE_MB``, default 1024). A graph takes about
#: 8 (d + 2 g + 2) bytes per prior item: 400 B at d = g = 16, 40 MB for 100,000 items; at the
#: default d = 4, g = 16, 304 B: 304 MB for 1,000,000 items, within the default 1 GB
_cache: "OrderedDict[tuple, RunGraph]" = OrderedDict()
_cache_lock = threading.Lock()
_load_locks: dict[tuple, threading.Lock] = {}

#: Each large-class row's retained prior: the same class-restricted ``ORDER BY coords <-> z LIMIT
#: max_prior`` as pm_shortlist's (so the planner makes the same choice: each class partition's HNSW
#: index, ef_search and the iterative scan set by pm_prepare_prior_search), max_prior written in
#: (a constant of the run) and the statement planned per call, as pm_shortlist's is.
#: Parameters: the rows (float8[][], one per searched row) and their labels.
PRIOR_KNN = sql.SQL(
    "SELECT ARRAY(SELECT c.item_id FROM {prior} AS c WHERE c.label = q.label "
    "             ORDER BY c.coords <-> q.zv LIMIT {max_prior}) "
    "FROM (SELECT g.i, (p.labels)[g.i] AS label, "
    "             ARRAY(SELECT x FROM unnest((p.rows)[g.i:g.i][1:{d}]) AS x)::vector AS zv "
    "      FROM (SELECT %s::float8[] AS rows, %s::bigint[] AS labels) AS p "
    "      CROSS JOIN LATERAL generate_series(1, cardinality(p.labels)) AS g(i)) AS q "
    "ORDER BY q.i")


def prior_knn_statement(run_id: int, n_components: int, max_prior: int) -> sql.Composed:
    return PRIOR_KNN.format(prior=run_table(run_id, "prior"), d=sql.Literal(int(n_components)),
                            max_prior=sql.Literal(int(max_prior)))


@dataclass(frozen=True)
class RunGraph:
    """The arrays of one run's class rows (prior rows sorted by item id)."""

    run_id: int
    ids: np.ndarray  # (n,) int64, ascending
    labels: np.ndarray  # (n,) int64
    coords: np.ndarray  # (n, d) float64: clipped frame coordinates (coords8)
    nbrs: np.ndarray  # (n, g) int64: neighbour lists, nearest first
    nhub: np.ndarray  # (n, g) float64: hub count of each neighbour in the row's class
    members: dict  # label -> positions of the class's prior rows (ascending id)
    top_hubs: dict  # label -> (ids, hubs), hub descending then id, at most MAX_K_PRIME
    fill_ids: np.ndarray  # the run's first MAX_K_PRIME item ids

    @property
    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.labels.nbytes + self.coords.nbytes + self.nbrs.nbytes + self.nhub.nbytes)


def supports(conn, meta: Mapping[str, Any]) -> bool:
    """Whether ``meta``'s run (:func:`pm_vector.db.resolve.frame.run_row`) can be scored here: a
    single-node run with neighbour lists in its prior and at least one neighbour per item."""
    doc, run = meta["coll"]["class_rows"], meta["run"]
    if doc.get("shards"):
        return False
    if int(doc.get("graph_degree_effective", doc.get("graph_degree", 0)) or 0) < 1:
        return False
    with _cache_lock:
        if _key(conn, meta) in _cache:
            return True  # read already (the k-NN statement needs only the prior's coordinates and labels)
    return prior_has_nbrs(conn, int(run["id"]))  # (a catalog lookup: tests drop the columns of a live run)


def _key(conn, meta: Mapping[str, Any]) -> tuple:
    run, doc = meta["run"], meta["coll"]["class_rows"]
    pg = conn.pgconn
    return pg.host, pg.port, pg.db, int(run["id"]), str(run["created_at"]), int(doc.get("graph_version", 0))


def run_graph(conn, meta: Mapping[str, Any]) -> RunGraph:
    """The :class:`RunGraph` of ``meta``'s run (:func:`pm_vector.db.resolve.frame.run_row`), read on
    ``conn`` in its current snapshot the first time, then from this process's memory."""
    run = meta["run"]
    doc = meta["coll"]["class_rows"]
    key = _key(conn, meta)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
        lock = _load_locks.setdefault(key, threading.Lock())
    with lock:  # one load per key; concurrent requests of the same run wait for it
        with _cache_lock:
            hit = _cache.get(key)
        if hit is not None:
            return hit
        graph = _load(conn, int(run["id"]), doc)
        with _cache_lock:
            _cache[key] = graph
            budget = _cache_budget()
            while len(_cache) > 1 and sum(g.nbytes for g in _cache.values()) > budget:
                _cache.popitem(last=False)
            _load_locks.pop(key, None)
    return graph


def _cache_budget() -> int:
    return int(settings().run_graph_cache_mb * 2**20)


def cached_bytes() -> int:
    """Bytes of the graphs this process holds now (at most the cache budget, but one graph is
    always kept)."""
    with _cache_lock:
        return int(sum(g.nbytes for g in _cache.values()))


def clear_cache() -> None:
    """Forget the graphs read so far (they are keyed by run and graph version; this frees memory)."""
    with _cache_lock:
        _cache.clear()


def _load(conn, run_id: int, doc: Mapping[str, Any]) -> RunGraph:
    t = partial(run_table, int(run_id))
    d = int(doc["n_components"])
    g = conn.execute(sql.SQL("SELECT cardinality(nbrs) FROM {} LIMIT 1").format(t("prior"))).fetchone()
    g = int(g[0]) if g is not None else 0
    cols = [("item_id", "int8", 0), ("label", "int8", 0), ("coords8", "float8[]", d), ("nbrs", "int8[]", g),
            ("nhub", "float8[]", g)]
    # streamed into arrays sized by the run's class sizes (the COPY stream is never held whole)
    a = _binary.copy_out_columns(conn, sql.SQL("SELECT item_id, label, coords8, nbrs, nhub FROM {} ORDER BY item_id").format(
        t("prior")), cols, sum(int(v) for v in doc.get("class_sizes") or [0]))
    h = _binary.decode([("label", "int8", 0), ("item_id", "int8", 0), ("hub", "float8", 0)], _binary.copy_out(
        conn, sql.SQL("SELECT label, item_id, hub FROM (SELECT label, item_id, hub, row_number() OVER "
                      "(PARTITION BY label ORDER BY hub DESC, item_id) AS rn FROM {} AS h) AS s "
                      "WHERE rn <= {} ORDER BY label, rn").format(t("hubs"), sql.Literal(MAX_K_PRIME))))
    fill = np.array([r[0] for r in conn.execute(
        sql.SQL("SELECT item_id FROM {} ORDER BY item_id LIMIT {}").format(t("items"), sql.Literal(MAX_K_PRIME))).fetchall()],
        dtype=np.int64)
    labels = a["label"]
    members = {int(c): np.flatnonzero(labels == int(c)) for c in doc["classes"]}
    top = {}
    for c in doc["classes"]:
        sel = h["label"] == int(c)
        top[int(c)] = (h["item_id"][sel], h["hub"][sel])
    return RunGraph(run_id=int(run_id), ids=a["item_id"], labels=labels, coords=a["coords8"].reshape(-1, d),
                    nbrs=a["nbrs"].reshape(-1, g), nhub=a["nhub"].reshape(-1, g), members=members, top_hubs=top,
                    fill_ids=fill)


def searched_rows(doc: Mapping[str, Any], labels: list[int], max_prior: int) -> list[int]:
    """The rows whose class has more than ``max_prior`` items (their prior is searched; the
    others retain their whole class)."""
    sizes = {int(c): int(n) for c, n in zip(doc["classes"], doc["class_sizes"])}
    return [i for i, c in enumerate(labels) if sizes.get(int(c), 0) > max_prior]


def prior_knn(conn, graph: RunGraph, doc: Mapping[str, Any], rows: np.ndarray, labels: list[int],
              max_prior: int) -> list[np.ndarray]:
    """The retained prior of each row (positions into ``graph``): the whole class when it has at
    most ``max_prior`` items, else the ``max_prior`` nearest by the class's HNSW index, all
    searched rows in ONE statement (:data:`PRIOR_KNN`) on ``conn``, in its transaction."""
    search = searched_rows(doc, labels, max_prior)
    out: list[Any] = [graph.members[int(c)] for c in labels]  # replaced below for the searched rows
    if search:
        conn.execute("SELECT pm_vector.pm_prepare_prior_search(%s)", [int(max_prior)])
        found = conn.execute(prior_knn_statement(graph.run_id, rows.shape[1], max_prior),
                             [rows[search].tolist(), [int(labels[i]) for i in search]], binary=True,
                             prepare=False).fetchall()
        for i, (ids,) in zip(search, found):
            ids = np.asarray(ids, dtype=np.int64)
            pos = np.searchsorted(graph.ids, ids)
            if ids.size and (pos.max() >= graph.ids.size or np.any(graph.ids[pos] != ids)):
                raise RuntimeError(f"run {graph.run_id}: the prior changed under a cached graph")  # pragma: no cover
            out[i] = pos
    return out
