"""The cell release through HTTP: Client.query(release=...) ("auto" follows the public rule, the
answer says which release it used), the ledger charged (eps, 0), answers identical to the database's
resolve of the same request; bad cell requests get a clear 422 and nothing is logged."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from pm_vector.client.http import Client


def _ledger(tmp_path):
    from pm_vector.client.budget import PrivacyBudget

    return PrivacyBudget(tmp_path / "ledger.json", default_epsilon=1000.0)


def test_query_release_option_and_ledger(service, svc_collection, svc_key, svc_split, tmp_path, requests_logged):
    from pm_vector.privacy.cell_release import GAUSSIAN_ABOVE, cell_level_for_epsilon, max_cells_for

    Xq, yq = svc_split.query
    before = requests_logged(svc_collection)
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as c:
        cells = c.public_cells(svc_collection)
        assert cells is not None and list(cells.levels_)[:4] == [2, 4, 8, 16]
        r = c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, k=8, shortlist=32)  # auto: the cells below 512
        # K: the public rule for eps 4, no finer than the collection's public size allows (800 items, 10 classes)
        assert r["release"] == "cells" and r["delta"] == 0.0
        assert r["n_cells"] == cell_level_for_epsilon(4.0, cells.levels_, max_cells_for(800, 10, 32))
        assert len(r["item_ids"]) == 8 and r["reranked"] == "codes" and r["distances"] == sorted(r["distances"])
        r2 = c.query(svc_collection, Xq[1], int(yq[1]), epsilon=4.0, k=8, shortlist=32, release="cells", n_cells=16)
        assert r2["release"] == "cells" and r2["n_cells"] == 16
        st = c.budget.status(c.budget_key())
        assert st["epsilon_spent"] == pytest.approx(8.0) and st["delta_spent"] == 0.0  # (eps, 0) per request
        g = c.query(svc_collection, Xq[2], int(yq[2]), epsilon=4.0, k=8, shortlist=32, release="gaussian")
        assert g["release"] == "gaussian" and g["delta"] == 1e-5 and g["n_cells"] is None
        hi = c.query(svc_collection, Xq[3], int(yq[3]), epsilon=GAUSSIAN_ABOVE, k=8, shortlist=32)  # the Gaussian
        assert hi["release"] == "gaussian"
        lf = c.query(svc_collection, Xq[4], None, epsilon=4.0, k=8, shortlist=32)  # label-free: a public classifier
        assert lf["release"] == "cells" and lf["label_predicted"]
        paper = c.query(svc_collection, Xq[5], int(yq[5]), epsilon=1.0, k=8, protocol="privatemail_paper")
        assert paper["release"] == "privatemail_paper"
        with pytest.raises(Exception, match="release must be one of"):
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, release="laplace")
        with pytest.raises(Exception, match="published levels"):
            c.query(svc_collection, Xq[0], int(yq[0]), epsilon=4.0, release="cells", n_cells=5)
    assert requests_logged(svc_collection) == before + 6
    from pm_vector import db

    logged = db.list_requests(svc_collection, limit=6)
    assert [x["request"].get("release", "privatemail_paper") for x in logged][::-1] == \
        ["cells", "cells", "gaussian", "gaussian", "cells", "privatemail_paper"]


def test_http_answers_equal_the_database_resolve(service, svc_collection, svc_key, svc_split, tmp_path):
    from pm_vector.db.resolve.resolution import resolve

    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as c:
        for i in range(3):
            req, _ = c.build_request(svc_collection, Xq[i], int(yq[i]), epsilon=2.0, shortlist=16, release="cells")
            assert not req.seeded and req.release == "cells"
            res = c.resolve(svc_collection, req)
            want = resolve(svc_collection, req, log=False)
            # the service's answer travels in msgpack (ids as an array); the same ids, row by row
            assert [[int(v) for v in r["item_ids"]] for r in res["rows"]] == \
                [[int(v) for v in r["item_ids"]] for r in want["rows"]]
            assert res["release"] == "cells" and res["n_cells"] == req.n_cells


@pytest.fixture(scope="module")
def cell_req(service, svc_collection, svc_key, svc_split, tmp_path_factory):
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path_factory.mktemp("cell_req"))) as c:
        req, _ = c.build_request(svc_collection, svc_split.query[0][0], int(svc_split.query[1][0]), epsilon=4.0,
                                 shortlist=16, release="cells", n_cells=8)
    return req.to_dict()


@pytest.mark.parametrize("change,needle", [
    ({"cells_digest": "ab" * 32}, "fetch the current public anchor"),
    ({"n_cells": 32, "reports": [0] * 10}, "published levels"),
    ({"reports": [1, 2, 3]}, "needs exactly 10"),
    ({"reports": [8] + [0] * 9}, "[0, 8)"),
    ({"reports": [-1] + [0] * 9}, "[0, 8)"),
    ({"reports": [1.5] + [0] * 9}, "integer"),
    ({"reports": []}, "non-empty"),
    ({"delta": 1e-5}, "delta must be 0"),
    ({"epsilon": 0}, "epsilon"),
    ({"release": "gaussian"}, "release 'cells'"),
    ({"sigmas": [1.0]}, "unknown cell request field"),
    ({"shortlist": 0}, "shortlist"),
    ({"collection": "other"}, "built for collection"),
])
def test_bad_cell_requests_get_a_clear_422_and_nothing_is_logged(service, svc_collection, svc_key, cell_req,
                                                                  requests_logged, change, needle):
    before = requests_logged(svc_collection)
    body = json.dumps({"request": {**cell_req, **change}, "k": 8})
    r = httpx.post(f"{service.url}/collections/{svc_collection}/resolve", content=body, timeout=60,
                   headers={"Authorization": f"Bearer {svc_key['key']}", "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert needle in r.json()["message"]
    assert requests_logged(svc_collection) == before
    ok = httpx.post(f"{service.url}/collections/{svc_collection}/resolve", timeout=60,
                    content=json.dumps({"request": cell_req, "k": 8}),
                    headers={"Authorization": f"Bearer {svc_key['key']}", "Content-Type": "application/json"})
    assert ok.status_code == 200 and len(ok.json()["rows"]) == 10


@pytest.mark.parametrize("release", ["cells", "gaussian"])
def test_cli_query_release_option(service, svc_collection, svc_key, svc_split, tmp_path, release):
    from typer.testing import CliRunner

    from pm_vector.cli import app

    Xq, yq = svc_split.query
    np.save(tmp_path / "q.npy", Xq[:1])
    args = ["query", svc_collection, "--features", str(tmp_path / "q.npy"), "--label", str(int(yq[0])),
            "--epsilon", "2", "--url", service.url, "--api-key", svc_key["key"], "--budget-file",
            str(tmp_path / "l.json"), "--release", release, "--json"]
    r = CliRunner().invoke(app, args + (["--n-cells", "4"] if release == "cells" else []))
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["release"] == release and len(out["item_ids"]) == 8
    assert out["delta"] == (0.0 if release == "cells" else 1e-5)
    assert out["n_cells"] == (4 if release == "cells" else None)
    bad = CliRunner().invoke(app, args[:-3] + ["--release", "laplace"])
    assert bad.exit_code != 0 and "release must be one of" in bad.output
