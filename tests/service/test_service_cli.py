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


def test_demo_json(pm_home, capsys):
    """Issue #37, build item 6: the demo shows the trade. On its default collection and budget
    (digits, 8,000 bytes a request: the collection does not fit) the answer holds a share < 1 at
    eps 1 and a smaller one at eps 16, recall rises with eps, and every row says its plan, the
    ledger, the label-only ablation beside it, and download-all as the reference (before: 1000x32 B
    at eps 1 and 4, the whole collection, and no share, no ledger, no ablation)."""
    # 20 queries at eps 1 and 16: 340 in all, far over a client's default budget of 10 -- the
    # demo's evaluation ledger is given exactly what the evaluation spends
    res = json.loads(_run("demo", "--json", "--queries", "20", "--epsilons", "1,16").stdout)
    assert res["dataset"] == "digits" and res["max_bytes"] == 8000
    assert set(res) >= {"nonprivate", "results", "seconds", "download_all"}
    assert set(res["nonprivate"]) >= {"recall_at_8", "precision_at_8"}
    assert [r["epsilon"] for r in res["results"]] == [1.0, 16.0]
    lo, hi = res["results"]
    for r in (lo, hi):
        assert r["release"] == f"location M={r['level']}" and 0 <= r["precision_at_8"] <= 1 and r["query_p50_ms"] > 0
        assert r["share_held"] == pytest.approx(r["candidates"] / 1000) and r["bytes_per_request"] <= 8000
        assert 0.0 <= r["label_only_nn_recall_at_8"] <= 1.0
    assert lo["share_held"] < 1.0 and hi["share_held"] < lo["share_held"] and hi["level"] > lo["level"]
    assert hi["nn_recall_at_8"] > lo["nn_recall_at_8"] + 0.1  # recall rises with eps
    # the ledger: this row's queries, and what it holds after each row
    assert (lo["epsilon_spent"], hi["epsilon_spent"]) == (20.0, 320.0)
    assert lo["ledger_epsilon_spent"] == pytest.approx(20.0) and hi["ledger_epsilon_spent"] == pytest.approx(340.0)
    assert res["ledger_epsilon_spent"] == pytest.approx(340.0) and hi["ledger_releases"] == 40
    dl = res["download_all"]
    assert dl["nn_recall_at_8"] == 1.0 and dl["n_items"] == 1000 and dl["bytes"] > 1000 * 64 * 4
    # the table a user sees: every row, download-all, in 100 columns, and what it shows
    from pm_vector.cli.demo import _print_table

    _print_table(res)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert sum("location M=" in line for line in lines) == 2 and any("download all" in line for line in lines)
    assert "local DP binds" in " ".join(err.split())


def test_demo_default_collection_makes_the_release_choose():
    """Issue #37, build item 6: each built-in collection of ``pm-vector demo`` at its budget is one
    the answer cannot hold at eps 1 (before: digits' 1,000 items at 50 kB, all in every answer):
    the plan, a public function of (eps, N, budget, published levels and widths), says so without
    running a job."""
    from pm_vector.bench import demo
    from pm_vector.manifold.public_cells import LOCATION_LEVELS
    from pm_vector.privacy.location import plan

    for name, dim in (("digits", 64), ("fashion-mnist", 784)):
        n = demo.DEMO_SIZES[name][0]
        widths = [w for w in (16, 32, 64, 96, 128, 160, 192, 256) if w <= dim]  # the job's default widths
        budget = getattr(demo, "DEMO_MAX_BYTES", {}).get(name)
        assert plan(1.0, n_items=n, levels=LOCATION_LEVELS, widths=widths, max_bytes=budget).candidates < n, name
