"""The erasure plan of one run: what erasing items changes in its neighbour lists, hub counts and
per-cell counts (:func:`plan`), computed once from the run's items before the erasure and applied to
each table by :mod:`pm_vector.db.runs.erase`.

The erased and the affected items (those whose stored class-rows list holds an erased one) are
searched in ONE exact k-NN over the run's items before the erasure, deep enough that each keeps
``max(graph_degree, cells graph_degree)`` entries once the erased ones are left out. An affected
item's new list is its remaining old entries and the nearest remaining items, by distance, first
``graph_degree``; the hub counts change by (new list - old list) for affected items and lose the
erased items' lists; the per-cell counts lose the erased items' cell-release lists and gain the
affected items' new entries.

An attached table's sync (``quick``) makes one approximation above ``graph_exact_max_items`` items,
where the job's own graph is approximate: only the erased items are searched so (a thousand
affected items per 60 erased at 100,000 items made that search a second of each sync batch); an
affected item refills its list from the candidates its erased neighbours leave (their exact nearest
and their stored lists, an exact search when those are too few), and its cell-release list gains no
replacement until the next full job (the approximation the cell release already makes for a list
that held an erased item beyond ``graph_degree``). The refilled lists then hold 95 to 99 % of the
entries the exact search gives (3,000 random items of 8 dimensions, 5,000 clustered items of 128,
30 erased). ``delete_items`` keeps the exact search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ...neighbors import knn_rows


@dataclass
class Plan:
    """What an erasure changes in one run (positions are into ``ids``, the run's items before it)."""

    run_id: int
    doc: dict  # the run's class_rows document (may be {} for a run without class rows)
    ids: np.ndarray  # (N,) run item ids before the erasure, ascending
    labels: np.ndarray  # (N,)
    gone: np.ndarray  # (N,) bool: erased
    new_lists: dict = field(default_factory=dict)  # item id -> new class-rows neighbour list (ids, nearest first)
    hub_delta: dict = field(default_factory=dict)  # (label, item id) -> change of hub_c(item)
    cell_delta: dict = field(default_factory=dict)  # (level, label, cell, item id) -> change (level 0: h_c)

    @property
    def erased(self) -> np.ndarray:
        return self.ids[self.gone]


def _cells_of(cells_doc, labels: np.ndarray, X, q: np.ndarray) -> dict[int, dict[int, int]]:
    """Per published level K: position -> the public cell of its class that holds it (-1: its class
    has no cells), for the rows ``q``."""
    cells_of = {}
    ci = cells_doc.class_index(labels[q])
    for K in cells_doc.levels_:
        cells_of[int(K)] = dict(zip(q.tolist(), np.where(ci >= 0, cells_doc.assign(
            np.asarray(X[q], dtype=np.float64), np.maximum(ci, 0), int(K)), -1).tolist()))
    return cells_of


def plan(conn, run_id: int, doc: Mapping[str, Any] | None, ids, labels, X, erased, *,
         neighbor_lists: Mapping[int, np.ndarray] | None = None, cells_doc: Any = None, quick: bool = False) -> Plan:
    """The erasure plan of one run: ``ids``/``labels``/``X`` the run's items BEFORE the erasure
    (ascending ids), ``erased`` the ids that leave. ``neighbor_lists``: the run's stored class-rows
    lists of the erased items and of the items whose list holds one (read by :func:`stored_lists`).
    ``quick``: above ``graph_exact_max_items``, refill from the erased neighbours' candidates (module doc)."""
    ids = np.asarray(ids, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.int64)
    gone = np.isin(ids, np.asarray(erased, dtype=np.int64))
    p = Plan(run_id=int(run_id), doc=dict(doc or {}), ids=ids, labels=labels, gone=gone)
    if not gone.any() or not is_ready(doc):
        return p
    X = np.asarray(X)
    keep = np.flatnonzero(~gone)
    classes = set(int(c) for c in doc["classes"])
    g = int(doc.get("graph_degree_effective", doc["graph_degree"]))
    lists = dict(neighbor_lists or {})
    erased_set = set(int(i) for i in ids[gone])
    pos = {int(i): k for k, i in enumerate(ids)}
    affected = sorted(j for j, lst in lists.items() if j not in erased_set and erased_set & set(int(x) for x in lst))
    missing = [j for j in sorted(erased_set) + affected if j not in pos]
    if missing:  # every item of the run must come with the features it was built from
        raise RuntimeError(f"run {int(run_id)}: the features of items {missing[:5]} are not readable; nothing was erased")
    cells_ready = (doc.get("cells") or {}).get("status") == "ready" and cells_doc is not None
    gc = int((doc.get("cells") or {}).get("graph_degree") or 0) if cells_ready else 0
    q = np.array([pos[j] for j in sorted(erased_set)] + [pos[j] for j in affected], dtype=np.int64)
    exact = ids.shape[0] <= int(doc.get("graph_exact_max_items", 50_000))
    candidates = quick and not exact
    found = _searched(X, ids, q, len(erased_set), max(g, gc), exact, candidates, gone, lists, pos)
    hd: dict = {}
    cd: dict = {}

    def add(dct, key, v):
        dct[key] = dct.get(key, 0.0) + v
        if dct[key] == 0.0:
            del dct[key]

    cells_of = {}
    if cells_ready:
        cells_of = _cells_of(cells_doc, labels, X, q)
        cell_classes = set(int(c) for c in cells_doc.classes_)
    for r, qi in enumerate(q.tolist()):
        j = int(ids[qi])
        c = int(labels[qi])
        row = found[r]
        row = row[row != qi]
        old = np.asarray(lists.get(j, ids[row[:g]]), dtype=np.int64)
        if j in erased_set:
            if c in classes:
                for i in old:
                    add(hd, (c, int(i)), -1.0)
            if cells_ready and c in cell_classes:
                for i in ids[row[:gc]]:
                    _cell_edge(add, cd, cells_of, qi, c, int(i), -1.0)
            continue
        # refilled list: the old entries that remain and the nearest remaining items, by distance
        rem = row[~gone[row]]
        cand = np.unique(np.concatenate([[pos[int(i)] for i in old if int(i) not in erased_set and int(i) in pos],
                                          rem]).astype(np.int64))
        dist = ((np.asarray(X[cand], dtype=np.float64) - np.asarray(X[qi], dtype=np.float64)) ** 2).sum(1)
        new = ids[cand[np.lexsort((cand, dist))][:g]]
        p.new_lists[j] = new
        if c in classes:
            for i in old:
                add(hd, (c, int(i)), -1.0)
            for i in new:
                add(hd, (c, int(i)), 1.0)
        if cells_ready and c in cell_classes and not candidates:  # the cell list's new entries (its erased ones leave below)
            old_c, new_c = set(ids[row[:gc]].tolist()), ids[rem[:gc]].tolist()
            for i in new_c:
                if i not in old_c:
                    _cell_edge(add, cd, cells_of, qi, c, int(i), 1.0)
    p.hub_delta, p.cell_delta = hd, cd
    del keep
    return p


def _searched(X, ids: np.ndarray, q: np.ndarray, n_erased: int, depth: int, exact: bool, candidates: bool,
              gone: np.ndarray, lists: Mapping, pos: Mapping[int, int]) -> list[np.ndarray]:
    """Per row of ``q`` (the erased positions, then the affected ones): positions nearest first, deep
    enough that ``depth`` remain once the erased are left out: one exact search of them all over the
    run's items before the erasure (as the job built its graph: ``exact``). With ``candidates``
    (the job's graph is approximate there): an exact search of the erased items only, and each
    affected item ranks the candidates an erased neighbour leaves -- its remaining entries, the
    erased items' exact nearest and their stored lists -- falling back to an exact search when
    those are fewer than ``depth``."""
    kk = min(X.shape[0], depth + 1 + min(depth, n_erased))
    if not candidates:
        return list(knn_rows(X, q, kk, exact))
    found = list(knn_rows(X, q[:n_erased], kk, False)) if n_erased else []
    near_erased = {int(ids[qi]): found[r] for r, qi in enumerate(q[:n_erased].tolist())}
    fallback = []
    for qi in q[n_erased:].tolist():
        j = int(ids[qi])
        cand: set[int] = set()
        for e in lists.get(j, ()):
            e = int(e)
            p_e = pos.get(e)
            if p_e is None:
                continue
            cand.add(p_e)
            if e in near_erased:
                cand.update(int(x) for x in near_erased[e])
                cand.update(pos[int(x)] for x in lists.get(e, ()) if int(x) in pos)
        cand.discard(qi)
        c = np.fromiter(cand, np.int64, len(cand))
        c = c[~gone[c]]
        if c.size < depth:
            fallback.append(len(found))
        d = ((np.asarray(X[c], dtype=np.float64) - np.asarray(X[qi], dtype=np.float64)) ** 2).sum(1)
        found.append(c[np.lexsort((c, d))])
    if fallback:
        exact_rows = knn_rows(X, q[np.asarray(fallback)], kk, False)
        for r, f in zip(fallback, exact_rows):
            found[r] = f
    return found


def _cell_edge(add, cd, cells_of, qi, c, i, v) -> None:
    add(cd, (0, c, 0, i), v)
    for K, m in cells_of.items():
        if m.get(qi, -1) >= 0:
            add(cd, (K, c, int(m[qi]), i), v)


def is_ready(doc) -> bool:
    return bool(doc) and doc.get("status") == "ready"


