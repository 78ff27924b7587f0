"""The service's commands: keys, ingest, query, demo, --help with an example."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pm_vector.cli import app
from pm_vector.cli.service import register

register(app)
runner = CliRunner()


def _run(*args, ok=True):
    r = runner.invoke(app, list(args))
    if ok:
        assert r.exit_code == 0, (r.output, r.exception)
    return r


@pytest.mark.parametrize("cmd", [["serve"], ["keys", "create"], ["keys", "list"], ["keys", "revoke"], ["query"],
                                 ["demo"], ["ingest"], ["bench", "load"]])
def test_help_has_an_example(cmd):
    r = _run(*cmd, "--help")
    assert "Example" in r.output and "pm-vector" in r.output


def test_keys_create_list_revoke(pm_home):
    rec = json.loads(_run("keys", "create", "--name", "cli-test", "--json").stdout)
    assert rec["key"].startswith("pmv_") and rec["active"]
    rows = json.loads(_run("keys", "list", "--json").stdout)
    mine = [r for r in rows if r["id"] == rec["id"]][0]
    assert "key" not in mine and mine["prefix"] == rec["key"][:12]
    assert rec["key"] not in _run("keys", "list").stdout  # the secret is never listed
    out = json.loads(_run("keys", "revoke", str(rec["id"]), "--json").stdout)
    assert out["active"] is False
    r = _run("keys", "revoke", "999999", ok=False)
    assert r.exit_code == 2 and "no API key" in r.output
    r = _run("keys", "create", "--name", " ", ok=False)
    assert r.exit_code == 2 and "name" in r.output


def test_ingest_npy_and_parquet_message(pm_home, svc_split, tmp_path):
    from pm_vector import db

    X, y = svc_split.server
    np.save(tmp_path / "X.npy", X[:50] * 3.0)
    np.save(tmp_path / "y.npy", y[:50])
    name = "cli_ingest"
    try:
        out = json.loads(_run("ingest", name, "--features", str(tmp_path / "X.npy"), "--labels",
                              str(tmp_path / "y.npy"), "--create", "--json").stdout)
        assert out["n_rows"] == 50 and out["created"] == name
        Xa, ya = svc_split.anchor
        np.save(tmp_path / "A.npy", Xa)
        np.save(tmp_path / "ya.npy", ya)
        out = json.loads(_run("ingest", name, "--features", str(tmp_path / "A.npy"), "--labels",
                              str(tmp_path / "ya.npy"), "--role", "anchor", "--json").stdout)
        assert out["role"] == "anchor" and out["n_rows"] == len(ya)
        assert db.collection_info(name)["n_items"] == 50
        np.save(tmp_path / "bad.npy", np.full((3, 64), np.nan))
        np.save(tmp_path / "yb.npy", y[:3])
        r = _run("ingest", name, "--features", str(tmp_path / "bad.npy"), "--labels", str(tmp_path / "yb.npy"),
                 ok=False)
        assert r.exit_code == 2 and db.collection_info(name)["n_items"] == 50
    finally:
        db.drop_collection(name, missing_ok=True)
    (tmp_path / "X.parquet").write_bytes(b"PAR1")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        r = _run("ingest", name, "--features", str(tmp_path / "X.parquet"), "--labels", str(tmp_path / "y.npy"),
                 ok=False)
        assert r.exit_code == 2 and "pyarrow" in r.output


def test_query_command(service, svc_collection, svc_key, svc_split, tmp_path, monkeypatch):
    Xq, yq = svc_split.query
    np.save(tmp_path / "q.npy", Xq[:3])
    ledger = tmp_path / "b.json"
    args = ["query", svc_collection, "--features", str(tmp_path / "q.npy"), "--row", "1", "--label", str(int(yq[1])),
            "--epsilon", "1", "--url", service.url, "--api-key", svc_key["key"], "--budget", "1.5",
            "--budget-file", str(ledger)]
    res = json.loads(_run(*args, "--json").stdout)
    assert len(res["item_ids"]) == 8 and res["budget"]["epsilon_spent"] == pytest.approx(1.0)
    # the resolve's bytes on the wire, both ways (the default wire: msgpack)
    assert res["wire"] == "msgpack" and res["bytes_per_request"] == res["bytes_sent"] + res["bytes_received"] > 0
    assert res["answer"] == "compact" and res["reranked"] == "codes" and "labels" not in res
    raw = json.loads(_run(*args[:-1], str(tmp_path / "raw.json"), "--raw-features", "--json").stdout)
    assert raw["reranked"] == "features" and len(raw["labels"]) == 8 and raw["shortlist"] == 128
    r = _run(*args, ok=False)  # a second eps=1 query exceeds 1.5
    assert r.exit_code == 2 and "budget" in r.output
    r = _run("query", svc_collection, "--features", str(tmp_path / "q.npy"), "--label", "1", "--epsilon", "1",
             "--url", service.url, "--api-key", "pmv_wrong", "--budget-file", str(ledger), ok=False)
    assert r.exit_code == 2 and "401" in r.output


def test_demo_json(pm_home):
    # 6 queries at eps 1, 4 and 16: 126 in all, far over a client's default budget of 10 -- the
    # demo's evaluation ledger is given exactly what the evaluation spends
    res = json.loads(_run("demo", "--json", "--queries", "6", "--epsilons", "1,4,16").stdout)
    assert set(res) >= {"nonprivate", "results", "seconds"}
    assert set(res["nonprivate"]) >= {"recall_at_8", "precision_at_8"}
    assert [r["epsilon"] for r in res["results"]] == [1.0, 4.0, 16.0]
    r = res["results"][0]
    assert set(r) >= {"epsilon", "recall_at_8", "precision_at_8", "query_p50_ms"}
    assert 0.0 <= r["precision_at_8"] <= 1.0 and r["query_p50_ms"] > 0
    assert res["ledger_epsilon_spent"] == pytest.approx(6 * 21.0)
