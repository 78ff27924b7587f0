"""One re-rank (pm_vector.client.rerank.rank) behind query.rerank, PrivateKNN.rerank /
rerank_codes and Client.query: the same order, by raw features or by published codes."""

import numpy as np
import pytest

from pm_vector.client.query import PrivateKNN, rerank
from pm_vector.client.rerank import rank
from pm_vector.errors import InvalidInputError
from pm_vector.privacy import secure_generator


def _data(n=40, d=12):
    g = secure_generator()
    F = g.normal(size=(n, d))
    F[7] = F[3]  # a tie: stable order keeps the earlier candidate first
    return g.normal(size=d), F, np.arange(1000, 1000 + n)


def test_features_order_is_exact_and_stable():
    q, F, ids = _data()
    order, d = rank(q, F)
    np.testing.assert_allclose(d, np.linalg.norm(F - q, axis=1))
    assert np.all(np.diff(d[order]) >= 0)
    assert list(order).index(3) < list(order).index(7)
    np.testing.assert_array_equal(rerank(q, F, 5), order[:5])
    np.testing.assert_array_equal(PrivateKNN.rerank(q, ids, F, k=5), ids[order[:5]])
    assert PrivateKNN.rerank(q, ids[:0], F[:0], k=5).shape == (0,)
    with pytest.raises(InvalidInputError, match="one row per candidate"):
        PrivateKNN.rerank(q, ids[:-1], F, k=5)
    with pytest.raises(InvalidInputError, match="features"):
        rank(q[:-1], F)


def test_codes_order_is_the_asymmetric_distance():
    faiss = pytest.importorskip("faiss")  # noqa: F841
    from pm_vector.manifold.codes import ProductCodes

    g = secure_generator()
    A = g.normal(size=(600, 16))
    pc = ProductCodes(code_bytes=8).fit(A)
    X = g.normal(size=(50, 16))
    codes = pc.encode(X)
    q = g.normal(size=16)
    order, d = rank(q, codes=codes, product_codes=pc)
    np.testing.assert_allclose(d, pc.distances(q, codes))
    np.testing.assert_array_equal(order, np.argsort(pc.distances(q, codes), kind="stable"))
    ids = np.arange(50) * 3
    np.testing.assert_array_equal(PrivateKNN.rerank_codes(q, ids, codes, pc, k=8), ids[order[:8]])
    with pytest.raises(InvalidInputError, match="one row per candidate"):
        PrivateKNN.rerank_codes(q, ids[:-1], codes, pc, k=8)


def _timing_advantage(times_a, times_b, rng) -> float:
    """TPR - FPR of the attacker's best threshold on the rank() times, chosen on one half of the
    trials and scored on the other (so the score of a classifier fit to noise is 0 in expectation)."""
    a, b = np.asarray(times_a), np.asarray(times_b)
    ia, ib = rng.permutation(a.size), rng.permutation(b.size)
    fa, ta = a[ia[: a.size // 2]], a[ia[a.size // 2:]]
    fb, tb = b[ib[: b.size // 2]], b[ib[b.size // 2:]]
    best, best_t, sign = -1.0, 0.0, 1.0
    for t in np.quantile(np.r_[fa, fb], np.linspace(0.02, 0.98, 49)):
        for s in (1.0, -1.0):  # "ordered" is faster (s = 1) or slower (s = -1) than t
            adv = np.mean(s * fa < s * t) - np.mean(s * fb < s * t)
            if adv > best:
                best, best_t, sign = adv, t, s
    return float(np.mean(sign * ta < sign * best_t) - np.mean(sign * tb < sign * best_t))


@pytest.mark.parametrize("n", [2_000, 20_000])
def test_rerank_time_does_not_follow_the_servers_order(n):
    """Issue #35, finding 12b: numpy's stable sort is faster on ordered values, so a server that
    ordered its codes by distance from a guessed query made rank()'s time tell whether the guess
    was right (in-process TPR - FPR .26 to .68 from 325 to 65,536 candidates). rank() now takes
    the candidates in a CSPRNG permutation first: the attacker's classifier of the times, the
    server's order by distance from the (rightly guessed) query against a random order, scores
    within noise (4 standard errors of TPR - FPR on the held-out half)."""
    pytest.importorskip("faiss")
    import time

    from pm_vector.manifold.codes import ProductCodes

    g = np.random.default_rng()  # the test's own draws (the server's data and the worlds' order)
    pc = ProductCodes(code_bytes=16).fit(g.normal(size=(2000, 32)))
    codes = pc.encode(g.normal(size=(n, 32)))
    q = g.normal(size=32)
    q /= np.linalg.norm(q)
    by_distance = codes[np.argsort(pc.distances(q, codes), kind="stable")]  # the guess was right
    trials = 300
    worlds = g.permutation(np.r_[np.ones(trials, bool), np.zeros(trials, bool)])  # interleaved
    times = {True: [], False: []}
    for ordered in worlds:
        # a fresh array in both worlds, as the client's decoder gives it (the same array every trial
        # would sit warm in the cache and time itself, not the order)
        C = by_distance.copy() if ordered else codes[g.permutation(n)]
        t0 = time.perf_counter_ns()
        rank(q, codes=C, product_codes=pc)
        times[bool(ordered)].append(time.perf_counter_ns() - t0)
    adv = _timing_advantage(times[True], times[False], g)
    m = trials // 2
    bound = 4 * np.sqrt(2 * 0.25 / m)  # 4 standard errors of a difference of two rates (at most 1/2 each)
    print(f"\nre-rank timing attack, {n:,} candidates: TPR - FPR {adv:+.3f} (noise bound {bound:.3f}); "
          f"medians ordered {np.median(times[True]) / 1e3:.0f} us, random {np.median(times[False]) / 1e3:.0f} us")
    assert abs(adv) <= bound, (adv, bound)
    # the result is still the stable order of the distances in the candidates' order
    order, d = rank(q, codes=by_distance, product_codes=pc)
    np.testing.assert_array_equal(order, np.argsort(pc.distances(q, by_distance), kind="stable"))
    np.testing.assert_allclose(d, pc.distances(q, by_distance))


def test_equal_distances_keep_the_candidates_order():
    """The permutation does not change the result: ties (duplicate codes or features) come in
    candidate order, as a stable sort gives."""
    g = secure_generator()
    F = np.repeat(g.normal(size=(5, 6)), 40, axis=0)[g.permutation(200)]
    q = g.normal(size=6)
    for _ in range(20):
        order, d = rank(q, F)
        np.testing.assert_array_equal(order, np.argsort(np.linalg.norm(F - q, axis=1), kind="stable"))
