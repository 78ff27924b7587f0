"""Privacy accountant for one client's sequence of releases."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..errors import BudgetExceededError, InvalidInputError, PrivacyParameterError

__all__ = ["PrivacyAccountant", "Spend"]

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


class PrivacyAccountant:
    """Records the (epsilon, delta) of every release on one client's data and composes them.

    Composition (valid for adaptively chosen mechanisms):

    * basic: ``(sum eps_i, sum delta_i)`` (Dwork & Roth 2014, Thm 3.16);
    * advanced, with ``delta_slack = delta' > 0`` (Dwork, Rothblum & Vadhan
      2010; Dwork & Roth Thm 3.20, heterogeneous form):
      ``eps' = sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i (e^{eps_i} - 1)``,
      ``delta_total = sum delta_i + delta'``.

    :meth:`total` returns whichever pair has the smaller epsilon. Budgets
    (``epsilon_budget``, ``delta_budget``; None = unlimited *for this in-memory object*; the
    client's ledger, :class:`~pm_vector.client.budget.PrivacyBudget`, gives every collection
    without one a default budget instead) are checked with
    the accountant's own ``delta_slack`` before anything is recorded.
    Releases that were not recorded here are not covered.
    """

    def __init__(self, epsilon_budget: float | None = None, delta_budget: float | None = None,
                 delta_slack: float | None = None):
        self.epsilon_budget = _check_optional("epsilon_budget", epsilon_budget)
        self.delta_budget = _check_optional("delta_budget", delta_budget, upper=1.0)
        self.delta_slack = _check_optional("delta_slack", delta_slack, upper=1.0)
        self._spends: list[Spend] = []

    # ------------------------------------------------------------------ composition
    @staticmethod
    def _compose(spends, delta_slack: float | None) -> tuple[float, float]:
        if not spends:
            return 0.0, 0.0
        eps = [s.epsilon for s in spends]
        basic = (math.fsum(eps), math.fsum(s.delta for s in spends))
        if delta_slack is None:
            return basic
        adv_eps = (math.sqrt(2.0 * math.log(1.0 / delta_slack) * math.fsum(e * e for e in eps))
                   + math.fsum(e * math.expm1(e) for e in eps))
        if adv_eps < basic[0]:
            return adv_eps, basic[1] + delta_slack
        return basic

    def total(self, delta_slack: float | None = None) -> tuple[float, float]:
        """Total ``(epsilon, delta)`` of everything recorded.

        ``delta_slack=None``: basic composition. ``delta_slack > 0``: the
        smaller-epsilon one of basic and advanced composition (the latter adds
        ``delta_slack`` to delta). With nothing recorded: ``(0.0, 0.0)``.
        """
        return self._compose(self._spends, _check_optional("delta_slack", delta_slack, upper=1.0))

    # ------------------------------------------------------------------ budget
    def check(self, epsilon: float, delta: float) -> tuple[float, float]:
        """Return the totals after a release of (epsilon, delta), or raise :class:`BudgetExceededError`.

        Uses the accountant's ``delta_slack``. Records nothing.
        """
        e, d = _check_spend(epsilon, delta)
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
