"""`pm-vector bench privacy`: nearest-neighbour utility of the private methods against epsilon.

Every method answers the same disjoint query split at the same (epsilon, delta); the split,
sizes and seeds are part of the output. Each private method returns ``k'`` candidates
(``shortlist``) for the real query, and the client re-ranks them by raw features to the final
``k`` (:meth:`pm_vector.client.query.PrivateKNN.rerank`). The headline metric is
``nn_recall_at_k``: the share of the exact non-private ``k`` nearest server items that come back
(:func:`pm_vector.bench.metrics.nn_recall_at_k`). ``epsilon = inf`` is each method's noise-free
endpoint (the same pipeline without noise; not a release).

Methods:

- ``pm_vector``: the default: per epsilon the release the public rule
  :func:`~pm_vector.privacy.cells.release_for_epsilon` picks (the cell release, or the Gaussian
  one from ``GAUSSIAN_ABOVE``; the Gaussian's noise-free endpoint at ``inf``). Each row says which
  (``release``) and its ``delta``.
- ``pm_vector_cells``: the cell release (:mod:`pm_vector.privacy.cells`): public cells per class
  (k-means of the public anchor, :class:`~pm_vector.manifold.cells.PublicCells`), the real row's
  cell by K-ary randomized response, uniform reports in every other row, pure eps (delta 0); the
  server's :class:`~pm_vector.shortlist.CellShortlist`. K by
  :func:`~pm_vector.privacy.cells.cell_level_for_epsilon` (``--cells`` fixes it). At ``inf``: the
  true cell at the rule's finest K. The real row is the query's nearest public cell over every class
  (``PrivateCellKNN(row="nearest")``: no label needed, measured best); ``pm_vector_cells_label``
  takes the query's label's class instead. Each row has ``expected_nn_recall_at_k``: the exact
  expectation over the release's randomness for the same queries.
- ``pm_vector_gaussian``: the class-rows Gaussian release: class frames
  (:class:`~pm_vector.manifold.class_frames.ClassFrames` ``(4, 0.9)`` on the public anchor), one
  clipped discrete-Gaussian row per class (:class:`PrivateKNN`), the server's
  :class:`~pm_vector.shortlist.PosteriorShortlist`. At ``inf``:
  :func:`~pm_vector.shortlist.noise_free_shortlist` on 16-d frames (items of any class).
- ``pm_vector_codes``: ``pm_vector``'s candidates re-ranked by the collection's published
  compact codes (:class:`~pm_vector.manifold.codes.PublicProjection`: 64-d PCA of the public
  anchor, halfvec) instead of raw features.
- ``pm_vector_label_free``: ``pm_vector`` with a :class:`~pm_vector.kahm.KAHMClassifier` fit on
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
import zlib
from dataclasses import dataclass

import numpy as np

from ..client import PrivateMail, PublicAnchor
from ..client.query import PrivateKNN
from ..errors import InvalidInputError, PMVectorError
from ..manifold import AnchorFrame
from ..manifold.class_frames import ClassFrames
from ..manifold.codes import PublicProjection
from ..privacy import secure_generator
from ..alignment import align_request
from ..privacy.cells import release_for_epsilon
from ..shortlist import PosteriorShortlist, noise_free_shortlist
from . import cell_methods
from .baselines import DPPCA, DPRandomProjection, RawKNN, ReferenceClassLDP, knn_search
from .privacy_plot import plot  # noqa: F401  (`pm-vector bench privacy --plot`)
from .metrics import (candidate_bytes, chance_recall_at_k, collection_bytes, distinct_lists_per_class,
                      float_payload_bytes, nn_recall_at_k, precision_at_k, recall_at_k)

#: every method, in table order
METHODS = ("pm_vector", "pm_vector_cells", "pm_vector_cells_label", "pm_vector_gaussian", "pm_vector_codes",
           "pm_vector_label_free",
           "label_only", "partition_only", "reference_ldp", "privatemail_paper", "dp_random_projection", "dp_pca",
           "raw_knn", "download_lists", "download_all")
#: methods without an epsilon (one row each)
NON_PRIVATE = ("raw_knn", "download_all")
#: the methods run when none are named (the paper's and the projection baselines are asked for by name)
DEFAULT_METHODS = ("pm_vector", "pm_vector_cells", "pm_vector_cells_label", "pm_vector_gaussian", "pm_vector_codes",
           "pm_vector_label_free",
                   "label_only", "partition_only", "reference_ldp", "raw_knn", "download_lists", "download_all")
#: the epsilons of a run unless given
DEFAULT_EPSILONS = (1.0, 2.0, 4.0, 8.0, 16.0, 64.0, math.inf)
#: default k' per built-in dataset
DEFAULT_SHORTLIST = {"digits": 32, "fashion-mnist": 128}


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
    #: pm_vector_codes: dimension of the published halfvec code
    code_components: int = 64
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
    names = tuple(dict.fromkeys(m.strip() for m in str(text).split(",") if m.strip()))
    bad = [m for m in names if m not in METHODS]
    if bad:
        raise InvalidInputError(f"unknown method(s) {', '.join(bad)}; choose from {', '.join(METHODS)}.")
    return tuple(m for m in METHODS if m in names)


def epsilon_json(eps):
    """``None`` for non-private rows, ``"inf"`` for the noise-free endpoint, else the number."""
    if eps is None:
        return None
    return "inf" if math.isinf(eps) else float(eps)


def _seed(cfg: BenchConfig, method: str, eps) -> int:
    """A reproducible, distinct seed for every (method, epsilon)."""
    return (cfg.seed * 1_000_003 + zlib.crc32(f"{method}:{eps}".encode())) % (2 ** 63)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, ties by the lower index (as PosteriorShortlist.shortlist)."""
    return np.lexsort((np.arange(scores.size), -scores))[:k]


def _privatemail_client(frame, eps, delta, cfg, rng):
    return PrivateMail(frame, epsilon=eps, delta=delta, dp_sigma=cfg.dp_sigma, dp_alpha=cfg.dp_alpha, _rng=rng)


class _Context:
    """The fitted public and server-side state shared by all methods."""

    def __init__(self, split, cfg: BenchConfig, progress):
        self.cfg = cfg
        self.say = progress or (lambda msg: None)
        self.Xs, self.ys = split.server
        self.Xa, self.ya = split.anchor
        self.Xd, self.yd = split.dummy
        self.Xq, self.yq = split.query
        self.partitions = None
        if cfg.partitions is not None:
            from ..manifold.partitions import PublicPartitions
            # the classes are the public partitions: every part's items get theirs from their features
            self.partitions = PublicPartitions(cfg.partitions, random_state=cfg.seed).fit(self.Xa)
            self.ys, self.ya, self.yd, self.yq = (self.partitions.predict(X) for X in
                                                  (self.Xs, self.Xa, self.Xd, self.Xq))
            # a partition without a public dummy takes its public anchor rows as dummies
            lack = np.setdiff1d(np.unique(self.ya), self.yd)
            if lack.size:
                add = np.isin(self.ya, lack)
                self.Xd, self.yd = np.concatenate([self.Xd, self.Xa[add]]), np.concatenate([self.yd, self.ya[add]])
        self.dim = int(self.Xs.shape[1])
        self.C = int(len(np.unique(self.ya)))
        self._cache = {}

    def get(self, name, build):
        if name not in self._cache:
            t = time.perf_counter()
            self._cache[name] = build()
            self.say(f"  fitted {name} in {time.perf_counter() - t:.1f}s")
        return self._cache[name]

    @property
    def frames(self) -> ClassFrames:
        return self.get("class frames", lambda: ClassFrames(self.cfg.class_components, self.cfg.clip_quantile)
                        .fit(self.Xa, self.ya))

    @property
    def frames_nf(self) -> ClassFrames:
        return self.get("noise-free frames", lambda: ClassFrames(self.cfg.noise_free_components,
                                                                 self.cfg.clip_quantile).fit(self.Xa, self.ya))

    @property
    def posterior(self) -> PosteriorShortlist:
        return self.get("posterior shortlist", lambda: PosteriorShortlist(self.cfg.graph_degree, self.cfg.max_prior)
                        .fit(self.frames, self.Xs, self.ys))

    @property
    def classifier(self):
        def build():
            from ..kahm import KAHMClassifier
            return KAHMClassifier().fit(self.Xa, self.ya)
        return self.get("KAHM classifier", build)

    @property
    def predicted(self) -> np.ndarray:
        return self.get("KAHM predictions", lambda: np.asarray(self.classifier.predict(self.Xq)).astype(np.int64))

    @property
    def codes(self):
        """``(projection, item codes)``: the collection's published compact code (public PCA)."""
        def build():
            proj = PublicProjection(self.cfg.code_components).fit(self.Xa)
            return proj, proj.transform(self.Xs)
        return self.get("public codes", build)

    @property
    def smlq(self):
        def build():
            frame = AnchorFrame(self.cfg.n_components, seed=self.cfg.seed).fit(self.Xa, self.ya)
            return frame, frame.extend(self.Xs, self.ys)
        return self.get("SMLQ anchor frame", build)


# ----------------------------------------------------------------------------- methods
# each returns (candidates (q, k') int64, request_bytes per request, rows answered per request, extra dict)

def _variant_inputs(ctx: _Context, variant: str):
    """``(labels, features)`` of the queries: the true labels or the classifier's (``label_free``)."""
    return (ctx.predicted if variant == "label_free" else ctx.yq), ctx.Xq


def _default(ctx: _Context, eps, variant: str):
    """What the public rule picks at ``eps``: the cell release or the Gaussian one."""
    if release_for_epsilon(eps) == "cells":
        return _cells(ctx, eps, variant)
    return _gaussian(ctx, eps, variant)


def _cells(ctx: _Context, eps, variant: str):
    """The cell release; its real row is the nearest public cell (``labelled``), the label's class
    (``label``) or the classifier's (``label_free``)."""
    labels, X = _variant_inputs(ctx, variant)
    seed = _seed(ctx.cfg, f"pm_vector_cells:{variant}", eps)
    args = dict(true_idx=ctx.true_idx, k=int(ctx.cfg.k))
    if variant == "label_free":  # the client's classifier picks the row
        return cell_methods.run_cells(ctx, eps, None, X, seed, classifier=ctx.classifier, row="label", **args)
    return cell_methods.run_cells(ctx, eps, labels, X, seed, row="label" if variant == "label" else "nearest",
                                  **args)


def _gaussian(ctx: _Context, eps, variant: str):
    cfg, kp = ctx.cfg, ctx.cfg.shortlist
    q = len(ctx.yq)
    labels, X = _variant_inputs(ctx, variant)
    C, d = ctx.C, ctx.frames.components_.shape[1]
    # rows (C x d), sigmas (C) and classes (C) of the request, plus the 32-hex frames digest
    req_bytes = float_payload_bytes(C * d + C, n_ids=C) + 32
    extra = {"release": "gaussian"}
    if math.isinf(eps):
        fr = ctx.frames_nf
        cand = noise_free_shortlist(fr, ctx.Xs, fr.clipped(X, labels), labels, kp)
        return cand, req_bytes, C, extra
    client = PrivateKNN(ctx.frames, ctx.Xd, ctx.yd, eps, cfg.delta, shortlist=kp,
                        classifier=ctx.classifier if variant == "label_free" else None)
    client._inject_generator(secure_generator(_seed(cfg, f"pm_vector_gaussian:{variant}", eps)))
    ps = ctx.posterior
    cand = np.empty((q, kp), dtype=np.int64)
    json_bytes = 0
    for i in range(q):
        label = None if variant == "label_free" else int(labels[i])
        req, sec = client.request(X[i], label)
        s = ps.scores(req.rows[sec.row], req.sigmas[sec.row], req.classes[sec.row])
        cand[i] = _top(s, kp)
        json_bytes += len(req.to_json())
    extra["request_json_bytes"] = round(json_bytes / q, 1)
    extra["noise_sigmas"] = [round(float(s), 6) for s in client.mechanism.sigmas_]
    return cand, req_bytes, C, extra


def _reference_ldp(ctx: _Context, eps):
    cfg, kp = ctx.cfg, ctx.cfg.shortlist
    fr = ctx.frames  # ClassFrames(4, 0.9): exactly mu_c, U_c (top 4 directions) and r_c (90th percentile)
    C, d = ctx.C, fr.components_.shape[1]
    req_bytes = float_payload_bytes(C * d, n_ids=C)
    ref = ReferenceClassLDP(eps, cfg.delta).fit(fr, ctx.Xs, ctx.ys)
    # only the real rows are drawn here; the dummy rows (drawn the same way) do not change the answer
    z = ref.release(ctx.Xq, ctx.yq, secure_generator(_seed(cfg, "reference_ldp", eps)))
    extra = {} if math.isinf(eps) else {"noise_sigmas": [round(float(s), 6) for s in ref.sigmas_]}
    return ref.shortlist(z, ctx.yq, kp), req_bytes, C, extra


def _privatemail(ctx: _Context, eps):
    cfg, kp = ctx.cfg, ctx.cfg.shortlist
    frame, items = ctx.smlq
    C, n_anchor, m = ctx.C, len(ctx.ya), frame.anchor_embedding_.shape[1]
    req_bytes = float_payload_bytes((C + n_anchor) * m, n_ids=n_anchor)
    if math.isinf(eps):
        return knn_search(frame.extend(ctx.Xq, ctx.yq), items, kp), req_bytes, C, {}
    anchor = PublicAnchor(list(range(n_anchor)), ctx.Xa, ctx.ya, ctx.Xd, ctx.yd)
    client = _privatemail_client(frame, eps, cfg.delta, cfg, secure_generator(_seed(cfg, "privatemail", eps)))
    cand = np.empty((len(ctx.yq), kp), dtype=np.int64)
    sigma = None
    for i in range(len(ctx.yq)):
        req, secret = client.request(ctx.Xq[i], int(ctx.yq[i]), anchor)
        aligned = align_request(req, anchor.ids, frame.anchor_embedding_)
        cand[i] = knn_search(aligned[secret.real_row:secret.real_row + 1], items, kp)[0]
        sigma = req.noise_sigma
        if (i + 1) % 100 == 0:
            ctx.say(f"    privatemail_paper eps={eps:g}: {i + 1}/{len(ctx.yq)} requests")
    return cand, req_bytes, C, {"noise_sigma": sigma, "request_rows": C + n_anchor}


def _dp_projection(ctx: _Context, eps, cls):
    cfg, kp = ctx.cfg, ctx.cfg.shortlist
    m = cfg.projection_dim
    req_bytes = float_payload_bytes(m)
    fit_eps = 1.0 if math.isinf(eps) else eps  # the projection does not depend on epsilon
    method = cls(m, fit_eps, cfg.delta).fit(ctx.Xs, ctx.ys, secure_generator(_seed(cfg, cls.name, "fit")))
    if math.isinf(eps):
        cand = knn_search(method.project(ctx.Xq), method.server_embedding_, kp)
        return cand, req_bytes, 1, {}
    cand = method.search(ctx.Xq, kp, secure_generator(_seed(cfg, cls.name, eps)))
    return cand, req_bytes, 1, {"noise_sigma": float(method.noise_sigma_)}


# ----------------------------------------------------------------------------- the run

def _rerank(Xq, Xs, cand, k) -> np.ndarray:
    return np.stack([PrivateKNN.rerank(Xq[i], cand[i], Xs[cand[i]], k) for i in range(len(Xq))])


def _rerank_codes(ctx: _Context, cand, k) -> np.ndarray:
    proj, codes = ctx.codes
    return _rerank(proj.transform(ctx.Xq), codes, cand, k)


def run(split, cfg: BenchConfig, progress=None) -> dict:
    """Run the chosen methods on a :class:`~pm_vector.datasets.Split`; return the JSON-able result.

    ``progress(message)`` receives one line per finished method and epsilon.
    """
    t0 = time.perf_counter()
    k, kp = int(cfg.k), int(cfg.shortlist)
    methods = parse_methods(",".join(cfg.methods))
    # the label ablation has the name of what the rows stand for; a classifier has nothing to pick
    # when the rows are public partitions (the client computes its partition)
    drop = ("label_only", "pm_vector_label_free") if cfg.partitions is not None else ("partition_only",)
    methods = tuple(m for m in methods if m not in drop)
    ctx = _Context(split, cfg, progress)
    Xs, ys, Xq, yq = ctx.Xs, ctx.ys, ctx.Xq, ctx.yq
    if not 1 <= k <= kp:
        raise InvalidInputError(f"k ({k}) must be between 1 and the shortlist k' ({kp}).")
    if kp > len(ys):
        raise InvalidInputError(f"the shortlist k' ({kp}) exceeds the {len(ys)} server items.")
    for e in cfg.epsilons:
        if not (e > 0):
            raise InvalidInputError(f"epsilons must be positive (or inf); got {e!r}.")
    coll = collection_bytes(len(ys), ctx.dim)

    t = time.perf_counter()
    true_idx = RawKNN().fit(Xs, ys).search(Xq, k)
    ctx.true_idx = true_idx
    raw_seconds = time.perf_counter() - t
    class_ceiling = float(precision_at_k(ys[true_idx], yq))
    results = []

    def record(method, eps, retrieved, req_bytes, rows, seconds, extra=None, answer_k=kp, candidates=None,
               resp=None):
        if resp is None:
            resp = candidate_bytes(answer_k, rows, cfg.code_components, 2) if method == "pm_vector_codes" else \
                candidate_bytes(answer_k, rows, ctx.dim)
        total = float(req_bytes + resp)
        row = {"method": method, "epsilon": epsilon_json(eps), "delta": _delta_of(method, eps, extra or {}, cfg),
               f"nn_recall_at_{k}": nn_recall_at_k(retrieved, true_idx),
               f"precision_at_{k}": precision_at_k(ys[retrieved], yq),
               f"recall_at_{k}": recall_at_k(ys[retrieved], yq),
               "bytes_per_request": total, "request_bytes": float(req_bytes), "response_bytes": float(resp),
               "bytes_share_of_collection": total / coll,
               "distinct_lists_per_class": distinct_lists_per_class(retrieved, yq),
               # the same on the server's k' answer (before the client's re-rank): how much the answer
               # depends on the query beyond its class
               "distinct_candidate_lists_per_class": distinct_lists_per_class(
                   retrieved if candidates is None else candidates, yq),
               "seconds": round(seconds, 3), **(extra or {})}
        results.append(row)
        if progress:
            e = "-" if eps is None else f"{eps:g}"
            progress(f"{method} eps={e}: nn_recall@{k} {row[f'nn_recall_at_{k}']:.3f}, precision@{k} "
                     f"{row[f'precision_at_{k}']:.3f} ({seconds:.1f}s)")

    runners = {
        "pm_vector": lambda e: _default(ctx, e, "labelled"),
        "pm_vector_cells": lambda e: _cells(ctx, e, "labelled"),
        "pm_vector_cells_label": lambda e: _cells(ctx, e, "label"),
        "pm_vector_gaussian": lambda e: _gaussian(ctx, e, "labelled"),
        "pm_vector_codes": lambda e: _default(ctx, e, "labelled"),
        "pm_vector_label_free": lambda e: _default(ctx, e, "label_free"),
        "reference_ldp": lambda e: _reference_ldp(ctx, e),
        "privatemail_paper": lambda e: _privatemail(ctx, e),
        "dp_random_projection": lambda e: _dp_projection(ctx, e, DPRandomProjection),
        "dp_pca": lambda e: _dp_projection(ctx, e, DPPCA),
    }
    label_free_info = None
    skipped = {}
    for method in methods:
        if method == "raw_knn":
            # the raw query (float32) goes out; the k nearest come back
            record("raw_knn", None, true_idx, ctx.dim * 4, 1, raw_seconds, answer_k=k)
            continue
        if method in ("label_only", "partition_only"):
            t = time.perf_counter()
            cand = cell_methods.class_hubs(ctx)
            record(method, None, _rerank(Xq, Xs, cand, k), float_payload_bytes(0, n_ids=1), 1,
                   time.perf_counter() - t, {"release": "label"}, candidates=cand)
            continue
        if method == "download_all":
            t = time.perf_counter()
            retrieved = RawKNN().fit(Xs, ys).search(Xq, k)  # local exact search over the downloaded collection
            record("download_all", None, retrieved, 0, 1, time.perf_counter() - t, answer_k=len(ys))
            continue
        try:
            if method == "download_lists":
                levels = sorted({int(r["n_cells"]) for r in results if r.get("release") == "cells"} or
                                {cell_methods.level_for(ctx, e) for e in cfg.epsilons})
                for K in levels:
                    t = time.perf_counter()
                    cand, table_bytes, extra = cell_methods.download_lists(ctx, K, ctx.dim)
                    record("download_lists", 0.0, _rerank(Xq, Xs, cand, k), 0, 0, time.perf_counter() - t, extra,
                           candidates=cand, resp=table_bytes)
                continue
            if method == "pm_vector_label_free":
                t = time.perf_counter()
                acc = float(np.mean(ctx.predicted == yq))
                label_free_info = {"classifier": "KAHMClassifier (fit on the public anchor)", "accuracy": acc,
                                   "fit_and_predict_seconds": round(time.perf_counter() - t, 3)}
            for eps in cfg.epsilons:
                t = time.perf_counter()
                cand, req_bytes, rows, extra = runners[method](eps)
                cand = np.asarray(cand, dtype=np.int64)
                if cand.shape != (len(yq), kp):
                    raise RuntimeError(f"{method} returned candidates of shape {cand.shape}, expected "
                                       f"{(len(yq), kp)}")
                retrieved = _rerank_codes(ctx, cand, k) if method == "pm_vector_codes" else \
                    _rerank(Xq, Xs, cand, k)
                if method == "pm_vector_label_free":
                    extra = {**extra, "classifier_accuracy": label_free_info["accuracy"]}
                record(method, eps, retrieved, req_bytes, rows, time.perf_counter() - t, extra, candidates=cand)
        except PMVectorError as exc:
            # one method that cannot run on this data (e.g. a class too small for its KAHM subspace)
            # is skipped with its reason; every other method's figures are kept
            skipped[method] = str(exc)
            results[:] = [r for r in results if r["method"] != method]
            if progress:
                progress(f"{method} skipped: {exc}")

    freq = np.array([np.mean(ys == c) for c in np.unique(ys)])
    out = {"dataset": split.dataset.name, "split": split.describe(), "k": k, "shortlist": kp, "delta": cfg.delta,
           "seed": cfg.seed, "epsilons": [epsilon_json(e) for e in cfg.epsilons], "methods": list(methods),
           "class_ceiling": class_ceiling, f"chance_recall_at_{k}": float(chance_recall_at_k(freq, k)),
           "collection_bytes": coll, "dim": ctx.dim, "classes": ctx.C,
           "config": {"class_components": cfg.class_components, "clip_quantile": cfg.clip_quantile,
                      "noise_free_components": cfg.noise_free_components, "smlq_components": cfg.n_components,
                      "dp_sigma": cfg.dp_sigma, "dp_alpha": cfg.dp_alpha, "projection_dim": cfg.projection_dim,
                      "code_components": cfg.code_components, "max_prior": cfg.max_prior,
                      "graph_degree": cfg.graph_degree, "cell_levels": list(cfg.cell_levels),
                      "cell_graph_degree": cfg.cell_graph_degree,
                      "n_cells": cfg.n_cells, "partitions": cfg.partitions},
           "results": results, "seconds": round(time.perf_counter() - t0, 2)}
    if label_free_info is not None and "pm_vector_label_free" not in skipped:
        out["label_free_classifier"] = label_free_info
    if skipped:
        out["skipped"] = skipped
    if ctx.partitions is not None:
        out["labels"] = f"none: {cfg.partitions} public partitions (k-means of the public anchor) replace the classes"
    if "pm_vector_cells" in methods or "pm_vector" in methods:
        try:
            out["cell_levels"] = list(cell_methods.cell_state(ctx)[0].levels_)
        except PMVectorError:
            pass
    return out


def _delta_of(method: str, eps, extra: dict, cfg: BenchConfig):
    """The row's delta: 0 for the cell release and the downloads, the configured delta for the
    Gaussian releases, ``None`` where nothing is released with noise (raw_knn, eps = inf)."""
    if method in ("download_all", "download_lists"):
        return 0.0
    if eps is None or (isinstance(eps, float) and math.isinf(eps)):
        return None
    return 0.0 if extra.get("release") == "cells" else float(cfg.delta)

