"""Privacy accountant for one client's sequence of releases."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..errors import BudgetExceededError, InvalidInputError, PrivacyParameterError

__all__ = ["PrivacyAccountant", "Spend", "advanced_composition"]

_FORMAT_VERSION = 1
# Relative slack when comparing against a budget, so that e.g. 0.1 + 0.2 spent
# against a budget of 0.3 is not refused because of float rounding.
_BUDGET_RTOL = 1e-12


@dataclass(frozen=True)
class Spend:
    """One recorded release: an (epsilon, delta)-DP mechanism applied to the client's data."""

    epsilon: float
    delta: float
    label: str | None = None


def _check_spend(epsilon, delta) -> tuple[float, float]:
    for name, v in (("epsilon", epsilon), ("delta", delta)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(float(v)):
            raise PrivacyParameterError(f"{name} must be a real number; got {v!r}.")
    e, d = float(epsilon), float(delta)
    if not (e > 0 and math.isfinite(e)):
        raise PrivacyParameterError(f"epsilon must be finite and > 0; got {epsilon!r}.")
    if not 0 <= d < 1:
        raise PrivacyParameterError(f"delta must satisfy 0 <= delta < 1; got {delta!r}.")
    return e, d


#: THE bounds of a budget, one home (the accountant, the client's ledger and its settings,
#: :class:`pm_vector.client.settings.ClientSettings`, read them): each is a finite number > 0 and
#: below this (exclusive)
BUDGET_UPPER: dict[str, float] = {"epsilon_budget": math.inf, "delta_budget": 1.0, "delta_slack": 1.0}


def check_budget(name: str, value) -> float | None:
    """``value`` as a float when it is within the bounds of budget ``name`` (:data:`BUDGET_UPPER`; None
    stays None), else :class:`~pm_vector.errors.PrivacyParameterError`."""
    return _check_optional(name, value, upper=BUDGET_UPPER[name])


def budget_bounds(name: str) -> str:
    """The bounds of budget ``name`` in words: ``"finite and > 0"`` or ``"in (0, 1)"``."""
    hi = BUDGET_UPPER[name]
    return "finite and > 0" if hi == math.inf else f"in (0, {hi:g})"


def _check_optional(name: str, value, *, upper: float | None = None):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(float(value)):
        raise PrivacyParameterError(f"{name} must be a real number or None; got {value!r}.")
    v = float(value)
    if not (v > 0 and math.isfinite(v)) or (upper is not None and not v < upper):
        rng = f"0 < {name} < {upper:g}" if upper is not None else f"0 < {name} < inf"
        raise PrivacyParameterError(f"{name} must satisfy {rng}; got {value!r}.")
    return v


def _homogeneous(spends) -> bool:
    return all(s.epsilon == spends[0].epsilon and s.delta == spends[0].delta for s in spends)


def advanced_composition(epsilons, deltas, delta_slack: float) -> tuple[float, float]:
    """Heterogeneous advanced composition of releases whose parameters ``(eps_i, delta_i)`` were
    **all fixed before the first release** (mechanisms may still be chosen adaptively):
    ``eps' = sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i (e^{eps_i} - 1)``,
    ``delta = sum delta_i + delta'`` (Dwork, Rothblum & Vadhan 2010; Dwork & Roth 2014, Thm 3.20
    in its heterogeneous form). Not a stopping rule: with adaptively chosen parameters use basic
    composition (:class:`PrivacyAccountant`)."""
    spends = [Spend(*_check_spend(e, d)) for e, d in zip(epsilons, deltas, strict=True)]
    ds = check_budget("delta_slack", delta_slack)
    if ds is None:
        raise PrivacyParameterError("delta_slack must be a number in (0, 1).")
    if not spends:
        return 0.0, 0.0
    eps = [s.epsilon for s in spends]
    adv = math.sqrt(2.0 * math.log(1.0 / ds) * math.fsum(e * e for e in eps)) + math.fsum(e * math.expm1(e) for e in eps)
    return adv, math.fsum(s.delta for s in spends) + ds


class PrivacyAccountant:
    """Records the (epsilon, delta) of every release on one client's data, composes them, and
    refuses a release that would exceed the budget (a stopping rule: a *privacy filter*).

    What is proven, and therefore what this accountant does:

    * **basic composition** (default, ``delta_slack=None``): ``(sum eps_i, sum delta_i)``
      (Dwork & Roth 2014, Thm 3.16). As a stopping rule it is a valid privacy filter even when
      every release's mechanism *and* its (eps_i, delta_i) are chosen adaptively from earlier
      outputs (Rogers, Roth, Ullman & Vadhan 2016, "Privacy odometers and filters"): the whole
      interaction is (epsilon_budget, delta_budget)-DP.
    * **advanced composition** (``delta_slack = delta' > 0``), only for ``k`` releases of **one
      fixed** ``(eps0, delta0)`` (Dwork, Rothblum & Vadhan 2010; Dwork & Roth Thm 3.20):
      ``eps' = sqrt(2 k ln(1/delta')) eps0 + k eps0 (e^eps0 - 1)``,
      ``delta_total = k delta0 + delta'``, valid for adaptively chosen mechanisms whose
      parameters are fixed in advance. The first recorded release fixes ``(eps0, delta0)``
      (it is chosen before this accountant has released anything); a later release with other
      parameters is refused (:class:`~pm_vector.errors.PrivacyParameterError`), because advanced
      composition's formula with adaptively chosen eps_i is not a proven filter (Whitehouse,
      Ramdas, Rogers & Wu 2023 construct filters that allow it; none is implemented here). With one
      fixed ``(eps0, delta0)`` the budget check admits a fixed number ``k_max`` of releases
      (the totals grow with ``k`` alone), so the whole interaction is a ``k_max``-fold adaptive
      composition and is within the budget.

    :meth:`total` returns whichever pair has the smaller epsilon (basic, or advanced when it
    applies). Budgets (``epsilon_budget``, ``delta_budget``; None = unlimited *for this in-memory
    object*; the client's ledger, :class:`~pm_vector.client.budget.PrivacyBudget`, gives every
    collection without one a default budget instead) are checked with the accountant's own
    ``delta_slack`` before anything is recorded. Releases that were not recorded here are not
    covered. :func:`advanced_composition` is the heterogeneous theorem for a sequence of
    parameters fixed before the first release (a statement about that sequence, not a filter).
    """

    def __init__(self, epsilon_budget: float | None = None, delta_budget: float | None = None,
                 delta_slack: float | None = None):
        self.epsilon_budget = check_budget("epsilon_budget", epsilon_budget)
        self.delta_budget = check_budget("delta_budget", delta_budget)
        self.delta_slack = check_budget("delta_slack", delta_slack)
        self._spends: list[Spend] = []

    # ------------------------------------------------------------------ composition
    @staticmethod
    def _compose(spends, delta_slack: float | None) -> tuple[float, float]:
        if not spends:
            return 0.0, 0.0
        basic = (math.fsum(s.epsilon for s in spends), math.fsum(s.delta for s in spends))
        if delta_slack is None or not _homogeneous(spends):
            return basic  # advanced composition is proven only for one fixed (eps0, delta0)
        e0, d0, k = spends[0].epsilon, spends[0].delta, len(spends)
        adv_eps = math.sqrt(2.0 * k * math.log(1.0 / delta_slack)) * e0 + k * e0 * math.expm1(e0)
        if adv_eps < basic[0]:
            return adv_eps, k * d0 + delta_slack
        return basic

    def total(self, delta_slack: float | None = None) -> tuple[float, float]:
        """Total ``(epsilon, delta)`` of everything recorded.

        ``delta_slack=None``: basic composition. ``delta_slack > 0``: the smaller-epsilon one of
        basic and advanced composition (the latter adds ``delta_slack`` to delta), advanced only
        if every recorded release has the same (epsilon, delta) (class doc); otherwise basic.
        With nothing recorded: ``(0.0, 0.0)``.
        """
        return self._compose(self._spends, check_budget("delta_slack", delta_slack))

    # ------------------------------------------------------------------ budget
    def check(self, epsilon: float, delta: float) -> tuple[float, float]:
        """Return the totals after a release of (epsilon, delta), or raise :class:`BudgetExceededError`.

        Uses the accountant's ``delta_slack``. Records nothing. With ``delta_slack`` set, a
        release whose (epsilon, delta) differs from the first recorded one raises
        :class:`~pm_vector.errors.PrivacyParameterError` (class doc: not a proven filter).
        """
        e, d = _check_spend(epsilon, delta)
        if self.delta_slack is not None and self._spends and not _homogeneous([*self._spends, Spend(e, d)]):
            first = self._spends[0]
            raise PrivacyParameterError(
                f"this accountant composes by advanced composition (delta_slack={self.delta_slack:g}), which is "
                f"proven only for releases of one fixed (epsilon, delta), here ({first.epsilon:g}, {first.delta:g}) "
                f"from the first release; a release of ({e:g}, {d:g}) is refused and nothing was recorded. "
                "Use an accountant without delta_slack (basic composition: valid for adaptively chosen "
                "parameters).")
        after = self._compose([*self._spends, Spend(e, d)], self.delta_slack)
        if self.epsilon_budget is not None and after[0] > self.epsilon_budget * (1.0 + _BUDGET_RTOL):
            raise BudgetExceededError(
                f"release of (epsilon={e:g}, delta={d:g}) would bring the total epsilon to {after[0]:.6g} > budget "
                f"{self.epsilon_budget:g} (already spent {self.total(self.delta_slack)[0]:.6g}); nothing was recorded.")
        if self.delta_budget is not None and after[1] > self.delta_budget * (1.0 + _BUDGET_RTOL):
            raise BudgetExceededError(
                f"release of (epsilon={e:g}, delta={d:g}) would bring the total delta to {after[1]:.6g} > budget "
                f"{self.delta_budget:g}; nothing was recorded.")
        return after

    def spend(self, epsilon: float, delta: float = 0.0, label: str | None = None) -> tuple[float, float]:
        """Check the budget, then record the release; returns the new totals (with ``delta_slack``)."""
        if label is not None and not isinstance(label, str):
            raise InvalidInputError(f"label must be a str or None; got {type(label).__name__}.")
        after = self.check(epsilon, delta)
        e, d = _check_spend(epsilon, delta)
        self._spends.append(Spend(e, d, label))
        return after

    @property
    def spends(self) -> tuple[Spend, ...]:
        """The recorded releases, oldest first (read-only)."""
        return tuple(self._spends)

    def __len__(self) -> int:
        return len(self._spends)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        """JSON-serialisable state (``json.dumps`` works on it)."""
        return {"version": _FORMAT_VERSION, "epsilon_budget": self.epsilon_budget, "delta_budget": self.delta_budget,
                "delta_slack": self.delta_slack,
                "spends": [{"epsilon": s.epsilon, "delta": s.delta, "label": s.label} for s in self._spends]}

    @classmethod
    def from_dict(cls, data: dict) -> "PrivacyAccountant":
        """Rebuild an accountant from :meth:`to_dict` output; every field is re-validated."""
        if not isinstance(data, dict) or data.get("version") != _FORMAT_VERSION:
            raise InvalidInputError(f"not a PrivacyAccountant state of version {_FORMAT_VERSION}: {data!r:.200}")
        acc = cls(data.get("epsilon_budget"), data.get("delta_budget"), data.get("delta_slack"))
        spends = data.get("spends")
        if not isinstance(spends, list):
            raise InvalidInputError("PrivacyAccountant state has no 'spends' list.")
        for item in spends:
            if not isinstance(item, dict):
                raise InvalidInputError(f"bad spend record {item!r}.")
            e, d = _check_spend(item.get("epsilon"), item.get("delta"))
            label = item.get("label")
            if label is not None and not isinstance(label, str):
                raise InvalidInputError(f"bad spend label {label!r}.")
            acc._spends.append(Spend(e, d, label))  # history is restored even if it exceeds a later-lowered budget
        return acc

    def __repr__(self) -> str:
        eps, delta = self.total()
        return (f"PrivacyAccountant({len(self._spends)} releases, basic total eps={eps:.6g}, delta={delta:.3g}; "
                f"budget=({self.epsilon_budget}, {self.delta_budget}))")
