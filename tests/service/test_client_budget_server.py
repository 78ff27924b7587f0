"""A server cannot open a fresh budget: the client's ledger is keyed by the origin it was given.

A malicious server is played by a real HTTP server on loopback in front of the real service: it
forwards every call and, when rotating, answers each with a fresh ``collection_uuid`` / ``uuid``
and ``active_run_id`` / ``run_id``. Through the default budget (eps 10) it gets no more eps-1
queries than an honest server (10), with one Client or a new Client per query (its run changing
under every query, it gets none: :class:`~pm_vector.errors.RunChangedError`); dropping and
re-creating a collection on the real service (a new collection id) does not reset it either.
``pytest -s`` prints the counts.
"""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from pm_vector.client.budget import DEFAULT_EPSILON_BUDGET, PrivacyBudget
from pm_vector.client.http import Client
from pm_vector.errors import BudgetExceededError, RunChangedError

ATTEMPTS = 25
IDS = {"collection_uuid": lambda: str(uuid.uuid4()), "uuid": lambda: str(uuid.uuid4()),
       "active_run_id": lambda: int.from_bytes(uuid.uuid4().bytes[:6], "big"),
       "run_id": lambda: int.from_bytes(uuid.uuid4().bytes[:6], "big")}


@pytest.fixture(autouse=True)
def _default_budget(monkeypatch):
    monkeypatch.delenv("PM_VECTOR_EPSILON_BUDGET", raising=False)
    monkeypatch.delenv("PM_VECTOR_DELTA_BUDGET", raising=False)
    assert DEFAULT_EPSILON_BUDGET == 10.0


def _rotate(doc):
    """Fresh ids in an answer: at the top and in the entries of its top-level lists."""
    if not isinstance(doc, dict):
        return 0
    items = [doc] + [x for v in doc.values() if isinstance(v, list) for x in v if isinstance(x, dict)]
    n = 0
    for d in items:
        for key, fresh in IDS.items():
            if key in d:
                d[key] = fresh()
                n += 1
    return n


class Proxy:
    """``with Proxy(upstream, rotate) as p: p.url`` -- a loopback HTTP server forwarding to ``upstream``;
    ``rotate``: every JSON answer gets fresh ids (``p.rotated`` counts them)."""

    def __init__(self, upstream: str, rotate: bool):
        self.upstream, self.rotate, self.rotated = upstream, rotate, 0
        self._http = httpx.Client(base_url=upstream, timeout=60)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                r = proxy._http.request(self.command, self.path, content=body, headers=headers)
                out = r.content
                if proxy.rotate and r.headers.get("content-type", "").startswith("application/json"):
                    doc = r.json()
                    proxy.rotated += _rotate(doc)
                    out = json.dumps(doc).encode()
                self.send_response(r.status_code)
                self.send_header("Content-Type", r.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = _forward

            def log_message(self, *a):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "Proxy":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._http.close()


def _answered(url, key, name, split, ledger, *, client_per_query: bool, attempts: int = ATTEMPTS,
              start: int = 0) -> tuple[int, set]:
    """eps-1 queries answered out of ``attempts`` through ``ledger`` (default budget), and the
    collection ids seen."""
    Xq, yq = split.query
    answered, ids = 0, set()
    c = None
    try:
        for i in range(start, start + attempts):
            if c is None or client_per_query:
                if c is not None:
                    c.close()
                c = Client(url, key, budget=PrivacyBudget(ledger))
            ids.add(c.anchor_document(name).get("collection_uuid"))
            try:
                c.query(name, Xq[i], int(yq[i]), epsilon=1.0, shortlist=16)
                answered += 1
            except (BudgetExceededError, RunChangedError):  # a run changing under a query is refused
                pass
    finally:
        if c is not None:
            c.close()
    return answered, ids


@pytest.mark.parametrize("client_per_query", [False, True], ids=["one client", "a new client per query"])
@pytest.mark.slow
def test_a_server_rotating_its_ids_gets_no_more_queries_than_an_honest_one(service, svc_collection, svc_key,
                                                                           svc_split, tmp_path, client_per_query):
    counts = {}
    for rotate in (False, True):
        with Proxy(service.url, rotate) as p:
            counts[rotate] = _answered(p.url, svc_key["key"], svc_collection, svc_split,
                                       tmp_path / f"ledger-{rotate}.json", client_per_query=client_per_query)
            if rotate:  # it really did rotate: a fresh collection id on every anchor fetch
                assert p.rotated > 2 * ATTEMPTS and len(counts[rotate][1]) == ATTEMPTS
            else:
                assert p.rotated == 0 and len(counts[rotate][1]) == 1
    honest, rotating = counts[False][0], counts[True][0]
    print(f"\n[{'new client per query' if client_per_query else 'one client'}] eps-1 queries answered through "
          f"the default eps-10 budget, of {ATTEMPTS}: honest server {honest}, server rotating "
          f"collection_uuid/active_run_id on every call {rotating}")
    # a rotating server's run changes under every query: refused before anything is charged or sent
    assert honest == 10 and rotating <= honest


def test_dropping_and_recreating_the_collection_opens_no_fresh_budget(service, svc_key, svc_split, tmp_path):
    from pm_vector import db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.bench.demo import prepare_collection

    name = "svc_recreate_" + uuid.uuid4().hex[:8]
    ledger = tmp_path / "ledger.json"

    def create():
        prepare_collection(name, svc_split, allow_raw_features=True)
        db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)

    try:
        create()
        before, ids_a = _answered(service.url, svc_key["key"], name, svc_split, ledger, client_per_query=False,
                                  attempts=6)
        db.drop_collection(name)
        create()
        after, ids_b = _answered(service.url, svc_key["key"], name, svc_split, ledger, client_per_query=True,
                                 attempts=ATTEMPTS - 6, start=6)
    finally:
        db.drop_collection(name, missing_ok=True)
    assert len(ids_a) == len(ids_b) == 1 and ids_a != ids_b  # a new collection id after re-creating it
    print(f"\n[drop and re-create] eps-1 queries answered through the default eps-10 budget: {before} before the "
          f"drop, {after} after the re-create (new collection_uuid), {before + after} of {ATTEMPTS} in all")
    assert before == 6 and before + after == 10
