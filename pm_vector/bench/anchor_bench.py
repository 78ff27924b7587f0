"""`pm-vector bench kahm --part anchor`: the private query protocol on a DP fabricated anchor.

A server without a public dataset publishes an anchor fabricated from its own items
(:func:`pm_vector.db.kahm.roles.fabricate_anchor_set`). This benchmark measures what that costs the
protocol, end to end through the database, side by side in one run:

* ``public``: the reference -- a public anchor set and dummy pool (disjoint stratified splits
  of the dataset, as ``pm-vector bench privacy`` uses);
* ``fabricated``: the same collection, its anchor and dummy pool fabricated from its items at
  each ``anchor_epsilon``. ``unit="row"`` (the default, the headline): each item row clipped to
  the public L2 norm ``clip_norm`` and perturbed as a whole, so ``anchor_epsilon`` is the
  per-item epsilon. ``unit="element"``: Result 1 per element of the rows clipped to the public
  ``value_range`` (per item: ``p x epsilon``, reported as ``per_item_epsilon``).

For each, the embedding job runs on that anchor, then every held-out query is sent twice at
client epsilon ``client_epsilon``, built from the downloaded public anchor and resolved by SQL:
as a pm_vector request (class frames of the anchor, ``SHORTLIST`` candidates per row, the
client's re-rank by raw features: ``pm_vector`` with ``nn_recall_at_8``) and as a PrivateMail
request (the paper's protocol: recall@8 / precision@8 of the real rows). Raw k-NN in feature
space (no privacy) is printed beside them.

Returns ``{"anchor": [{"per_item_epsilon", "dataset", "anchor", "unit", "anchor_epsilon", "clip_norm",
"value_range", "client_epsilon", "recall_at_8", "precision_at_8", "pm_vector": {"nn_recall_at_8",
"precision_at_8"}, "fabricate_seconds", "embed_seconds", "query_seconds"}, ...], "raw_knn": [...],
"config": {...}}``.
"""

from __future__ import annotations

import time
import uuid
from typing import Callable, Iterable

import numpy as np

from .. import db
from ..client import PrivateMail
from ..client.query import PrivateKNN
from ..datasets import load_dataset, split_dataset
from ..db.kahm import roles as dk
from ..db.resolve.resolution import class_frames, client_frame, public_anchor, resolve
from ..db.runs.jobs import anchor_frame_embed_fn
from ..neighbors import knn_search
from ..privacy import secure_generator
from .metrics import nn_recall_at_k, precision_at_k, recall_at_k
from .privacy_bench import BenchConfig

__all__ = ["run_anchor_benchmark", "ANCHOR_SIZES"]

#: server items, public anchor, public dummy pool, queries (the public reference's split)
ANCHOR_SIZES = {"digits": (1000, 300, 150, 200), "fashion-mnist": (5000, 1000, 500, 200)}
K = 8
#: k' of the pm_vector requests
SHORTLIST = {"digits": 32, "fashion-mnist": 64}


def _queries(db, name, Xq, yq, ys, ids, client_epsilon, delta, cfg, seed) -> tuple[float, float, float]:
    t = time.perf_counter()
    pa, info = public_anchor(name)
    frame = client_frame(name, pa, info)
    client = PrivateMail(frame, epsilon=client_epsilon, delta=delta, dp_sigma=cfg.dp_sigma, dp_alpha=cfg.dp_alpha,
                         _rng=seed)
    pos = {int(v): j for j, v in enumerate(ids)}
    rows = []
    for i in range(len(yq)):
        req, sec = client.request(Xq[i], int(yq[i]), pa, collection=name)
        real = sec.pick(resolve(name, req.to_json(), k=K, log=False)["rows"])
        rows.append([pos[v] for v in real["item_ids"]])
    got = ys[np.asarray(rows)]
    return recall_at_k(got, yq, K), precision_at_k(got, yq, K), time.perf_counter() - t


def _pm_vector_queries(name, Xq, yq, ys, ids, true_idx, client_epsilon, delta, shortlist, seed) -> dict:
    """nn_recall@8 and precision@8 of pm_vector requests on the collection's current anchor."""
    pa, _ = public_anchor(name)
    client = PrivateKNN(class_frames(name), pa.dummy_features, pa.dummy_labels, client_epsilon, delta,
                        shortlist=shortlist, collection=name)._inject_generator(secure_generator(seed))
    pos = {int(v): j for j, v in enumerate(ids)}
    got = []
    for i in range(len(yq)):
        req, sec = client.request(Xq[i], int(yq[i]))
        real = sec.pick(resolve(name, req.to_json(), include_features=True, log=False)["rows"])
        cand = np.asarray([pos[v] for v in real["item_ids"]])
        got.append(PrivateKNN.rerank(Xq[i], cand, real["features"], K))
    got = np.asarray(got)
    return {"nn_recall_at_8": nn_recall_at_k(got, true_idx), "precision_at_8": precision_at_k(ys[got], yq, K),
            "shortlist": int(shortlist)}


def _anchor_configs(units, value_ranges, anchor_epsilons) -> list[tuple]:
    """The anchor sets compared: the public one, then a fabricated one per unit, value range (the
    row unit has none) and epsilon, as ``(kind, unit, epsilon, value range)``."""
    configs = [("public", None, None, None)]
    for unit in units:
        vrs = [None] if unit == "row" else [tuple(map(float, vr)) for vr in value_ranges]
        configs += [("fabricated", unit, float(e), vr) for vr in vrs for e in anchor_epsilons]
    return configs


def _register_anchors(name: str, kind: str, sp, per_class: tuple, eps, unit, vr, *, clip_norm: float, delta: float,
                      smoothing_steps, noise_seed) -> dict | None:
    """The collection's anchor set and dummy pool: the split's public ones, or fabricated from its items
    with differential privacy; returns the fabricated set's provenance (None for the public one)."""
    if kind == "public":
        db.register_anchor_set(name, *sp.anchor, role="anchor", description="public anchor")
        db.register_anchor_set(name, *sp.dummy, role="dummy", description="public dummy pool")
        return None
    a, d, src = per_class
    return dk.fabricate_anchor_set(name, eps, unit=unit, clip_norm=clip_norm, value_range=vr,
                                   delta=delta, anchors_per_class=a,
                                   dummies_per_class=d, source_per_class=src,
                                   smoothing_steps=smoothing_steps, noise_seed=noise_seed)["provenance"]


def run_anchor_benchmark(datasets: Iterable[str] = ("digits", "fashion-mnist"), *,
                         anchor_epsilons: Iterable[float] = (1.0, 4.0, 16.0, 64.0),
                         units: Iterable[str] = ("row",), clip_norm: float = 1.0,
                         value_ranges: Iterable[tuple[float, float]] = ((0.0, 1.0),),
                         client_epsilon: float = 1.0, delta: float = 1e-5, n_queries: int | None = None,
                         smoothing_steps: int | None = 5, seed: int = 0, noise_seed: int | None = None,
                         progress: Callable[[str], None] | None = None) -> dict:
    """Run the comparison on the (embedded or configured) database; see the module docstring.

    ``noise_seed=None`` draws the anchors' noise from a cryptographically seeded generator (an
    int makes the run repeatable)."""
    say = progress or (lambda _m: None)
    cfg = BenchConfig(epsilons=(client_epsilon,), seed=seed)
    out: dict = {"anchor": [], "raw_knn": []}
    db.start()
    db.upgrade()
    t_all = time.perf_counter()
    for dsname in datasets:
        sizes = list(ANCHOR_SIZES[dsname])
        if n_queries is not None:
            sizes[3] = int(n_queries)
        ds = load_dataset(dsname)
        sp = split_dataset(ds, *sizes, seed=seed)
        Xs, ys = sp.server
        Xq, yq = sp.query
        true_idx = knn_search(Xq, Xs, K)
        raw = ys[true_idx]
        out["raw_knn"].append({"dataset": dsname, "recall_at_8": recall_at_k(raw, yq, K),
                               "precision_at_8": precision_at_k(raw, yq, K)})
        per_class = {"digits": (30, 15, 90), "fashion-mnist": (100, 50, 400)}[dsname]
        name = f"bench_anchor_{uuid.uuid4().hex[:8]}"
        db.create_collection(name, ds.dim, ds.classes.tolist(), allow_raw_features=True,
                             description=f"{dsname} (bench kahm --part anchor)")
        try:
            ids = np.asarray(db.ingest(name, Xs, ys)["item_ids"])
            for kind, unit, eps, vr in _anchor_configs(units, value_ranges, anchor_epsilons):
                t = time.perf_counter()
                prov = _register_anchors(name, kind, sp, per_class, eps, unit, vr, clip_norm=clip_norm, delta=delta,
                                         smoothing_steps=smoothing_steps, noise_seed=noise_seed)
                fab_s = time.perf_counter() - t
                t = time.perf_counter()
                db.run_embedding_job(name, {"n_components": cfg.n_components}, cfg.seed, embed_fn=anchor_frame_embed_fn)
                emb_s = time.perf_counter() - t
                rec, prec, q_s = _queries(db, name, Xq, yq, ys, ids, client_epsilon, delta, cfg, seed + 7)
                pmv = _pm_vector_queries(name, Xq, yq, ys, ids, true_idx, client_epsilon, delta, SHORTLIST[dsname],
                                         seed + 11)
                row = {"per_item_epsilon": None if prov is None else prov["per_item_epsilon"],
                       "dataset": dsname, "anchor": kind, "unit": unit, "anchor_epsilon": eps,
                       "clip_norm": clip_norm if unit == "row" else None,
                       "value_range": None if vr is None else list(vr),
                       "n_anchors": sizes[1] if kind == "public" else per_class[0] * len(ds.classes),
                       "client_epsilon": client_epsilon, "recall_at_8": rec, "precision_at_8": prec,
                       "pm_vector": pmv,
                       "fabricate_seconds": round(fab_s, 3), "embed_seconds": round(emb_s, 3),
                       "query_seconds": round(q_s, 3), "n_queries": int(len(yq))}
                out["anchor"].append(row)
                say(f"{dsname} {kind}" + ("" if eps is None else
                                         f" per-item eps={row['per_item_epsilon']:g} ({unit} level)") +
                    f": recall@8 {rec:.3f} precision@8 {prec:.3f}; pm_vector nn_recall@8 "
                    f"{pmv['nn_recall_at_8']:.3f} precision@8 {pmv['precision_at_8']:.3f}")
        finally:
            db.drop_collection(name, missing_ok=True)
    out["config"] = {"sizes": {d: ANCHOR_SIZES[d] for d in datasets}, "client_epsilon": client_epsilon,
                     "delta": delta, "smoothing_steps": smoothing_steps, "seed": seed, "units": list(units),
                     "clip_norm": clip_norm,
                     "noise_seed": "secure" if noise_seed is None else noise_seed,
                     "frame_n_components": cfg.n_components, "k": K,
                     "per_class": {"digits": "30 anchors + 15 dummies from 90 items",
                                   "fashion-mnist": "100 anchors + 50 dummies from 400 items"},
                     "total_seconds": round(time.perf_counter() - t_all, 1)}
    return out
