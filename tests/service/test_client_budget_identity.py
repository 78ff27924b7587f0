"""The client's budget against the real service: keyed by the server's origin as the client was
given it (one budget for every collection of the server and every loopback name of it; the
collection id the server publishes is information only), a default budget (never unlimited),
and every path that releases noise charges it -- query, build_request (both protocols),
private_knn, resolve of a foreign request, the CLI. No public method takes a seed."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pm_vector.client.budget import MemoryBudget, PrivacyBudget
from pm_vector.client.http import Client
from pm_vector.client.privatemail import paper_charge
from pm_vector.errors import BudgetExceededError

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture(autouse=True)
def _no_budget_env(monkeypatch):
    monkeypatch.delenv("PM_VECTOR_EPSILON_BUDGET", raising=False)
    monkeypatch.delenv("PM_VECTOR_DELTA_BUDGET", raising=False)


def _resolves(c: Client) -> list[str]:
    sent: list[str] = []
    c._http.event_hooks["request"].append(lambda req: sent.append(req.url.path))
    return sent


def test_the_collection_id_is_information_and_the_budget_key_is_the_origin(service, svc_collection, svc_key):
    from pm_vector.db.postgres import connect

    with Client(service.url, svc_key["key"], budget=MemoryBudget()) as c:
        a = c.anchor_document(svc_collection)["collection_uuid"]
        assert UUID.match(a) and c.anchor_document(svc_collection)["collection_uuid"] == a
        assert c.collection_id(svc_collection) == a
        assert c.budget_key() == f"origin:http://localhost:{service.port}"  # 127.0.0.1: loopback
    with connect() as conn:
        row = conn.execute("SELECT uuid::text FROM pm_vector.collections WHERE name = %s", [svc_collection]).fetchone()
    assert row[0] == a


def test_loopback_names_of_one_server_share_one_budget(service, svc_collection, svc_key, svc_split, tmp_path):
    Xq, yq = svc_split.query
    path = tmp_path / "ledger.json"
    other = service.url.replace("127.0.0.1", "localhost")
    assert other != service.url
    keys = []
    for url in (service.url, other):
        with Client(url, svc_key["key"], budget=PrivacyBudget(path)) as c:
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, shortlist=16)
            keys.append(c.budget_key())
    assert keys[0] == keys[1]
    st = PrivacyBudget(path).status(keys[0])
    assert st["releases"] == 2 and st["epsilon_spent"] == pytest.approx(8.0)
    with Client(other, svc_key["key"], budget=PrivacyBudget(path)) as c:
        sent = _resolves(c)
        with pytest.raises(BudgetExceededError):  # the default budget (eps 10) is shared too
            c.query(svc_collection, Xq[1], int(yq[1]), epsilon=4.0, shortlist=16)
        assert not any(p.endswith("/resolve") for p in sent)
    assert PrivacyBudget(path).keys() == [keys[0]]


def test_no_budget_is_the_default_ledger_with_the_default_budget(service, svc_collection, svc_key, svc_split,
                                                                 tmp_path, monkeypatch):
    # PM_VECTOR_HOME also locates this session's database: move the ledger only
    import pm_vector.client.budget as budget_mod

    monkeypatch.setattr(budget_mod, "default_path", lambda: tmp_path / "client" / "budget.json")
    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"]) as c:  # budget=None
        assert c.budget.path == tmp_path / "client" / "budget.json"
        r = c.query(svc_collection, Xq[0], int(yq[0]), epsilon=6.0, shortlist=16)
        assert r["budget"]["epsilon_budget"] == 10.0 and r["budget"]["default_budget"]
        with pytest.raises(BudgetExceededError):
            c.query(svc_collection, Xq[1], int(yq[1]), epsilon=6.0, shortlist=16)
    monkeypatch.setenv("PM_VECTOR_EPSILON_BUDGET", "20")  # the documented override
    with Client(service.url, svc_key["key"]) as c:
        assert c.query(svc_collection, Xq[1], int(yq[1]), epsilon=6.0, shortlist=16)["budget"]["epsilon_spent"] == \
            pytest.approx(12.0)


def test_every_releasing_path_charges(service, svc_collection, svc_key, svc_split):
    Xq, yq = svc_split.query
    budget = MemoryBudget(default_epsilon=100.0)
    with Client(service.url, svc_key["key"], budget=budget) as c:
        key = c.budget_key()
        spent = lambda: budget.status(key)["epsilon_spent"]
        req, _ = c.build_request(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, shortlist=16, release="gaussian")
        assert spent() == pytest.approx(1.0)
        c.resolve(svc_collection, req)  # built (and charged) here: not charged again
        assert spent() == pytest.approx(1.0)
        foreign = dict(req.to_dict(), rows=(np.asarray(req.rows) + 0.0).tolist(), epsilon=2.0)
        foreign["rows"][0][0] += 1e-3  # another release than the one built here
        c.resolve(svc_collection, foreign)
        assert spent() == pytest.approx(3.0)
        pk = c.private_knn(svc_collection, epsilon=0.5)
        pk.request(Xq[1], int(yq[1]))
        pk.request(Xq[2], int(yq[2]))
        assert spent() == pytest.approx(4.0)
        c.build_request(svc_collection, Xq[3], int(yq[3]), epsilon=1.0, protocol="privatemail_paper")
        paper = paper_charge(1.0, 1e-5)[0]  # what the paper's request costs between real queries (4.75)
        assert spent() == pytest.approx(4.0 + paper) and 4.7 < paper < 4.8
        c.query(svc_collection, Xq[4], int(yq[4]), epsilon=1.0, shortlist=16)
        assert spent() == pytest.approx(5.0 + paper) and budget.status(key)["releases"] == 6
        assert budget.keys() == [key]  # one entry: the server's, whatever the collection


def test_public_methods_take_no_seed_nor_unknown_keywords(service, svc_collection, svc_key, svc_split):
    """A seed (the tests' private ``_rng``) or any other unknown keyword is refused with a TypeError
    before anything is fetched, charged or sent; the paper's own options still pass."""
    Xq, yq = svc_split.query
    budget = MemoryBudget()
    with Client(service.url, svc_key["key"], budget=budget) as c:
        sent = _resolves(c)
        for kw in ({"_rng": 0}, {"_rng": np.random.default_rng(0)}, {"_seed": 1}, {"rng": 0}, {"seed": 0}):
            for protocol in ("pm_vector", "privatemail_paper"):
                with pytest.raises(TypeError, match="keyword"):
                    c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, protocol=protocol, **kw)
                with pytest.raises(TypeError, match="keyword"):
                    c.build_request(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, protocol=protocol, **kw)
        assert sent == [] and budget.status(c.budget_key())["releases"] == 0
        r = c.query(svc_collection, Xq[0], int(yq[0]), epsilon=1.0, protocol="privatemail_paper", dp_alpha=0.4,
                    rerank=False)
        assert r["protocol"] == "privatemail_paper" and budget.status(c.budget_key())["releases"] == 1


def test_a_refused_request_releases_nothing(service, svc_collection, svc_key, svc_split):
    Xq, yq = svc_split.query
    budget = MemoryBudget(default_epsilon=1.0)
    with Client(service.url, svc_key["key"], budget=budget) as c:
        sent = _resolves(c)
        pk = c.private_knn(svc_collection, epsilon=0.75)
        pk.request(Xq[0], int(yq[0]))
        with pytest.raises(BudgetExceededError):
            pk.request(Xq[1], int(yq[1]))
        with pytest.raises(BudgetExceededError):
            c.build_request(svc_collection, Xq[1], int(yq[1]), epsilon=0.75)
        assert not any(p.endswith("/resolve") for p in sent)
        assert budget.status(c.budget_key())["releases"] == 1


def test_an_earlier_clients_entries_of_this_server_are_carried_over(service, svc_collection, svc_key, svc_split,
                                                                     tmp_path):
    """A ledger written when entries were kept per published collection id: the spends of every
    entry whose base URL is this server move into the server's entry; another server's stay."""
    Xq, yq = svc_split.query
    path = tmp_path / "old.json"
    other = service.url.replace("127.0.0.1", "localhost")
    spend = lambda e: {"epsilon": e, "delta": 1e-5, "label": None}  # noqa: E731
    entry = lambda *es: {"version": 1, "epsilon_budget": None, "delta_budget": None,  # noqa: E731
                         "delta_slack": None, "spends": [spend(e) for e in es]}
    path.write_text(json.dumps({
        "version": 1,
        "collections": {"uuid:aaa": entry(3.0), "uuid:bbb": entry(2.0, 1.0), "uuid:ccc": entry(4.0)},
        "names": {"uuid:aaa": f"{svc_collection}@{service.url}", "uuid:bbb": f"x@{other}/",
                  "uuid:ccc": "y@http://10.0.0.1:8000"},
        "aliases": {svc_collection: "uuid:aaa", "y": "uuid:ccc"}}))
    with Client(service.url, svc_key["key"], budget=PrivacyBudget(path)) as c:
        with pytest.raises(BudgetExceededError):  # 6 spent on this server before: 6 + 6 > 10
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=6.0, shortlist=16)
        c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, shortlist=16)
        key = c.budget_key()
    data = PrivacyBudget(path).export()  # the ledger in its JSON form
    assert sorted(data["collections"]) == sorted([key, "uuid:ccc"]) and data["aliases"] == {"y": "uuid:ccc"}
    st = PrivacyBudget(path).status(key)
    assert st["epsilon_spent"] == pytest.approx(10.0) and st["releases"] == 4
    assert PrivacyBudget(path).status("uuid:ccc")["epsilon_spent"] == pytest.approx(4.0)


def test_cli_query_charges_the_servers_origin(service, svc_collection, svc_key, svc_split, tmp_path):
    from typer.testing import CliRunner

    from pm_vector.cli import app

    Xq, yq = svc_split.query
    np.save(tmp_path / "q.npy", Xq[:2])
    ledger = tmp_path / "cli.json"
    r = CliRunner().invoke(app, ["query", svc_collection, "--features", str(tmp_path / "q.npy"), "--label",
                                 str(int(yq[0])), "--epsilon", "1", "--url", service.url, "--api-key",
                                 svc_key["key"], "--budget", "2.5", "--budget-file", str(ledger), "--json"])
    assert r.exit_code == 0, r.output
    data = PrivacyBudget(ledger).export()  # the ledger in its JSON form
    (key,) = data["collections"]
    assert key == f"origin:http://localhost:{service.port}" and data["collections"][key]["epsilon_budget"] == 2.5
    assert len(data["collections"][key]["spends"]) == 1
