"""Issue #37, build item 2: the client, one path. A default private query goes
``Client.query`` -> pick -> build -> exchange -> check -> re-rank without coming back: no module of
``pm_vector.client`` is entered again while it is on the stack below another (the mixins called
back into ``http.py``: http -> location -> http -> public_documents -> http, three times), and it
crosses fewer modules than the 50 the issue counted. The trace is ``tools/client_path.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def client_path():
    path = Path(__file__).resolve().parents[2] / "tools" / "client_path.py"
    spec = importlib.util.spec_from_file_location("client_path", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_default_query_goes_one_way(service, svc_collection, svc_key, svc_split, client_path):
    Xq, _ = svc_split.query
    t = client_path.default_query(service.url, svc_key["key"], svc_collection, Xq[0], epsilon=4.0)
    print(f"\ndefault query ({t['result']['release']}): {len(t['modules'])} pm_vector modules, "
          f"{len(t['client'])} client modules {t['client']}; entered again: {t['reentered']} {t['chains']}")
    assert t["result"]["release"] == "location"
    assert t["reentered"] == [], t["reentered"]
    assert len(t["modules"]) < 50


def test_loading_the_public_document_builds_no_release_client(service, svc_collection, svc_key, svc_split,
                                                              monkeypatch):
    """Loading a collection's public document (its codes, cells, the default query's plan) builds no
    :class:`~pm_vector.client.query.PrivateKNN` (it used to build one as a side effect, with the class
    frames of every dummy); a query of the Gaussian release builds its own."""
    from pm_vector.client import Client, MemoryBudget
    from pm_vector.client.query import PrivateKNN

    built = []
    init = PrivateKNN.__init__

    def counted(self, *a, **kw):
        built.append(1)
        init(self, *a, **kw)

    monkeypatch.setattr(PrivateKNN, "__init__", counted)
    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"], budget=MemoryBudget()) as c:
        c.budget.set_budget(c.budget_key(), epsilon=100.0)
        assert c.product_codes(svc_collection) is not None and c.location_cells(svc_collection) is not None
        assert built == []
        assert c.query(svc_collection, Xq[0], epsilon=4.0)["release"] == "location"
        assert built == []
        assert c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, release="gaussian")["release"] == "gaussian"
        assert built == [1]
