"""What a process keeps between location answers (:mod:`pm_vector.db.resolve.location_cache`): the base
rows, top hubs and code slices a miss builds from are held per run and ``graph_version``, and an answer
built on them is entry by entry and byte by byte the one built from the tables -- after deletes that
rewrite the rows (a run without the delta: a new ``graph_version``), after a write that commits between
a build and its log (what that build read is not kept), and after a merge (the old run's parts leave
memory)."""

from __future__ import annotations

import numpy as np

from test_db_delta import _base_request, _cells
from test_db_erase import _collection
from test_db_locations import _Calls


def _keys_of(cache_dict, run_id: int, version: int | None = None) -> list:
    return [k for k in cache_dict if k[2] == run_id and (version is None or k[4] == version)]


def _graph_version(conn, rid: int) -> int:
    return int(conn.execute("SELECT coalesce((class_rows ->> 'graph_version')::int, 0) FROM pm_vector.embedding_runs "
                            "WHERE id = %s", [rid]).fetchone()[0])


def _fresh(cname, req):
    """The answer built from the tables alone: every cache of the process emptied first."""
    from pm_vector.db.resolve import location_cache
    from pm_vector.db.resolve.resolution import resolve

    location_cache.clear_all()
    return resolve(cname, req, log=False)


def _setup(db, cname, delta: bool):
    """A 400-item collection (``delta``: its writes take the delta, else rewrite the rows), the requests
    of every cell of its finest level, and every cache of this process emptied."""
    from pm_vector.db.resolve import location_cache, location_resolution
    from pm_vector.protocol.location import LocationRequest

    X, y, ids, rid = _collection(db, cname, n=400, delta=delta)
    cells, pc, _ = _cells(cname)
    base = _base_request(cname, X, 8.0, pc.widths_, max_bytes=2_500).to_dict()
    M = int(cells.levels_[-1])
    location_cache.clear_all()
    location_resolution._KNOWN.clear()
    return X, y, rid, M, [LocationRequest.from_dict({**base, "level": M, "report": r}) for r in range(M)]


def test_rows_and_codes_held_answer_as_the_tables_through_rewrites_and_writes_in_between(db, cname, conn):
    """A run without the delta (every delete rewrites its rows and increases its graph_version): every
    cell of the finest level answered (rows and codes held), items deleted, every cell answered
    again: each answer equals the one built from the tables with every cache emptied, holds no deleted
    item, and no part of the old version is held. Then a delete that commits between a known build's
    first statement and its log: the answer comes from the full path, without the item, and the parts
    that build read are not held under the version it was keyed by."""
    from pm_vector.db.postgres import connect
    from pm_vector.db.resolve import location_cache, location_resolution
    from pm_vector.db.resolve.resolution import resolve

    X, y, rid, M, reqs = _setup(db, cname, delta=False)
    v0 = _graph_version(conn, rid)
    with connect() as pooled:
        first = [resolve(cname, q, conn=pooled) for q in reqs]
        assert _keys_of(location_cache.ROWS._d, rid, v0) and _keys_of(location_cache.CODES._d, rid, v0)
        for q, got in zip(reqs, first):
            assert got["codes_data"] == _fresh(cname, q)["codes_data"]
        location_resolution.CACHE.clear()
        for q in reqs:  # (the caches filled again by the known path)
            resolve(cname, q, conn=pooled)
        assert len(_keys_of(location_cache.ROWS._d, rid, v0)) >= M

        answered = sorted({int(i) for got in first for i in np.asarray(got["item_ids"], np.int64).tolist()})
        gone = answered[::5]
        db.delete_items(cname, item_ids=gone)
        v1 = _graph_version(conn, rid)
        assert v1 > v0
        for q in reqs:
            location_resolution.CACHE.clear()
            got = resolve(cname, q, conn=pooled)
            want = _fresh(cname, q)
            assert np.array_equal(got["item_ids"], want["item_ids"]) and got["codes_data"] == want["codes_data"]
            assert not set(np.asarray(got["item_ids"], np.int64).tolist()) & set(gone)
        location_resolution.CACHE.clear()
        for q in reqs:
            resolve(cname, q, conn=pooled)
        assert len(_keys_of(location_cache.ROWS._d, rid, v1)) >= M
        assert not _keys_of(location_cache.ROWS._d, rid, v0) and not _keys_of(location_cache.CODES._d, rid, v0)

        q = reqs[0]
        location_resolution.CACHE.clear()
        resolve(cname, q, conn=pooled)
        victim = int(np.asarray(resolve(cname, q, conn=pooled)["item_ids"], np.int64)[0])
        location_resolution.CACHE.clear()
        location_cache.ROWS.clear()
        location_cache.CODES.clear()
        got = resolve(cname, q, conn=_Calls(pooled, at=1, then=lambda: db.delete_items(cname, item_ids=[victim])))
        v2 = _graph_version(conn, rid)
        assert v2 > v1 and victim not in set(np.asarray(got["item_ids"], np.int64).tolist())
        assert not _keys_of(location_cache.ROWS._d, rid, v1) and not _keys_of(location_cache.CODES._d, rid, v1)
        want = _fresh(cname, q)
        assert np.array_equal(got["item_ids"], want["item_ids"]) and got["codes_data"] == want["codes_data"]


def test_a_merge_takes_the_old_runs_parts_out_of_memory(db, cname, conn):
    """A run taking the delta: its parts held after answers, deletes and new items answered alike
    (the delta read beside the held base), then a merge: the first answer from the new run drops
    every part of the old one."""
    from dbtest_helpers import make_embed_fn, make_extend_fn
    from pm_vector.db.postgres import connect
    from pm_vector.db.resolve import location_cache, location_resolution
    from pm_vector.db.resolve.resolution import resolve

    X, y, rid, M, reqs = _setup(db, cname, delta=True)
    with connect() as pooled:
        first = [resolve(cname, q, conn=pooled) for q in reqs]
        held = len(_keys_of(location_cache.ROWS._d, rid))
        assert held >= M and _keys_of(location_cache.CODES._d, rid)
        answered = sorted({int(i) for got in first for i in np.asarray(got["item_ids"], np.int64).tolist()})
        gone = answered[::4]
        db.delete_items(cname, item_ids=gone)
        db.ingest(cname, X[:20] * 0.999, y[:20], external_ids=[f"n{i}" for i in range(20)])
        for q in reqs:
            got = resolve(cname, q, conn=pooled)
            want = _fresh(cname, q)
            assert np.array_equal(got["item_ids"], want["item_ids"]) and got["codes_data"] == want["codes_data"]
            assert not set(np.asarray(got["item_ids"], np.int64).tolist()) & set(gone)
        location_resolution.CACHE.clear()
        for q in reqs:  # (held again: _fresh emptied every cache)
            resolve(cname, q, conn=pooled)
        assert len(_keys_of(location_cache.ROWS._d, rid)) >= M
        new_rid = db.merge(cname, embed_fn=make_embed_fn(), embed_fn_extend=make_extend_fn())["run_id"]
        assert new_rid != rid
        resolve(cname, reqs[0], conn=pooled)
        assert not _keys_of(location_cache.ROWS._d, rid) and not _keys_of(location_cache.CODES._d, rid)
        assert _keys_of(location_cache.ROWS._d, new_rid)
