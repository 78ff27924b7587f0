"""Product codes fit on the public anchor, and the public rule for a compact answer's shape."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pm_vector.bench.metrics import wire_answer_bytes
from pm_vector.errors import InvalidInputError
from pm_vector.manifold.codes import (ANSWER_BUDGET_BYTES, MAX_CODE_BYTES, MIN_CODE_BYTES, MIN_K_PRIME, ProductCodes,
                                      compact_answer_shape)
from pm_vector.protocol.codec import MSGPACK, decode, encode

D = 32  # a multiple of every sub-space count below: the rotation is a full orthogonal d x d matrix


def _unit(X):
    return X / np.linalg.norm(X, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    scale = np.linspace(2.0, 0.2, D)  # anisotropic, as real features are
    anchor = _unit(rng.normal(size=(400, D)) * scale)
    items = _unit(rng.normal(size=(300, D)) * scale)
    return anchor, items


@pytest.fixture(scope="module")
def codes(data):
    return ProductCodes(16, n_stages=2).fit(data[0])


def test_round_trip_gives_identical_codes_and_digest(codes, data):
    doc = codes.to_dict()
    back = ProductCodes.from_dict(doc)
    assert back.digest() == codes.digest()
    assert back.stage_bytes_ == codes.stage_bytes_ == (8, 16)
    np.testing.assert_array_equal(back.encode(data[1]), codes.encode(data[1]))
    # through the wire (msgpack, arrays as the codec's extension) as well
    wired = ProductCodes.from_dict(decode(encode(doc, MSGPACK), MSGPACK))
    assert wired.digest() == codes.digest()
    np.testing.assert_array_equal(wired.encode(data[1]), codes.encode(data[1]))


def test_a_tampered_document_has_another_digest_or_is_refused(codes):
    doc = codes.to_dict()
    moved = {**doc, "centroids": [c.copy() for c in doc["centroids"]]}
    moved["centroids"][1][0, 0, 0] += 1e-3
    assert ProductCodes.from_dict(moved).digest() != codes.digest()
    bad = {
        "format": {**doc, "format": "pm_vector.public-projection/1"},
        "shape": {**doc, "rotation": doc["rotation"][:-1]},
        "stages": {**doc, "centroids": doc["centroids"][:1]},
        "centroid shape": {**doc, "centroids": [doc["centroids"][0][:, :255], doc["centroids"][1]]},
        "missing": {k: v for k, v in doc.items() if k != "mean"},
        "not numeric": {**doc, "mean": ["a"] * D},
        "nan": {**doc, "mean": np.full(D, np.nan, np.float32)},
        "code bytes": {**doc, "code_bytes": 24},
        "not a list": {**doc, "centroids": 3},
    }
    for why, d in bad.items():
        with pytest.raises(InvalidInputError):
            ProductCodes.from_dict(d)
        assert why  # every case is refused with the library's error, not a KeyError or ValueError


def test_a_prefix_decodes_as_the_first_stages(codes, data):
    c = codes.encode(data[1])
    assert c.shape == (300, 16) and c.dtype == np.uint8
    first = codes.decode(c[:, :8])
    full = codes.decode(c)
    # the second stage codes the first stage's residual: the full code is the better reconstruction
    R = codes._rotate(data[1])
    assert np.linalg.norm(full - R) < np.linalg.norm(first - R)
    second = ProductCodes._decode_stage(codes.centroids_[1], c[:, 8:])
    np.testing.assert_allclose(full, first + second)
    for bad in (c[:, :4], c[:, :12], np.zeros((3, 17), np.uint8), c[0]):
        with pytest.raises(InvalidInputError, match="one of"):
            codes.decode(bad)


def test_asymmetric_distance_is_the_distance_to_the_reconstruction(codes, data):
    q = data[1][0]
    c = codes.encode(data[1][1:50])
    for width in codes.stage_bytes_:
        recon = codes.mean_ + codes.decode(c[:, :width]) @ codes.rotation_  # back in feature space
        np.testing.assert_allclose(codes.distances(q, c[:, :width]), np.linalg.norm(recon - q, axis=1), atol=1e-9)


@pytest.mark.parametrize("params", [(MIN_CODE_BYTES - 1, 1), (MAX_CODE_BYTES + 1, 1), (33, 2), (32, 0),
                                    (True, 1), (16.0, 1), ("16", 1)])
def test_code_size_out_of_bounds_is_refused(params, data):
    with pytest.raises(InvalidInputError, match="code_bytes|n_stages"):
        ProductCodes(*params).fit(data[0])


def test_too_small_an_anchor_is_refused_clearly(data):
    with pytest.raises(InvalidInputError, match="256"):
        ProductCodes(8).fit(data[0][:100])


def test_fit_is_deterministic_on_the_same_anchor(codes, data):
    again = ProductCodes(16, n_stages=2).fit(data[0])
    assert again.digest() == codes.digest()
    np.testing.assert_array_equal(again.encode(data[1]), codes.encode(data[1]))
    assert ProductCodes(16, n_stages=2).fit(data[0][::-1][:300]).digest() != codes.digest()


def test_the_rule_fits_the_budget_for_2_to_100_rows():
    fields = {"release": "gaussian", "n_cells": 128, "run_id": 2 ** 31, "k_prime": 1000,
              "codes": {"bytes": 64, "digest": "f" * 64}}
    previous = {}
    for C in range(2, 101):
        for release in ("cells", "gaussian"):
            kp, b = compact_answer_shape(C, release, 4.0 if release == "cells" else math.inf, (32, 64))
            assert kp >= MIN_K_PRIME and b in (32, 64)
            assert wire_answer_bytes(C, kp, code_bytes=b) <= ANSWER_BUDGET_BYTES, (C, release, kp, b)
            assert wire_answer_bytes(C, kp, code_bytes=b, fields=fields) <= ANSWER_BUDGET_BYTES + 200
            assert kp <= previous.get((release, b), kp)  # more rows, fewer candidates of a width each
            previous[(release, b)] = kp
    # the cell release takes the first stage and the most candidates, the Gaussian the whole code
    assert compact_answer_shape(10, "cells", 4.0, (32, 64)) == (130, 32)
    assert compact_answer_shape(10, "gaussian", math.inf, (32, 64)) == (69, 64)
    # with many rows the whole code would leave too few candidates: the Gaussian takes the prefix
    assert compact_answer_shape(60, "gaussian", math.inf, (32, 64))[1] == 32
    assert compact_answer_shape(10, "cells", 4.0, (8,)) == (391, 8)


def test_the_rule_refuses_bad_input():
    for args in [(0, "cells", 4.0, (32, 64)), (10, "laplace", 4.0, (32, 64)), (10, "cells", 4.0, ()),
                 (10, "cells", 4.0, (64, 32)), (True, "cells", 4.0, (32,))]:
        with pytest.raises(InvalidInputError):
            compact_answer_shape(*args)
    with pytest.raises(InvalidInputError):
        compact_answer_shape(10, "cells", 4.0, (32,), budget_bytes=0)


def test_every_stage_code_is_the_nearest_centroid_of_its_residual(codes, data):
    """The encoder (faiss ``compute_codes``, float32) against brute force in float64: each sub-vector
    of each stage's residual gets a centroid at its least distance (up to float32 rounding)."""
    R = codes._rotate(data[1])
    col = 0
    for cen in codes.centroids_:
        m, _, ds = cen.shape
        got = codes.encode(data[1])[:, col:col + m]
        for j in range(m):
            sub = R[:, j * ds:(j + 1) * ds]
            d2 = ((sub[:, None, :] - cen[j][None]) ** 2).sum(-1)  # (n, 256)
            chosen = d2[np.arange(len(sub)), got[:, j]]
            assert np.all(chosen <= d2.min(1) + 1e-5 * (1 + d2.min(1)))
        R = R - codes._decode_stage(cen, got)
        col += m


# ----------------------------------------------------------------------------- wide tables

@pytest.fixture(scope="module")
def wide(data):
    return ProductCodes(16, n_stages=2, widths=(24, 32)).fit(data[0])


def test_wide_tables_sit_after_the_residual_stages(wide, data):
    assert wide.stage_bytes_ == (8, 16) and wide.widths_ == (8, 16, 24, 32) and wide.total_bytes_ == 16 + 24 + 32
    assert [wide.span(w) for w in wide.widths_] == [(0, 8), (0, 16), (16, 24), (40, 32)]
    c = wide.encode(data[1])
    assert c.shape == (300, 72)
    # the residual part is the residual-only code's; each table codes the item on its own
    np.testing.assert_array_equal(c[:, :16], ProductCodes(16, n_stages=2).fit(data[0]).encode(data[1]))
    for w in (24, 32):
        assert wide.select(c, w).shape == (300, w)
        assert wide.decode(wide.select(c, w)).shape[0] == 300
    with pytest.raises(InvalidInputError, match="published widths"):
        wide.select(c, 20)
    with pytest.raises(InvalidInputError, match="one of"):
        wide.decode(c[:, :20])


def test_a_wide_tables_distance_is_the_distance_to_its_reconstruction(wide, data):
    q = data[1][0]
    c = wide.encode(data[1][1:50])
    for k, w in enumerate((24, 32)):
        rot = wide._wide_rotations[k]
        recon = wide.mean_ + wide.decode(wide.select(c, w)) @ rot  # back in feature space
        np.testing.assert_allclose(wide.distances(q, wide.select(c, w)), np.linalg.norm(recon - q, axis=1), atol=1e-9)
        np.testing.assert_allclose(rot.T @ rot, np.eye(D), atol=1e-9)  # every direction once (padding rows zero)


def test_a_wide_table_codes_held_out_items_better_than_the_residual_prefix(data):
    """The reason the tables exist: on items the anchor did not hold, one 32-byte table reconstructs
    better than two residual stages of 16 (the second over-fits the anchor's residuals)."""
    rng = np.random.default_rng(3)
    scale = np.linspace(2.0, 0.2, 64)
    anchor, items = (_unit(rng.normal(size=(n, 64)) * scale) for n in (300, 400))
    pc = ProductCodes(32, n_stages=2, widths=(64,)).fit(anchor)
    c = pc.encode(items)
    err_res = np.linalg.norm(pc.decode(pc.select(c, 32)) - pc.rotate(items, 32), axis=1).mean()
    single = ProductCodes(16, n_stages=1, widths=(32,)).fit(anchor)
    c1 = single.encode(items)
    err_wide = np.linalg.norm(single.decode(single.select(c1, 32)) - single.rotate(items, 32), axis=1).mean()
    print(f"held-out reconstruction error at 32 bytes: residual 2 x 16 {err_res:.4f}, one table {err_wide:.4f}")
    assert err_wide < err_res


def test_the_wide_document_round_trips_and_the_first_format_still_reads(wide, codes, data):
    back = ProductCodes.from_dict(wide.to_dict())
    assert back.digest() == wide.digest() and back.widths_ == wide.widths_
    np.testing.assert_array_equal(back.encode(data[1]), wide.encode(data[1]))
    moved = wide.to_dict()
    moved["wide_centroids"] = [c.copy() for c in moved["wide_centroids"]]
    moved["wide_centroids"][0][0, 0, 0] += 1e-3
    assert ProductCodes.from_dict(moved).digest() != wide.digest()
    for bad in ({**wide.to_dict(), "widths": [24]}, {**wide.to_dict(), "widths": [24, 40]},
                {**wide.to_dict(), "wide_centroids": 3}, {**wide.to_dict(), "widths": [8, 32]}):
        with pytest.raises(InvalidInputError):
            ProductCodes.from_dict(bad)
    # a run built before the wide tables published format 1 (no widths): it reads with its old digest
    v1 = {k: v for k, v in codes.to_dict().items() if k not in ("widths", "wide_centroids")}
    v1["format"] = "pm_vector.product-codes/1"
    old = ProductCodes.from_dict(v1)
    assert old.digest() == codes.digest() and old.widths_ == old.stage_bytes_ == (8, 16)


# ----------------------------------------------------------------------------- one-dimension sub-spaces

def _faiss_codes(cen, R):
    import faiss

    m, _, ds = cen.shape
    pq = faiss.ProductQuantizer(m * ds, m, 8)
    faiss.copy_array_to_vector(np.ascontiguousarray(cen, dtype=np.float32).ravel(), pq.centroids)
    return pq.compute_codes(np.ascontiguousarray(R, dtype=np.float32))


def _one_dim_case(rng, m, n, grid):
    """Centroids and values of one-dimension sub-spaces; ``grid`` > 0 draws them from a few grid
    points (duplicate centroids, values on centroids and on midpoints: every kind of tie)."""
    if grid:
        pts = np.arange(-grid, grid + 1, dtype=np.float64) / grid
        cen = rng.choice(pts, size=(m, 256, 1))
        R = rng.choice(np.concatenate([pts, (pts[1:] + pts[:-1]) / 2, [-3.0, 3.0]]), size=(n, m))
    else:
        cen = np.sort(rng.normal(size=(m, 256, 1)), axis=1)[:, rng.permutation(256)]
        R = rng.normal(size=(n, m)) * rng.choice([0.01, 1.0, 5.0], size=(n, 1))
    return cen.astype(np.float32).astype(np.float64), R


@pytest.mark.parametrize("grid", [0, 1, 3, 40])
def test_one_dimension_codes_equal_faiss_ties_included(grid):
    from pm_vector.manifold.codes import _StageCoder

    rng = np.random.default_rng(grid)
    cen, R = _one_dim_case(rng, 16, 4000, grid)
    coder = _StageCoder(cen)
    assert coder.one_dim
    assert np.array_equal(coder.codes(R), _faiss_codes(cen, R))


def test_one_dimension_codes_equal_faiss_on_float32_neighbours():
    """Values one float32 step either side of every midpoint between neighbouring centroids (where
    float32 rounding decides), and the centroids themselves."""
    from pm_vector.manifold.codes import _StageCoder

    rng = np.random.default_rng(7)
    cen, _ = _one_dim_case(rng, 4, 1, 0)
    s = np.sort(cen[:, :, 0].astype(np.float32), axis=1)
    mid = ((s[:, 1:] + s[:, :-1]) / 2).astype(np.float32)
    cols = [np.concatenate([np.nextafter(mid[j], -np.inf), mid[j], np.nextafter(mid[j], np.inf), s[j]])
            for j in range(4)]
    R = np.stack(cols, axis=1).astype(np.float64)
    assert np.array_equal(_StageCoder(cen).codes(R), _faiss_codes(cen, R))


def test_one_dimension_codes_equal_faiss_property():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from pm_vector.manifold.codes import _StageCoder

    f32 = st.floats(-4, 4, width=32, allow_subnormal=False)

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(st.lists(f32, min_size=1, max_size=8), st.lists(f32, min_size=1, max_size=30), st.integers(0, 2**32 - 1))
    def check(vals, xs, seed):
        rng = np.random.default_rng(seed)
        cen = rng.choice(np.asarray(vals, dtype=np.float64), size=(2, 256, 1))
        R = rng.choice(np.asarray(xs + vals, dtype=np.float64), size=(len(xs), 2))
        assert np.array_equal(_StageCoder(cen).codes(R), _faiss_codes(cen, R))

    check()
