"""`bench privacy`'s methods: the fitted public and server-side state (:class:`_Context`) and each
private method's answer to every query (see :mod:`pm_vector.bench.privacy_bench` for what each
method is).

Each request method returns ``(candidates (q, k') int64, request bytes, rows answered per
request, extra dict)``; its request bytes are the msgpack bytes on the wire
(:func:`~pm_vector.bench.metrics.wire_bytes` of the request document, mean over the queries). The
compact answer (:func:`compact`) and the code download (:func:`download_codes`) return their own
re-ranked lists and answer bytes.
"""

from __future__ import annotations

import math
import time
import zlib

import numpy as np

from ..alignment import align_request
from ..client import PrivateMail, PublicAnchor
from ..client.query import PrivateKNN
from ..manifold import AnchorFrame
from ..manifold.class_frames import ClassFrames
from ..manifold.codes import ProductCodes, compact_answer_shape
from ..privacy import secure_generator
from ..protocol import releases
from ..shortlist import PosteriorShortlist, noise_free_shortlist
from . import cell_methods
from .baselines import ReferenceClassLDP, knn_search
from .metrics import wire_answer_bytes, wire_bytes, wire_request_bytes
from ..kahm import KAHMClassifier
from ..manifold.partitions import PublicPartitions


def _seed(cfg, method: str, eps) -> int:
    """A reproducible, distinct seed for every (method, epsilon)."""
    return (cfg.seed * 1_000_003 + zlib.crc32(f"{method}:{eps}".encode())) % (2 ** 63)


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` highest scores, ties by the lower index (as PosteriorShortlist.shortlist)."""
    return np.lexsort((np.arange(scores.size), -scores))[:k]


def _privatemail_client(frame, eps, delta, cfg, rng):
    return PrivateMail(frame, epsilon=eps, delta=delta, dp_sigma=cfg.dp_sigma, dp_alpha=cfg.dp_alpha, _rng=rng)


class _Context:
    """The fitted public and server-side state shared by all methods."""

    def __init__(self, split, cfg, progress):
        self.cfg = cfg
        self.say = progress or (lambda msg: None)
        self.Xs, self.ys = split.server
        self.Xa, self.ya = split.anchor
        self.Xd, self.yd = split.dummy
        self.Xq, self.yq = split.query
        self.partitions = None
        if cfg.partitions is not None:
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
            return KAHMClassifier().fit(self.Xa, self.ya)
        return self.get("KAHM classifier", build)

    @property
    def predicted(self) -> np.ndarray:
        return self.get("KAHM predictions", lambda: np.asarray(self.classifier.predict(self.Xq)).astype(np.int64))

    @property
    def codes(self):
        """``(ProductCodes, item codes (n, code_bytes) uint8)``: the collection's published compact
        codes, fit on the public anchor only."""
        def build():
            widths = tuple(w for w in self.cfg.code_widths if w <= self.Xa.shape[1])  # as the job: at most d
            pc = ProductCodes(self.cfg.code_bytes, self.cfg.code_stages, widths).fit(self.Xa)
            return pc, pc.encode(self.Xs)
        return self.get("product codes", build)

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


def _default(ctx: _Context, eps, variant: str, shortlist: int | None = None):
    """What the public rule (:func:`pm_vector.protocol.releases.default_release` among the class-rows
    releases) picks at ``eps``: the cell release or the Gaussian one."""
    run = _CLASS_ROWS_RUNS[releases.default_release(eps, class_rows=True).name]
    return run(ctx, eps, variant, shortlist)


def _cells(ctx: _Context, eps, variant: str, shortlist: int | None = None):
    """The cell release; its real row is the nearest public cell (``labelled``), the label's class
    (``label``) or the classifier's (``label_free``)."""
    labels, X = _variant_inputs(ctx, variant)
    seed = _seed(ctx.cfg, f"pm_vector_cells:{variant}", eps)
    args = dict(true_idx=ctx.true_idx, k=int(ctx.cfg.k), shortlist=shortlist)
    if variant == "label_free":  # the client's classifier picks the row
        return cell_methods.run_cells(ctx, eps, None, X, seed, classifier=ctx.classifier, row="label", **args)
    return cell_methods.run_cells(ctx, eps, labels, X, seed, row="label" if variant == "label" else "nearest",
                                  **args)


def _gaussian(ctx: _Context, eps, variant: str, shortlist: int | None = None):
    cfg, shortlist = ctx.cfg, int(shortlist or ctx.cfg.shortlist)
    q = len(ctx.yq)
    labels, X = _variant_inputs(ctx, variant)
    C = ctx.C
    extra = {"release": "gaussian"}
    if math.isinf(eps):
        fr = ctx.frames_nf
        cand = noise_free_shortlist(fr, ctx.Xs, fr.clipped(X, labels), labels, shortlist)
        # no request is drawn at the endpoint: the bytes of one of the same shape (16-d frames)
        shape = PrivateKNN(fr, ctx.Xd, ctx.yd, 1.0, cfg.delta, shortlist=shortlist)
        shape._inject_generator(secure_generator(_seed(cfg, "request shape", shortlist)))
        return cand, float(wire_bytes(shape.request(X[0], int(labels[0]))[0].to_dict())), C, extra
    client = PrivateKNN(ctx.frames, ctx.Xd, ctx.yd, eps, cfg.delta, shortlist=shortlist,
                        classifier=ctx.classifier if variant == "label_free" else None)
    client._inject_generator(secure_generator(_seed(cfg, f"pm_vector_gaussian:{variant}", eps)))
    ps = ctx.posterior
    cand = np.empty((q, shortlist), dtype=np.int64)
    json_bytes = wire = 0
    for i in range(q):
        label = None if variant == "label_free" else int(labels[i])
        req, sec = client.request(X[i], label)
        s = ps.scores(req.rows[sec.real_row], req.sigmas[sec.real_row], req.classes[sec.real_row])
        cand[i] = _top(s, shortlist)
        json_bytes += len(req.to_json())
        wire += wire_bytes(req.to_dict())
    req_bytes = wire / q
    extra["request_json_bytes"] = round(json_bytes / q, 1)
    extra["noise_sigmas"] = [round(float(s), 6) for s in client.mechanism.sigmas_]
    return cand, req_bytes, C, extra


def _reference_ldp(ctx: _Context, eps):
    cfg, shortlist = ctx.cfg, ctx.cfg.shortlist
    fr = ctx.frames  # ClassFrames(4, 0.9): exactly mu_c, U_c (top 4 directions) and r_c (90th percentile)
    C, d = ctx.C, fr.components_.shape[1]
    req_bytes = wire_request_bytes(C * d, n_ids=C)
    ref = ReferenceClassLDP(eps, cfg.delta).fit(fr, ctx.Xs, ctx.ys)
    # only the real rows are drawn here; the dummy rows (drawn the same way) do not change the answer
    z = ref.release(ctx.Xq, ctx.yq, secure_generator(_seed(cfg, "reference_ldp", eps)))
    extra = {} if math.isinf(eps) else {"noise_sigmas": [round(float(s), 6) for s in ref.sigmas_]}
    return ref.shortlist(z, ctx.yq, shortlist), req_bytes, C, extra


def _privatemail(ctx: _Context, eps):
    cfg, shortlist = ctx.cfg, ctx.cfg.shortlist
    frame, items = ctx.smlq
    C, n_anchor, m = ctx.C, len(ctx.ya), frame.anchor_embedding_.shape[1]
    req_bytes = wire_request_bytes((C + n_anchor) * m, n_ids=n_anchor)
    if math.isinf(eps):
        return knn_search(frame.extend(ctx.Xq, ctx.yq), items, shortlist), req_bytes, C, {}
    anchor = PublicAnchor(list(range(n_anchor)), ctx.Xa, ctx.ya, ctx.Xd, ctx.yd)
    client = _privatemail_client(frame, eps, cfg.delta, cfg, secure_generator(_seed(cfg, "privatemail", eps)))
    cand = np.empty((len(ctx.yq), shortlist), dtype=np.int64)
    sigma = None
    for i in range(len(ctx.yq)):
        req, secret = client.request(ctx.Xq[i], int(ctx.yq[i]), anchor)
        aligned = align_request(req, anchor.ids, frame.anchor_embedding_)
        cand[i] = knn_search(aligned[secret.real_row:secret.real_row + 1], items, shortlist)[0]
        sigma = req.noise_sigma
        if (i + 1) % 100 == 0:
            ctx.say(f"    privatemail_paper eps={eps:g}: {i + 1}/{len(ctx.yq)} requests")
    return cand, req_bytes, C, {"noise_sigma": sigma, "request_rows": C + n_anchor}


def _dp_projection(ctx: _Context, eps, cls):
    cfg, shortlist = ctx.cfg, ctx.cfg.shortlist
    m = cfg.projection_dim
    req_bytes = wire_request_bytes(m)
    fit_eps = 1.0 if math.isinf(eps) else eps  # the projection does not depend on epsilon
    method = cls(m, fit_eps, cfg.delta).fit(ctx.Xs, ctx.ys, secure_generator(_seed(cfg, cls.name, "fit")))
    if math.isinf(eps):
        cand = knn_search(method.project(ctx.Xq), method.server_embedding_, shortlist)
        return cand, req_bytes, 1, {}
    cand = method.search(ctx.Xq, shortlist, secure_generator(_seed(cfg, cls.name, eps)))
    return cand, req_bytes, 1, {"noise_sigma": float(method.noise_sigma_)}



#: the benchmark's run of each class-rows release of the table
_CLASS_ROWS_RUNS = {"cells": _cells, "gaussian": _gaussian}


def _rerank(Xq, Xs, cand, k) -> np.ndarray:
    return np.stack([PrivateKNN.rerank(Xq[i], cand[i], Xs[cand[i]], k) for i in range(len(Xq))])


def compact(ctx: _Context, eps):
    """The default answer: the class-rows release :func:`~pm_vector.protocol.releases.default_release` picks, its shape ``(k', b)`` by
    the public rule :func:`compact_answer_shape`, every row's ``k'`` candidates as uint32 ids and
    ``b``-byte code prefixes; the client re-ranks its row by :meth:`ProductCodes.distances`.

    Returns ``(candidates (q, k'), retrieved (q, k), request bytes, answer bytes, extra)``."""
    pc, codes = ctx.codes
    k = int(ctx.cfg.k)
    rel = releases.default_release(eps, class_rows=True)
    release = rel.name
    shortlist, b = compact_answer_shape(ctx.C, rel, eps, pc.widths_)
    shortlist = min(shortlist, len(ctx.ys))
    cand, req_bytes, rows, extra = _default(ctx, eps, "labelled", shortlist)
    cand = np.asarray(cand, dtype=np.int64)
    retrieved = np.stack([c[np.argsort(pc.distances(x, pc.select(codes[c], b)), kind="stable")[:k]]
                          for x, c in zip(ctx.Xq, cand)])
    fields = {"release": release, "n_cells": int(extra.get("n_cells") or 0), "run_id": 1, "k_prime": shortlist,
              "codes": {"bytes": b, "digest": pc.digest()}}
    extra = {**{key: v for key, v in extra.items() if not key.startswith("expected_")},
             "k_prime": shortlist, "code_bytes": b}
    return cand, retrieved, req_bytes, float(wire_answer_bytes(rows, shortlist, code_bytes=b, fields=fields)), extra


def download_codes(ctx: _Context):
    """Every item's code (each published width in turn) and the codebooks that width needs
    downloaded once, searched locally by asymmetric distance: eps 0. Yields ``(retrieved (q, k),
    bytes, extra)`` per width; the bytes are the msgpack of the ids (uint32), the codes and the
    codebooks (the residual stages a prefix needs, or the one wide table)."""
    pc, codes = ctx.codes
    k = int(ctx.cfg.k)
    books = pc.to_dict()
    for b in pc.widths_:
        Rq = pc.rotate(ctx.Xq, b).astype(np.float32)
        recon = pc.decode(pc.select(codes, b)).astype(np.float32)  # the same order as ProductCodes.distances
        retrieved = knn_search(Rq, recon, k)
        stages = [c for c, w in zip(books["centroids"], pc.stage_bytes_) if w <= b] if b in pc.stage_bytes_ else []
        wide = [c for c in books["wide_centroids"] if c.shape[0] == b]
        cb = {**books, "centroids": stages, "wide_centroids": wide}
        doc = {"item_ids": np.zeros(len(ctx.ys), np.uint32), "codes": pc.select(codes, b), "codebooks": cb}
        # the codebooks are also what a client of compact answers downloads once (with the anchor)
        yield retrieved, float(wire_bytes(doc)), {"code_bytes": b, "codebook_bytes": wire_bytes(cb)}
