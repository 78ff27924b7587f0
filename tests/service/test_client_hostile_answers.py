"""The real client against a hostile server in front of the real service (a tampering proxy on
loopback, tests/pmtest_hostile.py): malformed answers are one documented error, a run that
changes under a query is refused before anything is charged, an anchor document's frame
parameters are bounded before the client computes with them, and a request that provably never
left is not charged."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest
from pmtest_hostile import DROP, TamperProxy

from pm_vector.client.budget import MemoryBudget
from pm_vector.client.http import Client
from pm_vector.errors import MalformedAnswerError, PMVectorError, RunChangedError, ServiceError


def _budget():
    return MemoryBudget(default_epsilon=100.0)


@pytest.mark.parametrize("tamper", ["no rows", "one row short", "rows not a list", "row not a map", "no ids"])
def test_a_malformed_resolve_answer_is_one_error(service, svc_collection, svc_key, svc_split, tamper):
    def change(method, path, doc):
        if path.endswith("/resolve"):
            rows = doc["rows"]
            doc["rows"] = {"no rows": [], "one row short": rows[:1], "rows not a list": 7,
                           "row not a map": [3] * len(rows),
                           "no ids": [{k: v for k, v in r.items() if k != "item_ids"} | {"item_ids": "x"}
                                      for r in rows]}[tamper]
        return doc

    Xq, yq = svc_split.query
    with TamperProxy(service.url, change) as p, Client(p.url, svc_key["key"], budget=_budget()) as c:
        for i in range(3):  # the real row differs between queries: the error does not
            with pytest.raises(ServiceError) as e:
                c.query(svc_collection, Xq[i], int(yq[i]), epsilon=1.0, shortlist=16)
            assert isinstance(e.value, MalformedAnswerError) or e.value.error in ("malformed_answer", "too_large")


def test_a_run_that_changes_on_every_get_is_refused_before_anything_is_charged(service, svc_collection, svc_key,
                                                                              svc_split):
    fresh = lambda: int.from_bytes(uuid.uuid4().bytes[:6], "big")  # noqa: E731

    def rotate(method, path, doc):
        if method == "GET" and "active_run_id" in doc:
            doc["active_run_id"] = fresh()
        if method == "GET" and path.endswith("/anchor") and "run_id" in doc:
            doc["run_id"] = fresh()
        return doc

    Xq, yq = svc_split.query
    budget = _budget()
    with TamperProxy(service.url, rotate) as p, Client(p.url, svc_key["key"], budget=budget) as c:
        refused = 0
        for i in range(8):
            before = len(p.requests)
            try:
                c.query(svc_collection, Xq[i], int(yq[i]), epsilon=1.0, shortlist=16)
            except RunChangedError as e:
                refused += 1
                assert "run" in str(e)
            mine = p.requests[before:]
            assert sum(path.endswith("/anchor") for _, path in mine) <= 1  # one download a query at most
            assert sum(path == f"/collections/{svc_collection}" for _, path in mine) == 1  # asked once
            assert not any(path.endswith("/resolve") for _, path in mine)
        downloads = sum(path.endswith("/anchor") for _, path in p.requests)
        assert refused == 8 and budget.status(c.budget_key())["releases"] == 0
    print(f"\nrun changing on every GET: 8 of 8 queries refused, {downloads} anchor downloads in all, nothing charged")
    assert downloads <= 4  # pm_vector.client.public_documents.ANCHOR_DOWNLOADS per minute


def test_an_answer_of_another_run_is_refused(service, svc_collection, svc_key, svc_split):
    def other_run(method, path, doc):
        if path.endswith("/resolve"):
            doc["run_id"] = (doc.get("run_id") or 0) + 1
        return doc

    Xq, yq = svc_split.query
    with TamperProxy(service.url, other_run) as p, Client(p.url, svc_key["key"], budget=_budget()) as c:
        with pytest.raises(RunChangedError, match="in the middle of a query"):
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, shortlist=16)


@pytest.mark.parametrize("param,value", [("n_iter", 10 ** 9), ("n_extend_iter", 10 ** 7), ("n_components", 10 ** 6),
                                         ("n_neighbors", -1), ("sigma", float("1e300"))])
def test_an_anchor_documents_frame_parameters_are_bounded_before_use(service, svc_collection, svc_key, svc_split,
                                                                     param, value):
    def huge(method, path, doc):
        if path.endswith("/anchor"):
            doc["frame"]["params"][param] = value
        return doc

    Xq, yq = svc_split.query
    out: dict = {}

    def run():
        try:
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, protocol="privatemail_paper")
        except Exception as e:  # noqa: BLE001 - what the query raised
            out["error"] = e

    with TamperProxy(service.url, huge) as p, Client(p.url, svc_key["key"], budget=_budget()) as c:
        t0 = time.perf_counter()
        th = threading.Thread(target=run, daemon=True)
        th.start()
        th.join(20)
        took = time.perf_counter() - t0
        assert not th.is_alive(), f"the client computed with {param}={value} for more than 20 s"
        assert isinstance(out.get("error"), MalformedAnswerError) and param in str(out["error"])
        assert c.budget.status(c.budget_key())["releases"] == 0
    print(f"\nanchor document with {param}={value}: refused in {took:.2f} s")


def test_a_request_that_never_left_is_not_charged(service, svc_collection, svc_key, svc_split):
    """ConnectError before a byte of the resolve was written: the charge is withdrawn and the draw
    discarded. A connection dropped after the request was written: charged as before."""
    Xq, yq = svc_split.query
    budget = _budget()
    for i in range(6):  # the server stops listening just before each resolve is sent
        with TamperProxy(service.url, lambda m, p, d: d) as p, Client(p.url, svc_key["key"], budget=budget) as c:
            key = c.budget_key()
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, shortlist=16)
            assert budget.status(key)["releases"] == 1
            c._http.event_hooks["request"].append(
                lambda req: p.close_listener() if req.url.path.endswith("/resolve") else None)
            with pytest.raises(httpx.ConnectError) as e:
                c.query(svc_collection, Xq[1 + i], int(yq[1 + i]), epsilon=1.0, shortlist=16)
            assert "withdrawn" in " ".join(getattr(e.value, "__notes__", ()))
            st = budget.status(key)
            assert st["releases"] == 1 and st["epsilon_spent"] == pytest.approx(1.0)
    print("\nConnectError before the resolve's first byte: 0 of 6 charged")
    drop = lambda m, path, d: DROP if path.endswith("/resolve") else d  # noqa: E731
    with TamperProxy(service.url, drop) as p, Client(p.url, svc_key["key"], budget=budget) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            c.query(svc_collection, Xq[2], int(yq[2]), epsilon=1.0, shortlist=16)
        assert budget.status(c.budget_key())["releases"] == 1  # it may have been read: charged


@pytest.mark.parametrize("drop", ["dummy_features", "labels", "frame"])
def test_a_malformed_anchor_document_is_one_error(service, svc_collection, svc_key, svc_split, drop):
    def without(method, path, doc):
        if path.endswith("/anchor"):
            doc.pop(drop)
        return doc

    Xq, yq = svc_split.query
    with TamperProxy(service.url, without) as p, Client(p.url, svc_key["key"], budget=_budget()) as c:
        with pytest.raises(PMVectorError, match="anchor document|publishes no class frames"):  # outside a query too
            c.private_knn(svc_collection, epsilon=1.0)
        with pytest.raises(PMVectorError, match="anchor document"):
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, protocol="privatemail_paper")
        assert c.budget.status(c.budget_key())["releases"] == 0
