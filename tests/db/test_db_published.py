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
    the codes anew."""
    from dbtest_helpers import make_embed_fn

    X, y, ids, rid = _collection(db, cname, n=300, delta=True)
    docs0, dig0 = _published(conn, rid)
    r2 = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn(), class_rows={"code_bytes": 16})["run_id"]
    docs2, dig2 = _published(conn, r2)
    assert dig2["locations"] == dig0["locations"] and dig2["cells"] == dig0["cells"]
    assert dig2["frames"] == dig0["frames"] and docs2["public_locations"] == docs0["public_locations"]
    assert dig2["codes"] != dig0["codes"]
    rng = np.random.default_rng(11)
    A = rng.normal(size=(90, X.shape[1])) + 2.0 * np.eye(X.shape[1])[np.arange(90) % 3]
    A = (A / np.linalg.norm(A, axis=1, keepdims=True)).astype(np.float32)
    db.register_anchor_set(cname, A, np.arange(90) % 3)
    r3 = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn(), class_rows={"code_bytes": 16})["run_id"]
    _, dig3 = _published(conn, r3)
    assert all(dig3[k] != dig2[k] for k in ("frames", "cells", "locations", "codes"))
