"""Collections, ingest, anchor sets, item fetch and request log against the embedded PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest
from dbtest_helpers import data

from pm_vector.errors import InvalidInputError, PMVectorError


def _count_items(conn, name):
    return conn.execute("SELECT count(*) FROM pm_vector.items i JOIN pm_vector.collections c "
                        "ON c.id = i.collection_id WHERE c.name = %s", [name]).fetchone()[0]


def test_create_info_list_drop(db, cname):
    info = db.create_collection(cname, 8, [2, 0, 1], metric="cosine", allow_raw_features=True, description="x")
    assert info["name"] == cname and info["feature_dim"] == 8 and info["feature_type"] == "vector"
    assert info["labels"] == [0, 1, 2] and info["metric"] == "cosine" and info["allow_raw_features"] is True
    assert info["n_items"] == 0 and info["active_run_id"] is None
    assert info["settings"]["description"] == "x" and info["settings"]["keep_previous_runs"] == 1
    assert cname in [c["name"] for c in db.list_collections()]
    with pytest.raises(db.CollectionExistsError, match="already exists"):
        db.create_collection(cname, 8, [0])
    out = db.drop_collection(cname)
    assert out["dropped"] is True
    with pytest.raises(db.CollectionNotFoundError, match="unknown collection"):
        db.collection_info(cname)
    assert db.drop_collection(cname, missing_ok=True)["dropped"] is False
    with pytest.raises(db.CollectionNotFoundError):
        db.drop_collection(cname)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="bad name", dim=4, labels=[0]), "invalid collection name"),
    (dict(name="tr\n", dim=4, labels=[0]), "invalid collection name"),  # re.match with $ accepted it
    (dict(name="ok", dim=0, labels=[0]), "dim must be"),
    (dict(name="ok", dim=16001, labels=[0]), "dim must be"),
    (dict(name="ok", dim=4, labels=[]), "at least one"),
    (dict(name="ok", dim=4, labels=[1, 1]), "repeat"),
    (dict(name="ok", dim=4, labels=[0.5]), "integer"),
    (dict(name="ok", dim=4, labels=[0], metric="hamming"), "metric"),
    (dict(name="ok", dim=4, labels=[0], hnsw_m=16, hnsw_ef_construction=20), "2 \\* hnsw_m"),
])
def test_create_collection_bad_input(db, kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        db.create_collection(**kwargs)
    assert "ok" not in [c["name"] for c in db.list_collections()]


def test_ingest_roundtrip_and_fetch(db, cname, conn):
    db.create_collection(cname, 5, [0, 1, 2], allow_raw_features=True)
    X, y = data(250, 5)
    seen = []
    out = db.ingest(cname, X, y, external_ids=[f"doc-{i}" for i in range(250)],
                    payloads=[{"i": i} if i % 2 else None for i in range(250)], batch_size=100,
                    progress=lambda d, n: seen.append((d, n)))
    assert seen == [(100, 250), (200, 250), (250, 250)]
    assert out["n_rows"] == 250 and out["item_ids"].shape == (250,)
    assert len(set(out["item_ids"].tolist())) == 250
    assert db.collection_info(cname)["n_items"] == 250
    got = db.fetch_items(cname, out["item_ids"][[7, 3]], include_features=True)
    assert got["external_ids"] == ["doc-7", "doc-3"]
    assert got["payloads"] == [{"i": 7}, {"i": 3}]
    assert got["labels"].tolist() == [y[7], y[3]]
    np.testing.assert_array_equal(got["features"], X[[7, 3]])
    st = conn.execute("SELECT status, n_rows, n_written FROM pm_vector.ingests WHERE id = %s",
                      [out["ingest_id"]]).fetchone()
    assert st == ("succeeded", 250, 250)
    with pytest.raises(InvalidInputError, match="not in collection"):
        db.fetch_items(cname, [10**12])


def test_raw_features_need_permission(db, cname):
    db.create_collection(cname, 3, [0])
    out = db.ingest(cname, np.ones((2, 3)), [0, 0])
    assert db.fetch_items(cname, out["item_ids"])["labels"].tolist() == [0, 0]
    with pytest.raises(db.RawFeaturesNotAllowedError, match="allow_raw_features"):
        db.fetch_items(cname, out["item_ids"], include_features=True)


def test_ingest_bad_input_writes_nothing(db, cname, conn):
    db.create_collection(cname, 4, [0, 1])
    X, y = data(20, 4, n_labels=2)
    db.ingest(cname, X, y, external_ids=[f"e{i}" for i in range(20)])
    n_ingests = conn.execute("SELECT count(*) FROM pm_vector.ingests").fetchone()[0]

    with pytest.raises(db.CollectionNotFoundError, match="unknown collection"):
        db.ingest(cname + "_nope", X, y)
    with pytest.raises(db.DimensionMismatchError, match="has 4"):
        db.ingest(cname, np.ones((3, 5)), [0, 0, 0])
    Xn = X.copy()
    Xn[3, 1] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        db.ingest(cname, Xn, y)
    with pytest.raises(InvalidInputError, match="2-d"):
        db.ingest(cname, X[0], [0])
    with pytest.raises(db.UnknownLabelError, match="not in the label set"):
        db.ingest(cname, X[:2], [0, 7])
    with pytest.raises(InvalidInputError, match="one label per row"):
        db.ingest(cname, X[:2], [0])
    with pytest.raises(db.DuplicateExternalIdError, match="occurs twice"):
        db.ingest(cname, X[:2], [0, 1], external_ids=["a", "a"])
    with pytest.raises(db.DuplicateExternalIdError, match="already exist"):
        db.ingest(cname, X[:2], [0, 1], external_ids=["new", "e5"])
    with pytest.raises(InvalidInputError, match="JSON"):
        db.ingest(cname, X[:2], [0, 1], payloads=[{"a": object()}, None])
    with pytest.raises(InvalidInputError, match="entries for 2 rows"):
        db.ingest(cname, X[:2], [0, 1], external_ids=["x"])
    # errors are pm_vector errors and ValueErrors
    with pytest.raises(ValueError):
        db.ingest(cname, X[:2], [0, 9])
    assert _count_items(conn, cname) == 20
    assert conn.execute("SELECT count(*) FROM pm_vector.ingests").fetchone()[0] == n_ingests


def test_ingest_failing_midway_is_undone(db, cname, conn):
    """A failure after some batches were written leaves nothing: one transaction, invisible until it commits."""
    db.create_collection(cname, 4, [0, 1])
    X, y = data(300, 4, n_labels=2)
    seen = []

    class Boom(Exception):
        pass

    def progress(done, total):
        seen.append((done, _count_items(conn, cname), db.collection_info(cname)["n_items"]))
        if done >= 200:
            raise Boom("stop here")

    with pytest.raises(Boom):
        db.ingest(cname, X, y, batch_size=100, progress=progress)
    assert seen == [(100, 0, 0), (200, 0, 0)]  # two batches written, none visible to another session
    assert _count_items(conn, cname) == 0
    st, err = conn.execute("SELECT status, error FROM pm_vector.ingests i JOIN pm_vector.collections c "
                           "ON c.id = i.collection_id WHERE c.name = %s", [cname]).fetchone()
    assert st == "failed" and "Boom" in err and "stop here" not in err  # the class only: no input values


def test_database_constraints_back_up_the_api(db, cname, conn):
    """Rows written by plain SQL get the same checks (statement-level triggers, unique ids)."""
    import psycopg

    db.create_collection(cname, 3, [0, 1])
    db.ingest(cname, np.ones((1, 3)), [0], external_ids=["a"])
    cid = db.collection_info(cname)["id"]
    with pytest.raises(psycopg.Error, match="has 4 features, but the collection has 3") as ei:
        conn.execute("INSERT INTO pm_vector.items (collection_id, label, features) VALUES (%s, 0, '[1,2,3,4]')",
                     [cid])
    assert ei.value.sqlstate == "PM010"
    with pytest.raises(psycopg.Error, match="label 5 is not in the label set") as ei:
        conn.execute("INSERT INTO pm_vector.items (collection_id, label, features) VALUES (%s, 5, '[1,2,3]')",
                     [cid])
    assert ei.value.sqlstate == "PM011"
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("INSERT INTO pm_vector.items (collection_id, external_id, label, features) "
                     "VALUES (%s, 'a', 0, '[1,2,3]')", [cid])
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO pm_vector.items (collection_id, label) VALUES (%s, 0)", [cid])
    with pytest.raises(psycopg.Error, match="NaN not allowed"):
        conn.execute("INSERT INTO pm_vector.items (collection_id, label, features) VALUES (%s, 0, '[1,NaN,3]')",
                     [cid])
    assert _count_items(conn, cname) == 1


def test_high_dimensional_collection_uses_halfvec(db, cname, conn):
    d = 2100
    info = db.create_collection(cname, d, [0, 1], allow_raw_features=True)
    assert info["feature_type"] == "halfvec"
    X, y = data(6, d, n_labels=2)
    out = db.ingest(cname, X, y)
    row = conn.execute("SELECT features IS NULL, vector_dims(features_half), pg_typeof(features_half)::text "
                       "FROM pm_vector.items WHERE id = %s", [int(out["item_ids"][0])]).fetchone()
    assert row == (True, d, "halfvec")
    got = db.fetch_items(cname, out["item_ids"], include_features=True)["features"]
    np.testing.assert_allclose(got, X, rtol=1e-3, atol=1e-3)  # half precision
    with pytest.raises(InvalidInputError, match="half precision"):
        db.ingest(cname, np.full((1, d), 1e6), [0])


def test_anchor_sets(db, cname):
    db.create_collection(cname, 4, [0, 1, 2])
    with pytest.raises(db.NoAnchorSetError, match="register_anchor_set"):
        db.get_anchor_set(cname)
    A, ya = data(30, 4, seed=1)
    r1 = db.register_anchor_set(cname, A, ya, description="public v1")
    D, yd = data(50, 4, seed=2)
    db.register_anchor_set(cname, D, yd, role="dummy")
    a = db.get_anchor_set(cname)
    assert a.anchor_set_id == r1["anchor_set_id"] and a.role == "anchor" and len(a) == 30
    np.testing.assert_array_equal(a.features, A)  # stable order: anchor i is row i
    np.testing.assert_array_equal(a.labels, ya)
    np.testing.assert_array_equal(a.positions, np.arange(30))
    d = db.get_anchor_set(cname, "dummy")
    np.testing.assert_array_equal(d.features, D)
    # a new registration becomes current; the old one stays retrievable by id
    r2 = db.register_anchor_set(cname, A[:10], ya[:10])
    assert db.get_anchor_set(cname).anchor_set_id == r2["anchor_set_id"]
    assert len(db.get_anchor_set(cname, anchor_set_id=r1["anchor_set_id"])) == 30
    info = db.collection_info(cname)
    assert info["anchor_set_id"] == r2["anchor_set_id"] and info["n_anchors"] == 10 and info["n_dummies"] == 50
    with pytest.raises(InvalidInputError, match="role"):
        db.register_anchor_set(cname, A, ya, role="query")
    with pytest.raises(db.DimensionMismatchError):
        db.register_anchor_set(cname, np.ones((3, 5)), [0, 0, 0])
    with pytest.raises(db.UnknownLabelError):
        db.register_anchor_set(cname, A[:2], [0, 5])
    with pytest.raises(db.CollectionNotFoundError):
        db.register_anchor_set(cname + "x", A, ya)
    assert db.get_anchor_set(cname).anchor_set_id == r2["anchor_set_id"]


def test_request_log(db, cname):
    import datetime as dt

    db.create_collection(cname, 2, [0])
    t0 = dt.datetime.now(dt.timezone.utc)
    rid = db.log_request(cname, {"rows": [[0.1, 0.2]], "labels": [0], "k": 5}, row_count=5, run_id=None,
                         received_at=t0, finished_at=t0 + dt.timedelta(milliseconds=12))
    logs = db.list_requests(cname)
    assert logs[0]["id"] == rid and logs[0]["row_count"] == 5 and logs[0]["request"]["k"] == 5
    assert abs(logs[0]["duration_ms"] - 12.0) < 1e-6
    with pytest.raises(InvalidInputError):
        db.log_request(cname, {"x": float("nan")})
    db.drop_collection(cname)
    assert [r for r in db.list_requests(cname) if r["id"] == rid][0]["collection_id"] is None


def test_errors_are_pm_vector_errors(db):
    for cls in (db.CollectionNotFoundError, db.NoActiveRunError, db.DimensionMismatchError,
                db.DuplicateExternalIdError, db.PgvectorMissingError, db.SchemaNotReadyError):
        assert issubclass(cls, PMVectorError)


def test_ingest_with_create_is_one_transaction(db, cname, conn):
    """create= makes the collection in the ingest's transaction: a failed first ingest leaves none."""
    from pm_vector.db.errors import CollectionExistsError

    X, y = data(50, 4, n_labels=3)
    bad = X.copy()
    bad[7, 1] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        db.ingest(cname, bad, y, create={})
    with pytest.raises(InvalidInputError, match="metric"):
        db.ingest(cname, X, y, create={"metric": "hamming"})

    def boom(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        db.ingest(cname, X, y, create={}, batch_size=10, progress=boom)
    assert cname not in {c["name"] for c in db.list_collections()}
    out = db.ingest(cname, X, y, create={"allow_raw_features": True}, batch_size=20)
    info = db.collection_info(cname)
    assert info["n_items"] == 50 and info["labels"] == sorted(set(y.tolist())) and info["allow_raw_features"]
    assert out["item_ids"].shape == (50,)
    with pytest.raises(CollectionExistsError, match="already exists"):
        db.ingest(cname, X, y, create={})
    assert db.collection_info(cname)["n_items"] == 50
