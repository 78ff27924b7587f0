"""A run's embeddings and their location cells kept in the process's memory: the EXACT ``g`` nearest
live items of new items, for the delta's estimate (:func:`pm_vector.db.runs.delta.estimate`).

The estimate used to ask the run's HNSW index, per new item, for its ``g`` nearest (one sub-select
per item), then read the neighbours' raw features to assign their cells: about 2 ms a new item at
100,000 items, and above a few thousand items an index with random levels answers differently in
two databases built apart (a cluster and one node placed the same new item differently). Here the
search is exact, in numpy, over every live item of the run: ``(distance, item id)`` ascending, the
order of an exact SQL scan ``ORDER BY (distance) + 0, item_id``, with the distances computed in
float64 by a fixed sequence of elementwise operations (the same bits in every process), so two
databases holding the same run and the same writes place a new item alike.

An entry, keyed as :mod:`pm_vector.db.runs.item_cache`'s (the database, the collection, the run, its
creation time), holds per live item -- ids ascending -- its embedding (``float32 (N, k)``) and its
cell at every published location level (``(L, N)``, -1 until known): an item's embedding never
changes while it is in the run, its features neither (a changed row is a new item) and an id is
never reused. **Which items are live** is read at every :func:`get`, in the caller's transaction
(so a rolled-back transaction or another process's write cannot leave a wrong answer behind): the
run's items as built (``run_<id>_items`` less the delta's items, listed at the entry's first load)
plus the items the delta added since (their ids in ``pm_vector.delta_entries``, one published
level) minus the tombstones; both lists are bounded by the merge's threshold, and the entry keeps
them, moved forward by this process's own writes and read whole only when another wrote
(:mod:`pm_vector.db.runs.delta_sets`). The delta's items not seen yet are read then (their embeddings, and
their cells from their entries: no raw features); a base item's cells are assigned from its raw
features the first time it is someone's neighbour (:func:`cells_of`), then kept. A tombstoned
item leaves the entry at the next :func:`get` (no deleted item's embedding stays in memory), and
so do the entries of the collection's other runs (a merge's run replaces them). A check keeps it
honest: the live items counted must match the run's ``n_items`` (which every delta write keeps),
else the entry is read again (a rolled-back write it followed, a run changed another way).

Memory: 8 + 4k + 2L + 2 bytes an item (id, embedding, int16 cells below 32,768 cells a level, two
flags): 94 B at k = 16 and L = 10, so 9.4 MB at 100,000 items and 94 MB at 10^6, plus the search's
copy of the live embeddings for its duration (6.4 MB at 100,000 items). :data:`MAX_ENTRIES`
entries kept, least recently used out; one per collection.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
from psycopg import sql

from .. import _binary
from ..core.collection import load_items
from ..run_tables import run_table
from .delta_sets import DeltaSets
from .embeddings import vector_type
from ...neighbors import product_knn

#: entries kept (least recently used out)
MAX_ENTRIES = 4
#: candidates kept per new item beyond ``g`` by the float32 pre-selection, before the exact re-rank
MARGIN = 8

_cache: "OrderedDict[tuple, RunNearest]" = OrderedDict()
_lock = threading.Lock()
#: held around the use of an entry (:func:`get` to the last read of its arrays): the sync's batch and
#: a merge's switch may run on two threads of one process
LOCK = threading.RLock()


def distances(E: np.ndarray, x: np.ndarray, metric: str) -> np.ndarray:
    """pgvector's distance of operator ``metric`` (l2 ``<->``, cosine ``<=>``, ip ``<#>``) from each row
    of ``E`` to ``x``, in float64 by a fixed sequence of elementwise operations over the columns
    (no BLAS, no reduction whose order a build may change: the same bits everywhere)."""
    E = np.asarray(E, np.float64)
    x = np.asarray(x, np.float64)
    if metric == "l2":
        s = np.zeros(E.shape[0])
        for j in range(E.shape[1]):
            d = E[:, j] - x[j]
            s += d * d
        return np.sqrt(s)
    dot = np.zeros(E.shape[0])
    for j in range(E.shape[1]):
        dot += E[:, j] * x[j]
    if metric == "ip":
        return -dot
    ee = np.zeros(E.shape[0])
    for j in range(E.shape[1]):
        ee += E[:, j] * E[:, j]
    xx = 0.0
    for v in x.tolist():
        xx += v * v
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 - dot / (np.sqrt(ee) * np.sqrt(xx))


def _search(E: np.ndarray, Q: np.ndarray, k: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """The pre-selection: per row of ``Q``, the ``k`` rows of ``E`` nearest by the exact flat search in
    float32 by a matrix product (:func:`~pm_vector.neighbors.product_knn`; ``(approx, positions)``,
    ``approx`` monotone in the distance: squared for l2), and the error bound of ``approx`` per row
    (``tests/test_run_nearest.py`` checks a bound of 0 is too small for it)."""
    E32 = np.ascontiguousarray(E, np.float32)
    Q32 = np.ascontiguousarray(Q, np.float32)
    if metric == "cosine":
        Q32 = Q32 / np.maximum(np.linalg.norm(Q32, axis=1, keepdims=True), 1e-30)
        E32 = E32 / np.maximum(np.linalg.norm(E32, axis=1, keepdims=True), 1e-30)
    qn = np.linalg.norm(Q32.astype(np.float64), axis=1)
    # (a bound of the largest row norm from float32 sums of d squares: each off by at most (d + 1) u, u = 2^-24)
    en = float(np.sqrt(float(np.einsum("ij,ij->i", E32, E32).max(initial=0.0)) * (1 + 1.2e-7 * (E32.shape[1] + 2))))
    # the float32 error's scale: (d + 3) u of the terms' size (u = 2^-24), at least 1e-5; the inner
    # product's search is an l2 one in d + 1 dimensions, of terms up to (|q| + M)^2 (product_knn)
    if metric == "l2":
        rel = max(1e-5, 1.2e-7 * (E32.shape[1] + 3))
        D, I = product_knn(Q32, E32, k)
        return D.astype(np.float64), I, rel * (qn + en) ** 2 + 1e-12
    rel = max(1e-5, 1.2e-7 * (E32.shape[1] + 6))
    D, I = product_knn(Q32, E32, k, inner_product=True)
    D = D.astype(np.float64)
    return ((1.0 - D) if metric == "cosine" else -D), I, rel * (qn + en) ** 2 + 1e-12


def _approx_of(d: float, metric: str) -> float:
    """:func:`_search`'s scale of an exact distance ``d`` (squared for l2)."""
    return d * d if metric == "l2" else d


def nearest(E: np.ndarray, ids: np.ndarray, Q: np.ndarray, qids: np.ndarray, g: int, metric: str) -> list[np.ndarray]:
    """For each row of ``Q`` (item ``qids[i]``): the positions in ``E`` / ``ids`` of its ``g`` nearest
    rows other than itself, ``(distance, id)`` ascending (:func:`distances`). A float32 pre-selection
    of ``g`` + 1 + :data:`MARGIN` (:func:`_search`), then the exact re-rank; a row whose cut is too
    close to call within the pre-selection's error (ties at the margin) is ranked over every row
    exactly, so the answer is the exact one whatever the pre-selection's order of ties."""
    n, b = E.shape[0], Q.shape[0]
    keep = min(n, g + 1 + MARGIN)  # (+1: the item itself, when it is a row of E)
    if b == 0 or n == 0:
        return [np.zeros(0, np.int64) for _ in range(b)]
    approx, cand, tol = _search(E, Q, keep, metric)
    out = []
    for i in range(b):
        c = cand[i][cand[i] >= 0]
        d = distances(E[c], Q[i], metric)
        mine = ids[c] == qids[i]
        d, c = d[~mine], c[~mine]
        order = np.lexsort((ids[c], d))
        got = c[order][:g]
        # the cut: a row left out by the pre-selection may come before the last kept one within its error
        if n > keep and got.size == g:
            last = d[order][g - 1]
            if not np.isfinite(last) or approx[i, -1] - _approx_of(last, metric) <= tol[i]:
                d = distances(E, Q[i], metric)
                d[ids == qids[i]] = np.inf
                got = np.lexsort((ids, d))[:g]
                got = got[np.isfinite(d[got])]
        out.append(got.astype(np.int64))
    return out


class RunNearest:
    """One run's entry (module doc): ``ids`` ascending, ``emb`` (N, k) float32, ``cells`` (L, N)
    (-1: not known yet), ``levels`` (the published location levels, the rows of ``cells``), ``base``
    (a mask of ``ids``: the run's items as built), ``sure`` (a mask: the row as a committed
    transaction wrote it; a new item placed by the caller's transaction is not, until a later
    :func:`get` reads it back: that transaction may roll back and the item be placed again),
    ``offset`` (the run's ``n_items`` less the live items counted, at the entry's load: a later
    difference means the run changed in a way the entry does not follow, and it is loaded again)."""

    def __init__(self, levels, k: int):
        self.levels = [int(M) for M in levels]
        self.k = int(k)
        self.ids = np.zeros(0, np.int64)
        self.emb = np.zeros((0, self.k), np.float32)
        dt = np.int16 if max(self.levels, default=0) < (1 << 15) else np.int32
        self.cells = np.zeros((len(self.levels), 0), dt)
        self.base = np.zeros(0, bool)
        self.sure = np.zeros(0, bool)
        self.offset: int | None = None
        self.sets = DeltaSets()

    def put(self, ids, emb, cells=None, *, base: bool = False, sure: bool = True) -> None:
        """Items with their embeddings and (``(L, n)``, -1 unknown) cells: added, or their rows
        replaced (an item held but not sure)."""
        ids = np.asarray(ids, np.int64)
        if ids.size == 0:
            return
        emb = np.asarray(emb, np.float32).reshape(-1, self.k)
        c = (np.full((len(self.levels), ids.size), -1, self.cells.dtype) if cells is None
             else np.asarray(cells).astype(self.cells.dtype))
        held = _mask_of(self.ids, ids)
        if held.any():
            at = self.positions(ids[held])
            self.emb[at], self.cells[:, at], self.sure[at] = emb[held], c[:, held], sure
        new = ~held
        if not new.any():
            return
        self.ids = np.concatenate([self.ids, ids[new]])
        self.emb = np.concatenate([self.emb, emb[new]])
        self.cells = np.concatenate([self.cells, c[:, new]], 1)
        self.base = np.concatenate([self.base, np.full(int(new.sum()), bool(base))])
        self.sure = np.concatenate([self.sure, np.full(int(new.sum()), bool(sure))])
        if self.ids.size > 1 and not np.all(self.ids[1:] > self.ids[:-1]):  # (new ids mostly follow the old)
            o = np.argsort(self.ids, kind="stable")
            self.ids, self.emb, self.cells = self.ids[o], self.emb[o], self.cells[:, o]
            self.base, self.sure = self.base[o], self.sure[o]

    def drop(self, gone: np.ndarray) -> None:
        """The rows of mask ``gone`` (the run's tombstoned items) out of memory: a deleted item's
        embedding and cells are not kept (its rows in the run's tables leave with the merge)."""
        if gone.any():
            keep = ~gone
            self.ids, self.emb, self.cells = self.ids[keep], self.emb[keep], self.cells[:, keep]
            self.base, self.sure = self.base[keep], self.sure[keep]

    def positions(self, ids) -> np.ndarray:
        """Positions of ``ids`` (all held)."""
        return np.searchsorted(self.ids, np.asarray(ids, np.int64))

    def nbytes(self) -> int:
        return int(self.ids.nbytes + self.emb.nbytes + self.cells.nbytes + self.base.nbytes + self.sure.nbytes)


def key(conn, run_id: int) -> tuple[tuple, int, int, int, str | None] | None:
    """The entry's key (the database, the collection, the run, its creation time), the run's embedding
    width, the items it holds now (``n_items``) and its ``delta_version``, as the caller's transaction
    sees them, and the transaction's id when it has written (:mod:`~pm_vector.db.runs.delta_sets`);
    None for a run that is gone."""
    row = conn.execute("SELECT created_at, embedding_dim, n_items, collection_id, delta_version, "
                       "pg_current_xact_id_if_assigned()::text FROM pm_vector.embedding_runs WHERE id = %s",
                       [int(run_id)]).fetchone()
    if row is None:
        return None
    info = conn.info
    return ((info.host, info.port, info.dbname, int(row[3]), int(run_id), str(row[0])), int(row[1]), int(row[2] or 0),
            int(row[4]), row[5])


def read_embeddings(conn, run_id: int, k: int, ids=None) -> dict[str, np.ndarray]:
    """``{"item_id" (ascending), "embedding" (n, k) float32}`` of the run's items (of ``ids`` when given),
    by binary COPY."""
    where = sql.SQL("") if ids is None else sql.SQL(" WHERE item_id = ANY({}::bigint[])").format(
        sql.Literal([int(i) for i in np.asarray(ids).tolist()]))
    buf = _binary.copy_out(conn, sql.SQL("SELECT item_id, embedding FROM {}{} ORDER BY item_id").format(
        run_table(run_id, "items"), where))
    got = _binary.decode([("item_id", "int8", 0), ("embedding", vector_type(k), k)], buf)
    return {"item_id": np.asarray(got.get("item_id", np.zeros(0)), np.int64),
            "embedding": np.asarray(got.get("embedding", np.zeros((0, k))), np.float32).reshape(-1, k)}


def _mask(held: np.ndarray, ids) -> np.ndarray:
    """A mask of ``held`` (ascending): True at the ids of ``ids``."""
    ids = np.asarray(ids, np.int64)
    out = np.zeros(held.size, bool)
    if ids.size and held.size:
        p = np.minimum(np.searchsorted(held, ids), held.size - 1)
        out[p[held[p] == ids]] = True
    return out


def _mask_of(held: np.ndarray, ids) -> np.ndarray:
    """A mask of ``ids``: True where ``held`` (ascending) has the id."""
    ids = np.asarray(ids, np.int64)
    if ids.size == 0 or held.size == 0:
        return np.zeros(ids.size, bool)
    p = np.minimum(np.searchsorted(held, ids), held.size - 1)
    return held[p] == ids


def _load(conn, rid: int, levels, k: int, delta_ids, new_ids) -> RunNearest:
    ent = RunNearest(levels, k)
    got = read_embeddings(conn, rid, k)
    first = ~np.isin(got["item_id"], delta_ids) & ~np.isin(got["item_id"], new_ids)
    ent.put(got["item_id"][first], got["embedding"][first], base=True)
    return ent


def get(conn, run_id: int, levels, new_ids=(), new_cells=None) -> tuple[RunNearest, np.ndarray]:
    """The run's entry, brought up to the caller's transaction, and the mask of its live items: as
    built or placed by the delta, not tombstoned, with the items ``new_ids``
    the caller's transaction is placing now (their rows in ``run_<id>_items`` written, their entries
    and the run's ``n_items`` not yet; ``new_cells`` (L, n) their cells: module doc). Hold
    :data:`LOCK` while the entry is used."""
    rid = int(run_id)
    levels = [int(M) for M in levels]
    got_key = key(conn, rid)
    if got_key is None:
        raise LookupError(f"run {rid} is gone")
    kk, k, n_items, version, xid = got_key
    new_ids = np.asarray(new_ids, np.int64)
    with _lock:
        ent = _cache.get(kk)
        if ent is not None:
            _cache.move_to_end(kk)
        for other in [o for o in _cache if o[:4] == kk[:4] and o != kk]:  # (the collection's runs before: merged)
            del _cache[other]
    if ent is not None and (ent.levels != levels or ent.k != k):
        ent = None
    for attempt in (0, 1):
        sets = ent.sets if ent is not None else DeltaSets()
        dead, delta_ids = sets.current(conn, rid, kk[5], levels[0] if levels else None, version, xid)
        if ent is None:
            ent = _load(conn, rid, levels, k, delta_ids, new_ids)
            ent.sets = sets
            with _lock:
                _cache[kk] = ent
                while len(_cache) > MAX_ENTRIES:
                    _cache.popitem(last=False)
        # the delta's items not held (or not sure), read back: embeddings, and cells from their entries
        held = _mask_of(ent.ids, delta_ids)
        sure = np.zeros(delta_ids.size, bool)
        sure[held] = ent.sure[ent.positions(delta_ids[held])]
        todo = delta_ids[~sure]  # (few: the items other transactions placed since the last pass)
        todo = todo[~_mask_of(dead, todo) & ~_mask_of(np.unique(new_ids), todo)]
        if todo.size:
            got = read_embeddings(conn, rid, k, todo)
            cells = np.full((len(levels), got["item_id"].size), -1, np.int64)
            pos = {int(i): j for j, i in enumerate(got["item_id"].tolist())}
            row = {M: r for r, M in enumerate(levels)}
            for i, M, c in conn.execute("SELECT item_id, level, cell FROM pm_vector.delta_entries WHERE run_id = %s "
                                        "AND item_id = ANY(%s)", [rid, list(pos)]).fetchall():
                if int(M) in row and int(i) in pos:
                    cells[row[int(M)], pos[int(i)]] = int(c)
            ent.put(got["item_id"], got["embedding"], cells)
        if new_ids.size:
            placed = read_embeddings(conn, rid, k, new_ids)
            at = {int(i): j for j, i in enumerate(new_ids.tolist())}
            nc = None if new_cells is None else np.asarray(new_cells)[:, [at[int(i)] for i in placed["item_id"]]]
            ent.put(placed["item_id"], placed["embedding"], nc, sure=False)
        # (the ids tombstoned since the sets' held state, or all: every other was dropped before)
        ent.drop(_mask(ent.ids, dead if sets.fresh is None else sets.fresh))
        live = ent.base | _mask(ent.ids, delta_ids)
        counted = int(live.sum())
        if ent.offset is None:
            ent.offset = n_items - counted
        if n_items - counted == ent.offset or attempt:
            break
        ent = None  # (the run changed in a way the entry does not follow: loaded again)
    return ent, live | _mask(ent.ids, new_ids)


def cells_of(conn, coll: Mapping[str, Any], ent: RunNearest, pos: np.ndarray, cells) -> None:
    """The cells at every level of the entry's items at positions ``pos`` whose cells are not known,
    assigned from their raw features (read now; an item whose features cannot be read stays
    unknown, and counts in no cell)."""
    pos = np.unique(np.asarray(pos, np.int64))
    if ent.cells.shape[0] == 0:
        return
    todo = pos[ent.cells[0, pos] < 0]
    if todo.size == 0:
        return
    got = load_items(conn, coll, ids=ent.ids[todo])
    if got["id"].size == 0:
        return
    at = ent.positions(got["id"])
    X = np.asarray(got["features"], np.float64)
    for r, M in enumerate(ent.levels):
        ent.cells[r, at] = cells.assign(X, 0, M)


def forget(run_id: int | None = None) -> None:
    """Drop the entries of a run (all of them with None)."""
    with _lock:
        for kk in [kk for kk in _cache if run_id is None or kk[4] == int(run_id)]:
            del _cache[kk]
