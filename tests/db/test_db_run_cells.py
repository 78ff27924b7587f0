"""A run's public cells parsed once per process (pm_vector.db.runs.run_cells): the cells the run
stores, for both releases; kept only under the digest the run publishes, checked; none for a
release the run does not have ready."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def run(pm_home):
    import pm_vector.db as db
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    ds = load_dataset("digits")
    sp = split_dataset(ds, 400, 300, 150, 50, seed=1)
    name = "run_cells_cache"
    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, ds.dim, ds.classes.tolist())
    db.ingest(name, *sp.server)
    db.register_anchor_set(name, *sp.anchor)
    db.register_anchor_set(name, *sp.dummy, role="dummy")
    yield db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)["run_id"]
    db.drop_collection(name, missing_ok=True)


@pytest.mark.parametrize("kind,column", [("cells", "public_cells"), ("locations", "public_locations")])
def test_the_cells_are_the_runs_and_kept_under_their_checked_digest(run, conn, kind, column):
    from pm_vector.db.runs import run_cells
    from pm_vector.manifold.public_cells import PublicCells

    doc, stored = conn.execute(f"SELECT class_rows, {column} FROM pm_vector.embedding_runs WHERE id = %s",
                               [run]).fetchone()
    run_cells._cache.clear()
    got = run_cells.get(conn, run, doc, kind)
    want = PublicCells.from_dict(stored)
    assert got.digest() == want.digest() == doc[kind]["digest"] and got.levels_ == want.levels_
    assert run_cells.get(conn, run, doc, kind) is got  # parsed once
    # a document whose published digest is not the stored cells': parsed, used, never kept
    run_cells._cache.clear()
    other = dict(doc, **{kind: dict(doc[kind], digest="0" * 64)})
    again = run_cells.get(conn, run, other, kind)
    assert again.digest() == want.digest() and not run_cells._cache
    # a release the run does not have ready: none
    assert run_cells.get(conn, run, dict(doc, **{kind: {"status": "failed"}}), kind) is None
    assert run_cells.get(conn, run, None, kind) is None
