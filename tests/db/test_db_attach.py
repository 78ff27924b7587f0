"""A user's own table as the collection (migration 0015): attach_table reads the vectors from the table
(no copy in pm_vector's schema), skips and reports invalid rows; the triggers queue inserts, updates
and deletes; sync applies them in order, exactly once, and the answers follow; the SQLAlchemy face."""

from __future__ import annotations

import numpy as np
import pytest


def _vec(v):
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


@pytest.fixture
def user_table(db, conn):
    import uuid

    t = "docs_" + uuid.uuid4().hex[:8]
    rng = np.random.default_rng(5)
    y = rng.integers(0, 3, 400)
    X = rng.normal(size=(400, 6)) + 2.0 * np.eye(6)[y]
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    conn.execute(f"CREATE TABLE public.{t} (id bigint PRIMARY KEY, embedding vector, category int, title text)")
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s, %s)",
                        [(i + 1, _vec(X[i]), int(y[i]), f"doc {i + 1}") for i in range(400)])
    conn.execute(f"INSERT INTO public.{t} VALUES (1001, NULL, 1, 'no vector')")
    conn.execute(f"INSERT INTO public.{t} VALUES (1002, '[1,2,3]', 1, 'three dims')")
    yield t, X, y
    conn.execute(f"DROP TABLE IF EXISTS public.{t}")


def _served(db, name, X, y, delta=False):
    """Anchor sets and one job. ``delta`` False: the sync rewrites the run's rows in its batch (what these
    tests check; tests/db/test_db_delta.py: the delta's tombstones and entries)."""
    from dbtest_helpers import make_embed_fn

    if not delta:
        with db.connect() as c:
            c.execute("UPDATE pm_vector.collections SET settings = settings || '{\"delta\": false}'::jsonb "
                      "WHERE name = %s", [name])
            c.commit()
    db.register_anchor_set(name, X[:90], y[:90])
    db.register_anchor_set(name, X[90:120], y[90:120], role="dummy")
    return db.run_embedding_job(name, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]


def _ids_of(conn, name):
    return {r[0]: r[1] for r in conn.execute(
        "SELECT i.external_id, i.id FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
        "WHERE c.name = %s", [name]).fetchall()}


@pytest.mark.slow
def test_attach_reads_the_table_and_sync_applies_its_changes_once(db, cname, conn, user_table):
    from dbtest_helpers import make_extend_fn

    from pm_vector.db.resolve.resolution import resolve
    from test_db_erase import _row_requests

    t, X, y = user_table
    out = db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding",
                          label_column="category", payload_columns=["title"], dim=6)
    assert out["items"] == 400 and out["skipped"] == 2 and out["labels"] == [0, 1, 2]
    # no copy of the features in pm_vector's schema
    assert conn.execute("SELECT count(*) FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = "
                        "i.collection_id WHERE c.name = %s AND num_nonnulls(i.features, i.features_half) > 0",
                        [cname]).fetchone()[0] == 0
    rid = _served(db, cname, X, y)
    reqs = _row_requests(cname, X, y, n=3)
    assert all(len(r["item_ids"]) for q in reqs for r in resolve(cname, q, log=False)["rows"])
    got = db.fetch_items(cname, [_ids_of(conn, cname)["5"]])
    assert got["payloads"] == [{"title": "doc 5"}]
    # changes: an insert, a vector update, a payload-only update, a delete, a row that loses its vector,
    # a row of the wrong dimension -- queued by the triggers
    conn.execute(f"INSERT INTO public.{t} VALUES (2001, %s::vector, 2, 'new')", [_vec(X[10])])
    conn.execute(f"UPDATE public.{t} SET embedding = %s::vector WHERE id = 7", [_vec(X[20])])
    conn.execute(f"UPDATE public.{t} SET title = 'renamed' WHERE id = 8")
    conn.execute(f"DELETE FROM public.{t} WHERE id = 9")
    conn.execute(f"UPDATE public.{t} SET embedding = NULL WHERE id = 11")
    conn.execute(f"INSERT INTO public.{t} VALUES (2002, '[1,2]', 0, 'short')")
    before = _ids_of(conn, cname)
    res = db.sync(cname, embed_fn_extend=make_extend_fn())
    assert res["applied"] == 6 and res["inserted"] == 1 and res["replaced"] == 1 and res["payloads"] == 1
    assert sorted(k for k, _ in res["rejected"]) == ["11", "2002"]
    after = _ids_of(conn, cname)
    assert "9" not in after and "11" not in after and "2002" not in after and "2001" in after
    assert after["7"] != before["7"] and after["8"] == before["8"]
    gone = {before["9"], before["11"], before["7"]}
    items = {r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{rid}_items").fetchall()}
    assert not gone & items and after["2001"] in items and after["7"] in items
    assert db.fetch_items(cname, [after["8"]])["payloads"] == [{"title": "renamed"}]
    for q in reqs:
        assert not gone & {i for r in resolve(cname, q, log=False)["rows"] for i in r["item_ids"]}
    assert db.sync(cname)["applied"] == 0  # exactly once: the queue is empty
    with pytest.raises(Exception, match="attached to table"):  # the table is the truth: change it there
        db.delete_items(cname, external_ids=["8"])
    db.drop_collection(cname)  # its triggers go with it: the table's writes queue nothing more
    conn.execute(f"INSERT INTO public.{t} VALUES (3001, %s::vector, 2, 'after')", [_vec(X[1])])
    assert conn.execute("SELECT count(*) FROM pm_vector.attach_changes").fetchone()[0] == 0


def test_the_sqlalchemy_face_and_sql(db, cname, conn, user_table):
    from sqlalchemy import BigInteger, Integer, Text
    from sqlalchemy.orm import DeclarativeBase, mapped_column
    from pgvector.sqlalchemy import VECTOR

    t, X, y = user_table

    class Base(DeclarativeBase):
        pass

    class Document(Base):
        __tablename__ = t
        __table_args__ = {"schema": "public"}
        id = mapped_column(BigInteger, primary_key=True)
        embedding = mapped_column(VECTOR())
        category = mapped_column(Integer)
        title = mapped_column(Text)

    out = db.attach_table(cname, column=Document.embedding, label=Document.category, payload=[Document.title], dim=6)
    assert out["items"] == 400
    with pytest.raises(Exception, match="no dimension"):
        conn.execute("SELECT pm_vector.pm_attach_table('x_nodim', %s::regclass, 'id', 'embedding')", [f"public.{t}"])
