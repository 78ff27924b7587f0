"""A location answer no longer reads every tombstone of its run (issue 36: an answer with a full delta
at most 1.5 x one with an empty delta): the process holds the run's set per ``delta_version``
(:class:`pm_vector.db.resolve.location_cache.TombstoneSets`), read by the first miss of a version
in its first statement, with the version, and used by every other answer built at that version;
the answers stay the numpy ranking of the stored rows minus every tombstone, entry by entry."""

from __future__ import annotations

import numpy as np

from test_db_delta import _Received, _base_request, _cells, _row
from test_db_erase import _collection


def _tombstones_read(seen: _Received) -> list[list[int]]:
    """The tombstone rows (-3: the run's version, then its tombstones) each binary result carried."""
    from pm_vector.db.runs.array_rows import unsend_records

    out = []
    for cur in seen.results:
        res = cur.pgresult
        if res is None or res.nfields < 3 or not res.fformat(0):
            continue
        for r in range(res.ntuples):
            if res.get_value(r, 0) == (-3).to_bytes(4, "big", signed=True):
                out.append(unsend_records(res.get_value(r, 2), "int8").tolist())
    return out


def _want(conn, rid, M, r, dead, eps, size):
    from pm_vector.privacy.location import location_weight
    from pm_vector.shortlist import location_list

    (rid_, rh, rch), (tid, _th, tch) = _row(conn, rid, M, r)
    keep = [k for k, i in enumerate(rid_) if i not in dead]
    tkeep = [k for k, i in enumerate(tid) if i not in dead]
    return location_list([rid_[k] for k in keep], [rh[k] for k in keep], [rch[k] for k in keep],
                         [tid[k] for k in tkeep], [tch[k] for k in tkeep], location_weight(eps), size)[0].tolist()


def test_answers_read_the_runs_tombstones_once_per_version_and_answer_alike(db, cname, conn, monkeypatch):
    """Every cell of the finest level, every answer built (the answer cache cleared): the first reads
    the run's tombstones (with the version) and filters the top hubs by them, the others do neither
    (the old code read all of them in every answer, then filtered the top hubs in every answer); each
    equals the numpy ranking; a delete (a new version) is read and filtered by the next answer once,
    and its item is in no answer from then on. That read carries only the new version's tombstones."""
    from pm_vector.db.postgres import connect
    from pm_vector.db.resolve import location_resolution
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.protocol.location import LocationRequest

    filtered = []
    live_top = location_resolution.live_top
    monkeypatch.setattr(location_resolution, "live_top", lambda *a: filtered.append(1) or live_top(*a))
    X, y, ids, rid = _collection(db, cname, n=460, delta=True)
    cells, pc, _ = _cells(cname)
    base = _base_request(cname, X, 4.0, pc.widths_, max_bytes=2_500).to_dict()
    size = int(base["candidates"])
    top = _row(conn, rid, 0, 0)[1][0]
    gone = sorted(set(ids[::7].tolist()) | set(top[:size // 2]))  # (the first top hubs among them)
    db.delete_items(cname, item_ids=gone)
    dead = set(gone)
    M = int(cells.levels_[-1])

    def answer(r, c):
        location_resolution.CACHE.clear()  # every answer built
        filtered.clear()
        seen = _Received(c)
        ans = resolve(cname, LocationRequest.from_dict({**base, "level": M, "report": r}), conn=seen)
        assert not ans["cached"]
        return np.asarray(ans["item_ids"], np.int64).tolist(), _tombstones_read(seen)

    with connect() as c:
        for r in range(M):
            got, read = answer(r, c)
            assert got == _want(conn, rid, M, r, dead, 4.0, size), r
            if r == 0:
                assert len(read) == 1 and set(read[0]) >= dead  # the first: every tombstone (and the version), once
                assert len(filtered) == 1  # and the top hubs filtered by them
            else:
                assert read == [] and filtered == [], r  # the others: none
        more = sorted(set([i for i in ids.tolist() if i not in dead][:3] + [int(i) for i in top if i not in dead][:1]))
        db.delete_items(cname, item_ids=more)
        dead |= set(more)
        for r in range(M):
            got, read = answer(r, c)
            assert got == _want(conn, rid, M, r, dead, 4.0, size) and not set(got) & dead, r
            # the first: only the new version's tombstones (each records its version, migration 0033), joined
            # to the set held; the others: none
            assert len(read) == (1 if r == 0 else 0) and (not read or sorted(read[0][1:]) == more), r
            assert len(filtered) == (1 if r == 0 else 0), r
