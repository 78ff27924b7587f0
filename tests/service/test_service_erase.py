"""Deleting items over HTTP (admin keys only) and with ``pm-vector items delete``: unknown ids are a
404 that deletes nothing; a deleted item is in no answer afterwards."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from typer.testing import CliRunner


@pytest.fixture
def small(pm_home, svc_split):
    from pm_vector import db
    from pm_vector.bench.demo import prepare_collection
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    name = "erase_" + uuid.uuid4().hex[:8]
    prepare_collection(name, svc_split)
    db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    yield name
    db.drop_collection(name, missing_ok=True)


def _post(service, key, path, body):
    return httpx.post(service.url + path, content=json.dumps(body).encode(), timeout=120,
                      headers={"Authorization": f"Bearer {key['key']}", "Content-Type": "application/json"})


def test_delete_route_is_admin_only_refuses_unknown_ids_and_erases(service, small, svc_key, svc_admin_key,
                                                                   svc_split):
    from pm_vector import db

    path = f"/collections/{small}/items/delete"
    n0 = db.collection_info(small)["n_items"]
    assert _post(service, svc_key, path, {"external_ids": ["digits-0"]}).status_code == 403
    ext = [f"digits-{int(i)}" for i in svc_split.server_idx[:3]]
    r = _post(service, svc_admin_key, path, {"external_ids": ext + ["nope"]})
    assert r.status_code == 404 and "nothing was deleted" in r.json()["message"]
    r = _post(service, svc_admin_key, path, {"ids": [1], "external_ids": ext})
    assert r.status_code == 422
    assert db.collection_info(small)["n_items"] == n0
    r = _post(service, svc_admin_key, path, {"external_ids": ext})
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] == 3 and db.collection_info(small)["n_items"] == n0 - 3


def test_cli_items_delete(small, tmp_path):
    from pm_vector.cli import app

    runner = CliRunner()
    f = tmp_path / "ids.txt"
    f.write_text("x1\n")
    r = runner.invoke(app, ["items", "delete", small, "--ids", str(f)])
    assert r.exit_code == 2 and "not item ids" in " ".join(r.output.split())  # wrapped where the path ends
    from pm_vector.db import connect

    with connect() as c:
        own = [r[0] for r in c.execute("SELECT i.id FROM pm_vector.items i JOIN pm_vector.collections co ON "
                                       "co.id = i.collection_id WHERE co.name = %s ORDER BY i.id LIMIT 2",
                                       [small]).fetchall()]
    f.write_text("\n".join(map(str, own)) + "\n")
    r = runner.invoke(app, ["items", "delete", small, "--ids", str(f), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["deleted"] == 2
    r = runner.invoke(app, ["items", "delete", small, "--ids", str(f)])
    assert r.exit_code == 2 and "nothing was deleted" in r.output and "Traceback" not in r.output


def test_cli_items_update(small, tmp_path):
    from pm_vector import db
    from pm_vector.cli import app
    from pm_vector.db import connect

    runner = CliRunner()
    with connect() as c:
        iid, ext = c.execute("SELECT i.id, i.external_id FROM pm_vector.items i JOIN pm_vector.collections co ON "
                             "co.id = i.collection_id WHERE co.name = %s ORDER BY i.id LIMIT 1", [small]).fetchone()
    r = runner.invoke(app, ["items", "update", small, "--external-id", ext, "--payload", "{bad"])
    assert r.exit_code == 2 and "not JSON" in r.output
    r = runner.invoke(app, ["items", "update", small, "--external-id", ext, "--payload", '{"t": 1}', "--json"])
    assert r.exit_code == 0, r.output
    assert db.fetch_items(small, [iid])["payloads"] == [{"t": 1}]
