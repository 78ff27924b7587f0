"""``pm-vector demo``: the whole product on the embedded server, end to end.

1. a collection from a built-in dataset (scikit-learn's digits, 1,000 server items, by default;
   ``fashion-mnist``: 10,000), disjoint stratified split into server items, public anchor set,
   public dummy pool and held-out queries;
2. ingest the items, publish the anchor set and the dummy pool;
3. start the real service on loopback (uvicorn in a thread, free port) with a fresh API key;
4. run the server's SMLQ embedding job through the API and follow its progress;
5. answer private queries at each epsilon through the service with the real client
   (:class:`pm_vector.client.http.Client`, budget ledger in a temporary file; the default release:
   one report of the query's public cell over the whole collection, an answer of ids and code
   prefixes within ``max_bytes`` (:data:`DEMO_MAX_BYTES`: 8,000 bytes on digits, the client's
   50,000 on Fashion-MNIST), client-side re-rank), and the non-private baseline (exact k-NN on raw
   features, in memory);
6. per epsilon: the release and its level, the ledger (eps this row spent, eps it holds in all),
   bytes per request on the wire, the share of the collection the answer holds (candidates / N),
   nn_recall@8 (share of the exact 8 nearest items returned), the label-only ablation at the same
   answer size (:class:`LabelOnly`), query latency; and download-all's bytes and recall as the
   reference.

The budget is where the trade shows: an answer that cannot hold the whole collection makes the plan
choose (a coarse level and many candidates at eps 1, a fine level, fewer candidates and wider codes
at eps 16). On digits' 1,000 items the client's 50 kB holds every item at eps 1 and 4, so the demo
gives digits 8,000 bytes (a third of the collection at eps 1); Fashion-MNIST's 10,000 items need no
smaller budget (a quarter at eps 1 within 50 kB) but an embedding job of minutes rather than seconds.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from typing import Any, Callable

import numpy as np

from ..protocol import releases
from .. import db
from ..client.budget import PrivacyBudget
from ..client.http import Client
from ..client.rerank import rank
from ..datasets import load_dataset, split_dataset
from ..neighbors import knn_search, neighbor_graph
from ..privacy.location import LocationRandomizedResponse
from ..service.auth import create_key, revoke_key
from ..service.runner import ServiceThread
from ..service.settings import ServiceSettings
from ..shortlist import CELL_GRAPH_DEGREE, hub_counts
from .metrics import precision_at_k, recall_at_k, wire_answer_bytes

#: (server items, anchor set, dummy pool, queries per epsilon) of each built-in dataset
DEMO_SIZES = {"digits": (1000, 300, 150, 60), "fashion-mnist": (10000, 1000, 500, 40)}
#: the dataset ``pm-vector demo`` runs on unless told: its embedding job takes seconds (Fashion-MNIST's
#: 784 dimensions take minutes: the product codes' fit and encoding, the cells)
DEFAULT_DATASET = "digits"
#: the byte budget of one request per dataset unless told (None: the client's, 50,000): on digits'
#: 1,000 items 50 kB holds the whole collection at every eps, 8,000 bytes makes the plan choose
DEMO_MAX_BYTES = {"digits": 8000, "fashion-mnist": None}
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


class LabelOnly:
    """The label-only ablation: the query's label in place of the private report, at the same
    answer size. A query of class ``c`` gets the ``S`` items most often among the 32 nearest of
    ``c``'s items (the class's hub counts, ties by position: what the class-rows answers tend to as
    eps -> 0), re-ranked by the same published code prefix the release's answer carries
    (:func:`pm_vector.client.rerank.rank`). It sends the label, so it is no private release: it
    shows what the location report adds over knowing the class."""

    def __init__(self, Xs, ys, product_codes):
        ys = np.asarray(ys)
        n = len(ys)
        graph = neighbor_graph(np.asarray(Xs), CELL_GRAPH_DEGREE)
        self.order = {int(c): np.lexsort((np.arange(n), -hub_counts(graph, np.flatnonzero(ys == c), n)))
                      for c in np.unique(ys)}
        self.pc = product_codes
        self.codes = product_codes.encode(Xs)  # the codes the run stores: encoded from the same features

    def nn_recall(self, Xq, yq, exact, candidates: int, code_bytes: int) -> float:
        """Mean share of each query's exact ``K`` nearest (positions ``exact[i]``) among the top ``K``
        of its class's ``candidates`` hubs re-ranked by ``code_bytes``-byte codes."""
        hits = []
        for i in range(len(yq)):
            cand = self.order[int(yq[i])][:candidates]
            order, _ = rank(Xq[i], codes=self.pc.select(self.codes[cand], code_bytes), product_codes=self.pc)
            hits.append(len(set(cand[order[:K]].tolist()) & set(np.asarray(exact[i]).tolist())) / K)
        return float(np.mean(hits))


def prepare_collection(name: str, split, *, allow_raw_features: bool = False,
                       progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Create ``name`` from a :class:`~pm_vector.datasets.Split`: items, anchor set, dummy pool."""
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
    Xq, yq = split.query
    Xs, ys = split.server
    idx = knn_search(Xq, Xs, K)
    ext = np.array([f"{ds.name}-{int(i)}" for i in split.server_idx])
    where = {int(v): j for j, v in enumerate(prep["item_ids"])}
    nonpriv = {"nn_recall_at_8": 1.0, "recall_at_8": recall_at_k(ys[idx], yq, K),
               "precision_at_8": precision_at_k(ys[idx], yq, K)}
    return Xq, yq, ys, idx, ext, where, nonpriv


def _download_all(Xs) -> dict[str, Any]:
    """The reference: the client downloads every item (ids and float32 features) and searches
    locally: exact (nn_recall 1) and private without any eps, for the whole collection's bytes."""
    n, d = np.shape(Xs)
    return {"method": "download_all", "bytes": int(wire_answer_bytes(1, n, dim=d)), "nn_recall_at_8": 1.0,
            "share_held": 1.0, "n_items": int(n)}


def _run_job(client, name: str, seed: int, prog) -> float:
    """The embedding job, started through the service and followed to its end; returns its seconds."""
    job = client.start_job(name, {"n_components": 8}, seed=seed)
    t_job = time.perf_counter()

    def follow(j):
        if j.get("stage"):
            prog(f"job: {j['stage']}", j.get("done", 0), max(1, j.get("total", 1)))

    client.wait_job(job["job_id"], progress=follow, poll=0.1)
    return time.perf_counter() - t_job


def _queries_at(client, name: str, eps: float, delta: float, max_bytes, data: dict, prog, done: int,
                total: int) -> tuple[dict, list, int]:
    """Every query at one epsilon through the client (the default release and answer); returns (the
    result row: the plan, recall, precision, bytes, latency, the releases used), the answered
    external ids per query, and the queries done so far."""
    Xq, yq, ys, where, ext, idx = (data[k] for k in ("Xq", "yq", "ys", "where", "ext", "idx"))
    labels, lat, srv, nn, sent, got, answers, used, plans = [], [], [], [], [], [], [], set(), set()
    for i in range(len(yq)):
        # the default release and answer: one location report, its plan by the public rule
        r = client.query(name, Xq[i], int(yq[i]), epsilon=float(eps), delta=delta, k=K, max_bytes=max_bytes)
        # the compact answer carries ids: the demo knows its items' labels and external ids
        pos = [where[int(v)] for v in r["item_ids"]]
        labels.append(ys[pos])
        used.add(releases.describe(r).split(",")[0])  # e.g. "location M=256" (the table's one line)
        if r.get("level") is not None:  # a location answer: its public plan
            plans.add((int(r["level"]), int(r["candidates"]), int(r["code_bytes"])))
        answers.append(ext[pos].tolist())
        nn.append(len(set(answers[-1]) & set(ext[idx[i]].tolist())) / K)
        lat.append(r["timing"]["total_ms"])
        srv.append(r["timing"]["resolve_ms"])
        sent.append(r["bytes_sent"])
        got.append(r["bytes_received"])
        done += 1
        prog(f"queries eps={eps:g}", done, total)
    L = np.asarray(labels)
    n_items = len(ys)
    # the plan is a public function of (eps, N, the byte budget): one per row
    level, cand, width = max(plans) if plans else (None, None, None)
    row = {"epsilon": float(eps), "release": ", ".join(sorted(used)), "level": level, "candidates": cand,
           "code_bytes": width, "share_held": None if cand is None else min(cand, n_items) / n_items,
           "nn_recall_at_8": float(np.mean(nn)),
           "recall_at_8": recall_at_k(L, yq, K), "precision_at_8": precision_at_k(L, yq, K),
           "distinct_lists_per_class": _distinct_per_class(answers, yq),
           "bytes_per_request": float(np.median(np.add(sent, got))),
           "query_p50_ms": float(np.percentile(lat, 50)),
           "query_p95_ms": float(np.percentile(lat, 95)),
           "resolve_p50_ms": float(np.percentile(srv, 50)), "n_queries": int(len(yq))}
    return row, answers, done


def _ablate(row: dict, label_only: "LabelOnly | None", data: dict) -> None:
    """The row's label-only figure, at the row's answer size and code width (location rows only)."""
    if label_only is None or row["candidates"] is None:
        row["label_only_nn_recall_at_8"] = None
        return
    row["label_only_nn_recall_at_8"] = label_only.nn_recall(data["Xq"], data["yq"], data["idx"],
                                                           row["candidates"], row["code_bytes"])


def run_demo(dataset: str = DEFAULT_DATASET, epsilons=(1.0, 4.0, 16.0), *, n_queries: int | None = None,
             seed: int = 0, delta: float = 1e-5, keep: bool = False, progress=None,
             log: Callable[[str], None] | None = None, wire: str = "msgpack",
             max_bytes: int | None = None) -> dict[str, Any]:
    """Run the demo; returns ``{"nonprivate": {...}, "results": [...], "download_all": {...}, "seconds", ...}``.

    ``wire``: the client's wire format (``"msgpack"`` or ``"json"``); ``bytes_per_request`` of a
    result is the median resolve's bytes on the wire, both ways, and ``anchor_document_bytes``
    the public anchor's download (request and answer). ``max_bytes``: the byte budget of one
    request (None: :data:`DEMO_MAX_BYTES` of the dataset, else the client's 50,000). Each result
    row has the plan (``level``, ``candidates``,
    ``code_bytes``), ``share_held`` (candidates / N), ``label_only_nn_recall_at_8`` and the
    ledger after it (``ledger_epsilon_spent``, ``ledger_releases``) beside ``epsilon_spent`` (the
    row's own queries).

    ``progress(task, done, total)`` reports steps; ``keep``: leave the collection in the database."""
    t_start = time.perf_counter()
    say = log or (lambda s: None)
    prog = progress or (lambda *a: None)
    key_name = str(dataset).strip().lower().replace("_", "-")
    sizes = DEMO_SIZES.get(key_name, DEMO_SIZES["digits"])
    if n_queries is not None:
        sizes = sizes[:3] + (int(n_queries),)
    if max_bytes is None:
        max_bytes = DEMO_MAX_BYTES.get(key_name)
    ds = load_dataset(dataset, max_items=sum(sizes) + 50 if key_name != "digits" else None, seed=seed)
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
                data = {"Xq": Xq, "yq": yq, "ys": ys, "idx": idx, "ext": ext, "where": where}
                client.anchor_document(name)
                anchor_bytes = client.last_exchange["bytes_sent"] + client.last_exchange["bytes_received"]
                pc = client.product_codes(name)  # public: the codebooks the anchor document publishes
                label_only = None if pc is None else LabelOnly(split.server[0], ys, pc)
                results = []
                total = len(epsilons) * len(yq)
                done = 0
                examples = None
                for eps in epsilons:
                    row, answers, done = _queries_at(client, name, float(eps), delta, max_bytes, data, prog, done,
                                                     total)
                    _ablate(row, label_only, data)
                    spent = budget.status(client.budget_key())  # the server's entry, after this row
                    row.update(epsilon_spent=float(eps) * len(yq), ledger_epsilon_spent=spent["epsilon_spent"],
                               ledger_epsilon_budget=spent["epsilon_budget"], ledger_releases=spent["releases"])
                    results.append(row)
                    same = [i for i in range(len(yq)) if yq[i] == yq[0]]
                    if len(same) >= 2:
                        examples = {"epsilon": float(eps), "label": int(yq[0]),
                                    "queries": [{"query": int(split.query_idx[i]), "answer": answers[i],
                                                 "exact": ext[idx[i]].tolist()} for i in same[:2]]}
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
        "max_bytes": max_bytes, "nonprivate": nonpriv, "results": results,
        "download_all": _download_all(split.server[0]), "same_class_examples": examples,
        "ledger_epsilon_spent": spent["epsilon_spent"], "wire": wire, "anchor_document_bytes": anchor_bytes,
        "seconds": time.perf_counter() - t_start}


def summary(res: dict[str, Any]) -> str:
    """One sentence on what the demo's table shows: where local DP binds, read off the results."""
    rows = [r for r in res["results"] if r.get("share_held") is not None]
    if not rows:
        return "no row used the location release: nothing to read off the plan."
    first, last = rows[0], rows[-1]
    dl = res["download_all"]
    if first["share_held"] >= 1.0:
        return (f"At eps {first['epsilon']:g} the answer already holds the whole collection "
                f"({dl['n_items']:,} items): the byte budget does not bind here, so the table shows no trade "
                f"(a larger collection or a smaller --max-bytes shows it).")
    text = (f"At eps {first['epsilon']:g} the report is true with probability {_rr_p(first):.2f} among "
            f"M={first['level']} cells, so the answer must hold {first['share_held']:.0%} of the collection to "
            f"find {first['nn_recall_at_8']:.2f} of the 8 nearest: there local DP binds.")
    if last is not first:
        text += (f" At eps {last['epsilon']:g} {last['share_held']:.0%} of it ({last['candidates']:,} items, "
                 f"{last['code_bytes']} B codes) finds {last['nn_recall_at_8']:.2f}: the bytes bind, not eps.")
    lo = first.get("label_only_nn_recall_at_8")
    if lo is not None:
        text += f" The label alone, at eps {first['epsilon']:g}'s answer size, finds {lo:.2f}."
    return text + f" Downloading all {dl['n_items']:,} items: 1.00 for {dl['bytes'] / 1e6:.1f} MB a client."


def _rr_p(row: dict) -> float:
    """The probability that the row's report is the query's true cell (M-ary randomized response)."""
    return LocationRandomizedResponse(row["epsilon"], row["level"]).p_
