"""Payloads without a follow-up: every candidate of every row of a resolve answer carries its
payload, so the client's query returns its k results' payloads and sends nothing after the
answer; ``pm-vector ingest --payloads FILE.jsonl`` and ``pm-vector db payload-limit``."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from typer.testing import CliRunner

from pm_vector.cli import app
from pm_vector.cli.service import register
from pm_vector.client.budget import PrivacyBudget
from pm_vector.client.http import Client

register(app)
runner = CliRunner()


def _payload(i: int) -> dict:
    return {"title": f"doc {i}", "n": i, "tags": ["é", i % 3]}


@pytest.fixture(scope="module")
def pay_collection(pm_home, svc_split):
    """A digits collection (no raw features: the default, compact answer) whose items carry payloads;
    returns (name, {item_id: payload})."""
    from pm_vector import db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    name = "pay_" + uuid.uuid4().hex[:8]
    ds = svc_split.dataset
    db.create_collection(name, ds.dim, [int(c) for c in ds.classes], max_payload_bytes=64)
    Xs, ys = svc_split.server
    ids = db.ingest(name, Xs, ys, payloads=[_payload(i) for i in range(len(ys))])["item_ids"]
    db.register_anchor_set(name, *svc_split.anchor, role="anchor")
    db.register_anchor_set(name, *svc_split.dummy, role="dummy")
    db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    yield name, {int(item): _payload(i) for i, item in enumerate(ids)}
    db.drop_collection(name, missing_ok=True)


def _ledger(tmp_path):
    return PrivacyBudget(tmp_path / "ledger.json", default_epsilon=1000.0)


def test_resolve_returns_every_candidates_payload_for_every_row(service, svc_key, svc_split, pay_collection,
                                                                 tmp_path):
    name, expected = pay_collection
    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as c:
        req, _ = c.build_request(name, Xq[0], int(yq[0]), epsilon=4.0, shortlist=16)
        res = c.resolve(name, req, k=8)
    assert len(res["rows"]) == 10
    for row in res["rows"]:
        ids = np.asarray(row["item_ids"]).tolist()
        assert len(ids) == 16 and len(row["payloads"]) == 16
        assert row["payloads"] == [expected[int(i)] for i in ids]


def test_query_returns_its_k_payloads_without_a_later_request(service, svc_key, svc_split, pay_collection,
                                                              tmp_path):
    name, expected = pay_collection
    Xq, yq = svc_split.query
    with Client(service.url, svc_key["key"], budget=_ledger(tmp_path)) as c:
        c.private_knn(name, epsilon=4.0)  # the public anchor first
        for i in range(3):
            sent: list = []
            c._http.event_hooks["request"] = [lambda r: sent.append(r.url.path)]
            r = c.query(name, Xq[i], int(yq[i]), epsilon=4.0, k=8, shortlist=32)
            assert sent and sent[-1].endswith("/resolve")  # the answer is the last exchange
            assert not any(p.endswith("/items") for p in sent)
            assert len(r["item_ids"]) == 8 and len(r["payloads"]) == 8
            assert r["payloads"] == [expected[int(j)] for j in np.asarray(r["item_ids"]).tolist()]


# ----------------------------------------------------------------------------- the CLI

def _run(*args, ok=True):
    r = runner.invoke(app, list(args))
    if ok:
        assert r.exit_code == 0, (r.output, r.exception)
    return r


def _count(name):
    from pm_vector import db

    return db.collection_info(name)["n_items"]


def test_cli_ingest_payloads(pm_home, svc_split, tmp_path):
    from pm_vector import db

    X, y = svc_split.server
    np.save(tmp_path / "X.npy", X[:5])
    np.save(tmp_path / "y.npy", y[:5])
    good = [_payload(i) for i in range(4)] + [None]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(v) for v in good) + "\n", encoding="utf-8")
    name = "cli_pay_" + uuid.uuid4().hex[:6]
    base = ["ingest", name, "--features", str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy")]
    try:
        out = json.loads(_run(*base, "--payloads", str(tmp_path / "p.jsonl"), "--create", "--max-payload-bytes",
                              "48", "--json").stdout)
        assert out["n_rows"] == 5
        assert db.collection_info(name)["settings"]["max_payload_bytes"] == 48
        with db.connect() as conn:
            got = conn.execute("SELECT payload FROM pm_vector.items i JOIN pm_vector.collections c ON "
                               "c.id = i.collection_id WHERE c.name = %s ORDER BY i.id", [name]).fetchall()
        assert [g[0] for g in got] == good

        def refused(text, *match, extra=()):
            (tmp_path / "bad.jsonl").write_text(text, encoding="utf-8")
            r = _run(*base, "--payloads", str(tmp_path / "bad.jsonl"), *extra, ok=False)
            out = " ".join(r.output.split())
            assert r.exit_code == 2 and all(m in out for m in match), r.output
            assert _count(name) == 5  # nothing of a refused ingest is written

        refused('{"a": 1}\n{"a": \n1\n2\n3\n', "line 2", "not one JSON value")
        refused('1\n\n2\n3\n4\n', "line 2", "blank")
        refused('1\nNaN\n2\n3\n4\n', "line 2")
        refused('1\n2\n3\n', "3 line(s) for 5")
        refused('1\n2\n3\n4\n"' + "x" * 47 + '"\n', "payloads[4]", "49 bytes", "max_payload_bytes of 48")
        r = _run("ingest", name, "--features", str(tmp_path / "X.npy"), "--labels", str(tmp_path / "y.npy"),
                 "--role", "anchor", "--payloads", str(tmp_path / "p.jsonl"), ok=False)
        assert r.exit_code == 2 and "--role items" in r.output
        r = _run(*base, "--max-payload-bytes", "10", ok=False)
        assert r.exit_code == 2 and "--create" in r.output
        # the admin raises the bound; then the 49-byte payload goes in
        out = json.loads(_run("db", "payload-limit", name, "49", "--json").stdout)
        assert out == {"collection": name, "max_payload_bytes": 49, "previous": 48}
        _run(*base, "--payloads", str(tmp_path / "bad.jsonl"))
        assert _count(name) == 10
        r = _run("db", "payload-limit", name, "20", ok=False)
        assert r.exit_code == 2 and "the bound stays 49" in " ".join(r.output.split())
        r = _run("db", "payload-limit", name, "70000", ok=False)
        assert r.exit_code == 2 and "max_payload_bytes must be" in " ".join(r.output.split())
    finally:
        db.drop_collection(name, missing_ok=True)
