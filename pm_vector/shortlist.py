"""The server's shortlist for a pm_vector request (one noised row per class).

:class:`PosteriorShortlist` is the ranking: fit on the server's items (what the embedding job
stores per run), it scores every item for a released row. :func:`noise_free_shortlist` is the
benchmark-only endpoint without noise. :func:`rank_retained` ranks one row from its retained
prior alone: what a resolve runs once the database has found that prior (the pgvector k-NN of
the row in its class). The SQL function ``pm_vector.pm_shortlist`` computes the same scores in
the database, for SQL callers and sharded runs (tests compare all three).

:class:`CellShortlist` is the ranking of the cell release (:mod:`pm_vector.privacy.cell_release`): per
(class, cell) hub counts (:func:`cell_hub_counts`) weighted by the reported cell's likelihood.
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidInputError
from .neighbors import EXACT_MAX_ITEMS, graph_method, neighbor_graph
from .deprecation import renamed_keywords
from ._validation import as_labels, as_matrix
from .privacy.cell_release import cell_weight

#: neighbours per item in the server's raw k-NN graph
GRAPH_DEGREE = 16
#: neighbours per item in the cell release's graph (CellShortlist): measured on Fashion-MNIST
#: (k' = 128), 32 neighbours give nn_recall@8 0.835 / 0.823 against 0.797 / 0.796 with 16 at
#: eps 16 and K = 100 / 64, and the same within 0.01 at K <= 16; 64 lose 0.02 at K <= 16. The
#: first GRAPH_DEGREE columns of this graph are PosteriorShortlist's graph.
CELL_GRAPH_DEGREE = 32
#: prior items per row read by distance (index order); the rest enter through the class hub counts.
#: 512: the statement aggregates C x max_prior x graph_degree contributions, half as many as at 1024,
#: for nn_recall@8 0.328 / 0.333 / 0.361 / 0.574 at eps 1 / 4 / 16 / 64 on Fashion-MNIST against
#: 0.329 / 0.343 / 0.361 / 0.572 (docs/benchmarks.md, "Where a resolve spends its time")
MAX_PRIOR = 512
#: a retained prior item whose weight exceeds the far weight by less than this adds nothing of its
#: own (it counts as far, through the hub counts): the statement then aggregates only the items
#: that move a score by at least this much (see PosteriorShortlist and docs/benchmarks.md, "Where a resolve
#: spends its time")
MIN_WEIGHT = 0.0


class PosteriorShortlist:
    """The server's answer to a pm_vector request: fitted on the items (the embedding job stores
    ``neighbors_``, the prior and ``hubs_`` in the run's tables) and scored in memory here, in
    SQL by ``pm_vector.pm_shortlist`` (``sql/0005_class_rows.sql``: the same scores, one
    statement per request).

    A released row ``z_c`` of class ``c`` with noise ``sigma_c`` says where the query probably
    lies in class ``c``'s frame. The server's items of class ``c`` are the prior: item ``j``
    gets the weight ``w_j = exp(-(||z_c - p_j||^2 - min) / (2 sigma_c^2))`` (``p_j`` its clipped
    frame coordinates), and every item ``i`` the score ``sum_j w_j [i in N(j)]``, ``N(j)`` the
    ``graph_degree`` nearest items of ``j`` by raw features (of any class). The ``k'`` best
    scored items are the row's shortlist. When the noise is large the weights are flat and the
    shortlist holds the class's hubs (what the label alone gives); as epsilon grows it narrows
    to the query's neighbourhood. Only the ``max_prior`` nearest prior items are weighted
    individually; the others share the weight of the farthest of those, through the precomputed
    per-class hub counts ``h_c(i) = sum_{j in c} [i in N(j)]`` (exact when a class has at most
    ``max_prior`` items). A retained item whose excess ``w_j - w_far`` is below ``min_weight``
    is treated as far too (its neighbours get only the hub term): each such item moves a score by
    less than ``min_weight``, and the SQL statement then unnests only the neighbour lists of the
    items that matter -- at small epsilon (flat weights) almost none, at large epsilon a few dozen.

    ``graph`` / ``graph_exact_max_items``: how the raw k-NN graph is computed
    (:func:`pm_vector.neighbors.neighbor_graph`: exact up to that many items, blocked k-means cells
    above, or forced with ``"exact"`` / ``"ivf"`` / ``"hnsw"``). Float32 items are kept in float32 (no float64 copy of
    all of them; each class's rows are converted for its frame only).

    Learned: ``neighbors_`` ``(N, graph_degree)``, ``prior_`` (per class: item indices and
    clipped coordinates), ``hubs_`` (per class: hub counts), ``graph_method_`` (``"exact"``,
    ``"ivf"`` or ``"hnsw"``).
    """

    def __init__(self, graph_degree: int = GRAPH_DEGREE, max_prior: int = MAX_PRIOR, min_weight: float = MIN_WEIGHT,
                 graph: str = "auto", graph_exact_max_items: int = EXACT_MAX_ITEMS):
        self.graph_degree = graph_degree
        self.max_prior = max_prior
        self.min_weight = min_weight
        self.graph = graph
        self.graph_exact_max_items = graph_exact_max_items

    def fit(self, frames, X, y, neighbors: np.ndarray | None = None) -> "PosteriorShortlist":
        """``neighbors``: a graph of ``X`` the caller computed already (``(N, >= graph_degree)``
        positions, nearest first, e.g. the cell release's wider one): its first ``graph_degree``
        columns are used instead of computing the graph again."""
        X = as_matrix(X, "items", dtype=np.float32 if getattr(X, "dtype", None) == np.float32 else np.float64)
        y = as_labels(y, X.shape[0], "item labels")
        g = int(self.graph_degree)
        if g < 1 or int(self.max_prior) < 1:
            raise InvalidInputError("graph_degree and max_prior must be positive integers.")
        mw = self.min_weight
        if isinstance(mw, bool) or not isinstance(mw, (int, float, np.floating)) or not 0 <= float(mw) < 1:
            raise InvalidInputError(f"min_weight must be a number in [0, 1), got {mw!r}.")
        self.graph_method_ = graph_method(X.shape[0], self.graph, self.graph_exact_max_items)
        g_eff = min(g, X.shape[0] - 1)
        if neighbors is not None:
            nb = np.asarray(neighbors)
            if nb.ndim != 2 or nb.shape[0] != X.shape[0] or nb.shape[1] < max(g_eff, 0):
                raise InvalidInputError(f"neighbors must be ({X.shape[0]}, >= {g_eff}), got {nb.shape}.")
            self.neighbors_ = np.ascontiguousarray(nb[:, :max(g_eff, 0)], dtype=np.int64)
        else:
            self.neighbors_ = neighbor_graph(X, g, method=self.graph_method_)
        self.n_items_ = X.shape[0]
        self.frames_ = frames
        self.prior_, self.hubs_ = {}, {}
        for c in frames.classes_:
            idx = np.flatnonzero(y == c)
            self.prior_[int(c)] = (idx, frames.clipped(X[idx], np.full(idx.size, c)) if idx.size else
                                   np.zeros((0, frames.components_.shape[1])))
            self.hubs_[int(c)] = hub_counts(self.neighbors_, idx, X.shape[0])
        return self

    def scores(self, z, sigma: float, label: int) -> np.ndarray:
        """Score of every item for one released row ``z`` of class ``label`` with noise ``sigma``."""
        idx, P = self.prior_[int(label)]
        s = np.zeros(self.n_items_)
        if idx.size == 0:
            return s
        d2 = prior_d2(P, z)
        order = np.argsort(d2, kind="stable")[: int(self.max_prior)]
        dw, keep, w_far = prior_weights(d2[order], sigma, order.size < idx.size, self.min_weight)
        np.add.at(s, self.neighbors_[idx[order[keep]]].ravel(), np.repeat(dw[keep], self.neighbors_.shape[1]))
        if w_far > 0:
            s += w_far * self.hubs_[int(label)]
        return s

    @renamed_keywords(k_prime="shortlist")  # its old keyword, until 0.3.0
    def shortlist(self, request, shortlist: int | None = None) -> list[np.ndarray]:
        """For every row of a :class:`~pm_vector.client.query.ClassRowsRequest`, the ``k'`` item
        indices with the highest scores (ties by index)."""
        shortlist = int(shortlist or request.shortlist)
        out = []
        for z, sigma, c in zip(request.rows, request.sigmas, request.classes):
            s = self.scores(z, sigma, c)
            order = np.lexsort((np.arange(s.size), -s))
            out.append(order[:shortlist])
        return out


#: rows of the graph read at a time by :func:`hub_counts`
HUB_BATCH = 65_536


def hub_counts(neighbors: np.ndarray, rows: np.ndarray, n_items: int, batch_size: int | None = None) -> np.ndarray:
    """``(n_items,)`` float64: how many of the lists ``neighbors[rows]`` hold each item (the
    class hub counts ``h_c``), summed over batches of ``batch_size`` rows (exact integers)."""
    b = int(batch_size or HUB_BATCH)
    out = np.zeros(int(n_items), np.int64)
    for s in range(0, rows.shape[0], b):
        out += np.bincount(neighbors[rows[s:s + b]].ravel(), minlength=int(n_items))
    return out.astype(np.float64)


def prior_d2(P: np.ndarray, z) -> np.ndarray:
    """Squared distances in float64 from the released row ``z`` to prior coordinates ``P``."""
    return ((P - np.asarray(z, dtype=np.float64)) ** 2).sum(1)


def prior_weights(d2: np.ndarray, sigma: float, far: bool, min_weight: float):
    """``(dw, keep, w_far)`` of the retained prior, ``d2`` ascending: each item's excess weight
    ``w_j - w_far`` over the far weight (that of the farthest retained item when the class had
    more than ``max_prior`` items -- ``far`` -- else 0), and which items add it (``dw >=
    min_weight``)."""
    if d2.size == 0:
        return d2, np.zeros(0, bool), 0.0
    w = np.exp(-(d2 - d2[0]) / (2.0 * float(sigma) ** 2))
    w_far = float(w[-1]) if far else 0.0
    dw = w - w_far
    return dw, dw >= float(min_weight), w_far


@renamed_keywords(k_prime="shortlist")  # its old keyword, until 0.3.0
def rank_retained(d2: np.ndarray, nbrs: np.ndarray, nhub: np.ndarray, sigma: float, far: bool, min_weight: float,
                  top_ids: np.ndarray, top_hubs: np.ndarray, fill_ids: np.ndarray, shortlist: int):
    """The ``k'`` best ``(item ids, scores)`` of one row, from its retained prior alone: ``d2``
    ascending (ties by item id), ``nbrs`` / ``nhub`` their neighbour lists (item ids) and those
    neighbours' hub counts in the row's class, the class's top hubs (``top_ids`` by hub
    descending, then id; at least ``k'`` of them when the class has that many) and the run's
    first item ids (``fill_ids``). The same scores as :meth:`PosteriorShortlist.scores`, summed in
    the same order, and the same candidates as ``pm_vector.pm_shortlist``: items touched by a
    retained item, the class's ``k'`` top hubs when ``w_far > 0`` and the ``k'`` first items;
    any other item scores ``w_far * hub`` at most, below all of those top hubs (or 0, and
    after the fill by id)."""
    shortlist = int(shortlist)
    dw, keep, w_far = prior_weights(d2, sigma, far, min_weight)
    nb = nbrs[keep].ravel()
    hubs_on = w_far > 0
    top_ids = top_ids[:shortlist] if hubs_on else top_ids[:0]
    cand_ids = np.concatenate([nb, top_ids, fill_ids[:shortlist]])
    if cand_ids.size == 0:
        return cand_ids, np.zeros(0)
    lo = int(cand_ids.min())
    span = int(cand_ids.max()) - lo + 1
    if span > 64 * cand_ids.size + (1 << 16):  # ids far apart: compact them first
        uniq, inv = np.unique(cand_ids, return_inverse=True)
        pos_nb, pos_top = inv[:nb.size], inv[nb.size:nb.size + top_ids.size]
        pos_all, ids_of = inv, uniq
        span = uniq.size
    else:
        pos_nb, pos_top = nb - lo, top_ids - lo
        pos_all, ids_of = cand_ids - lo, None
    score = np.bincount(pos_nb, weights=np.repeat(dw[keep], nbrs.shape[1]), minlength=span)
    if hubs_on:
        hub = np.zeros(span)
        hub[pos_nb] = nhub[keep].ravel()
        hub[pos_top] = top_hubs[:top_ids.size]
        score = score + w_far * hub
    is_cand = np.zeros(span, bool)
    is_cand[pos_all] = True
    cand = np.flatnonzero(is_cand)
    ids = cand + lo if ids_of is None else ids_of[cand]
    s = score[cand]
    if s.size > shortlist:  # only the scores reaching the k'-th are ordered (all of them: ties at the edge included)
        edge = np.partition(s, s.size - shortlist)[s.size - shortlist]
        top = np.flatnonzero(s >= edge)
        ids, s = ids[top], s[top]
    best = np.lexsort((ids, -s))[:shortlist]
    return ids[best], s[best]


@renamed_keywords(k_prime="shortlist")  # its old keyword, until 0.3.0
def noise_free_shortlist(frames, X, query_coords, labels, shortlist: int) -> np.ndarray:
    """Benchmark only: the ``k'`` items of *any* class nearest to each query's clipped frame
    coordinates, ranked in its class's frame without noise (the endpoint the private answers
    approach as epsilon grows). Never part of a request."""
    out = np.empty((len(labels), int(shortlist)), dtype=np.int64)
    coords = {}
    for i, (z, c) in enumerate(zip(np.asarray(query_coords), labels)):
        if int(c) not in coords:
            coords[int(c)] = frames.transform(X, np.full(X.shape[0], c))
        d2 = ((coords[int(c)] - z) ** 2).sum(1)
        out[i] = np.argsort(d2, kind="stable")[: int(shortlist)]
    return out


# --------------------------------------------------------------------------- the cell release's ranking
def cell_hub_counts(neighbors, y_index, cell_of_item, n_items: int, *, n_classes: int | None = None,
                    n_cells: int | None = None):
    """Per-(class, cell) hub counts ``h_{c,K,r}(i) = sum_{j in class c, cell(j) = r} [i in N(j)]``
    as a ``scipy.sparse.csr_matrix`` of shape ``(n_classes * n_cells, n_items)`` (row ``c * K + r``,
    float64 integer values). ``neighbors``: ``(N, g)`` item ids, ``y_index``: each item's class
    position, ``cell_of_item``: each item's cell in its class."""
    from scipy import sparse

    nb = np.asarray(neighbors, dtype=np.int64)
    yi = np.asarray(y_index, dtype=np.int64).reshape(-1)
    cell = np.asarray(cell_of_item, dtype=np.int64).reshape(-1)
    if nb.ndim != 2 or yi.shape[0] != nb.shape[0] or cell.shape[0] != nb.shape[0]:
        raise InvalidInputError("neighbors must be (N, g), with one class index and one cell per item.")
    C = int(n_classes if n_classes is not None else (yi.max() + 1 if yi.size else 1))
    K = int(n_cells if n_cells is not None else (cell.max() + 1 if cell.size else 1))
    if yi.size and (yi.min() < 0 or yi.max() >= C or cell.min() < 0 or cell.max() >= K):
        raise InvalidInputError("class indices and cells must lie in [0, n_classes) and [0, n_cells).")
    rows = np.repeat(yi * K + cell, nb.shape[1])
    m = sparse.csr_matrix((np.ones(rows.size), (rows, nb.ravel())), shape=(C * K, int(n_items)))
    m.sum_duplicates()
    return m


class CellShortlist:
    """The server's answer to a cell request (:mod:`pm_vector.privacy.cell_release`), in memory.

    Fit on the server's items with the published cells: ``N(j)`` the ``graph_degree`` (32) nearest
    items of ``j`` by raw features (any class), ``h_c(i)`` the class hub count (as
    :class:`PosteriorShortlist`), and per level ``K`` and cell ``r`` of class ``c`` the cell hub
    count ``h_{c,K,r}(i)`` (``cell(j)`` = nearest centroid of ``j``'s class). A report ``r`` for
    class ``c`` weights item ``j`` of class ``c`` by its RR likelihood ``T(cell(j), r)`` (``p`` if
    ``cell(j) = r``, else ``q``), so item ``i`` scores ``q h_c(i) + (p - q) h_{c,K,r}(i)``,
    proportional to ``h_c(i) + w h_{c,K,r}(i)`` with ``w = cell_weight(eps)`` (``e^eps - 1``,
    capped so that eps = inf ranks by ``(h_{c,K,r}, h_c)``). The row's answer is its top ``k'``
    items by (score desc, id asc): items scoring 0 come last, by id (the fill).

    Learned: ``neighbors_``, ``hubs_`` (dict class index -> dense counts), ``cell_hubs_`` (dict
    ``K -> csr (C * K, N)`` from :func:`cell_hub_counts`), ``cells_of_items_`` (dict ``K -> int64
    (N,)``), ``y_index_``, ``n_items_``.
    """

    def __init__(self, graph_degree: int = CELL_GRAPH_DEGREE):
        self.graph_degree = graph_degree

    def fit(self, cells, X, y) -> "CellShortlist":
        X = as_matrix(X, "items")
        y = as_labels(y, X.shape[0], "item labels")
        g = self.graph_degree
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
            raise InvalidInputError("graph_degree must be a positive integer.")
        self.cells_ = cells
        self.y_index_ = cells.class_index(y)
        self.neighbors_ = neighbor_graph(X, int(g))
        self.n_items_ = X.shape[0]
        C = cells.classes_.size
        self.hubs_ = {c: np.bincount(self.neighbors_[self.y_index_ == c].ravel(), minlength=self.n_items_)
                      .astype(np.float64) for c in range(C)}
        self.cells_of_items_, self.cell_hubs_ = {}, {}
        for K in cells.levels_:
            cell = cells.assign(X, self.y_index_, K)
            self.cells_of_items_[K] = cell
            self.cell_hubs_[K] = cell_hub_counts(self.neighbors_, self.y_index_, cell, self.n_items_, n_classes=C,
                                                 n_cells=K)
        return self

    def scores(self, class_index: int, K: int, report: int, epsilon) -> np.ndarray:
        """Score of every item for the report ``report`` of class position ``class_index``."""
        K, c, r = int(K), int(class_index), int(report)
        if K not in self.cell_hubs_ or not 0 <= r < K or c not in self.hubs_:
            raise InvalidInputError(f"no cell {r} of class position {c} at level {K}.")
        h = self.cell_hubs_[K].getrow(c * K + r).toarray().ravel()
        return self.hubs_[c] + cell_weight(epsilon) * h

    @renamed_keywords(k_prime="shortlist")  # its old keyword, until 0.3.0
    def shortlist(self, request, shortlist: int | None = None) -> list[np.ndarray]:
        """For every row of a :class:`~pm_vector.client.request.CellRequest`, the ``k'`` item
        indices with the highest scores (ties by index)."""
        shortlist = int(shortlist or request.shortlist)
        out = []
        for c, r in enumerate(request.reports):
            s = self.scores(c, request.n_cells, r, request.epsilon)
            out.append(np.lexsort((np.arange(s.size), -s))[:shortlist])
        return out


#: the most candidates a location answer may hold (and the most entries a run keeps per cell)
MAX_LOCATION_CANDIDATES = 65_536


def location_list(row_ids, row_hubs, row_chubs, top_ids, top_chubs, weight: float, size: int) -> tuple[np.ndarray,
                                                                                                      np.ndarray]:
    """The answer to a location report (:mod:`pm_vector.privacy.location`): ``(ids, scores)`` of
    the ``size`` best items, best first.

    Candidates: the reported cell's row (``row_ids`` with ``h_r``, ``row_hubs``, and ``h``,
    ``row_chubs``), scored ``h(i) + weight * h_r(i)``, and the collection's top hubs (``top_ids``
    by ``h`` desc, with ``h``, ``top_chubs``), scored ``h(i)`` (their ``h_r`` is 0 unless they are in
    the row). Ranked by score desc, then id; an item in both keeps its larger score. float64
    throughout: ``pm_vector.pm_location_shortlist_core`` ranks with the same numbers."""
    size = int(size)
    ids = np.concatenate([np.asarray(row_ids, np.int64), np.asarray(top_ids, np.int64)[:size]])
    s = np.concatenate([np.asarray(row_chubs, np.float64) + float(weight) * np.asarray(row_hubs, np.float64),
                        np.asarray(top_chubs, np.float64)[:size]])
    if ids.size == 0:
        return ids, s
    k = 2 * size  # (an item is at most twice among them: in the row and in the top hubs)
    if ids.size > k > 0:
        # only the entries scoring at least the k-th best can matter, ties kept: fewer than ``size``
        # items score above the answer's last, each with at most two entries, so the k-th best is at
        # most the answer's last score, and every item scoring at least that keeps its best entry. The
        # same list as sorting all of them (a row of 20,000 entries at 10^6 items: 4 ms a miss, the
        # ranking's most): one partition instead
        keep = s >= np.partition(s, ids.size - k)[ids.size - k]
        ids, s = ids[keep], s[keep]
    o = np.lexsort((-s, ids))  # by id, best score first
    first = np.r_[True, ids[o][1:] != ids[o][:-1]]
    ids, s = ids[o][first], s[o][first]
    o = np.lexsort((ids, -s))[:size]
    return ids[o], s[o]


#: :func:`live` tests many ids by a table of the tombstones' id range up to this many ids (bytes)
_ISIN_TABLE = 1 << 24
#: :func:`live` tests up to this many ids by a binary search each
_SEARCH_MAX = 8192


def live(ids, dead: np.ndarray) -> np.ndarray:
    """A mask of ``ids``: True where the id is not in ``dead`` (ascending, as the tombstones are read:
    ``ORDER BY item_id``). Up to :data:`_SEARCH_MAX` ids, a binary search of each (a cell's row: at
    324,000 tombstones ``np.isin`` built a table of their whole range for each row, about 0.5 ms);
    more ids (the top hubs, once per tombstone set: :func:`live_top`) by ``np.isin``, a table of the
    ids' range when it is small (item ids of a sequence)."""
    ids = np.asarray(ids, np.int64)
    if dead.size == 0 or ids.size == 0:
        return np.ones(ids.shape, bool)
    if ids.size <= _SEARCH_MAX:
        pos = np.searchsorted(dead, ids)
        return dead[np.minimum(pos, dead.size - 1)] != ids
    kind = "table" if int(dead[-1]) - int(dead[0]) < _ISIN_TABLE else None
    return ~np.isin(ids, dead, kind=kind)


def live_top(top_ids, top_chubs, dead) -> tuple[np.ndarray, np.ndarray]:
    """The top hubs ``(ids, chubs)`` minus the tombstoned ids ``dead`` (ascending), in their order: the
    same for every answer at one tombstone set, so a resolving process filters them once per set
    (:mod:`pm_vector.db.resolve.location_cache`)."""
    top_ids = np.asarray(top_ids, np.int64)
    kt = live(top_ids, np.asarray(dead, np.int64))
    return top_ids[kt], np.asarray(top_chubs, np.float64)[kt]


def merged_row(row_ids, row_hubs, row_chubs, new_ids, new_hubs, new_chubs, top_ids, top_chubs, dead, *,
               top_live: bool = False):
    """The candidates :func:`location_list` ranks once a run has a delta (:mod:`pm_vector.db.runs.delta`):
    ``(row_ids, row_hubs, row_chubs, top_ids, top_chubs)`` of the base row minus the tombstoned ids
    ``dead`` (ascending) together with the cell's delta entries (``new_*``: ``h_r``, ``h``), and the
    top hubs minus ``dead`` (:func:`live_top`; ``top_live``: the caller passes them so already).
    ``pm_location_shortlist_core`` (``sql/0023_delta.sql``) ranks the same union."""
    dead = np.asarray(dead, np.int64)
    row_ids, new_ids = (np.asarray(a, np.int64) for a in (row_ids, new_ids))
    k, kn = live(row_ids, dead), live(new_ids, dead)
    if not top_live:
        top_ids, top_chubs = live_top(top_ids, top_chubs, dead)
    f = lambda a, m: np.asarray(a, np.float64)[m]  # noqa: E731
    return (np.concatenate([row_ids[k], new_ids[kn]]), np.concatenate([f(row_hubs, k), f(new_hubs, kn)]),
            np.concatenate([f(row_chubs, k), f(new_chubs, kn)]), np.asarray(top_ids, np.int64),
            np.asarray(top_chubs, np.float64))
