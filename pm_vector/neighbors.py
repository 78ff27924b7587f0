"""k-NN on raw features: exact (:func:`knn_search`, the ground truth of every benchmark) and the
server's neighbour graph (:func:`neighbor_graph`, what the shortlist of :mod:`pm_vector.shortlist`
walks): exact up to :data:`EXACT_MAX_ITEMS` items, approximate above (:func:`ivf_graph`). Items
added to a run or refilled after an erasure are searched as the run's graph was built
(:func:`knn_rows`).

The rule (``method``): ``"auto"`` computes the graph exactly when the collection has at most
``exact_max_items`` items (O(N^2) work, float64: the graph every test and figure on collections
of that size was made with) and blocked by k-means cells above (:func:`ivf_graph`: exact search
within each cell's nearest cells, float32, about linear in N, its probe chosen on a sample so
the lists hold a target share of the exact neighbours); ``"exact"``, ``"ivf"`` and ``"hnsw"``
(a faiss HNSW index, :func:`hnsw_graph`: 5 to 10 times slower than the blocked graph at
250,000 rows for a like recall) force one. The collection's ``settings["class_rows"]``
(``graph``, ``graph_exact_max_items``) choose them for its embedding job
(:mod:`pm_vector.db.runs.class_rows`).
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidInputError

#: float64 entries of one distance block (256 MB)
_BLOCK = 1 << 25
#: largest collection whose graph ``method="auto"`` computes exactly (about 40 s at 128 dims)
EXACT_MAX_ITEMS = 50_000
#: graph methods: see the module doc
GRAPH_METHODS = ("auto", "exact", "ivf", "hnsw")
#: HNSW parameters of ``graph="hnsw"``. ``pm-vector bench scale`` (unit-norm clustered rows,
#: 128 dims) reported the 16-NN graph's recall against the exact one: with ef_search 64, 0.993 at
#: 125,000 items and 0.972 at 250,000, so ef_search is 128
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128
#: the blocked graph (:func:`ivf_graph`, what ``"auto"`` uses above ``exact_max_items``): about this
#: many rows per k-means cell (``n / IVF_CELL_ROWS`` cells, at least 16)
IVF_CELL_ROWS = 500
#: the numbers of nearest cells a cell's rows search, tried in order until the sample's recall
#: reaches the target (the last one is kept otherwise)
IVF_PROBES = (8, 12, 16, 24, 32, 48, 64, 96, 128)
#: the share of a sample's exact ``g`` nearest rows its lists must hold before the probe is kept
IVF_TARGET_RECALL = 0.97
#: rows of that sample
IVF_SAMPLE = 500


def _faiss():
    """faiss (k-means, flat and HNSW search, BLAS products; see pyproject.toml), imported where a
    search first needs it."""
    import faiss

    return faiss


def knn_rows(X, q: np.ndarray, k: int, exact: bool) -> np.ndarray:
    """The ``k`` nearest rows of ``X`` to its rows ``q`` (positions; a row is among its own nearest,
    not always first among equal rows), nearest first, searched as an embedding job built its graph:
    ``exact`` -- the job's exact graph (:func:`knn_search`: float64, ties by position) -- else an exact
    float32 search by a matrix product (:func:`product_knn`), where the job's graph is approximate
    anyway: no float64 copy of ``X``."""
    if not q.size or k < 1:
        return np.zeros((0, 0), np.int64)
    if exact:
        return knn_search(X[q], X, k)
    X32 = np.ascontiguousarray(X, dtype=np.float32)
    return product_knn(X32[q], X32, k)[1]


#: items a block of :func:`product_knn` (its distances: queries x 8,192 float32)
PRODUCT_BLOCK = 8192


def product_knn(queries: np.ndarray, items: np.ndarray, k: int,
                inner_product: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The exact flat search in float32 by a matrix product, for any number of queries: ``(D, I)``
    (``(q, k)``; squared L2 ascending, or with ``inner_product`` the inner product descending; ``I``
    int64, -1 past the items, with ``D`` faiss's largest float32 (negated for the inner product)); equal
    ``D`` in no promised order. Per block of :data:`PRODUCT_BLOCK` items, ``faiss.pairwise_L2sqr`` (one
    BLAS ``sgemm``: ``|q|^2 + |x|^2 - 2 q.x``) and faiss's heaps keep the ``k`` best: faiss's own product
    search, which ``faiss.knn`` takes only from ``distance_compute_blas_threshold`` queries (128,000 in
    faiss 1.15; below it compares every pair with SIMD loops), without turning that process-wide
    threshold. For 360 queries of 16 dimensions against 300,000 items, about a third of the SIMD
    loops' CPU (``tools/search_cpu.py``; ``docs/benchmarks.md``).

    ``inner_product``: the squared L2 search of the rows lifted by one dimension, ``q' = (q, 0)`` and
    ``x' = (x, sqrt(M^2 - |x|^2))`` with ``M`` the largest ``|x|``: ``|q' - x'|^2 = |q|^2 + M^2 - 2 q.x``
    orders as the inner product, and ``D = (|q|^2 + M^2 - |q' - x'|^2) / 2``. Its float32 error is of the
    order of ``(d + 1) 2^-24 (|q| + M)^2``, not faiss's ``d 2^-24 |q| M``: for a caller that re-ranks
    exactly within a bound of it (:func:`pm_vector.db.runs.run_nearest.nearest`)."""
    faiss = _faiss()

    Q = np.ascontiguousarray(queries, dtype=np.float32)
    X = np.ascontiguousarray(items, dtype=np.float32)
    nq, n, k = Q.shape[0], X.shape[0], int(k)
    D = np.empty((nq, k), np.float32)
    I = np.empty((nq, k), np.int64)
    heaps = faiss.float_maxheap_array_t()
    heaps.nh, heaps.k = nq, k
    heaps.val, heaps.ids = faiss.swig_ptr(D), faiss.swig_ptr(I)
    heaps.heapify()
    if inner_product:
        xx = np.einsum("ij,ij->i", X, X)
        top = np.float32(xx.max(initial=0.0))
        qq = np.einsum("ij,ij->i", Q, Q)
        Q = np.ascontiguousarray(np.hstack([Q, np.zeros((nq, 1), np.float32)]))
    d = Q.shape[1]
    lifted = np.empty((min(n, PRODUCT_BLOCK), d), np.float32) if inner_product else None
    buf = np.empty(nq * min(max(n, 1), PRODUCT_BLOCK), np.float32)
    for j0 in range(0, n, PRODUCT_BLOCK):
        nb = min(PRODUCT_BLOCK, n - j0)
        block = X[j0:j0 + nb]
        if inner_product:
            lifted[:nb, :-1] = block
            lifted[:nb, -1] = np.sqrt(np.maximum(top - xx[j0:j0 + nb], 0))
            block = lifted[:nb]
        faiss.pairwise_L2sqr(d, nq, faiss.swig_ptr(Q), nb, faiss.swig_ptr(block), faiss.swig_ptr(buf), d, d, nb)
        heaps.addn(nb, faiss.swig_ptr(buf), j0, 0, nq)
    heaps.reorder()
    if inner_product:
        D = np.where(I >= 0, (qq[:, None] + top - D) / 2, -np.finfo(np.float32).max).astype(np.float32)
    return D, I


def knn_search(queries: np.ndarray, items: np.ndarray, k: int, *, batch_size: int | None = None,
               item_sqnorms: np.ndarray | None = None) -> np.ndarray:
    """Exact Euclidean k-NN: ``(q, k)`` int64 indices of the ``k`` nearest ``items`` of each query,
    nearest first (ties broken by the lower index). Computed in float64, in query batches of
    ``batch_size`` (memory ``batch_size x n_items``; by default at most ~256 MB per batch)."""
    qs = np.asarray(queries, dtype=np.float64)
    xs = np.asarray(items, dtype=np.float64)
    n = xs.shape[0]
    if not 1 <= k <= n:
        raise InvalidInputError(f"k must be between 1 and the number of server items ({n}); got {k}.")
    sq = np.einsum("ij,ij->i", xs, xs) if item_sqnorms is None else item_sqnorms
    if batch_size is None:
        batch_size = max(1, min(1024, _BLOCK // max(n, 1)))
    out = np.empty((qs.shape[0], k), dtype=np.int64)
    for start in range(0, qs.shape[0], batch_size):
        qb = qs[start:start + batch_size]
        # ||q - x||^2 minus the per-query constant ||q||^2
        d = sq[None, :] - 2.0 * (qb @ xs.T)
        if k < n:
            cand = np.argpartition(d, k - 1, axis=1)[:, :k]
            cand.sort(axis=1)  # ascending index, so the stable sort below breaks ties by index
            # a tie at the k-th distance: argpartition keeps an arbitrary one of the tied items;
            # those rows take the lowest-index ones, so that the k nearest are a prefix of the
            # k + 1 nearest (the graph's first columns are the smaller graph)
            kth = np.max(np.take_along_axis(d, cand, axis=1), axis=1, keepdims=True)
            tied = np.flatnonzero(np.count_nonzero(d <= kth, axis=1) > k)
            for r in tied:
                inside = np.flatnonzero(d[r] < kth[r, 0])
                at = np.flatnonzero(d[r] == kth[r, 0])[:k - inside.size]
                cand[r] = np.sort(np.concatenate([inside, at]))
        else:
            cand = np.broadcast_to(np.arange(n), d.shape).copy()
        dc = np.take_along_axis(d, cand, axis=1)
        order = np.argsort(dc, axis=1, kind="stable")
        out[start:start + qb.shape[0]] = np.take_along_axis(cand, order, axis=1)
    return out


def graph_method(n: int, method: str = "auto", exact_max_items: int = EXACT_MAX_ITEMS) -> str:
    """``"exact"``, ``"ivf"`` or ``"hnsw"``: how :func:`neighbor_graph` computes the graph of ``n`` rows."""
    if method not in GRAPH_METHODS:
        raise InvalidInputError(f"graph method must be one of {list(GRAPH_METHODS)}, got {method!r}.")
    if method == "auto":
        return "exact" if int(n) <= int(exact_max_items) else "ivf"
    return method


def neighbor_graph(X: np.ndarray, g: int, *, method: str = "auto", exact_max_items: int = EXACT_MAX_ITEMS,
                   n_threads: int | None = None, info: dict | None = None) -> np.ndarray:
    """``(n, g)`` int64 positions of the ``g`` nearest *other* rows of every row of ``X``, nearest
    first; ``g`` is capped at ``n - 1``. Exact (float64, ties by the lower index) or approximate
    (:func:`ivf_graph`, :func:`hnsw_graph`) by :func:`graph_method`. None makes an ``n x n``
    matrix nor (on the approximate paths) a float64 copy of ``X``. ``info``: filled by
    :func:`ivf_graph` (server-side figures of the build; never published)."""
    n = np.shape(X)[0]
    g = min(int(g), n - 1)
    if g <= 0:
        return np.zeros((n, 0), np.int64)
    how = graph_method(n, method, exact_max_items)
    if how == "ivf":
        return ivf_graph(X, g, n_threads=n_threads, info=info)
    if how == "hnsw":
        return hnsw_graph(X, g, n_threads=n_threads)
    X = np.asarray(X, dtype=np.float64)
    return _drop_self(knn_search(X, X, g + 1), g)


def _drop_self(nb: np.ndarray, g: int, start: int = 0, rows: np.ndarray | None = None) -> np.ndarray:
    """``(n, g)`` of the ``(n, g + 1)`` neighbour lists of rows ``start, start + 1, ...`` (or of the
    positions ``rows``): drop each row itself (a duplicate of lower index may precede it); if
    absent, drop the farthest."""
    n = nb.shape[0]
    own = nb == ((int(start) + np.arange(n)) if rows is None else np.asarray(rows))[:, None]
    drop = np.where(own.any(1), own.argmax(1), g)
    keep = np.ones_like(nb, dtype=bool)
    keep[np.arange(n), drop] = False
    return nb[keep].reshape(n, g).astype(np.int64, copy=False)


def hnsw_graph(X: np.ndarray, g: int, *, m: int = HNSW_M, ef_construction: int = HNSW_EF_CONSTRUCTION,
               ef_search: int = HNSW_EF_SEARCH, n_threads: int | None = None, batch_size: int = 65_536) -> np.ndarray:
    """Approximate :func:`neighbor_graph`: ``(n, g)`` int64 positions of ``g`` near *other* rows of
    every row of ``X``, nearest first by float32 distance, from a faiss ``IndexHNSWFlat`` of the
    rows (``m`` links, ``ef_construction``; searched with ``max(ef_search, 2 (g + 1))``).

    Memory: the index's float32 copy of ``X`` and its links (about ``4 d + 8 m`` bytes per row);
    ``X`` is read in float32 (a float32 array is used as is) and searched in batches of
    ``batch_size`` rows. Not bit-for-bit deterministic across thread counts (insertion order of a
    parallel build); a row the search returns fewer than ``g + 1`` results for (never seen on
    connected data) gets its exact list. ``n_threads``: faiss's OpenMP threads (default: all)."""
    faiss = _faiss()

    X32 = np.ascontiguousarray(X, dtype=np.float32)
    n, d = X32.shape
    g = min(int(g), n - 1)
    if g <= 0:
        return np.zeros((n, 0), np.int64)
    if n_threads is not None:
        faiss.omp_set_num_threads(int(n_threads))
    index = faiss.IndexHNSWFlat(d, int(m))
    index.hnsw.efConstruction = int(ef_construction)
    index.add(X32)
    index.hnsw.efSearch = max(int(ef_search), 2 * (g + 1))
    out = np.empty((n, g), np.int64)
    for s in range(0, n, int(batch_size)):
        e = min(n, s + int(batch_size))
        _, nb = index.search(X32[s:e], g + 1)
        short = np.flatnonzero((nb < 0).any(1))
        if short.size:  # fewer results than asked: the exact list of those rows
            nb[short] = knn_search(X32[s + short], X32, g + 1)
        out[s:e] = _drop_self(nb, g, start=s)
    return out


def ivf_graph(X: np.ndarray, g: int, *, cell_rows: int = IVF_CELL_ROWS, probes: tuple = IVF_PROBES,
              target_recall: float = IVF_TARGET_RECALL, sample: int = IVF_SAMPLE, n_threads: int | None = None,
              info: dict | None = None) -> np.ndarray:
    """Approximate :func:`neighbor_graph` by blocks: ``(n, g)`` int64 positions of ``g`` near *other*
    rows of every row of ``X``, nearest first by float32 distance.

    1. faiss k-means (``n / cell_rows`` cells, trained on 64 rows per cell) and every row's cell;
    2. the probe: for ``sample`` random rows, their exact ``g`` nearest rows (brute force against
       all rows) and their lists under each probe ``p`` of ``probes`` in turn; the first ``p``
       whose lists hold ``target_recall`` of the exact neighbours is kept (else the last);
    3. for every cell, the exact ``g + 1`` nearest rows of its rows among the rows of its ``p``
       nearest cells (itself first): one search by a matrix product per cell (:func:`product_knn`).

    Work: about ``n * p * cell_rows * d`` multiply-adds, linear in ``n`` for a fixed probe. Memory:
    a float32 copy of ``X`` (none when ``X`` is float32 and contiguous) and the lists. Every row
    is searched against its own cell, so a row whose cell is a cluster of duplicates finds them.
    A cell whose probed cells hold fewer than ``g + 1`` rows gets its rows' exact lists. ``info``
    receives ``cells``, ``probe`` and ``sample_recall`` (the kept probe's share on the sample):
    figures of the server's raw data, recorded with the job's timings and never published."""
    faiss = _faiss()

    X32 = np.ascontiguousarray(X, dtype=np.float32)
    n, d = X32.shape
    g = min(int(g), n - 1)
    if g <= 0:
        return np.zeros((n, 0), np.int64)
    if not probes or any(int(p) < 1 for p in probes) or not 0.0 < float(target_recall) <= 1.0:
        raise InvalidInputError("probes must be positive integers and target_recall in (0, 1].")
    if n_threads is not None:
        faiss.omp_set_num_threads(int(n_threads))
    rng = np.random.default_rng(0)  # the server's own job (not a release): a fixed seed repeats the build
    nlist = int(min(max(16, n // max(int(cell_rows), 1)), max(1, n // 4)))
    train = X32 if n <= 64 * nlist else X32[np.sort(rng.choice(n, 64 * nlist, replace=False))]
    km = faiss.Kmeans(d, nlist, niter=10, seed=1, max_points_per_centroid=64, min_points_per_centroid=1)
    km.train(train)
    assign = np.empty(n, np.int64)
    for s in range(0, n, 262_144):
        assign[s:s + 262_144] = km.index.search(X32[s:s + 262_144], 1)[1][:, 0]
    order = np.argsort(assign, kind="stable")
    bounds = np.searchsorted(assign[order], np.arange(nlist + 1))
    members = [order[bounds[c]:bounds[c + 1]] for c in range(nlist)]
    pmax = min(int(max(probes)), nlist)
    near = km.index.search(km.centroids, pmax)[1]  # each cell's nearest cells (itself first, unless tied)
    near = np.array([np.concatenate([[c], [j for j in row if j != c and j >= 0]])[:pmax] for c, row in
                     enumerate(near)], dtype=np.int64)

    def lists(rows: np.ndarray, cell: int, p: int) -> np.ndarray:
        cand = np.concatenate([members[j] for j in near[cell, :p]])
        if cand.size < g + 1:
            return knn_search(X32[rows], X32, g + 1)
        return cand[product_knn(X32[rows], X32[cand], g + 1)[1]]  # g + 1 <= cand.size: no -1 in the result

    # the probe, on a sample: the smallest whose lists hold target_recall of the exact neighbours
    sm = np.sort(rng.choice(n, min(int(sample), n), replace=False))
    ex = product_knn(X32[sm], X32, g + 2)[1]
    exact = [set(r[r != i][:g].tolist()) for r, i in zip(ex, sm)]
    probe, rec = pmax, 0.0
    sm_cells = [(c, np.flatnonzero(assign[sm] == c)) for c in np.unique(assign[sm])]  # one search per cell
    for p in sorted({min(int(p), nlist) for p in probes}):
        got = np.empty((sm.size, g + 1), np.int64)
        for c, at in sm_cells:
            got[at] = lists(sm[at], int(c), p)
        rec = float(np.mean([len(set(r[r != i][:g].tolist()) & e) / g for r, i, e in zip(got, sm, exact)]))
        probe = p
        if rec >= float(target_recall):
            break
    out = np.empty((n, g), np.int64)
    for c in range(nlist):
        rows = members[c]
        if rows.size:
            out[rows] = _drop_self(lists(rows, c, probe), g, rows=rows)
    if info is not None:
        info.update({"cells": nlist, "probe": int(probe), "sample_recall": rec})
    return out
