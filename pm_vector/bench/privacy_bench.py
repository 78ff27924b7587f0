"""`pm-vector bench privacy`: nearest-neighbour utility of the private methods against epsilon.

Every method answers the same disjoint query split at the same (epsilon, delta); the split,
sizes and seeds are part of the output. Each private method returns ``k'`` candidates
(``shortlist``) for the real query, and the client re-ranks them to the final ``k``: by the
candidates' compact codes (``pm_vector_compact``, the default answer) or by raw features
(:meth:`pm_vector.client.query.PrivateKNN.rerank`). The headline metric is
``nn_recall_at_k``: the share of the exact non-private ``k`` nearest server items that come back
(:func:`pm_vector.bench.metrics.nn_recall_at_k`). ``epsilon = inf`` is each method's noise-free
endpoint (the same pipeline without noise; not a release).

Bytes: ``bytes_per_request`` is what one request costs on the wire, both directions: the msgpack
bytes (:mod:`pm_vector.protocol.codec`) of the request document and of an answer of every row's
``k'`` candidates (uint32 ids with uint8 codes, or with float32 features); the downloads count
the msgpack bytes of what they download (:func:`~pm_vector.bench.metrics.wire_bytes`).

Methods (the implementations: :mod:`pm_vector.bench.privacy_methods`):

- ``pm_vector_compact``: the default answer: the default release (below), each row's ``k'``
  candidates as ids and compact codes (:class:`~pm_vector.manifold.codes.ProductCodes`, fit on the
  public anchor, ``--code-bytes``), ``(k', code prefix)`` by the public rule
  :func:`~pm_vector.manifold.codes.compact_answer_shape` (its own ``k'``, not ``--shortlist``);
  the client re-ranks by asymmetric distance.
- ``pm_vector_raw`` (alias ``pm_vector``): the raw-feature answer: per epsilon the release the public rule
  :func:`~pm_vector.privacy.cell_release.release_for_epsilon` picks (the cell release, or the Gaussian
  one from ``GAUSSIAN_ABOVE``; the Gaussian's noise-free endpoint at ``inf``). Each row says which
  (``release``) and its ``delta``.
- ``pm_vector_cells``: the cell release (:mod:`pm_vector.privacy.cell_release`): public cells per class
  (k-means of the public anchor, :class:`~pm_vector.manifold.public_cells.PublicCells`), the real row's
  cell by K-ary randomized response, uniform reports in every other row, pure eps (delta 0); the
  server's :class:`~pm_vector.shortlist.CellShortlist`. K by
  :func:`~pm_vector.privacy.cell_release.cell_level_for_epsilon` (``--cells`` fixes it). At ``inf``: the
  true cell at the rule's finest K. The real row is the query's nearest public cell over every class
  (``PrivateCellKNN(row="nearest")``: no label needed, measured best); ``pm_vector_cells_label``
  takes the query's label's class instead. Each row has ``expected_nn_recall_at_k``: the exact
  expectation over the release's randomness for the same queries.
- ``pm_vector_gaussian``: the class-rows Gaussian release: class frames
  (:class:`~pm_vector.manifold.class_frames.ClassFrames` ``(4, 0.9)`` on the public anchor), one
  clipped discrete-Gaussian row per class (:class:`PrivateKNN`), the server's
  :class:`~pm_vector.shortlist.PosteriorShortlist`. At ``inf``:
  :func:`~pm_vector.shortlist.noise_free_shortlist` on 16-d frames (items of any class).
- ``pm_vector_label_free``: ``pm_vector_raw`` with a :class:`~pm_vector.kahm.KAHMClassifier` fit on
  the public anchor choosing the real row's class (skipped,
  with a message, when a class has too few anchor rows for its KAHM subspace).
- ``label_only`` (``partition_only`` for a collection without labels): what the label alone gives:
  the ``k'`` hubs of the query's class (the answer of either release as eps -> 0), re-ranked by
  the client's real features. One row, not a private release (the label itself is what it uses).
- ``reference_ldp``: the textbook local-DP release in the same frames: per class ``mu_c``, the
  top 4 directions ``U_c`` and ``r_c`` (90th percentile); every row (real query in its class,
  one public dummy in every other) is ``clip_{r_c}(U_c (x - mu_c)) + N(0, sigma_c^2 I)`` with
  ``sigma_c`` the analytic Gaussian sigma for ``(eps/2, delta/2)`` at sensitivity ``2 r_c``
  (two rows change: basic composition); the server ranks the class's items by distance to the
  row in the same clipped coordinates.
- ``privatemail_paper``: the PrivateMail protocol (Algorithm 1, SMLQ anchor frame, dummies,
  private first iteration, post-processing, Kabsch-Umeyama alignment), ``k'`` from the real row's
  embedding. At ``inf``: the labelled query's noise-free SMLQ embedding.
- ``dp_random_projection``, ``dp_pca``: the query's 8-d projection released with Gaussian noise
  (:mod:`pm_vector.bench.baselines`). At ``inf``: the noiseless projection.
- ``raw_knn``: exact k-NN on the raw features (non-private reference).
- ``download_lists``: the public table of the cell answers (C x K lists) downloaded once and
  looked up at the true cell: eps 0, one row per level K the cell release used
  (:mod:`pm_vector.bench.cell_methods`); its bytes are the table's.
- ``download_codes``: every item's code (one row per published stage prefix) and the codebooks
  downloaded once and searched locally by asymmetric distance: eps 0, reusable for every query.
- ``download_all``: the client downloads the whole collection and searches locally: perfectly
  private, exact, and as expensive as the collection.

A collection without labels (``partitions=C``): the public partitions
(:class:`~pm_vector.manifold.partitions.PublicPartitions`, k-means of the public anchor) replace
the classes of every part of the split; each item's and each query's class is its partition.

Server-side work in the benchmark is restricted to the real row's answer: the other rows'
answers do not change what the client sees about its query (they are counted in the bytes).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError, PMVectorError
from ..protocol import releases
from . import cell_methods, location_methods
from . import privacy_methods as pm
from .baselines import DPPCA, DPRandomProjection, RawKNN
from .privacy_plot import plot  # noqa: F401  (`pm-vector bench privacy --plot`)
from .metrics import (chance_recall_at_k, collection_bytes, distinct_lists_per_class, nn_recall_at_k,
                      precision_at_k, recall_at_k, wire_answer_bytes, wire_request_bytes)

#: every method, in table order
METHODS = ("pm_vector_location", "pm_vector_compact", "pm_vector_raw", "pm_vector_cells", "pm_vector_cells_label", "pm_vector_gaussian",
           "pm_vector_label_free",
           "label_only", "partition_only", "reference_ldp", "privatemail_paper", "dp_random_projection", "dp_pca",
           "raw_knn", "download_codes", "download_lists", "download_all")
#: other names of methods
ALIASES = {"pm_vector": "pm_vector_raw"}
#: methods without an epsilon (one row each)
NON_PRIVATE = ("raw_knn", "download_all")
#: the methods run when none are named (the paper's and the projection baselines are asked for by name)
DEFAULT_METHODS = ("pm_vector_location", "pm_vector_compact", "pm_vector_raw", "pm_vector_cells", "pm_vector_cells_label",
                   "pm_vector_gaussian", "pm_vector_label_free", "label_only", "partition_only", "reference_ldp",
                   "raw_knn", "download_codes", "download_lists", "download_all")
#: the epsilons of a run unless given
DEFAULT_EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0, 64.0, math.inf)
#: default k' per built-in dataset
DEFAULT_SHORTLIST = {"digits": 32, "fashion-mnist": 128, "fashion-mnist-70k": 128}


@dataclass
class BenchConfig:
    epsilons: tuple = DEFAULT_EPSILONS
    delta: float = 1e-5
    k: int = 8
    shortlist: int = 32
    seed: int = 0
    methods: tuple = DEFAULT_METHODS
    #: privatemail_paper: the SMLQ anchor frame's dimension (kept under this name: the database
    #: benchmarks and tests build their PrivateMail collections with BenchConfig().n_components)
    n_components: int = 16
    #: pm_vector / reference_ldp class frames
    class_components: int = 4
    clip_quantile: float = 0.9
    #: class frames of the noise-free endpoint
    noise_free_components: int = 16
    #: privatemail_paper's private iteration (the old benchmark's settings)
    dp_sigma: float = 1.0
    dp_alpha: float = 0.5
    #: dp_random_projection / dp_pca
    projection_dim: int = 8
    #: pm_vector_compact / download_codes / pm_vector_location: bytes of an item's residual code
    #: stages, their number, and the widths of the single-stage tables (as an embedding job's defaults)
    code_bytes: int = 32
    code_stages: int = 2
    code_widths: tuple = (64, 96, 128, 160, 192, 256)
    #: pm_vector_location: the byte budgets of one request (a row per budget and epsilon)
    max_bytes: tuple = (50_000,)
    #: pm_vector: prior items weighted one by one per row (the rest through the hub counts)
    max_prior: int = 512  # pm_vector.shortlist.MAX_PRIOR, the server default
    #: pm_vector: neighbours per item in the server's raw k-NN graph
    graph_degree: int = 16
    #: pm_vector_cells: the levels K fit per class (the usable ones: K <= the smallest class's anchor rows)
    cell_levels: tuple = (2, 4, 8, 16, 32, 64, 128)
    #: pm_vector_cells: neighbours per item in the cell ranking's graph
    cell_graph_degree: int = 32  # pm_vector.shortlist.CELL_GRAPH_DEGREE
    #: pm_vector_cells: a fixed K instead of the public rule
    n_cells: int | None = None
    #: a collection without labels: this many public partitions replace the classes
    partitions: int | None = None


def parse_epsilons(text: str) -> tuple[float, ...]:
    """``"1,4,16,inf"`` -> ``(1.0, 4.0, 16.0, inf)``; every value must be > 0 (``inf``: noise-free)."""
    vals = []
    for part in str(text).split(","):
        p = part.strip().lower()
        if not p:
            continue
        if p in ("inf", "infinity", "+inf"):
            vals.append(math.inf)
            continue
        try:
            v = float(p)
        except ValueError:
            raise InvalidInputError(f"expected comma-separated numbers or inf, e.g. 1,4,16,inf; got {text!r}") from None
        if not v > 0 or math.isnan(v):
            raise InvalidInputError(f"epsilons must be positive numbers (or inf); got {part.strip()!r}")
        vals.append(v)
    if not vals:
        raise InvalidInputError(f"no epsilon given; e.g. 1,4,16,inf (got {text!r})")
    return tuple(dict.fromkeys(vals))


def parse_methods(text: str | None) -> tuple[str, ...]:
    if text is None or not str(text).strip():
        return DEFAULT_METHODS
    names = tuple(dict.fromkeys(ALIASES.get(m.strip(), m.strip()) for m in str(text).split(",") if m.strip()))
    bad = [m for m in names if m not in METHODS]
    if bad:
        raise InvalidInputError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}.")
    return tuple(m for m in METHODS if m in names)


def epsilon_json(eps):
    """``None`` for non-private rows, ``"inf"`` for the noise-free endpoint, else the number."""
    if eps is None:
        return None
    return "inf" if math.isinf(eps) else float(eps)


# ----------------------------------------------------------------------------- the run

def _check_run(cfg: BenchConfig, k: int, shortlist: int, n_items: int) -> None:
    """Refuse k, the shortlist k' and the epsilons the benchmark cannot run with."""
    if not 1 <= k <= shortlist:
        raise InvalidInputError(f"k ({k}) must be between 1 and the shortlist k' ({shortlist}).")
    if shortlist > n_items:
        raise InvalidInputError(f"the shortlist k' ({shortlist}) exceeds the {n_items} server items.")
    for e in cfg.epsilons:
        if not (e > 0):
            raise InvalidInputError(f"epsilons must be positive (or inf); got {e!r}.")


class _Recorder:
    """``record(method, eps, retrieved, ...)``: one result row (recall, precision, bytes, distinct
    lists) appended to ``results``, and its progress line."""

    def __init__(self, ctx, cfg: BenchConfig, k: int, shortlist: int, true_idx, coll: float, progress):
        self.ctx, self.cfg, self.k, self.shortlist, self.true_idx, self.coll = ctx, cfg, k, shortlist, true_idx, coll
        self.progress = progress
        self.results: list[dict] = []

    def __call__(self, method, eps, retrieved, req_bytes, rows, seconds, extra=None, answer_k=None, candidates=None,
                 resp=None):
        ctx, cfg, k, true_idx, progress = self.ctx, self.cfg, self.k, self.true_idx, self.progress
        ys, yq = ctx.ys, ctx.yq
        if answer_k is None:
            answer_k = self.shortlist
        if resp is None:  # an answer of every row's k' candidates with raw float32 features
            resp = wire_answer_bytes(rows, answer_k, dim=ctx.dim)
        total = float(req_bytes + resp)
        row = {"method": method, "epsilon": epsilon_json(eps), "delta": _delta_of(method, eps, extra or {}, cfg),
               f"nn_recall_at_{k}": nn_recall_at_k(retrieved, true_idx),
               f"precision_at_{k}": precision_at_k(ys[retrieved], yq),
               f"recall_at_{k}": recall_at_k(ys[retrieved], yq),
               "bytes_per_request": total, "request_bytes": float(req_bytes), "response_bytes": float(resp),
               "bytes_share_of_collection": total / self.coll,
               "distinct_lists_per_class": distinct_lists_per_class(retrieved, yq),
               # the same on the server's k' answer (before the client's re-rank): how much the answer
               # depends on the query beyond its class
               "distinct_candidate_lists_per_class": distinct_lists_per_class(
                   retrieved if candidates is None else candidates, yq),
               "seconds": round(seconds, 3), **(extra or {})}
        self.results.append(row)
        if progress:
            e = "-" if eps is None else f"{eps:g}"
            exp = row.get(f"expected_nn_recall_at_{k}")
            progress(f"{method} eps={e}: nn_recall@{k} {row[f'nn_recall_at_{k}']:.3f}"
                     f"{'' if exp is None else f' (expected {exp:.3f})'}, precision@{k} "
                     f"{row[f'precision_at_{k}']:.3f}, {total / 1e3:,.1f} kB ({seconds:.1f}s)")


def _run_baseline(ctx, method: str, k: int, raw_seconds: float, record: _Recorder) -> bool:
    """The methods that take no epsilon and cannot fail (raw k-NN, the label / partition hubs, the
    download of everything): recorded; returns whether ``method`` was one of them."""
    Xs, ys, Xq = ctx.Xs, ctx.ys, ctx.Xq
    if method == "raw_knn":
        # the raw query (float32) goes out; the k nearest come back
        record("raw_knn", None, ctx.true_idx, wire_request_bytes(ctx.dim), 1, raw_seconds, answer_k=k)
        return True
    if method in ("label_only", "partition_only"):
        t = time.perf_counter()
        cand = cell_methods.class_hubs(ctx)
        record(method, None, pm._rerank(Xq, Xs, cand, k), wire_request_bytes(0, n_ids=1), 1,
               time.perf_counter() - t, {"release": "label"}, candidates=cand)
        return True
    if method == "download_all":
        t = time.perf_counter()
        retrieved = RawKNN().fit(Xs, ys).search(Xq, k)  # local exact search over the downloaded collection
        record("download_all", None, retrieved, 0, 1, time.perf_counter() - t, answer_k=len(ys))
        return True
    return False


def _run_method(ctx, cfg: BenchConfig, method: str, k: int, shortlist: int, record: _Recorder, state: dict) -> None:
    """One method that may fail (:class:`PMVectorError`: the caller skips it), at every epsilon
    (and every byte budget for the location release); the label-free classifier's accuracy goes
    to ``state["label_free_info"]``."""
    Xs, Xq, yq = ctx.Xs, ctx.Xq, ctx.yq
    runners = {
        "pm_vector_raw": lambda e: pm._default(ctx, e, "labelled"),
        "pm_vector_cells": lambda e: pm._cells(ctx, e, "labelled"),
        "pm_vector_cells_label": lambda e: pm._cells(ctx, e, "label"),
        "pm_vector_gaussian": lambda e: pm._gaussian(ctx, e, "labelled"),
        "pm_vector_label_free": lambda e: pm._default(ctx, e, "label_free"),
        "reference_ldp": lambda e: pm._reference_ldp(ctx, e),
        "privatemail_paper": lambda e: pm._privatemail(ctx, e),
        "dp_random_projection": lambda e: pm._dp_projection(ctx, e, DPRandomProjection),
        "dp_pca": lambda e: pm._dp_projection(ctx, e, DPPCA),
    }
    if method == "download_codes":
        t = time.perf_counter()
        for retrieved, nbytes, extra in pm.download_codes(ctx):
            record("download_codes", 0.0, retrieved, 0, 0, time.perf_counter() - t, extra, resp=nbytes)
            t = time.perf_counter()
        return
    if method == "download_lists":
        levels = sorted({int(r["n_cells"]) for r in record.results
                         if r.get("n_cells") and r["method"] != "pm_vector_compact"} or
                        {cell_methods.level_for(ctx, e) for e in cfg.epsilons})
        for K in levels:
            t = time.perf_counter()
            cand, table_bytes, extra = cell_methods.download_lists(ctx, K, ctx.dim)
            record("download_lists", 0.0, pm._rerank(Xq, Xs, cand, k), 0, 0, time.perf_counter() - t, extra,
                   candidates=cand, resp=table_bytes)
        return
    if method == "pm_vector_label_free":
        t = time.perf_counter()
        acc = float(np.mean(ctx.predicted == yq))
        state["label_free_info"] = {"classifier": "KAHMClassifier (fit on the public anchor)", "accuracy": acc,
                                    "fit_and_predict_seconds": round(time.perf_counter() - t, 3)}
    for eps in cfg.epsilons:
        t = time.perf_counter()
        if method == "pm_vector_location":
            for mb in cfg.max_bytes:
                t = time.perf_counter()
                cand, retrieved, req_bytes, resp, extra = location_methods.run_location(
                    ctx, eps, mb, pm._seed(cfg, method, eps))
                record(method, eps, retrieved, req_bytes, 1, time.perf_counter() - t, extra, resp=resp,
                       candidates=np.stack([c[:k] for c in cand]) if all(c.size >= k for c in cand)
                       else None)
            continue
        if method == "pm_vector_compact":
            cand, retrieved, req_bytes, resp, extra = pm.compact(ctx, eps)
            record(method, eps, retrieved, req_bytes, ctx.C, time.perf_counter() - t, extra,
                   candidates=cand, resp=resp)
            continue
        cand, req_bytes, rows, extra = runners[method](eps)
        cand = np.asarray(cand, dtype=np.int64)
        if cand.shape != (len(yq), shortlist):
            raise RuntimeError(f"{method} returned candidates of shape {cand.shape}, expected "
                               f"{(len(yq), shortlist)}")
        if method == "pm_vector_label_free":
            extra = {**extra, "classifier_accuracy": state["label_free_info"]["accuracy"]}
        record(method, eps, pm._rerank(Xq, Xs, cand, k), req_bytes, rows, time.perf_counter() - t, extra,
               candidates=cand)


def _summary(split, cfg: BenchConfig, ctx, methods: tuple, k: int, shortlist: int, coll: float, class_ceiling: float,
             results: list, t0: float, label_free_info, skipped: dict) -> dict:
    """The JSON-able result: the run's description and configuration, the rows, the crossover of the
    download baselines, what was skipped and the cell levels."""
    ys = ctx.ys
    freq = np.array([np.mean(ys == c) for c in np.unique(ys)])
    out = {"dataset": split.dataset.name, "split": split.describe(), "k": k, "shortlist": shortlist, "delta": cfg.delta,
           "seed": cfg.seed, "epsilons": [epsilon_json(e) for e in cfg.epsilons], "methods": list(methods),
           "class_ceiling": class_ceiling, f"chance_recall_at_{k}": float(chance_recall_at_k(freq, k)),
           "collection_bytes": coll, "dim": ctx.dim, "classes": ctx.C,
           "config": {"class_components": cfg.class_components, "clip_quantile": cfg.clip_quantile,
                      "noise_free_components": cfg.noise_free_components, "smlq_components": cfg.n_components,
                      "dp_sigma": cfg.dp_sigma, "dp_alpha": cfg.dp_alpha, "projection_dim": cfg.projection_dim,
                      "code_bytes": cfg.code_bytes, "code_stages": cfg.code_stages,
                      "code_widths": list(cfg.code_widths), "max_prior": cfg.max_prior,
                      "graph_degree": cfg.graph_degree, "cell_levels": list(cfg.cell_levels),
                      "cell_graph_degree": cfg.cell_graph_degree,
                      "n_cells": cfg.n_cells, "partitions": cfg.partitions},
           "results": results, "seconds": round(time.perf_counter() - t0, 2)}
    _crossover(out)
    if label_free_info is not None and "pm_vector_label_free" not in skipped:
        out["label_free_classifier"] = label_free_info
    if skipped:
        out["skipped"] = skipped
    if ctx.partitions is not None:
        out["labels"] = f"none: {cfg.partitions} public partitions (k-means of the public anchor) replace the classes"
    if {"pm_vector_cells", "pm_vector_raw", "pm_vector_compact"} & set(methods):
        try:
            out["cell_levels"] = list(cell_methods.cell_state(ctx)[0].levels_)
        except PMVectorError:
            pass
    return out


def run(split, cfg: BenchConfig, progress=None) -> dict:
    """Run the chosen methods on a :class:`~pm_vector.datasets.Split`; return the JSON-able result.

    ``progress(message)`` receives one line per finished method and epsilon.
    """
    t0 = time.perf_counter()
    k, shortlist = int(cfg.k), int(cfg.shortlist)
    methods = parse_methods(",".join(cfg.methods))
    # the label ablation has the name of what the rows stand for; a classifier has nothing to pick
    # when the rows are public partitions (the client computes its partition)
    drop = ("label_only", "pm_vector_label_free") if cfg.partitions is not None else ("partition_only",)
    methods = tuple(m for m in methods if m not in drop)
    ctx = pm._Context(split, cfg, progress)
    Xs, ys, Xq, yq = ctx.Xs, ctx.ys, ctx.Xq, ctx.yq
    _check_run(cfg, k, shortlist, len(ys))
    coll = collection_bytes(len(ys), ctx.dim)

    t = time.perf_counter()
    true_idx = RawKNN().fit(Xs, ys).search(Xq, k)
    ctx.true_idx = true_idx
    raw_seconds = time.perf_counter() - t
    class_ceiling = float(precision_at_k(ys[true_idx], yq))
    record = _Recorder(ctx, cfg, k, shortlist, true_idx, coll, progress)
    results = record.results
    state: dict = {"label_free_info": None}
    skipped = {}
    for method in methods:
        if _run_baseline(ctx, method, k, raw_seconds, record):
            continue
        try:
            _run_method(ctx, cfg, method, k, shortlist, record, state)
        except PMVectorError as exc:
            # one method that cannot run on this data (e.g. a class too small for its KAHM subspace)
            # is skipped with its reason; every other method's figures are kept
            skipped[method] = str(exc)
            results[:] = [r for r in results if r["method"] != method]
            if progress:
                progress(f"{method} skipped: {exc}")
    return _summary(split, cfg, ctx, methods, k, shortlist, coll, class_ceiling, results, t0, state["label_free_info"],
                    skipped)


def _crossover(out: dict) -> None:
    """``out["crossover"]``: for each download baseline row, how many compact requests cost as many
    bytes as the download (the download is reusable; below this many requests the private answer
    moves fewer bytes), against the largest compact request of the run; for ``download_codes`` also
    without the codebooks (which a client of compact answers downloads once too)."""
    compact = [r["bytes_per_request"] for r in out["results"] if r["method"] == "pm_vector_compact"]
    if not compact:
        return
    per = max(compact)
    out["crossover"] = [{"method": r["method"], **({"code_bytes": r["code_bytes"]} if "code_bytes" in r else {}),
                         **({"n_cells": r["n_cells"]} if "n_cells" in r else {}),
                         "download_bytes": r["bytes_per_request"], "compact_request_bytes": per,
                         "requests": r["bytes_per_request"] / per,
                         # a compact client downloads the codebooks once as well: the codes alone
                         **({"requests_without_codebooks": (r["bytes_per_request"] - r["codebook_bytes"]) / per}
                            if "codebook_bytes" in r else {})}
                        for r in out["results"] if r["method"] in ("download_codes", "download_lists", "download_all")]


def _delta_of(method: str, eps, extra: dict, cfg: BenchConfig):
    """The row's delta: 0 for the cell release and the downloads, the configured delta for the
    Gaussian releases, ``None`` where nothing is released with noise (raw_knn, eps = inf)."""
    if method in ("download_all", "download_lists", "download_codes"):
        return 0.0
    if eps is None or (isinstance(eps, float) and math.isinf(eps)):
        return None
    rel = releases.RELEASES.get(extra.get("release"))
    return float(rel.guarantee.delta) if rel is not None and rel.guarantee.pure else float(cfg.delta)

