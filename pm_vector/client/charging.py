"""What every client-side release does before it draws: charge the ledger.

:class:`ChargedRelease` is the base of :class:`~pm_vector.client.query.PrivateKNN` (class rows),
:class:`~pm_vector.client.cell_client.PrivateCellKNN` (cells) and
:class:`~pm_vector.client.location.PrivateLocationKNN` (the location release). A request is charged
``(mechanism.epsilon, mechanism.delta)`` to the ``accountant`` given, or to this machine's default
ledger under the single key :data:`~pm_vector.client.budget.LOCAL_KEY` (``"local"``: the caller's, not
derived from anything a server publishes -- cells, frames, digests or a collection's name), BEFORE
any randomness is drawn: a
:class:`~pm_vector.errors.BudgetExceededError` releases nothing. A release built with an injected
generator (tests and benchmarks; its requests say "seeded") is not a private release and charges
the default ledger nothing; an explicit accountant is still charged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidInputError
from .budget import LOCAL_KEY, PrivacyBudget


class ChargedRelease:
    """The ledger side of a client release: ``accountant``, ``collection``, ``mechanism`` (with
    ``epsilon`` and, for an approximate-DP mechanism, ``delta``) and the injected generator."""

    accountant: Any
    collection: str | None
    mechanism: Any
    _rng: np.random.Generator | None = None

    def _set_accountant(self, accountant) -> None:
        """``accountant`` (checked), or None: the default ledger under :data:`~pm_vector.client.budget.LOCAL_KEY`."""
        if accountant is not None and not callable(getattr(accountant, "spend", None)):
            raise InvalidInputError("accountant must have a spend(epsilon, delta, label=None) method (a "
                                    "PrivacyAccountant, or PrivacyBudget.account(key)).")
        self.accountant = accountant
        self._rng = None

    # tests and benchmarks only: requests built this way say "seeded" and are not charged
    def _inject_generator(self, rng: np.random.Generator):
        self._rng = rng
        return self

    def _charge(self) -> None:
        """Charge one release before any randomness is drawn (BudgetExceededError: nothing released)."""
        acc = self.accountant
        if acc is None:
            if self._rng is not None:  # seeded: tests and benchmarks; not a private release
                return

            acc = PrivacyBudget().account(LOCAL_KEY)  # one key: nothing published selects it
        acc.spend(self.mechanism.epsilon, float(getattr(self.mechanism, "delta", 0.0)), label=self.collection)
