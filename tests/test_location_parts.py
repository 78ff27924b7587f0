"""The location rows in parts (pm_vector.db.runs.locations): splitting a row by its items' parts
changes no entry, and the part level is a public function of the levels and the item count."""

import numpy as np
import pytest


def _data(n=3000, d=8, seed=0):
    from pm_vector.neighbors import knn_search

    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(12, d)) * 3
    X = centers[rng.integers(0, 12, n)] + rng.normal(size=(n, d))
    A = centers[rng.integers(0, 12, 400)] + rng.normal(size=(400, d))
    ids = np.arange(10, 10 + 3 * n, 3, dtype=np.int64)  # ids are not positions
    nb = knn_search(X, X, 33)
    nb = np.stack([r[r != k][:32] for k, r in enumerate(nb)])
    return A, X, ids, nb


def _joined(data):
    out = {}
    for lv, c, p, i, h, ch in zip(data.levels, data.cell, data.part, data.item_ids, data.hubs, data.chubs):
        if lv < 0:
            continue
        d = out.setdefault((int(lv), int(c)), {})
        for a, b, e in zip(i.tolist(), h.tolist(), ch.tolist()):
            assert a not in d  # an item sits in one part of a row
            d[a] = (b, e)
    return out


def test_parts_hold_the_same_entries_as_whole_rows(monkeypatch):
    from pm_vector.db.runs import locations

    A, X, ids, nb = _data()
    parted = locations.build(A, X, ids, neighbors=nb)
    assert parted.part_level == 32 and parted.doc()["part_level"] == 32  # 3,000 items / 64 a part: level 32
    monkeypatch.setattr(locations, "PART_ITEMS", 10**9)
    whole = locations.build(A, X, ids, neighbors=nb)
    assert whole.part_level == 0 and set(whole.part.tolist()) == {0} and -1 not in whole.levels.tolist()
    assert _joined(parted) == _joined(whole)
    # a row's parts joined (LocationsData.row, what the privacy benchmark ranks) answer as the whole row
    from pm_vector.shortlist import location_list

    for M in (2, 32, int(parted.cells.levels_[-1])):
        for r in range(M):
            for w in (1.0, 2.0 ** 20):
                a = location_list(*parted.row(M, r), parted.row(0, 0)[0], parted.row(0, 0)[2], w, 64)[0]
                b = location_list(*whole.row(M, r), whole.row(0, 0)[0], whole.row(0, 0)[2], w, 64)[0]
                assert a.tolist() == b.tolist()
    assert sum(parted.row(2, r)[0].size for r in range(2)) == sum(whole.row(2, r)[0].size for r in range(2)) > 0
    # the top hubs row: one part, in rank order
    top = [k for k, lv in enumerate(parted.levels) if lv == 0]
    assert len(top) == 1 and parted.item_ids[top[0]].tolist() == whole.item_ids[0].tolist()
    # the level -1 rows list every item once, in the part its cell at the part level gives
    book = {int(i): int(p) for lv, p, a in zip(parted.levels, parted.part, parted.item_ids) if lv == -1 for i in a}
    assert sorted(book) == ids.tolist()
    cell = parted.cells.assign(X, 0, 32)
    assert all(book[int(i)] == int(c) for i, c in zip(ids, cell))
    for lv, p, a in zip(parted.levels, parted.part, parted.item_ids):
        if lv > 0:
            assert {book[int(i)] for i in a} <= {int(p)}
    # parts are few per row at fine levels: every row of level 32 and finer has entries of few parts
    n_parts = {}
    for lv, c in zip(parted.levels, parted.cell):
        if lv > 0:
            n_parts[(int(lv), int(c))] = n_parts.get((int(lv), int(c)), 0) + 1
    assert max(v for (lv, _), v in n_parts.items() if lv >= 32) < 32


@pytest.mark.parametrize("n, want", [(100, 0), (127, 0), (128, 2), (3000, 32), (10_000, 128), (100_000, 1000),
                                     (10**6, 1000)])
def test_part_level(n, want):
    from pm_vector.db.runs.locations import part_level

    assert part_level([2, 4, 8, 16, 32, 64, 128, 256, 512, 1000], n) == want


def _location_list_sorting_all(row_ids, row_hubs, row_chubs, top_ids, top_chubs, weight, size):
    """The ranking as it was written first: every entry sorted (the reference)."""
    ids = np.concatenate([np.asarray(row_ids, np.int64), np.asarray(top_ids, np.int64)[:size]])
    s = np.concatenate([np.asarray(row_chubs, np.float64) + float(weight) * np.asarray(row_hubs, np.float64),
                        np.asarray(top_chubs, np.float64)[:size]])
    if ids.size == 0:
        return ids, s
    o = np.lexsort((-s, ids))
    first = np.r_[True, ids[o][1:] != ids[o][:-1]]
    ids, s = ids[o][first], s[o][first]
    o = np.lexsort((ids, -s))[:size]
    return ids[o], s[o]


def test_the_ranking_keeps_only_the_entries_that_can_matter_and_answers_alike():
    """``location_list`` partitions before it sorts; on rows full of ties (small integer counts, the
    weight 0, 1 or the cap), items in both the row and the top hubs (the top's score the larger, or
    the row's) and sizes from 0 past the candidates, it gives the same list as sorting every entry."""
    from pm_vector.shortlist import location_list

    rng = np.random.default_rng(7)
    for trial in range(400):
        n = int(rng.integers(0, 300))
        row_ids = rng.choice(1_000, size=n, replace=False).astype(np.int64)
        row_hubs = rng.integers(0, 4, n).astype(np.float64)
        row_chubs = rng.integers(0, 6, n).astype(np.float64)
        m = int(rng.integers(0, 120))
        top_ids = rng.choice(1_000, size=m, replace=False).astype(np.int64)  # many also in the row
        top_chubs = np.sort(rng.integers(0, 9, m).astype(np.float64))[::-1]
        w = float(rng.choice([0.0, 1.0, 2.0 ** 20, 0.37]))
        size = int(rng.integers(0, 160))
        got = location_list(row_ids, row_hubs, row_chubs, top_ids, top_chubs, w, size)
        want = _location_list_sorting_all(row_ids, row_hubs, row_chubs, top_ids, top_chubs, w, size)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist(), trial


def test_the_tombstones_leave_the_row_and_the_top_hubs_as_a_set_difference_would():
    """``merged_row`` (a binary search of each row id in the ascending tombstones; the top hubs
    filtered once per set by ``live_top``) keeps exactly the ids not tombstoned, in their order, with
    their own counts, on both sides of the search's threshold (a row of a few ids, a top of 20,000),
    for tombstones at the ends of the id range, and empty ones."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from pm_vector import shortlist

    @settings(max_examples=60, deadline=None)
    @given(st.integers(0, 2**31), st.sampled_from([0, 1, 7, 300, 20_000]), st.sampled_from([0, 5, 9000, 20_000]),
           st.sampled_from([0, 1, 50, 4000]))
    def check(seed, n_row, n_top, n_dead):
        rng = np.random.default_rng(seed)
        rest = 2 + rng.permutation(59_998)
        universe = np.r_[60_000, rest[:n_row // 2], 1, rest[n_row // 2:]]  # (the ends of the range in each row)
        row_ids = universe[:n_row + 1] if n_row else universe[:0]
        new_ids = np.r_[universe[n_row + 1:n_row + 40], 1]
        top_ids = rng.permutation(universe[:max(n_top, 1)])[:n_top]
        dead = np.unique(np.r_[rng.choice(universe[:25_000], n_dead), [1, 60_000][:min(n_dead, 2)]])
        hubs = [rng.random(a.size) for a in (row_ids, row_ids, new_ids, new_ids, top_ids)]
        got = shortlist.merged_row(row_ids, hubs[0], hubs[1], new_ids, hubs[2], hubs[3], top_ids, hubs[4], dead)
        live_top = shortlist.live_top(top_ids, hubs[4], dead)
        held = shortlist.merged_row(row_ids, hubs[0], hubs[1], new_ids, hubs[2], hubs[3], *live_top, dead,
                                    top_live=True)
        k, kn, kt = (~np.isin(a, dead) for a in (row_ids, new_ids, top_ids))
        want = (np.r_[row_ids[k], new_ids[kn]], np.r_[hubs[0][k], hubs[2][kn]], np.r_[hubs[1][k], hubs[3][kn]],
                top_ids[kt], hubs[4][kt])
        for a, b, c in zip(got, held, want):
            assert np.array_equal(a, c) and np.array_equal(b, c)

    check()
