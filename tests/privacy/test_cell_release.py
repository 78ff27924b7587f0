"""The cell release (K-ary randomized response of the real row, uniform dummy rows): its exact
privacy loss by enumeration against the claim, mechanisms that must fail it, the exact sampler's
frequencies, and attacks that see only what the server sees."""

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.privacy import secure_generator
from pm_vector.privacy.cell_release import (GAUSSIAN_ABOVE, CellRandomizedResponse, cell_level_for_epsilon,
                                            max_cells_for, release_for_epsilon, rr_probabilities)


# --------------------------------------------------------------------------- the sampler
@pytest.mark.parametrize("eps,K", [(0.5, 2), (1.0, 4), (2.0, 8), (0.1, 3), (3.7, 5)])
def test_sampler_frequencies_are_p_and_q(eps, K):
    m = CellRandomizedResponse(eps, K)
    n = 40_000
    a = K // 2
    draws = m.sample(a, n, secure_generator(int(eps * 1000) + K))
    counts = np.bincount(draws, minlength=K)
    p, q = rr_probabilities(eps, K)
    expected = np.full(K, q * n)
    expected[a] = p * n
    assert math.isclose(p + (K - 1) * q, 1.0)
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_a_wrong_p_is_caught_by_the_chi_square():
    """The test above can fail: frequencies of RR computed with K - 1 instead of K are rejected."""
    K, eps, n = 4, 1.0, 40_000
    draws = CellRandomizedResponse(eps, K - 1).sample(1, n, secure_generator(5))
    draws = np.where(draws == 1, 1, np.where(draws == 0, 0, 3))  # cells 0, 1 and 3 only
    p, q = rr_probabilities(eps, K)
    expected = np.full(K, q * n)
    expected[1] = p * n
    assert stats.chisquare(np.bincount(draws, minlength=K), expected).pvalue < 1e-6


def test_release_has_uniform_dummy_rows_and_rr_real_row():
    K, C, eps, n = 4, 3, 1.0, 6000
    m = CellRandomizedResponse(eps, K)
    g = secure_generator(11)
    out = np.stack([m.release(1, 2, C, g) for _ in range(n)])
    assert out.dtype == np.int64 and out.shape == (n, C)
    p, q = rr_probabilities(eps, K)
    real = np.bincount(out[:, 1], minlength=K)
    assert stats.chisquare(real, [q * n, q * n, p * n, q * n]).pvalue > 1e-3
    for j in (0, 2):
        assert stats.chisquare(np.bincount(out[:, j], minlength=K)).pvalue > 1e-3


def test_infinite_epsilon_reports_the_true_cell():
    m = CellRandomizedResponse(float("inf"), 8)
    assert m.delta == 0.0 and (m.p_, m.q_) == (1.0, 0.0)
    assert np.all(m.sample(5, 100, secure_generator(0)) == 5)


def test_bad_parameters_are_refused():
    for eps in (0, -1, float("nan"), "1", True):
        with pytest.raises(PrivacyParameterError):
            CellRandomizedResponse(eps, 4)
    for K in (1, 0, 2.5, True):
        with pytest.raises(InvalidInputError):
            CellRandomizedResponse(1.0, K)
    m = CellRandomizedResponse(1.0, 4)
    for args in ((3, 0, 3), (0, 4, 3), (-1, 0, 3), (0, 0, 0)):
        with pytest.raises(InvalidInputError):
            m.release(*args)


def test_public_rules_are_functions_of_eps_and_levels():
    levels = (2, 4, 8, 16, 32, 64, 100)
    ks = [cell_level_for_epsilon(e, levels) for e in (1, 2, 4, 8, 16, 64, float("inf"))]
    assert ks == [4, 4, 8, 64, 100, 100, 100]  # the measured rule (README "Where the limit binds")
    assert [cell_level_for_epsilon(e, levels, max_cells=78) for e in (4, 8, 16)] == [8, 64, 64]
    assert cell_level_for_epsilon(64, (2, 4)) == 4 and cell_level_for_epsilon(1, (8, 16), max_cells=4) == 8
    assert max_cells_for(10_000, 10, 128) == 78 and max_cells_for(1000, 10, 32) == 31
    assert release_for_epsilon(1.0) == "cells" and release_for_epsilon(64.0) == "cells"
    assert release_for_epsilon(float("inf")) == "gaussian" and release_for_epsilon(GAUSSIAN_ABOVE) == "gaussian"


# --------------------------------------------------------------------------- exact privacy loss
def _rr_row(a, K, p, q):
    return [p if r == a else q for r in range(K)]


def _laws(C, Ks, real_row_law, dummy_law):
    """Every input (class c, true cell a) -> its per-row output laws (lists of Fractions):
    row c is ``real_row_law(a, K_c)``, every other row j ``dummy_law(j, K_j)``."""
    return {(c, a): [real_row_law(a, Ks[j]) if j == c else dummy_law(j, Ks[j]) for j in range(C)]
            for c in range(C) for a in range(Ks[c])}


def _max_ratio(laws, Ks):
    """max over every pair of inputs (same class and class change) and every output R of
    P(R | one) / P(R | other), by enumeration of all outputs (exact Fractions)."""
    import itertools

    outputs = list(itertools.product(*[range(K) for K in Ks]))
    probs = {}
    for key, rows in laws.items():
        pr = []
        for R in outputs:
            v = Fraction(1)
            for j, r in enumerate(R):
                v *= rows[j][r]
            pr.append(v)
        assert sum(pr) == 1
        probs[key] = pr
    worst = Fraction(0)
    for x, px in probs.items():
        for y, py in probs.items():
            if x != y:
                worst = max(worst, max(a / b for a, b in zip(px, py)))
    return worst


def _mechanism_laws(C, K, eps):
    """The laws of CellRandomizedResponse with its own (float) q, as exact Fractions (p = 1 - (K-1) q,
    within 1e-16 of the float p_, so the law sums to 1 exactly)."""
    m = CellRandomizedResponse(eps, K)
    q = Fraction(m.q_)
    p = 1 - (K - 1) * q
    assert abs(float(p) - m.p_) < 1e-15
    u = Fraction(1, K)
    return _laws(C, [K] * C, lambda a, k: _rr_row(a, k, p, q), lambda j, k: [u] * k), p / q


CK = [(2, 2), (2, 8), (3, 3), (3, 8), (4, 2), (4, 4), (4, 5)]


@pytest.mark.parametrize("C,K", CK)
@pytest.mark.parametrize("eps", [0.25, 2.5])
def test_exact_privacy_loss_is_epsilon(C, K, eps):
    laws, pq = _mechanism_laws(C, K, eps)
    worst = _max_ratio(laws, [K] * C)
    assert worst == pq  # attained (same class, and class change), never exceeded
    assert abs(math.log(worst) - eps) < 1e-12


@pytest.mark.parametrize("C,K", [(2, 3), (3, 4), (4, 2)])
@pytest.mark.parametrize("e_eps", [Fraction(2), Fraction(7, 2), Fraction(10)])
def test_exact_privacy_loss_with_rational_exp_eps(C, K, e_eps):
    """With e^eps rational, p and q are exact rationals and the largest ratio is exactly e^eps."""
    den = e_eps + K - 1
    p, q, u = e_eps / den, 1 / den, Fraction(1, K)
    assert (p, q) == (Fraction(rr_probabilities(math.log(e_eps), K)[0]).limit_denominator(10 ** 6),
                      Fraction(rr_probabilities(math.log(e_eps), K)[1]).limit_denominator(10 ** 6))
    laws = _laws(C, [K] * C, lambda a, k: _rr_row(a, k, p, q), lambda j, k: [u] * k)
    assert _max_ratio(laws, [K] * C) == e_eps
    # the class-change pairs alone attain e^eps too: the dummy rows cost nothing
    change = {key: v for key, v in laws.items() if key[1] == 0}
    assert _max_ratio(change, [K] * C) == e_eps


@pytest.mark.parametrize("C,K", [(2, 3), (3, 4), (4, 3), (3, 8)])
def test_rr_computed_with_k_minus_1_loses_more_than_eps(C, K):
    eps = 1.0
    e = Fraction(math.exp(eps))
    p = e / (e + K - 2)  # the wrong T: K - 1 cells in the normaliser
    q = (1 - p) / (K - 1)
    u = Fraction(1, K)
    laws = _laws(C, [K] * C, lambda a, k: _rr_row(a, k, p, q), lambda j, k: [u] * k)
    assert math.log(_max_ratio(laws, [K] * C)) > eps + 0.05


@pytest.mark.parametrize("C,K", [(2, 3), (3, 4), (4, 3)])
def test_dummy_rows_reporting_rr_of_a_dummy_cell_lose_more_than_eps(C, K):
    """The variant the design refuses: each dummy row is the RR of a random public dummy's cell
    (the dummy pool's cells are not uniform): the class change then costs up to 2 eps."""
    eps = 1.0
    laws, _ = _mechanism_laws(1, K, eps)
    p, q = laws[(0, 0)][0][0], laws[(0, 0)][0][1]
    g = np.random.default_rng(C * 10 + K)
    dummy_law = {}
    for j in range(C):
        w = [Fraction(int(v)) for v in g.integers(1, 20, size=K)]
        pool = [x / sum(w) for x in w]  # the dummy pool's cell frequencies in class j
        dummy_law[j] = [sum(pool[b] * _rr_row(b, K, p, q)[r] for b in range(K)) for r in range(K)]
    laws = _laws(C, [K] * C, lambda a, k: _rr_row(a, k, p, q), lambda j, k: dummy_law[j])
    assert math.log(_max_ratio(laws, [K] * C)) > eps + 0.01
    # a point-mass pool (every dummy in cell 0) reaches 2 eps exactly
    point = {j: _rr_row(0, K, p, q) for j in range(C)}
    laws = _laws(C, [K] * C, lambda a, k: _rr_row(a, k, p, q), lambda j, k: point[j])
    assert abs(math.log(_max_ratio(laws, [K] * C)) - 2 * eps) < 1e-12


@pytest.mark.parametrize("Ks", [(2, 3), (2, 4, 8), (3, 3, 5)])
def test_a_k_that_differs_between_classes_loses_more_than_eps(Ks):
    eps = 1.0
    e = Fraction(math.exp(eps))

    def real(a, k):
        return _rr_row(a, k, e / (e + k - 1), 1 / (e + k - 1))
    laws = _laws(len(Ks), list(Ks), real, lambda j, k: [Fraction(1, k)] * k)
    loss = math.log(_max_ratio(laws, list(Ks)))
    f = [k / (float(e) + k - 1) for k in Ks]
    assert loss > eps + 1e-3
    assert abs(loss - (eps + math.log(max(f) / min(f)))) < 1e-12  # e^eps f(K_c) / f(K_c'), as the docstring says


def test_release_joint_frequencies_match_the_enumerated_law():
    """The sampler's whole output (every row) follows the law the enumeration above bounds."""
    import itertools

    C, K, eps, n = 2, 3, 1.0, 12_000
    laws, _ = _mechanism_laws(C, K, eps)
    m = CellRandomizedResponse(eps, K)
    g = secure_generator(3)
    out = np.stack([m.release(0, 2, C, g) for _ in range(n)])
    counts = np.bincount(out[:, 0] * K + out[:, 1], minlength=K * K)
    rows = laws[(0, 2)]
    expected = [float(rows[0][r0] * rows[1][r1]) * n for r0, r1 in itertools.product(range(K), range(K))]
    assert stats.chisquare(counts, expected).pvalue > 1e-3


# --------------------------------------------------------------------------- attacks (what the server sees)
ATTACK_EPS = (1.0, 4.0, 16.0)
BLIND_EPS = 1e-9


@pytest.fixture(scope="module")
def public_cells(digits_split):
    from pm_vector.manifold.public_cells import PublicCells

    Xa, ya = digits_split.anchor
    return PublicCells(levels=(2, 4, 8, 16)).fit(Xa, ya)


def _level(cells, eps):
    return cell_level_for_epsilon(max(eps, 0.5), cells.levels_)


def _which_row_rate(cells, anchor, queries, eps, n, seed):
    """The server guesses the real row from the reports alone: row j's report r has likelihood
    ratio sum_a pi_j(a) T(a, r) / (1/K) of being real (pi_j: the public anchor's cell shares in
    class j), the guess is the largest (ties at random). Returns the share of right guesses."""
    Xa, ya = anchor
    Xq, yq = queries
    K = _level(cells, eps)
    m = CellRandomizedResponse(eps, K)
    C = cells.classes_.size
    pi = np.stack([np.bincount(cells.assign(Xa[ya == c], j, K), minlength=K) / np.sum(ya == c)
                   for j, c in enumerate(cells.classes_)])
    T = np.full((K, K), m.q_)
    np.fill_diagonal(T, m.p_)
    like = pi @ T * K  # (C, K): likelihood ratio of "real" for a report r in row j
    ci = cells.class_index(yq)
    cell = cells.assign(Xq, ci, K)
    g = secure_generator(seed)
    attacker = np.random.default_rng(seed + 1)
    right = 0
    for t in range(n):
        i = t % len(yq)
        R = m.release(int(ci[i]), int(cell[i]), C, g)  # the secret enters only here
        score = like[np.arange(C), R]
        best = np.flatnonzero(score == score.max())
        right += int(attacker.choice(best) == ci[i])
    return right / n


def _distinguishing_rate(cells, queries, eps, n, seed, same_class):
    """Two public candidate queries x0, x1 (same class, or different classes); the client sends
    one (the secret bit). The server picks the candidate with the larger likelihood of the reports
    (the mechanism's public law; ties at random). Returns the share of right guesses."""
    Xq, yq = queries
    K = _level(cells, eps)
    m = CellRandomizedResponse(eps, K)
    C = cells.classes_.size
    ci = cells.class_index(yq)
    cell = cells.assign(Xq, ci, K)
    pairs = [(i, j) for i in range(len(yq)) for j in range(len(yq))
             if (ci[i] == ci[j]) == same_class and (not same_class or cell[i] != cell[j])]
    g = secure_generator(seed)
    attacker = np.random.default_rng(seed + 1)

    def loglik(R, i):
        c = ci[i]
        return math.log(m.p_ if R[c] == cell[i] else m.q_) if m.q_ > 0 else (0.0 if R[c] == cell[i] else -math.inf)
    right = 0
    for t in range(n):
        pair = pairs[attacker.integers(len(pairs))]
        b = int(attacker.integers(2))
        i = pair[b]
        R = m.release(int(ci[i]), int(cell[i]), C, g)
        l0, l1 = loglik(R, pair[0]), loglik(R, pair[1])
        guess = int(attacker.integers(2)) if l0 == l1 else int(l1 > l0)
        right += int(guess == b)
    return right / n


def test_which_row_attack_is_bounded_and_blind(public_cells, digits_split):
    C = public_cells.classes_.size
    n = 2000
    se = math.sqrt(0.25 / n)
    blind = _which_row_rate(public_cells, digits_split.anchor, digits_split.query, BLIND_EPS, n, 1)
    assert abs(blind - 1 / C) < 4 * se, blind
    print(f"\nwhich-row attack (C={C}): eps -> 0: {blind:.3f} (1/C = {1 / C:.3f})")
    rates = []
    for eps in ATTACK_EPS:
        rate = _which_row_rate(public_cells, digits_split.anchor, digits_split.query, eps, n, int(eps) + 2)
        bound = math.exp(eps) / (math.exp(eps) + C - 1)
        print(f"  eps {eps:g} (K={_level(public_cells, eps)}): measured {rate:.3f}, eps-DP bound {bound:.3f}")
        assert rate <= bound + 4 * se
        rates.append(rate)
    assert rates[-1] > 1 / C + 4 * se  # the attack has power: it is not blind by construction


@pytest.mark.parametrize("same_class", [True, False], ids=["same-class", "class-change"])
def test_two_query_distinguishing_attack_is_bounded_and_blind(public_cells, digits_split, same_class):
    n = 2000
    se = math.sqrt(0.25 / n)
    blind = _distinguishing_rate(public_cells, digits_split.query, BLIND_EPS, n, 5, same_class)
    assert abs(blind - 0.5) < 4 * se, blind
    print(f"\ntwo-query attack ({'same class' if same_class else 'class change'}): eps -> 0: {blind:.3f} (1/2)")
    for eps in ATTACK_EPS:
        rate = _distinguishing_rate(public_cells, digits_split.query, eps, n, int(eps) + 7, same_class)
        bound = math.exp(eps) / (1 + math.exp(eps))
        print(f"  eps {eps:g} (K={_level(public_cells, eps)}): measured {rate:.3f}, eps-DP bound {bound:.3f}")
        assert rate <= bound + 4 * se
        if eps >= 4:
            assert rate > 0.5 + 10 * se  # the attack has power


def test_real_row_sampler_work_does_not_depend_on_the_true_cell():
    """The cell release's real row uses the location release's fixed-work sampler: from the same
    generator state, every true cell leaves the generator in the same state (the old rejection loop
    drew more when the report was not the true cell: a timing channel inside the client)."""
    m = CellRandomizedResponse(2.0, 8)
    for seed in range(50):
        states = set()
        for a in range(8):
            g = np.random.default_rng(seed)
            m.release(1, a, 3, g)
            states.add(g.bit_generator.state["state"]["state"])
        assert len(states) == 1
