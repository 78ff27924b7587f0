"""PrivacyAccountant: exact compositions, budget refusal, persistence."""

from __future__ import annotations

import json
import math

import pytest

from pm_vector.errors import BudgetExceededError, InvalidInputError, PrivacyParameterError
from pm_vector.privacy import PrivacyAccountant
from pm_vector.privacy.accountant import advanced_composition


def test_empty_accountant():
    assert PrivacyAccountant().total() == (0.0, 0.0)
    assert PrivacyAccountant().total(delta_slack=1e-6) == (0.0, 0.0)


def test_basic_composition_exact():
    acc = PrivacyAccountant()
    acc.spend(0.1, 1e-5, label="first iterate")
    acc.spend(0.2, 2e-5)
    acc.spend(0.3, 0.0, label="laplace")
    eps, delta = acc.total()
    assert eps == pytest.approx(0.6, abs=1e-15) and delta == pytest.approx(3e-5, abs=1e-20)
    assert [s.label for s in acc.spends] == ["first iterate", None, "laplace"]
    assert len(acc) == 3


def test_advanced_composition_homogeneous_exact():
    # k = 100 releases of (0.1, 1e-7), delta' = 1e-6:
    # eps' = sqrt(2 * 100 * ln(1e6)) * 0.1 + 100 * 0.1 * (e^0.1 - 1) = 5.256522... + 1.051709... = 6.308231...
    acc = PrivacyAccountant()
    for _ in range(100):
        acc.spend(0.1, 1e-7)
    want = math.sqrt(2 * 100 * math.log(1e6)) * 0.1 + 100 * 0.1 * (math.exp(0.1) - 1)
    assert want == pytest.approx(6.3082310, rel=1e-7)
    eps, delta = acc.total(delta_slack=1e-6)
    assert eps == pytest.approx(want, rel=1e-12)
    assert delta == pytest.approx(100 * 1e-7 + 1e-6, rel=1e-12)
    assert acc.total() == pytest.approx((10.0, 1e-5))          # basic is larger here, so both differ


def test_advanced_composition_heterogeneous_exact():
    """The heterogeneous theorem is offered for a sequence fixed in advance (a function), not as
    the accountant's composition of adaptively chosen parameters."""
    eps_list = [0.05] * 50 + [0.2] * 10 + [0.01] * 200
    want = (math.sqrt(2 * math.log(1 / 1e-5) * sum(e * e for e in eps_list))
            + sum(e * (math.exp(e) - 1) for e in eps_list))
    eps, delta = advanced_composition(eps_list, [1e-9] * len(eps_list), 1e-5)
    assert want < sum(eps_list) == pytest.approx(6.5)
    assert eps == pytest.approx(want, rel=1e-12)
    assert delta == pytest.approx(260 * 1e-9 + 1e-5, rel=1e-12)
    # the accountant reports basic composition for that (heterogeneous) sequence
    acc = PrivacyAccountant()
    for e in eps_list:
        acc.spend(e, 1e-9)
    assert acc.total(delta_slack=1e-5) == pytest.approx((6.5, 260e-9))
    with pytest.raises(PrivacyParameterError):
        advanced_composition([0.1], [0.0], 0.0)
    with pytest.raises(ValueError):
        advanced_composition([0.1, 0.2], [0.0], 1e-6)


def test_advanced_composition_refuses_adaptively_changed_parameters():
    """Advanced composition is a proven stopping rule only for one fixed (eps0, delta0): an
    accountant using it refuses a release of other parameters (the old one accepted any
    sequence, e.g. an analyst lowering eps after seeing answers to squeeze more releases in)."""
    acc = PrivacyAccountant(epsilon_budget=7.0, delta_budget=2e-5, delta_slack=1e-6)
    for _ in range(100):
        acc.spend(0.1, 1e-7)
    before = acc.to_dict()
    for e, d in ((0.05, 1e-7), (0.1, 0.0), (0.2, 1e-7)):
        with pytest.raises(PrivacyParameterError, match="fixed"):
            acc.spend(e, d)
    assert acc.to_dict() == before
    # a basic-composition accountant (a filter for adaptive parameters) accepts any sequence
    basic = PrivacyAccountant(epsilon_budget=7.0, delta_budget=2e-5)
    for e in (0.1, 0.05, 3.0, 0.2):
        basic.spend(e, 1e-7)
    assert basic.total() == pytest.approx((3.35, 4e-7))


def test_advanced_composition_filter_admits_the_published_k_max():
    """With one fixed (eps0, delta0) the filter admits exactly the largest k for which Dwork &
    Roth's Thm 3.20, computed here directly, stays within both budgets."""
    e0, d0, slack, eps_budget, delta_budget = 0.1, 1e-7, 1e-6, 4.0, 1e-5

    def published(k):
        return (math.sqrt(2 * k * math.log(1 / slack)) * e0 + k * e0 * (math.exp(e0) - 1), k * d0 + slack)

    k_max = max(k for k in range(1, 200)
                if min(published(k)[0], k * e0) <= eps_budget
                and (published(k)[1] if published(k)[0] < k * e0 else k * d0) <= delta_budget)
    assert k_max > 40  # more than basic composition's 4.0 / 0.1
    acc = PrivacyAccountant(epsilon_budget=eps_budget, delta_budget=delta_budget, delta_slack=slack)
    n = 0
    while True:
        try:
            acc.spend(e0, d0)
        except BudgetExceededError:
            break
        n += 1
    assert n == k_max
    assert acc.total(slack) == pytest.approx(published(k_max), rel=1e-12)


def test_advanced_falls_back_to_basic_when_worse():
    acc = PrivacyAccountant()
    acc.spend(1.0, 1e-6)
    acc.spend(1.0, 1e-6)
    # advanced: sqrt(2 ln(1e5) * 2) + 2 (e - 1) = 6.79 + 3.44 > 2
    assert acc.total(delta_slack=1e-5) == (2.0, 2e-6)


def test_budget_refusal_records_nothing():
    acc = PrivacyAccountant(epsilon_budget=1.0, delta_budget=1e-5)
    acc.spend(0.6, 4e-6)
    before = acc.to_dict()
    with pytest.raises(BudgetExceededError):
        acc.spend(0.5, 1e-6)
    with pytest.raises(BudgetExceededError):
        acc.spend(0.1, 7e-6)
    with pytest.raises(BudgetExceededError):
        acc.check(0.41, 0.0)
    assert acc.to_dict() == before and len(acc) == 1
    acc.check(0.4, 6e-6)                       # exactly the remaining budget is allowed
    assert len(acc) == 1                       # check records nothing
    acc.spend(0.1, 1e-6)
    acc.spend(0.2, 1e-6)
    acc.spend(0.1, 4e-6)                       # 0.6 + 0.1 + 0.2 + 0.1 = 1.0 (float rounding tolerated)
    assert acc.total()[0] == pytest.approx(1.0)


def test_budget_with_advanced_composition():
    acc = PrivacyAccountant(epsilon_budget=7.0, delta_budget=2e-5, delta_slack=1e-6)
    for _ in range(100):
        acc.spend(0.1, 1e-7)                   # basic total would be 10 > 7; advanced 6.31 fits
    assert acc.total(delta_slack=1e-6)[0] == pytest.approx(6.3082310, rel=1e-7)
    with pytest.raises(PrivacyParameterError):
        acc.spend(1.0, 0.0)                    # other parameters: not covered (see below)
    with pytest.raises(BudgetExceededError):
        for _ in range(100):
            acc.spend(0.1, 1e-7)
    assert acc.total(delta_slack=1e-6)[0] <= 7.0 < len(acc) * 0.1


def test_persistence_roundtrip_through_json():
    acc = PrivacyAccountant(epsilon_budget=5.0, delta_budget=1e-4, delta_slack=1e-6)
    acc.spend(0.5, 1e-6, label="smlq release")
    acc.spend(0.5, 1e-6)
    restored = PrivacyAccountant.from_dict(json.loads(json.dumps(acc.to_dict())))
    assert restored.to_dict() == acc.to_dict()
    assert restored.total(1e-6) == acc.total(1e-6)
    with pytest.raises(PrivacyParameterError):
        restored.spend(0.25, 0.0)              # the fixed (eps0, delta0) survives the round trip
    basic = PrivacyAccountant.from_dict({**acc.to_dict(), "delta_slack": None})
    with pytest.raises(BudgetExceededError):
        basic.spend(4.5, 0.0)


@pytest.mark.parametrize("state", [
    {}, {"version": 2, "spends": []}, {"version": 1, "spends": "x"},
    {"version": 1, "spends": [{"epsilon": -1.0, "delta": 0.0}]},
    {"version": 1, "spends": [{"epsilon": 1.0, "delta": 1.5}]},
    {"version": 1, "spends": [{"epsilon": 1.0, "delta": 0.0, "label": 3}]},
    {"version": 1, "epsilon_budget": -1, "spends": []},
])
def test_from_dict_validates(state):
    with pytest.raises((InvalidInputError, PrivacyParameterError)):
        PrivacyAccountant.from_dict(state)


@pytest.mark.parametrize("eps,delta", [(0.0, 0.0), (-1.0, 0.0), (math.nan, 0.0), (math.inf, 0.0), (1.0, 1.0),
                                       (1.0, -0.1), (1.0, math.nan), ("1", 0.0)])
def test_bad_spend_is_refused_and_not_recorded(eps, delta):
    acc = PrivacyAccountant()
    with pytest.raises(PrivacyParameterError):
        acc.spend(eps, delta)
    assert len(acc) == 0


@pytest.mark.parametrize("kwargs", [dict(epsilon_budget=0.0), dict(delta_budget=1.0), dict(delta_slack=0.0),
                                    dict(delta_slack=math.nan), dict(epsilon_budget=math.inf)])
def test_bad_budgets(kwargs):
    with pytest.raises(PrivacyParameterError):
        PrivacyAccountant(**kwargs)
    with pytest.raises(PrivacyParameterError):
        PrivacyAccountant().total(delta_slack=0.0)
