"""The client's configuration, read from the environment in one place.

=============================== ================================= ===============================
variable                        setting                           default
=============================== ================================= ===============================
``PM_VECTOR_HOME``              ``home``: the client's files      ``~/.local/share/pm_vector``
                                (``home/client/budget.json``)
``PM_VECTOR_EPSILON_BUDGET``    ``epsilon_budget``: total epsilon  10 (:data:`DEFAULT_EPSILON_BUDGET`)
                                of a ledger entry with no budget
                                of its own
``PM_VECTOR_DELTA_BUDGET``      ``delta_budget``: its total delta  1e-4 (:data:`DEFAULT_DELTA_BUDGET`)
=============================== ================================= ===============================

:class:`ClientSettings` is frozen and validated: a bad value raises
:class:`~pm_vector.errors.InvalidInputError` naming the variable and the fix. :func:`settings`
reads the environment on every call (a process may change it between two ledgers). The database
layer reads ``PM_VECTOR_HOME`` too (:mod:`pm_vector.db.postgres.config`): one directory holds both
sides' files, but the client does not import the database layer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from ..errors import InvalidInputError, PrivacyParameterError
from ..privacy.accountant import budget_bounds, check_budget

ENV_HOME = "PM_VECTOR_HOME"
ENV_EPSILON = "PM_VECTOR_EPSILON_BUDGET"
ENV_DELTA = "PM_VECTOR_DELTA_BUDGET"
#: total epsilon of an entry (a server) that has no budget of its own
DEFAULT_EPSILON_BUDGET = 10.0
#: total delta of an entry that has no budget of its own
DEFAULT_DELTA_BUDGET = 1e-4
#: the budgets the environment sets: (setting, variable, an example value)
_BUDGETS = (("epsilon_budget", ENV_EPSILON, "10"), ("delta_budget", ENV_DELTA, "1e-4"))


def _default_home() -> Path:
    return Path(os.path.join(os.path.expanduser("~"), ".local", "share", "pm_vector"))


@dataclass(frozen=True)
class ClientSettings:
    """The client's configuration (see the module docstring for the variables).

    ``epsilon_budget`` is finite and > 0; ``delta_budget`` is in (0, 1): the bounds of
    :data:`pm_vector.privacy.accountant.BUDGET_UPPER`, which the ledger checks too.
    """

    home: Path
    epsilon_budget: float = DEFAULT_EPSILON_BUDGET
    delta_budget: float = DEFAULT_DELTA_BUDGET

    def __post_init__(self):
        if not isinstance(self.home, Path):
            raise InvalidInputError(f"{ENV_HOME} must be a directory path, got {self.home!r}.")
        for name, env, example in _BUDGETS:
            v = getattr(self, name)
            try:
                ok = v is not None and check_budget(name, v) is not None
            except PrivacyParameterError:
                ok = False
            if not ok:
                raise InvalidInputError(f"{env}={v!r} must be a number {budget_bounds(name)}; set it to the default "
                                        f"total budget (e.g. {example}) or unset it.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ClientSettings":
        """The settings from ``environ`` (default ``os.environ``); unset or empty variables: defaults."""
        env = os.environ if environ is None else environ
        vals: dict = {"home": Path(env[ENV_HOME]) if env.get(ENV_HOME) else _default_home()}
        for name, var, _example in _BUDGETS:
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            try:
                vals[name] = float(raw)
            except ValueError:
                raise InvalidInputError(f"{var}={raw!r} is not a number; set it to the default total budget "
                                        "(e.g. 10) or unset it.") from None
        return cls(**vals)

    @property
    def ledger_path(self) -> Path:
        """The privacy-budget ledger, ``home/client/budget.json``."""
        return self.home / "client" / "budget.json"


def settings() -> ClientSettings:
    """The client settings as the environment says now."""
    return ClientSettings.from_env()
