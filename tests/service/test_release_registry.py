"""A release registered by a test, answered end to end by the real service with no change under
``pm_vector/``: one :func:`pm_vector.protocol.releases.register` call (issue #37).

The test's release ("top-hubs") has its own request type and tiny wire format
(``{"format": "tests.top-hubs/1", "epsilon", "k"}``), its own service check and its own resolver
(the run's ``k`` most-cited items of its neighbour graph, a public function of the run: nothing
about the client's data). The service parses it, checks it, resolves it on the collection's
active run and writes its request log, all through the table; the table's other readers (the
default rule, the ledger's charge, the request types the server parses) see it too."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
import pytest

FORMAT = "tests.top-hubs/1"


@dataclass(frozen=True)
class TopHubsRequest:
    epsilon: float
    k: int
    collection: str | None = None

    def to_dict(self) -> dict:
        return {"format": FORMAT, "epsilon": self.epsilon, "k": self.k, "collection": self.collection}

    @classmethod
    def from_dict(cls, d) -> "TopHubsRequest":
        from pm_vector.errors import InvalidInputError

        if not isinstance(d, dict) or set(d) - {"format", "epsilon", "k", "collection"}:
            raise InvalidInputError("a top-hubs request has format, epsilon, k and collection only.")
        k = d.get("k")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 50:
            raise InvalidInputError(f"k must be an integer in 1..50, got {k!r}.")
        return cls(float(d["epsilon"]), k, d.get("collection"))


def _service_check(r, settings, name, *, k, code_bytes=None):
    from pm_vector.errors import InvalidInputError
    from pm_vector.service.errors import ApiError

    try:
        return TopHubsRequest.from_dict(r)
    except (InvalidInputError, KeyError, TypeError, ValueError) as exc:
        raise ApiError(422, "invalid_input", f"invalid top-hubs request: {exc}") from None


def _resolve_top_hubs(collection, req, raw, *, conn, log, received, t0, timings, **_):
    """The run's ``req.k`` items with the most neighbour-graph citations (its hub counts), logged
    in the resolve's transaction like every release's answer."""
    from psycopg import sql

    from pm_vector.db.resolve.requests import finish, run_snapshot

    with run_snapshot(collection, conn, False) as (rconn, meta):
        run_id = int(meta["run"]["id"])
        ids = [int(r[0]) for r in rconn.execute(
            sql.SQL("SELECT item_id FROM {} GROUP BY item_id ORDER BY sum(hub) DESC, item_id LIMIT %s").format(
                sql.Identifier("pm_vector", f"run_{run_id}_hubs")), [req.k]).fetchall()]
        log_id = finish(rconn, collection, req, raw, run_id=run_id, n_rows=len(ids), received=received, t0=t0,
                        log=log, timings=timings)
    return {"collection": collection, "run_id": run_id, "format": FORMAT, "release": "top-hubs",
            "item_ids": ids, "request_log_id": log_id}


@pytest.fixture
def top_hubs():
    from pm_vector.protocol import releases

    rel = releases.register(releases.Release(
        name="top-hubs", wire_format=FORMAT, request_type=TopHubsRequest, answer_type=None, check_answer=None,
        guarantee=releases.Guarantee("nothing of the client's is released: the request's epsilon is charged", 0.0),
        client_plan=None, resolver=_resolve_top_hubs, derived_tables=("hubs",), answers=("full",),
        service_check=_service_check, description="a test's release: the run's most-cited items"))
    try:
        yield rel
    finally:
        releases.unregister("top-hubs")


def _post(service, key, name, body):
    return httpx.post(f"{service.url}/collections/{name}/resolve", json=body,
                      headers={"Authorization": f"Bearer {key['key']}"}, timeout=30)


def test_a_release_registered_in_a_test_is_answered_by_the_service(top_hubs, service, svc_collection, svc_key,
                                                                  requests_logged):
    from pm_vector import db
    from pm_vector.protocol import releases
    from pm_vector.protocol.requests import REQUEST_TYPES

    # the table's readers see it
    assert REQUEST_TYPES[FORMAT] is TopHubsRequest and releases.by_format(FORMAT) is top_hubs
    assert top_hubs.guarantee.charge(TopHubsRequest(2.0, 5)) == (2.0, 0.0)
    assert releases.default_release(1.0).name == "location"  # a release with no default rule is never one

    before = requests_logged(svc_collection)
    r = _post(service, svc_key, svc_collection, {"request": TopHubsRequest(1.0, 5, svc_collection).to_dict()})
    assert r.status_code == 200, r.text
    ans = r.json()
    assert ans["release"] == "top-hubs" and ans["format"] == FORMAT
    ids = ans["item_ids"]
    assert len(ids) == 5 and len(set(ids)) == 5
    # the same public answer for the same request (a function of the run only)
    again = _post(service, svc_key, svc_collection, {"request": TopHubsRequest(1.0, 5).to_dict()}).json()
    assert again["item_ids"] == ids
    # logged through the same path as every release: the validated request, not the text sent
    assert requests_logged(svc_collection) == before + 2
    logged = db.list_requests(svc_collection, limit=2)
    docs = [row["request"] if isinstance(row["request"], dict) else json.loads(row["request"]) for row in logged]
    assert {d["format"] for d in docs} == {FORMAT}

    # the service checks it with the release's own check (a 4xx, nothing logged) ...
    bad = _post(service, svc_key, svc_collection, {"request": {"format": FORMAT, "epsilon": 1.0, "k": 500}})
    assert bad.status_code == 422 and "top-hubs" in bad.text, bad.text
    # ... and the answers it declares
    bad = _post(service, svc_key, svc_collection, {"request": TopHubsRequest(1.0, 5).to_dict(), "answer": "compact"})
    assert bad.status_code == 422 and "top-hubs" in bad.text, bad.text
    assert requests_logged(svc_collection) == before + 2


def test_an_unregistered_release_is_refused(service, svc_collection, svc_key, requests_logged):
    # without the registration the same body is an unknown format: a 422, nothing logged
    before = requests_logged(svc_collection)
    r = _post(service, svc_key, svc_collection, {"request": TopHubsRequest(1.0, 5).to_dict()})
    assert r.status_code == 422, r.text
    assert "unsupported request format" in r.text
    time.sleep(0)
    assert requests_logged(svc_collection) == before


MARKS = "test_marks"


def _erase_marks(conn, place, plan):
    """The test kind's erasure: the erased items' rows go (the hook a kind registers)."""
    from psycopg import sql

    conn.execute(sql.SQL("DELETE FROM {} WHERE item_id = ANY(%s)").format(
        sql.Identifier("pm_vector", f"run_{int(place.run_id)}_{MARKS}")), [plan.erased.tolist()])


def test_a_run_table_kind_a_test_release_names_is_erased_and_granted(pm_home, svc_split):
    """Build item 1: a kind of run table registered here and named by a release registered here is
    a table of every run that serves the release: a delete reaches it (in the delete's transaction)
    and the job's grant gives the query role SELECT on it, with no change under ``pm_vector/``.
    Before the release names it, the same registered kind is no table of the run: the delete leaves it."""
    import uuid

    from psycopg import sql

    from pm_vector import db
    from pm_vector.db.postgres.engine import connection
    from pm_vector.db.runs import kinds
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.protocol import releases

    ds = svc_split.dataset
    name = "marks_" + uuid.uuid4().hex[:8]
    db.create_collection(name, ds.dim, [int(c) for c in ds.classes], settings={"delta": False})
    Xs, ys = svc_split.server
    ids = [int(i) for i in db.ingest(name, Xs[:300], ys[:300])["item_ids"]]
    db.register_anchor_set(name, *svc_split.anchor, role="anchor")
    db.register_anchor_set(name, *svc_split.dummy, role="dummy")
    rid = int(db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)["run_id"])
    table = sql.Identifier("pm_vector", f"run_{rid}_{MARKS}")

    def marked():
        with connection() as conn:
            return {int(r[0]) for r in conn.execute(sql.SQL("SELECT item_id FROM {}").format(table)).fetchall()}

    kinds.register_kind(kinds.RunTable(MARKS, "coordinator", _erase_marks, answer=True))
    try:
        with connection() as conn:
            conn.execute(sql.SQL("CREATE TABLE {} (item_id bigint PRIMARY KEY)").format(table))
            conn.execute(sql.SQL("INSERT INTO {} SELECT unnest(%s::bigint[])").format(table), [ids])
            conn.commit()
        db.delete_items(name, item_ids=[ids[0]])  # no release names the kind yet: not a table of the run
        assert ids[0] in marked()
        rel = releases.register(releases.Release(
            name="test-marks", wire_format="tests.marks/1", request_type=type("MarksRequest", (), {}),
            answer_type=None, check_answer=None, guarantee=releases.Guarantee("eps", 0.0), client_plan=None,
            resolver=lambda *a, **k: {}, derived_tables=("hubs", MARKS)))
        try:
            db.delete_items(name, item_ids=ids[1:4])
            assert marked() == set(ids[4:]) | {ids[0]}  # the erasure reached it, nothing else went
            with connection() as conn:
                granted = kinds.grant_answer_tables(conn, rid)
                conn.commit()
                if granted:  # the query role exists (migration 0022)
                    assert f"run_{rid}_{MARKS}" in granted
                    assert conn.execute("SELECT has_table_privilege('pm_vector_query', %s, 'SELECT')",
                                        [f"pm_vector.run_{rid}_{MARKS}"]).fetchone()[0]
        finally:
            releases.unregister(rel.name)
    finally:
        kinds.unregister_kind(MARKS)
        with connection() as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
            conn.commit()
        db.drop_collection(name, missing_ok=True)
