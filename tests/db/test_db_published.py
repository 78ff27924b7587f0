"""A run's public documents are kept from one run to the next when their inputs are the same
(pm_vector/db/runs/published.py): a merge -- a new run of the same anchor set and parameters --
publishes the class frames, cells, location cells and product codes of the run it replaces, byte for
byte, so a client holding the last run's documents keeps building requests the server answers and
answers it accepts. Another anchor set, or other code parameters, fit anew."""

from __future__ import annotations

import numpy as np
from psycopg.types.json import Json

from test_db_delta import _base_request, _cells
from test_db_erase import _collection

_DOCS = ("class_frames", "public_cells", "public_locations", "public_projection")


def _published(conn, rid):
    row = conn.execute("SELECT class_frames, public_cells, public_locations, public_projection, class_rows "
                       "FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()
    cr = row[4]
    return dict(zip(_DOCS, row[:4])), {"frames": cr["frames_digest"], "cells": cr["cells"]["digest"],
                                       "locations": cr["locations"]["digest"], "codes": cr["codes"]["digest"]}


def _refit_locations_differently(conn, rid):
    """Stand in for a fit that came out a few ulps apart (faiss's threaded k-means): the run's location
    cells replaced by a fit of the same anchor with another seed, its digest published with it."""
    from pm_vector.db.core.collection import collection_row, load_anchor_set
    from pm_vector.manifold.public_cells import fit_location_cells

    name = conn.execute("SELECT c.name FROM pm_vector.collections c JOIN pm_vector.embedding_runs r "
                        "ON r.collection_id = c.id WHERE r.id = %s", [rid]).fetchone()[0]
    anchors = load_anchor_set(conn, collection_row(conn, name), "anchor", None)
    cells = fit_location_cells(np.asarray(anchors.features, np.float64), random_state=7)
    conn.execute("UPDATE pm_vector.embedding_runs SET public_locations = %s, "
                 "class_rows = jsonb_set(class_rows, '{locations,digest}', to_jsonb(%s::text)) WHERE id = %s",
                 [Json(cells.to_dict()), cells.digest(), rid])
    conn.commit()
    return cells.digest()


def test_a_merge_publishes_the_documents_of_the_run_it_replaces(db, cname, conn):
    """After a merge every published document and digest is the replaced run's, byte for byte; a
    request built on the replaced run's documents is answered by the new run and its answer passes the
    client's whole check with the codes digest the client holds. The replaced run's location cells are
    first swapped for another fit of the same anchor (what a threaded k-means gives on another day):
    the old merge fitted them again and published another digest, so the request was refused
    (CellsDigestMismatchError)."""
    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.protocol.location import LocationRequest, check_location_answer

    X, y, ids, rid = _collection(db, cname, n=400, delta=True)
    digest = _refit_locations_differently(conn, rid)
    docs0, dig0 = _published(conn, rid)
    assert dig0["locations"] == digest
    cells, pc, info = _cells(cname)
    req = _base_request(cname, X, 4.0, pc.widths_, max_bytes=4_000)
    db.ingest(cname, X[:20] * 0.95 + X[20:40] * 0.05, y[:20])
    db.delete_items(cname, item_ids=ids[::11].tolist())
    out = db.merge(cname, embed_fn=make_embed_fn(), embed_fn_extend=make_extend_fn())
    new = out["run_id"]
    assert new != rid
    docs1, dig1 = _published(conn, new)
    assert dig1 == dig0
    assert docs1 == docs0
    for M in cells.levels_[:2]:
        q = LocationRequest.from_dict({**req.to_dict(), "level": int(M), "report": 0})
        ans = resolve(cname, q, log=False)
        ids_, codes, _ = check_location_answer(ans, q, n_items=int(info["class_rows"]["n_items"]),
                                               codes_digest=dig0["codes"], run_id=new)
        assert ids_.size == min(q.candidates, int(ans["n_items"])) and not set(ids_.tolist()) & set(ids[::11].tolist())


def test_a_job_on_another_anchor_set_or_other_code_parameters_fits_anew(db, cname, conn):
    """The documents are kept only when their inputs are the same: a job on a new anchor set fits every
    document anew (the new anchor's cells); a job with other code parameters keeps the cells and fits
    the codes anew, and carries none of the codes before (pm_vector/db/runs/carry.py): with other stages
    of the same width, each of its codes is its own codes' ``encode``, none the replaced run's."""
    from dbtest_helpers import make_embed_fn

    from pm_vector.db.core.collection import collection_row, load_items

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    docs0, dig0 = _published(conn, rid)
    r2 = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn(), class_rows={"code_stages": 4})["run_id"]
    docs2, dig2 = _published(conn, r2)
    assert dig2["locations"] == dig0["locations"] and dig2["cells"] == dig0["cells"]
    assert dig2["frames"] == dig0["frames"] and docs2["public_locations"] == docs0["public_locations"]
    assert dig2["codes"] != dig0["codes"]
    t2 = conn.execute("SELECT timings FROM pm_vector.embedding_runs WHERE id = %s", [r2]).fetchone()[0]
    items = load_items(conn, collection_row(conn, cname))
    conn.rollback()
    assert "class_rows.codes_carried" not in t2 and "class_rows.codes_read_s" not in t2
    old, got, pc2 = _codes(conn, rid), _codes(conn, r2), _cells(cname)[1]
    assert len(next(iter(old.values()))) == len(next(iter(got.values())))  # the same width: a carry would fit
    want = pc2.encode(items["features"])
    assert all(got[int(i)] == bytes(w) for i, w in zip(items["id"].tolist(), want))
    assert sum(got[i] != old[i] for i in got if i in old) > len(got) // 2  # (not the replaced run's codes)
    rng = np.random.default_rng(11)
    A = rng.normal(size=(90, X.shape[1])) + 2.0 * np.eye(X.shape[1])[np.arange(90) % 3]
    A = (A / np.linalg.norm(A, axis=1, keepdims=True)).astype(np.float32)
    db.register_anchor_set(cname, A, np.arange(90) % 3)
    r3 = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn(), class_rows={"code_bytes": 16})["run_id"]
    _, dig3 = _published(conn, r3)
    assert all(dig3[k] != dig2[k] for k in ("frames", "cells", "locations", "codes"))


def _codes(conn, rid):
    return {int(i): bytes(c) for i, c in conn.execute(f"SELECT item_id, code FROM pm_vector.run_{int(rid)}_codes")}


def test_a_merge_carries_the_codes_of_the_items_the_replaced_run_holds(db, cname, conn):
    """A merge takes each item's code from the run it replaces (whose codes it publishes again) and
    encodes only the items that run holds no code of (pm_vector/db/runs/carry.py). Every code of the
    new run is then the published codes' ``encode`` of the item's features, as a full encode gives:
    the delta's new items' (carried), the items ingested without a placement and the one whose code
    the replaced run lost (removed here by hand): those are encoded. One stored code altered by hand
    shows which were carried: the merge keeps it. The read of the carried codes is timed apart."""
    from dbtest_helpers import make_embed_fn, make_extend_fn

    from pm_vector.db.core.collection import collection_row, load_items

    X, y, ids, rid = _collection(db, cname, n=400, delta=True)
    new_X = X[:20] * 0.9 + X[20:40] * 0.1
    db.ingest(cname, new_X[:10], y[:10], embed_fn_extend=make_extend_fn())  # placed in the delta, with codes
    db.ingest(cname, new_X[10:], y[10:20])  # not placed: the run holds no code of them
    db.delete_items(cname, item_ids=ids[::9].tolist())
    lost, altered = int(ids[1]), int(ids[2])
    conn.execute(f"DELETE FROM pm_vector.run_{rid}_codes WHERE item_id = %s", [lost])
    old = _codes(conn, rid)[altered]
    conn.execute(f"UPDATE pm_vector.run_{rid}_codes SET code = %s WHERE item_id = %s",
                 [bytes(255 - b for b in old), altered])
    conn.commit()
    held = set(_codes(conn, rid))
    conn.rollback()
    _, pc, _ = _cells(cname)
    out = db.merge(cname, embed_fn=make_embed_fn(), embed_fn_extend=make_extend_fn())
    new = out["run_id"]
    items = load_items(conn, collection_row(conn, cname))
    conn.rollback()
    want = pc.encode(items["features"])
    got = _codes(conn, new)
    assert sorted(got) == sorted(int(i) for i in items["id"])
    for i, w in zip(items["id"].tolist(), want):
        if i == altered:
            assert got[i] == bytes(255 - b for b in old) != bytes(w)  # carried as the replaced run held it
        else:
            assert got[i] == bytes(w)
    carried = sum(int(i) in held for i in items["id"])
    timings = conn.execute("SELECT timings FROM pm_vector.embedding_runs WHERE id = %s", [new]).fetchone()[0]
    conn.rollback()
    assert timings["class_rows.codes_carried"] == carried == len(got) - 11  # (the lost one, the 10 not placed)
    assert timings["class_rows.codes_read_s"] > 0
