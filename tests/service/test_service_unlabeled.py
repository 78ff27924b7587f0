"""Collections without labels: public partitions take the place of classes (pm_vector.db.store.partitioned).

An unlabeled digits collection (the labels dropped) with partitions=10: the anchor fits the
partitions, ingest labels every item by its nearest partition, the embedding job runs unchanged, and
a private query through the real service (cells and Gaussian, label=None) returns k items whose
labels are their nearest partitions; the refused cases get clear errors and write nothing; the CLI
ingests without labels."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from typer.testing import CliRunner

from pm_vector.client.http import Client
from pm_vector.errors import InvalidInputError


def _nearest(centroids, X):
    """The nearest centroid of every unit-norm row, computed here from scratch."""
    U = np.asarray(X, dtype=np.float64)
    U = U / np.linalg.norm(U, axis=1, keepdims=True)
    d = ((U[:, None, :] - np.asarray(centroids)[None, :, :]) ** 2).sum(-1)
    return d.argmin(1)


@pytest.fixture(scope="module")
def unlabeled(pm_home, svc_split):
    from pm_vector import db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    name = "unl_" + uuid.uuid4().hex[:8]
    Xs, _ = svc_split.server
    Xa, _ = svc_split.anchor
    Xd, _ = svc_split.dummy
    info = db.create_collection(name, Xs.shape[1], None, partitions=10, allow_raw_features=True)
    assert info["labels"] == list(range(10))
    with pytest.raises(InvalidInputError, match="register its public anchor"):
        db.ingest(name, Xs, None)  # before the anchor: no partitions yet
    with pytest.raises(InvalidInputError, match="role='anchor'"):
        db.register_anchor_set(name, Xd, None, role="dummy")  # a dummy set cannot fit the partitions
    assert db.collection_info(name)["n_items"] == 0
    db.register_anchor_set(name, Xa, None, role="anchor")
    # a small dummy pool leaves partitions without a public dummy: the client takes their anchor rows
    db.register_anchor_set(name, Xd[:3], None, role="dummy")
    assert np.unique(db.get_anchor_set(name, "dummy").labels).size < 10
    ing = db.ingest(name, Xs, None)
    db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    yield name, ing
    db.drop_collection(name, missing_ok=True)


def test_rows_are_labelled_by_their_nearest_partition(unlabeled, svc_split):
    from pm_vector import db

    name, ing = unlabeled
    cen = db.collection_info(name)["settings"]["partitions"]["public"]["centroids"]
    assert np.asarray(cen).shape == (10, svc_split.dataset.dim)
    Xs, _ = svc_split.server
    got = db.fetch_items(name, ing["item_ids"])["labels"]
    assert list(got) == list(_nearest(cen, Xs))
    assert len(set(got)) >= 5  # the partitions split the items (not one class)
    a = db.get_anchor_set(name, "anchor")
    assert list(a.labels) == list(_nearest(cen, svc_split.anchor[0]))
    assert list(db.get_anchor_set(name, "dummy").labels) == list(_nearest(cen, svc_split.dummy[0][:3]))
    # a later anchor set keeps the stored partitions
    db.register_anchor_set(name, svc_split.query[0], None, role="anchor")
    assert db.collection_info(name)["settings"]["partitions"]["public"]["centroids"] == cen
    assert list(db.get_anchor_set(name, "anchor").labels) == list(_nearest(cen, svc_split.query[0]))
    db.register_anchor_set(name, svc_split.anchor[0], None, role="anchor")  # back to the original anchor


def test_refused_labels_and_missing_labels(unlabeled, svc_collection, svc_split):
    from pm_vector import db

    name, _ = unlabeled
    Xs, ys = svc_split.server
    n = db.collection_info(name)["n_items"]
    with pytest.raises(InvalidInputError, match="has no labels"):
        db.ingest(name, Xs[:5], ys[:5])
    with pytest.raises(InvalidInputError, match="has no labels"):
        db.register_anchor_set(name, Xs[:5], ys[:5], role="dummy")
    assert db.collection_info(name)["n_items"] == n
    m = db.collection_info(svc_collection)["n_items"]
    with pytest.raises(InvalidInputError, match="partitions="):
        db.ingest(svc_collection, Xs[:5], None)
    with pytest.raises(InvalidInputError, match="partitions="):
        db.register_anchor_set(svc_collection, Xs[:5], None)
    assert db.collection_info(svc_collection)["n_items"] == m
    with pytest.raises(InvalidInputError, match="not both"):
        db.create_collection("unl_both", 64, [0, 1], partitions=4)
    with pytest.raises(InvalidInputError, match="partitions must be"):
        db.create_collection("unl_bad", 64, None, partitions=1)
    with pytest.raises(InvalidInputError, match="by partitions="):
        db.create_collection("unl_bad", 64, [0, 1], settings={"partitions": {"n_partitions": 2}})


@pytest.mark.parametrize("release", ["cells", "gaussian"])
def test_private_query_without_labels(service, unlabeled, svc_key, svc_split, tmp_path, release):
    from pm_vector import db
    from pm_vector.client.budget import PrivacyBudget

    name, _ = unlabeled
    cen = db.collection_info(name)["settings"]["partitions"]["public"]["centroids"]
    Xq, _ = svc_split.query
    with Client(service.url, svc_key["key"], budget=PrivacyBudget(tmp_path / "l.json", default_epsilon=100.0)) as c:
        assert np.array_equal(c.anchor_document(name)["partitions"]["centroids"], cen)
        for i in range(3):
            r = c.query(name, Xq[i], None, epsilon=4, k=8, shortlist=32, release=release)
            assert r["release"] == release and len(r["item_ids"]) == 8
            items = db.fetch_items(name, r["item_ids"], include_features=True)  # a compact answer: ids only
            assert list(items["labels"]) == list(_nearest(cen, items["features"]))
        if release == "gaussian":
            # the row of a query without a label is its nearest partition (no classifier)
            _, secret = c.build_request(name, Xq[0], None, epsilon=4, release="gaussian")
            assert secret.label == int(_nearest(cen, Xq[:1])[0]) and secret.predicted
            assert type(c._label_classifier(name)).__name__ == "PublicPartitions"


def test_cli_ingest_without_labels(pm_home, svc_split, tmp_path):
    from pm_vector import db
    from pm_vector.cli import app
    from pm_vector.cli.service import register

    register(app)
    runner = CliRunner()
    name = "unl_cli_" + uuid.uuid4().hex[:6]
    np.save(tmp_path / "A.npy", svc_split.anchor[0])
    np.save(tmp_path / "X.npy", svc_split.server[0][:60])
    np.save(tmp_path / "y.npy", svc_split.server[1][:60])
    try:
        r = runner.invoke(app, ["ingest", name, "--features", str(tmp_path / "X.npy"), "--create",
                                "--partitions", "6", "--json"])
        assert r.exit_code == 2 and "register its public anchor" in r.output
        r = runner.invoke(app, ["ingest", name, "--features", str(tmp_path / "A.npy"), "--role", "anchor",
                                "--create", "--partitions", "6", "--json"])
        assert r.exit_code == 0, r.output
        assert db.collection_info(name)["labels"] == list(range(6))
        r = runner.invoke(app, ["ingest", name, "--features", str(tmp_path / "X.npy"), "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["n_rows"] == 60
        r = runner.invoke(app, ["ingest", name, "--features", str(tmp_path / "X.npy"), "--labels",
                                str(tmp_path / "y.npy")])
        assert r.exit_code == 2 and "has no labels" in r.output
        r = runner.invoke(app, ["ingest", name, "--features", str(tmp_path / "X.npy"), "--partitions", "4"])
        assert r.exit_code == 2 and "--partitions goes with --create" in r.output
        assert db.collection_info(name)["n_items"] == 60
    finally:
        db.drop_collection(name, missing_ok=True)
