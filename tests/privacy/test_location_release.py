"""The location release (one report by M-ary randomized response, no label, no dummy rows): its exact
privacy loss by enumeration against the claim, a normalisation that must fail it, the exact sampler's
frequencies, work that does not depend on the secret or the outcome, and attacks that see only the
report (what the server sees), blind when the noise is infinite, printed beside their bounds."""

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.privacy import secure_generator
from pm_vector.privacy.location import (LocationRandomizedResponse, exact_loss, plan, rr_threshold,
                                        target_level)

TWO64 = 1 << 64


def _exp_upper(eps: float) -> Fraction:
    """A rational >= e^eps (60-digit decimal exp, raised by 10^-45 relative)."""
    with localcontext() as ctx:
        ctx.prec = 60
        return Fraction(Decimal(eps).exp() * (1 + Decimal(10) ** -45))


def _exp_lower(eps: float) -> Fraction:
    with localcontext() as ctx:
        ctx.prec = 60
        return Fraction(Decimal(eps).exp() * (1 - Decimal(10) ** -45))


def _laws(t: int, M: int) -> np.ndarray:
    """``(M, M)`` exact law: row a = the true cell, column r = the report, as Fractions."""
    pi = Fraction(t, TWO64)
    p, q = pi + (1 - pi) / M, (1 - pi) / M
    return [[p if r == a else q for r in range(M)] for a in range(M)]


def _max_loss(laws) -> Fraction:
    M = len(laws)
    return max(laws[a][r] / laws[b][r] for a in range(M) for b in range(M) for r in range(M))


# --------------------------------------------------------------------------- exact loss
@pytest.mark.parametrize("M", [2, 3, 8, 33])
@pytest.mark.parametrize("eps", [0.25, 1.0, 4.0, 16.0, 40.0])
def test_exact_privacy_loss_is_epsilon(M, eps):
    """Enumerating every pair of secrets (their true cells) and every report: the largest ratio is
    at most e^eps, and below it only by the 2^-64 grid of the threshold (relative
    ``(e^eps + M) / (M 2^64)``, plus 1e-12): the whole request is eps-DP, and no slack is wasted."""
    loss = _max_loss(_laws(rr_threshold(eps, M), M))
    assert loss == exact_loss(rr_threshold(eps, M), M)
    assert loss <= _exp_upper(eps)
    grid = (_exp_upper(eps) + M) / (M * Fraction(TWO64))
    assert loss >= _exp_lower(eps) * (1 - Fraction(1, 10 ** 12) - 2 * grid), float(loss)


def test_a_wrong_normalisation_loses_more_than_eps():
    """The enumeration can fail: pi computed with M instead of M - 1 in the denominator (the same
    rounding) releases with a loss above eps."""
    for M, eps in ((2, 1.0), (8, 4.0), (100, 2.0)):
        e = _exp_lower(eps)
        wrong = int((e - 1) / (e + M - 2) * TWO64)
        loss = _max_loss(_laws(wrong, M))
        assert loss > _exp_upper(eps), (M, eps, float(loss))


def test_level_above_every_threshold_and_large_levels():
    """At M = 2^20 and eps 16 the threshold is still the exact-rational law the proof uses."""
    M, eps = 1 << 20, 16.0
    t = rr_threshold(eps, M)
    assert exact_loss(t, M) <= _exp_upper(eps)
    assert 0 < t < TWO64


# --------------------------------------------------------------------------- the sampler
@pytest.mark.parametrize("eps,M", [(0.5, 2), (1.0, 4), (2.0, 8), (0.1, 3), (3.7, 5)])
def test_sampler_frequencies_are_p_and_q(eps, M):
    m = LocationRandomizedResponse(eps, M)
    n = 40_000
    a = M // 2
    counts = np.bincount(m.sample(a, n, secure_generator(int(eps * 1000) + M)), minlength=M)
    expected = np.full(M, m.q_ * n)
    expected[a] = m.p_ * n
    assert math.isclose(m.p_ + (M - 1) * m.q_, 1.0)
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # the same frequencies from the OS CSPRNG (the production generator)
    counts = np.bincount(m.sample(a, 20_000), minlength=M)
    assert stats.chisquare(counts, expected * 0.5).pvalue > 1e-4


def test_a_wrong_p_is_caught_by_the_chi_square():
    M, eps, n = 4, 1.0, 40_000
    draws = LocationRandomizedResponse(eps, M - 1).sample(1, n, secure_generator(5))
    m = LocationRandomizedResponse(eps, M)
    expected = np.full(M, m.q_ * n)
    expected[1] = m.p_ * n
    assert stats.chisquare(np.bincount(draws, minlength=M), expected).pvalue < 1e-6


def test_infinite_epsilon_reports_the_true_cell():
    m = LocationRandomizedResponse(float("inf"), 8)
    assert m.delta == 0.0 and (m.p_, m.q_) == (1.0, 0.0)
    assert np.all(m.sample(5, 100, secure_generator(0)) == 5)


def test_bad_parameters_are_refused():
    for eps in (0, -1, float("nan"), "1", True):
        with pytest.raises(PrivacyParameterError):
            LocationRandomizedResponse(eps, 4)
    for M in (1, 0, 2.5, True, 1 << 21):
        with pytest.raises(InvalidInputError):
            LocationRandomizedResponse(1.0, M)
    m = LocationRandomizedResponse(1.0, 4)
    for a in (4, -1, 1.0, True):
        with pytest.raises(InvalidInputError):
            m.release(a)


class _Counting(np.random.Generator):
    """A seeded generator that records every draw (method, bounds and size) it serves."""

    def __init__(self, seed):
        super().__init__(np.random.PCG64(seed))
        self.calls = []

    def integers(self, low, high=None, size=None, **kw):
        self.calls.append(("integers", low, high, size))
        return super().integers(low, high, size=size, **kw)


def test_sampler_work_is_the_same_for_every_secret_and_every_outcome():
    """Fixed work: from the same generator state, every true cell draws the same words in the same
    calls and leaves the generator in the same state; whether the report is the truth changes no
    draw (issue: the old rejection loop ran longer when it was not)."""
    M, eps = 16, 2.0
    m = LocationRandomizedResponse(eps, M)
    outcomes = {True: 0, False: 0}
    for seed in range(200):
        traces, states, reports = [], [], []
        for a in range(M):
            g = _Counting(seed)
            reports.append(m.release(a, g))
            traces.append(g.calls)
            states.append(g.bit_generator.state["state"]["state"])
        assert all(t == traces[0] for t in traces) and len(set(states)) == 1
        for a, r in enumerate(reports):
            outcomes[r == a] += 1
    assert outcomes[True] > 0 and outcomes[False] > 0  # both outcomes were seen, with the same work


def test_secure_generator_words_do_not_depend_on_the_secret():
    """With the OS CSPRNG, the words one release consumes are the same number for every true cell."""
    from pm_vector.privacy.rng import SecureRandom

    used = []
    for a in (0, 3, 7):
        g = SecureRandom()
        before = g._pos
        for _ in range(50):
            LocationRandomizedResponse(1.0, 8).release(a, g)
        used.append(g._pos - before)
    # uniform draws on [0, 8) never reject (8 is a power of two): exactly 3 words per release
    assert used == [150, 150, 150]


# --------------------------------------------------------------------------- the public plan
def test_plan_is_a_function_of_public_numbers_and_fits_the_budget():
    st = tuple(range(16, 257, 16))
    lv = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
    for n in (300, 10_000, 68_000, 1_000_000):
        for mb in (8_000, 50_000, 350_000, 5_000_000):
            prev = None
            for e in (1.0, 2.0, 4.0, 8.0, 16.0):
                p = plan(e, n_items=n, levels=lv, widths=st, max_bytes=mb)
                assert p.answer_bytes() <= mb and p.level in lv and p.code_bytes in st
                assert p == plan(e, n_items=n, levels=lv, widths=st, max_bytes=mb)
                if prev is not None:  # more eps: never coarser cells, never narrower codes
                    assert p.level >= prev.level and p.code_bytes >= prev.code_bytes
                prev = p
    assert target_level(1.0, 10_000, 2_000) < target_level(16.0, 10_000, 2_000)
    with pytest.raises(InvalidInputError):
        plan(4.0, n_items=100, levels=lv, widths=st, max_bytes=1_000)
    with pytest.raises(InvalidInputError):
        plan(4.0, n_items=100, levels=lv, widths=st, code_bytes=17)


# --------------------------------------------------------------------------- attacks (the server's view)
BLIND_EPS = 1e-9
ATTACK_EPS = (1.0, 4.0, 16.0)


@pytest.fixture(scope="module")
def location_cells(digits_split):
    from pm_vector.manifold.public_cells import fit_location_cells

    return fit_location_cells(digits_split.anchor[0], levels=(2, 4, 8, 16, 32))


def _level(eps):
    return 8 if eps < 2 else 32


def test_which_cell_attack_is_bounded_and_blind(location_cells, digits_split):
    """The server guesses the query's cell from the report alone (its best guess: the report).
    Measured against the eps-DP bound e^eps / (e^eps + M - 1) for a uniform prior over M cells,
    here on the queries' real (non-uniform) cells, where the bound holds per cell."""
    Xq, _ = digits_split.query
    n = 3000
    se = math.sqrt(0.25 / n)
    rows = []
    for eps in (BLIND_EPS,) + ATTACK_EPS:
        M = _level(eps)
        m = LocationRandomizedResponse(eps, M)
        cells = location_cells.assign(Xq, 0, M)
        g = secure_generator(int(eps) + 31)
        right = sum(int(m.release(int(cells[t % len(Xq)]), g) == cells[t % len(Xq)]) for t in range(n))
        rate, bound = right / n, math.exp(eps) / (math.exp(eps) + M - 1)
        rows.append((eps, M, rate, bound))
        assert rate <= bound + 4 * se, (eps, rate, bound)
    print("\nwhich-cell attack (report = guess): " + "; ".join(f"eps {e:g} M={M}: {r:.3f} (bound {b:.3f})"
                                                             for e, M, r, b in rows))
    assert abs(rows[0][2] - 1 / rows[0][1]) < 4 * se  # blind as eps -> 0
    assert rows[-1][2] > 0.9  # the attack has power


def test_two_query_distinguishing_attack_is_bounded_and_blind(location_cells, digits_split):
    """Two public candidate queries in different cells; the client sends one (the secret bit). The
    server guesses by the report's likelihood. Bounded by e^eps / (1 + e^eps), blind at eps -> 0."""
    Xq, _ = digits_split.query
    n = 3000
    se = math.sqrt(0.25 / n)
    rows = []
    for eps in (BLIND_EPS,) + ATTACK_EPS:
        M = _level(eps)
        m = LocationRandomizedResponse(eps, M)
        cells = location_cells.assign(Xq, 0, M)
        attacker = np.random.default_rng(int(eps) + 3)
        g = secure_generator(int(eps) + 5)
        right = 0
        for _ in range(n):
            i, j = attacker.choice(len(Xq), 2, replace=False)
            while cells[i] == cells[j]:
                i, j = attacker.choice(len(Xq), 2, replace=False)
            b = int(attacker.integers(2))
            r = m.release(int(cells[(i, j)[b]]), g)
            guess = 0 if r == cells[i] else 1 if r == cells[j] else int(attacker.integers(2))
            right += int(guess == b)
        rate, bound = right / n, math.exp(eps) / (1 + math.exp(eps))
        rows.append((eps, rate, bound))
        assert rate <= bound + 4 * se, (eps, rate, bound)
    print("\ntwo-query attack: " + "; ".join(f"eps {e:g}: {r:.3f} (bound {b:.3f})" for e, r, b in rows))
    assert abs(rows[0][1] - 0.5) < 4 * se
    assert rows[-1][1] > 0.9


def test_a_forged_item_count_sizes_no_request_beyond_the_budget_and_no_answer_beyond_the_request():
    """Issue #35, finding 12b: a server published ``n_items = 10^5`` for a small collection (nothing
    checks it): a 1 MB-budget client asked for 27,736 candidates, and their payloads were not
    counted. The count only caps the plan: the candidates are what the byte budget holds with
    every candidate's id, code and payload at its bound on the client's wire; and the answer is
    checked against the request (never more than its candidates) and its own ``n_items``."""
    from pm_vector.privacy.location import candidate_bytes
    from pm_vector.protocol.location import LocationRequest, check_location_answer, payload_wire_bytes

    st, lv = (16, 32), (2, 4, 8, 16, 32)
    for wire in ("msgpack", "json"):
        for bound in (0, 256, 4096):
            pb = payload_wire_bytes(bound, wire)
            p = plan(4.0, n_items=10 ** 5, levels=lv, widths=st, max_bytes=1 << 20, payload_bytes=pb, wire=wire)
            assert p.answer_bytes() <= 1 << 20
            assert p.candidates * candidate_bytes(p.code_bytes, pb, wire) <= (1 << 20) - 1_500
            if bound:
                assert p.candidates < 27_736
    req = LocationRequest(report=1, level=8, epsilon=4.0, locations_digest="ab", candidates=50, code_bytes=16)

    def answer(n, declared=None):
        a = {"release": "location", "level": 8, "report": 1, "run_id": 7, "codes": {"digest": "cd", "bytes": 16},
             "item_ids": np.arange(n, dtype=np.uint32), "codes_data": bytes(16 * n)}
        if declared is not None:
            a["n_items"] = declared
        return a

    def check(a, n_items=10 ** 5):
        return check_location_answer(a, req, n_items=n_items, codes_digest="cd", run_id=7)

    assert check(answer(50))[0].size == 50  # min(candidates, published count)
    assert check(answer(40, 40))[0].size == 40  # the run holds 40 now (after a delete)
    assert check(answer(50, 10 ** 9))[0].size == 50  # a count above the request's candidates: still 50
    for bad in (answer(60), answer(60, 60), answer(39, 40), answer(41, 40), answer(50, -1), answer(50, True),
                answer(50, "50"), answer(50, 1 << 41)):
        with pytest.raises(InvalidInputError):
            check(bad)
