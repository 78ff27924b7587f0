"""`pm-vector bench privacy`: Algorithm 1 in memory, PrivateMail against its baselines.

Every method answers the same disjoint query split at the same (eps, delta); the split,
sizes and seeds are part of the output. Methods:

- ``raw_knn``: exact k-NN on raw features (non-private reference);
- ``smlq_nonprivate``: the anchor-frame SMLQ embedding of the labelled query, no noise;
- ``privatemail``: the full protocol (dummies, private first iteration, post-processing,
  Kabsch-Umeyama alignment, k-NN of the real row);
- ``privatemail_label_only``: the same with the query's features replaced by a random server
  item's -- what the labels alone achieve (NOTES 7);
- ``dp_random_projection``, ``dp_pca``: the query released by a Gaussian mechanism after a
  random / PCA projection (see :mod:`pm_vector.bench.baselines`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..client import PrivateMail, PublicAnchor
from ..manifold import AnchorFrame
from ..privacy import secure_generator
from ..resolve import align_request, knn
from .baselines import DPPCA, DPRandomProjection, RawKNN
from .metrics import chance_recall_at_k, map_at_k, precision_at_k, recall_at_k

PRIVATE_METHODS = ("privatemail", "privatemail_label_only", "dp_random_projection", "dp_pca")


@dataclass
class BenchConfig:
    epsilons: tuple = (0.1, 1.0, 10.0)
    delta: float = 1e-5
    k: int = 8
    seed: int = 0
    n_components: int = 16
    dp_sigma: float = 1.0
    dp_alpha: float = 0.5
    projection_dim: int = 8


def _scores(retrieved_labels, query_labels, k) -> dict:
    return {f"recall_at_{k}": float(recall_at_k(retrieved_labels, query_labels)),
            f"precision_at_{k}": float(precision_at_k(retrieved_labels, query_labels)),
            f"map_at_{k}": float(map_at_k(retrieved_labels, query_labels))}


def run(split, cfg: BenchConfig, progress=None) -> dict:
    """Run every method on a :class:`~pm_vector.datasets.Split` and return the JSON-able result."""
    t0 = time.perf_counter()
    k = cfg.k
    Xs, ys = split.server
    Xa, ya = split.anchor
    Xd, yd = split.dummy
    Xq, yq = split.query
    results = []
    timings = {}

    def record(method, eps, retrieved_idx, seconds):
        results.append({"method": method, "epsilon": eps, **_scores(ys[retrieved_idx], yq, k),
                        "seconds": round(seconds, 3)})
        if progress:
            progress(method, eps)

    t = time.perf_counter()
    raw = RawKNN().fit(Xs, ys, secure_generator(cfg.seed))
    record("raw_knn", None, raw.search(Xq, k, secure_generator(cfg.seed)), time.perf_counter() - t)

    # server job: public anchor frame + out-of-sample extension of the items
    t = time.perf_counter()
    frame = AnchorFrame(cfg.n_components, seed=cfg.seed).fit(Xa, ya)
    items = frame.extend(Xs, ys)
    timings["server_embedding_seconds"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    q_emb = frame.extend(Xq, yq)
    record("smlq_nonprivate", None, knn(items, q_emb, k)[0], time.perf_counter() - t)

    anchor = PublicAnchor(list(range(len(ya))), Xa, ya, Xd, yd)
    item_rng = np.random.default_rng(cfg.seed + 1)
    for eps in cfg.epsilons:
        for method in ("privatemail", "privatemail_label_only"):
            t = time.perf_counter()
            client = PrivateMail(frame, epsilon=eps, delta=cfg.delta, dp_sigma=cfg.dp_sigma, dp_alpha=cfg.dp_alpha,
                                 seed=cfg.seed + 7)
            rows = []
            for i in range(len(yq)):
                x = Xq[i] if method == "privatemail" else Xs[item_rng.integers(len(Xs))]
                req, secret = client.request(x, int(yq[i]), anchor)
                aligned = align_request(req, anchor.ids, frame.anchor_embedding_)
                rows.append(secret.pick(knn(items, aligned, k)[0]))
            record(method, eps, np.asarray(rows), time.perf_counter() - t)
        for method, cls in (("dp_random_projection", DPRandomProjection), ("dp_pca", DPPCA)):
            t = time.perf_counter()
            m = cls(cfg.projection_dim, eps, cfg.delta).fit(Xs, ys, secure_generator(cfg.seed))
            record(method, eps, m.search(Xq, k, secure_generator(cfg.seed + 3)), time.perf_counter() - t)

    freq = np.array([np.mean(ys == c) for c in np.unique(ys)])
    return {"dataset": split.dataset.name, "k": k, "delta": cfg.delta, "seed": cfg.seed,
            "split": split.describe(), "frame": {"n_components": cfg.n_components, "sigma": frame.sigma_,
                                                 "alpha": frame.alpha, "n_neighbors": frame.n_neighbors},
            "privatemail": {"dp_sigma": cfg.dp_sigma, "dp_alpha": cfg.dp_alpha},
            f"chance_recall_at_{k}": float(chance_recall_at_k(freq, k)),
            "results": results, **timings, "seconds": round(time.perf_counter() - t0, 2)}
