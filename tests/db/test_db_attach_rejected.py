"""A bad row never blocks an attached table's queue (issue #35, findings 4, 5, 6): a change the sync
cannot apply -- a label that is not an integer, a vector the active run cannot place, a payload over
ingest's bounds -- is rejected with its reason (``pm_vector.attach_rejected``, migration 0021) and
the rest of the batch, the delete queued behind it included, is applied; correcting the row applies
it; the payload bounds hold at attach and at sync; a payload-only sync reaches the cached answers."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from test_db_attach import _ids_of, _vec

DEEP = json.dumps(json.loads("[" * 120 + "]" * 120))  # 120 levels of lists
HUGE = "[" + ",".join(["1e300"] * 10) + "]"  # jsonb keeps 1e300 as an integer of 301 digits
BIG = json.dumps({"t": "x" * 100_000})  # 100 KB


def _blobs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = rng.normal(size=(n, 6)) + 2.0 * np.eye(6)[y]
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32), y


@pytest.fixture
def text_table(db, conn):
    """A table whose label column is text (so that a writer can put 'abc' in it) and whose payload
    column is jsonb; 300 valid rows."""
    t = "rej_" + uuid.uuid4().hex[:8]
    X, y = _blobs(300, 3)
    conn.execute(f"CREATE TABLE public.{t} (id bigint PRIMARY KEY, embedding vector(6), category text, meta jsonb)")
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s, %s::jsonb)",
                        [(i + 1, _vec(X[i]), str(int(y[i])), json.dumps({"n": i + 1})) for i in range(300)])
    yield t, X, y
    conn.execute(f"DROP TABLE IF EXISTS public.{t}")


def _attach_and_serve(db, cname, t, X, y):
    """Attached, and a run built by the anchor frame (whose extension refuses a row with no anchor
    near it, as the CLI's sync places rows)."""
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    out = db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding",
                          label_column="category", payload_columns=["meta"], labels=[0, 1, 2])
    db.register_anchor_set(cname, X[:90], y[:90])
    db.register_anchor_set(cname, X[90:120], y[90:120], role="dummy")
    run = db.run_embedding_job(cname, {"n_components": 3}, 1, embed_fn=anchor_frame_embed_fn)["run_id"]
    return out, run


def _payload_of(conn, cname, key):
    row = conn.execute("SELECT i.payload FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
                       "WHERE c.name = %s AND i.external_id = %s", [cname, key]).fetchone()
    conn.rollback()
    return None if row is None else row[0]


def test_bad_rows_are_rejected_and_the_delete_behind_them_is_applied(db, cname, conn, text_table):
    """Finding 4: a label 'abc' (InvalidTextRepresentation) and a finite vector far from every anchor
    ("row 0 has no anchor ...") failed every batch, and the delete queued after them waited."""
    t, X, y = text_table
    _attach_and_serve(db, cname, t, X, y)
    rid = conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE name = %s", [cname]).fetchone()[0]
    conn.execute(f"INSERT INTO public.{t} VALUES (1001, %s::vector, 'abc', NULL)", [_vec(X[5])])
    conn.execute(f"INSERT INTO public.{t} VALUES (1002, %s::vector, '1', NULL)", [_vec(np.full(6, 1000.0))])
    conn.execute(f"INSERT INTO public.{t} VALUES (1003, %s::vector, '2', NULL)", [_vec(X[7])])  # a good one
    conn.execute(f"UPDATE public.{t} SET category = 'x1' WHERE id = 4")  # an item's row turns bad
    conn.execute(f"DELETE FROM public.{t} WHERE id = 9")
    before = _ids_of(conn, cname)
    out = db.sync(cname)
    assert out["applied"] == 5
    why = dict(out["rejected"])
    assert set(why) == {"1001", "1002", "4"}, out["rejected"]
    assert "'abc' is not an integer" in why["1001"] and "'x1' is not an integer" in why["4"]
    assert "cannot place its vector" in why["1002"] and "no anchor" in why["1002"]
    after = _ids_of(conn, cname)
    assert "9" not in after and "1003" in after  # the delete and the good insert, in the same sync
    assert not {"1001", "1002", "4"} & set(after)  # a rejected key has no item (the table is the truth)
    # the run's live items: its rows minus the delta's tombstones (pm_vector/db/runs/delta.py)
    in_run = {r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{rid}_items e WHERE NOT EXISTS (SELECT 1 "
                                         "FROM pm_vector.delta_tombstones z WHERE z.run_id = %s AND z.item_id = "
                                         "e.item_id)", [rid]).fetchall()}
    assert before["9"] not in in_run and before["4"] not in in_run and after["1003"] in in_run
    st = db.sync_status(cname)
    assert st["queued"] == 0 and st["rejected"] == 3
    listed = {r["key"]: r["reason"] for r in db.sync_rejected(cname)}
    assert listed == why
    # correcting the rows: their next change is applied, and they leave the rejected table
    conn.execute(f"UPDATE public.{t} SET category = '0' WHERE id IN (1001, 4)")
    conn.execute(f"UPDATE public.{t} SET embedding = %s::vector WHERE id = 1002", [_vec(X[11])])
    out = db.sync(cname)
    assert out["rejected"] == [] and out["applied"] == 3
    after = _ids_of(conn, cname)
    assert {"1001", "1002", "4"} <= set(after)
    assert db.sync_status(cname)["rejected"] == 0 and db.sync_rejected(cname) == []
    # a rejected key whose row is deleted leaves the table too
    conn.execute(f"UPDATE public.{t} SET category = 'abc' WHERE id = 10")
    assert [k for k, _ in db.sync(cname)["rejected"]] == ["10"]
    conn.execute(f"DELETE FROM public.{t} WHERE id = 10")
    assert db.sync(cname)["rejected"] == [] and db.sync_status(cname)["rejected"] == 0


def test_payloads_over_the_bounds_are_rejected_at_attach_and_at_sync(db, cname, conn, text_table):
    """Finding 5: through the table's payload columns, a 120-deep, a [1e300]*10 and a 100 KB payload
    were stored (ingest refuses all three)."""
    t, X, y = text_table
    conn.execute(f"UPDATE public.{t} SET meta = %s::jsonb WHERE id = 1", [DEEP])
    conn.execute(f"UPDATE public.{t} SET meta = %s::jsonb WHERE id = 2", [HUGE])
    conn.execute(f"UPDATE public.{t} SET meta = %s::jsonb WHERE id = 3", [BIG])
    out, _run = _attach_and_serve(db, cname, t, X, y)
    assert not {"1", "2", "3"} & set(_ids_of(conn, cname))  # not stored
    why = dict(out["rejected"])
    assert set(why) == {"1", "2", "3"} and out["items"] == 297
    assert "deeper than 16" in why["1"] and "beyond 64 bits" in why["2"] and "max_payload_bytes of 256" in why["3"]
    assert db.sync_status(cname)["rejected"] == 3
    # at sync: new rows and a payload-only change of a stored item
    for key, bad in ((2001, DEEP), (2002, HUGE), (2003, BIG)):
        conn.execute(f"INSERT INTO public.{t} VALUES (%s, %s::vector, '1', %s::jsonb)", [key, _vec(X[key - 1990]), bad])
    conn.execute(f"UPDATE public.{t} SET meta = %s::jsonb WHERE id = 5", [BIG])
    res = db.sync(cname)
    assert sorted(k for k, _ in res["rejected"]) == ["2001", "2002", "2003", "5"]
    assert not {"2001", "2002", "2003", "5"} & set(_ids_of(conn, cname))  # never stored, the old one not served
    biggest = conn.execute("SELECT max(octet_length(i.payload::text)) FROM pm_vector.items i JOIN pm_vector.collections "
                           "c ON c.id = i.collection_id WHERE c.name = %s", [cname]).fetchone()[0]
    assert biggest < 256
    # corrected: stored again
    conn.execute(f"UPDATE public.{t} SET meta = '{{\"n\": 5}}' WHERE id IN (1, 5)")
    assert db.sync(cname)["rejected"] == []
    assert _payload_of(conn, cname, "5") == {"meta": {"n": 5}} and _payload_of(conn, cname, "1") == {"meta": {"n": 5}}
    assert db.sync_status(cname)["rejected"] == 5  # 2, 3, 2001, 2002, 2003
    # the bound given at attach holds from the first row: no payload allowed, every row with one rejected
    other = "z_" + uuid.uuid4().hex[:8]
    try:
        out = db.attach_table(other, table=f"public.{t}", id_column="id", vector_column="embedding",
                              label_column="category", payload_columns=["meta"], labels=[0, 1, 2], max_payload_bytes=0)
        assert out["items"] == 0 and len(out["rejected"]) == 303
    finally:
        db.drop_collection(other, missing_ok=True)


def test_a_payload_only_sync_reaches_the_cached_location_answers(db, cname, conn, text_table):
    """Finding 6: a payload-only sync did not change the answer cache's key, and a service kept
    returning the old payloads."""
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.db.resolve.resolution import public_anchor, resolve
    from pm_vector.manifold.public_cells import PublicCells
    from pm_vector.privacy import secure_generator
    from pm_vector.protocol.published_codes import unpack

    t, X, y = text_table
    _attach_and_serve(db, cname, t, X, y)
    info = public_anchor(cname)[1]
    cells = PublicCells.from_dict(info["public_locations"])
    pc = unpack(info["product_codes"], info["class_rows"]["codes"]["digest"])
    client = PrivateLocationKNN(cells, 4.0, n_items=300, widths=pc.widths_, collection=cname, max_bytes=20_000)
    req = client._inject_generator(secure_generator(3)).request(X[20])
    ext = {v: k for k, v in _ids_of(conn, cname).items()}
    conn.rollback()
    with db.connect() as c:
        first = resolve(cname, req, conn=c, log=True)
        again = resolve(cname, req, conn=c, log=True)  # the process's cache (the one-round-trip path)
        assert again["cached"] and again["payloads"] == first["payloads"]
        assert [p["meta"]["n"] for p in first["payloads"]] == [int(ext[int(i)]) for i in first["item_ids"]]
        conn.execute(f"UPDATE public.{t} SET meta = jsonb_build_object('n', -id)")
        out = db.sync(cname)
        assert out["payloads"] == 300 and out["inserted"] == out["replaced"] == out["deleted"] == 0
        for log in (True, False):
            now = resolve(cname, req, conn=c if log else None, log=log)
            assert now["item_ids"].tolist() == first["item_ids"].tolist()
            assert [p["meta"]["n"] for p in now["payloads"]] == [-int(ext[int(i)]) for i in now["item_ids"]]


def test_the_downgrade_drops_the_rejected_table_and_the_name_rule(fresh_url):
    import psycopg
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, current_revision, upgrade_to_head

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    upgrade_to_head(fresh_url)
    table = "SELECT to_regclass('pm_vector.attach_rejected') IS NOT NULL"
    rule = "SELECT count(*) FROM pg_constraint WHERE conname = 'ck_collections_name_chars'"
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert c.execute(table).fetchone()[0] and c.execute(rule).fetchone()[0] == 1
        acl = c.execute("SELECT relacl::text[] FROM pg_class WHERE oid = 'pm_vector.attach_rejected'::regclass"
                        ).fetchone()[0] or []
        assert not [a for a in acl if a.startswith("=")]  # nothing for PUBLIC
        if c.execute("SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query'").fetchone():
            assert not c.execute("SELECT has_table_privilege('pm_vector_query', 'pm_vector.attach_rejected', "
                                 "'SELECT')").fetchone()[0]
    command.downgrade(alembic_config(fresh_url), "0020_capture")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert not c.execute(table).fetchone()[0] and c.execute(rule).fetchone()[0] == 0
        assert current_revision(c) == "0020_capture"
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert c.execute(table).fetchone()[0] and c.execute(rule).fetchone()[0] == 1
