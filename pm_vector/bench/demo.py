"""``pm-vector demo``: the whole product on the embedded server, end to end.

1. a collection from a built-in dataset (digits; ``fashion-mnist``), disjoint stratified split
   into server items, public anchor set, public dummy pool and held-out queries;
2. ingest the items, publish the anchor set and the dummy pool;
3. start the real service on loopback (uvicorn in a thread, free port) with a fresh API key;
4. run the server's SMLQ embedding job through the API and follow its progress;
5. answer private queries at each epsilon through the service with the real client
   (:class:`pm_vector.client.http.Client`, budget ledger in a temporary file; the default release:
   one report of the query's public cell over the whole collection, an answer of ids and code
   prefixes within 50,000 bytes, client-side re-rank), and the non-private baseline (exact k-NN
   on raw features, in memory);
6. a table: nn_recall@8 (share of the exact 8 nearest items returned), precision@8 and
   recall@8 by class, bytes per request, query latency p50; and two queries of one class with
   their (different) answers.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from typing import Any, Callable

import numpy as np

from ..protocol import releases

DEMO_SIZES = {"digits": (1000, 300, 150, 60), "fashion-mnist": (5000, 500, 300, 40)}
K = 8


def _distinct_per_class(answers, labels) -> float:
    """Mean over classes of (distinct answer lists) / (queries of the class): 1 when every query
    of a class gets its own answer, 1/n when all get the same."""
    labels = np.asarray(labels)
    shares = []
    for c in np.unique(labels):
        lists = {tuple(sorted(answers[i])) for i in np.flatnonzero(labels == c)}
        shares.append(len(lists) / int(np.sum(labels == c)))
    return float(np.mean(shares))


def prepare_collection(name: str, split, *, allow_raw_features: bool = False,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Create ``name`` from a :class:`~pm_vector.datasets.Split`: items, anchor set, dummy pool."""
    from .. import db

    ds = split.dataset
    db.create_collection(name, ds.dim, [int(c) for c in ds.classes], allow_raw_features=allow_raw_features,
                         description=f"{ds.name} (pm-vector demo)")
    Xs, ys = split.server
    ing = db.ingest(name, Xs, ys, external_ids=[f"{ds.name}-{int(i)}" for i in split.server_idx],
                    batch_size=5000, progress=progress)
    Xa, ya = split.anchor
    Xd, yd = split.dummy
    db.register_anchor_set(name, Xa, ya, role="anchor", description="public anchor set")
    db.register_anchor_set(name, Xd, yd, role="dummy", description="public dummy pool")
    return {"collection": name, "n_items": int(ing["n_rows"]), "n_anchors": int(len(ya)), "n_dummies": int(len(yd)),
            "item_ids": ing["item_ids"]}


def _exact(ds, split, prep: dict):
    """The non-private reference: exact k-NN on the raw features. Returns (the queries, their labels,
    the items' labels, the exact neighbours' positions, the items' external ids, item id -> position,
    the non-private figures)."""
    from .metrics import precision_at_k, recall_at_k
    from ..neighbors import knn_search

    Xq, yq = split.query
    Xs, ys = split.server
    idx = knn_search(Xq, Xs, K)
    ext = np.array([f"{ds.name}-{int(i)}" for i in split.server_idx])
    where = {int(v): j for j, v in enumerate(prep["item_ids"])}
    nonpriv = {"nn_recall_at_8": 1.0, "recall_at_8": recall_at_k(ys[idx], yq, K),
               "precision_at_8": precision_at_k(ys[idx], yq, K)}
    return Xq, yq, ys, idx, ext, where, nonpriv


def _run_job(client, name: str, seed: int, prog) -> float:
    """The embedding job, started through the service and followed to its end; returns its seconds."""
    job = client.start_job(name, {"n_components": 8}, seed=seed)
    t_job = time.perf_counter()

    def follow(j):
        if j.get("stage"):
            prog(f"job: {j['stage']}", j.get("done", 0), max(1, j.get("total", 1)))

    client.wait_job(job["job_id"], progress=follow, poll=0.1)
    return time.perf_counter() - t_job


def _queries_at(client, name: str, eps: float, delta: float, Xq, yq, ys, where: dict, ext, idx, prog, done: int,
                total: int) -> tuple[dict, list, int]:
    """Every query at one epsilon through the client (the default release and answer); returns (the
    result row: recall, precision, bytes, latency, the releases used), the answered external ids per
    query, and the queries done so far."""
    from .metrics import precision_at_k, recall_at_k

    labels, lat, srv, nn, sent, got, answers, used = [], [], [], [], [], [], [], set()
    for i in range(len(yq)):
        # the default release and answer: one location report, its plan by the public rule
        r = client.query(name, Xq[i], int(yq[i]), epsilon=float(eps), delta=delta, k=K)
        # the compact answer carries ids: the demo knows its items' labels and external ids
        pos = [where[int(v)] for v in r["item_ids"]]
        labels.append(ys[pos])
        used.add(releases.describe(r))  # e.g. "location M=256, 40x16 B"
        answers.append(ext[pos].tolist())
        nn.append(len(set(answers[-1]) & set(ext[idx[i]].tolist())) / K)
        lat.append(r["timing"]["total_ms"])
        srv.append(r["timing"]["resolve_ms"])
        sent.append(r["bytes_sent"])
        got.append(r["bytes_received"])
        done += 1
        prog(f"queries eps={eps:g}", done, total)
    L = np.asarray(labels)
    row = {"epsilon": float(eps), "release": ", ".join(sorted(used)),
           "nn_recall_at_8": float(np.mean(nn)),
           "recall_at_8": recall_at_k(L, yq, K), "precision_at_8": precision_at_k(L, yq, K),
           "distinct_lists_per_class": _distinct_per_class(answers, yq),
           "bytes_per_request": float(np.median(np.add(sent, got))),
           "query_p50_ms": float(np.percentile(lat, 50)),
           "query_p95_ms": float(np.percentile(lat, 95)),
           "resolve_p50_ms": float(np.percentile(srv, 50)), "n_queries": int(len(yq))}
    return row, answers, done


def run_demo(dataset: str = "digits", epsilons=(1.0, 4.0, 16.0), *, n_queries: int | None = None, seed: int = 0,
             delta: float = 1e-5, keep: bool = False, progress=None, log: Callable[[str], None] | None = None,
             wire: str = "msgpack") -> dict[str, Any]:
    """Run the demo; returns ``{"nonprivate": {...}, "results": [...], "seconds", ...}``.

    ``wire``: the client's wire format (``"msgpack"`` or ``"json"``); ``bytes_per_request`` of a
    result is the median resolve's bytes on the wire, both ways, and ``anchor_document_bytes``
    the public anchor's download (request and answer).

    ``progress(task, done, total)`` reports steps; ``keep``: leave the collection in the database."""
    from .. import db
    from ..client.budget import PrivacyBudget
    from ..client.http import Client
    from ..datasets import load_dataset, split_dataset
    from ..service.auth import create_key, revoke_key
    from ..service.runner import ServiceThread
    from ..service.settings import ServiceSettings

    t_start = time.perf_counter()
    say = log or (lambda s: None)
    prog = progress or (lambda *a: None)
    sizes = DEMO_SIZES.get(dataset, (1000, 300, 150, 60))
    if n_queries is not None:
        sizes = sizes[:3] + (int(n_queries),)
    ds = load_dataset(dataset, max_items=sum(sizes) + 50 if dataset != "digits" else None, seed=seed)
    split = split_dataset(ds, *sizes, seed=seed)
    name = f"demo_{ds.name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    say(f"dataset {ds.name}: {ds.n_items} items, {ds.dim} dims, {ds.n_classes} classes; server/anchor/dummy/query "
        f"= {sizes}; collection {name}")
    db.start()
    key = None
    try:
        prog("ingest", 0, sizes[0])
        prep = prepare_collection(name, split, allow_raw_features=True, progress=lambda d, t: prog("ingest", d, t))
        key = create_key(f"demo {name}", role="admin")  # the demo starts a job through the service
        settings = ServiceSettings.from_env(auth=True, pool_max=4)
        with ServiceThread(settings) as svc, tempfile.TemporaryDirectory() as tmp:
            say(f"service on {svc.url}")
            # the demo's queries stand for many users' queries, all charged to this one ledger: it is
            # given exactly what the evaluation spends (a client's default is eps 10 / delta 1e-4 per
            # server, pm_vector.client.budget), and refuses anything beyond
            n_q = sizes[3]
            budget = PrivacyBudget(f"{tmp}/budget.json", default_epsilon=n_q * float(sum(epsilons)) * (1 + 1e-9),
                                   default_delta=min(0.999, n_q * len(epsilons) * float(delta) * (1 + 1e-9)))
            with Client(svc.url, key["key"], budget=budget, wire=wire) as client:
                job_s = _run_job(client, name, seed, prog)
                Xq, yq, ys, idx, ext, where, nonpriv = _exact(ds, split, prep)
                results = []
                total = len(epsilons) * len(yq)
                done = 0
                examples = None
                for eps in epsilons:
                    row, answers, done = _queries_at(client, name, float(eps), delta, Xq, yq, ys, where, ext, idx,
                                                     prog, done, total)
                    results.append(row)
                    same = [i for i in range(len(yq)) if yq[i] == yq[0]]
                    if len(same) >= 2:
                        examples = {"epsilon": float(eps), "label": int(yq[0]),
                                    "queries": [{"query": int(split.query_idx[i]), "answer": answers[i],
                                                 "exact": ext[idx[i]].tolist()} for i in same[:2]]}
                spent = budget.status(client.budget_key())  # the server's entry
                client.anchor_document(name)
                anchor_bytes = client.last_exchange["bytes_sent"] + client.last_exchange["bytes_received"]
    finally:
        if key is not None:
            try:
                revoke_key(key["id"])
            except Exception:  # noqa: BLE001
                pass
        if not keep:
            db.drop_collection(name, missing_ok=True)
    return {"dataset": ds.name, "collection": name if keep else None, "sizes": dict(zip(
        ("server", "anchor", "dummy", "query"), sizes)), "k": K, "delta": delta, "job_seconds": job_s,
        "nonprivate": nonpriv, "results": results, "same_class_examples": examples,
        "ledger_epsilon_spent": spent["epsilon_spent"], "wire": wire, "anchor_document_bytes": anchor_bytes,
        "seconds": time.perf_counter() - t_start}
