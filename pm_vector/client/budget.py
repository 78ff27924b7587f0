"""A client's persistent privacy budget: one :class:`~pm_vector.privacy.PrivacyAccountant` per collection.

The ledger is a JSON file (default ``$PM_VECTOR_HOME/client/budget.json``, ``PM_VECTOR_HOME``
defaulting to ``~/.local/share/pm_vector``)::

    {"version": 1, "collections": {"<key>": PrivacyAccountant.to_dict(), ...}}

``<key>`` is the collection name, or ``"<server>|<collection>"`` when the client scopes budgets
by server. Every change is made under a file lock (several processes may share a ledger) and
written atomically (temporary file in the same directory, fsync, ``os.replace``), so a crash
leaves the old or the new ledger, never a torn one.

:meth:`PrivacyBudget.spend` checks the budget and records the release *before* the client
sends anything: a refused query raises :class:`~pm_vector.errors.BudgetExceededError` and
nothing is sent. A recorded release stays recorded even if the request then fails in transit
(it may have reached the server): the ledger over-counts rather than under-counts.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from ..errors import InvalidInputError
from ..privacy.accountant import PrivacyAccountant

_VERSION = 1


def default_path() -> Path:
    home = os.environ.get("PM_VECTOR_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share", "pm_vector")
    return Path(home) / "client" / "budget.json"


class PrivacyBudget:
    """Per-collection (epsilon, delta) ledger on disk."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()

    # ------------------------------------------------------------------ file
    @contextmanager
    def _locked(self) -> Iterator[None]:
        from filelock import FileLock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock", timeout=30):
            yield

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"version": _VERSION, "collections": {}}
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"the privacy ledger {self.path} is not valid JSON ({e}); restore it from a "
                                    "backup rather than deleting it (deleting forgets what was spent).") from None
        if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("collections"),
                                                                                           dict):
            raise InvalidInputError(f"the privacy ledger {self.path} is not a version-{_VERSION} ledger.")
        return data

    def _write(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".budget-", suffix=".json", dir=str(self.path.parent))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        try:  # make the rename durable too
            dfd = os.open(str(self.path.parent), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    @staticmethod
    def _key(collection: str) -> str:
        if not isinstance(collection, str) or not collection:
            raise InvalidInputError("a budget is kept per collection: give its name.")
        return collection

    # ------------------------------------------------------------------ API
    def accountant(self, collection: str) -> PrivacyAccountant:
        """The collection's accountant as stored (a fresh unlimited one if none)."""
        d = self._read()["collections"].get(self._key(collection))
        return PrivacyAccountant() if d is None else PrivacyAccountant.from_dict(d)

    def set_budget(self, collection: str, epsilon: float | None, delta: float | None = None,
                   delta_slack: float | None = None) -> dict[str, Any]:
        """Set (or change) a collection's budget; what was spent is kept."""
        key = self._key(collection)
        with self._locked():
            data = self._read()
            old = data["collections"].get(key)
            acc = PrivacyAccountant(epsilon, delta, delta_slack)  # validates
            if old is not None:
                prev = PrivacyAccountant.from_dict(old)
                acc._spends = list(prev.spends)
            data["collections"][key] = acc.to_dict()
            self._write(data)
        return self.status(collection)

    def check(self, collection: str, epsilon: float, delta: float) -> tuple[float, float]:
        """Totals after a release of (epsilon, delta), or :class:`BudgetExceededError`. Records nothing."""
        return self.accountant(collection).check(epsilon, delta)

    def spend(self, collection: str, epsilon: float, delta: float) -> tuple[float, float]:
        """Check and record one release atomically; raises :class:`BudgetExceededError` (nothing recorded)."""
        key = self._key(collection)
        with self._locked():
            data = self._read()
            d = data["collections"].get(key)
            acc = PrivacyAccountant() if d is None else PrivacyAccountant.from_dict(d)
            after = acc.spend(epsilon, delta, label=collection)
            data["collections"][key] = acc.to_dict()
            self._write(data)
        return after

    def status(self, collection: str) -> dict[str, Any]:
        acc = self.accountant(collection)
        eps, delta = acc.total(acc.delta_slack)
        rem = None if acc.epsilon_budget is None else max(0.0, acc.epsilon_budget - eps)
        return {"collection": collection, "epsilon_budget": acc.epsilon_budget, "delta_budget": acc.delta_budget,
                "delta_slack": acc.delta_slack, "releases": len(acc), "epsilon_spent": eps, "delta_spent": delta,
                "epsilon_remaining": rem, "path": str(self.path)}

    def collections(self) -> list[str]:
        return sorted(self._read()["collections"])
