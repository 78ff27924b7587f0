"""A client's persistent privacy budget: one :class:`~pm_vector.privacy.PrivacyAccountant` per collection.

The ledger is a JSON file (default ``$PM_VECTOR_HOME/client/budget.json``, ``PM_VECTOR_HOME``
defaulting to ``~/.local/share/pm_vector``)::

    {"version": 1, "collections": {"<key>": PrivacyAccountant.to_dict(), ...},
     "names": {"<key>": "<collection name>@<server>", ...}, "aliases": {"<name>": "<key>", ...}}

``<key>`` is the **server's identity of the collection**: ``"uuid:<collection uuid>"``, the stable
id the service publishes in the collection's anchor document (:meth:`Client.budget_key
<pm_vector.client.http.Client.budget_key>`); so ``http://127.0.0.1:8000`` and
``http://localhost:8000`` are one budget, and a renamed or re-embedded collection keeps its
budget. A ledger written before the ids (keyed by collection name) is carried over: the first
time a client learns a name's id, that name's entry moves to the id's key (the name stays as an
alias, so :meth:`status` and :meth:`set_budget` still accept it).

**Default budget.** A collection without a budget of its own is *not* unlimited: it gets
``epsilon = 10`` and ``delta = 1e-4`` in total (:data:`DEFAULT_EPSILON_BUDGET`,
:data:`DEFAULT_DELTA_BUDGET`; e.g. ten queries at epsilon 1, delta 1e-5), overridable per
collection with :meth:`PrivacyBudget.set_budget` (``pm-vector query --budget``), per ledger with
``PrivacyBudget(default_epsilon=..., default_delta=...)``, or per environment with
``PM_VECTOR_EPSILON_BUDGET`` / ``PM_VECTOR_DELTA_BUDGET``. There is no "unlimited": set a large
number if that is what you mean.

Every change is made under a file lock (several processes may share a ledger) and written
atomically (temporary file in the same directory, fsync, ``os.replace``), so a crash leaves the
old or the new ledger, never a torn one. :meth:`PrivacyBudget.spend` checks the budget and records
the release *before* the noise is drawn: a refused query raises
:class:`~pm_vector.errors.BudgetExceededError` and nothing is released or sent. A recorded release
stays recorded even if the request then fails in transit (the ledger over-counts rather than
under-counts). :class:`MemoryBudget` is the same ledger kept in memory (benchmarks, tests).
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
#: total epsilon of a collection that has no budget of its own (documented in the module doc)
DEFAULT_EPSILON_BUDGET = 10.0
#: total delta of a collection that has no budget of its own
DEFAULT_DELTA_BUDGET = 1e-4
ENV_EPSILON = "PM_VECTOR_EPSILON_BUDGET"
ENV_DELTA = "PM_VECTOR_DELTA_BUDGET"


def default_path() -> Path:
    home = os.environ.get("PM_VECTOR_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share", "pm_vector")
    return Path(home) / "client" / "budget.json"


def _env_float(name: str, fallback: float) -> float:
    v = os.environ.get(name)
    if v is None or v == "":
        return fallback
    try:
        return float(v)
    except ValueError:
        raise InvalidInputError(f"{name}={v!r} is not a number; set it to the default total budget "
                                "(e.g. 10) or unset it.") from None


class PrivacyBudget:
    """Per-collection (epsilon, delta) ledger on disk, with a default budget (module doc).

    ``default_epsilon`` / ``default_delta``: the total budget of a collection that has none of its
    own (None: ``$PM_VECTOR_EPSILON_BUDGET`` / ``$PM_VECTOR_DELTA_BUDGET``, else
    :data:`DEFAULT_EPSILON_BUDGET` / :data:`DEFAULT_DELTA_BUDGET`).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, default_epsilon: float | None = None,
                 default_delta: float | None = None):
        self.path = Path(path) if path is not None else default_path()
        eps = _env_float(ENV_EPSILON, DEFAULT_EPSILON_BUDGET) if default_epsilon is None else default_epsilon
        dlt = _env_float(ENV_DELTA, DEFAULT_DELTA_BUDGET) if default_delta is None else default_delta
        PrivacyAccountant(eps, dlt)  # validates: finite, > 0, delta < 1
        self.default_epsilon, self.default_delta = float(eps), float(dlt)

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
            raise InvalidInputError("a budget is kept per collection: give its ledger key (Client.budget_key) or name.")
        return collection

    @staticmethod
    def _resolve(data: dict[str, Any], key: str) -> str:
        """``key`` itself if it is an entry, else the entry a name alias points to, else ``key``."""
        if key in data["collections"]:
            return key
        return (data.get("aliases") or {}).get(key, key)

    def _with_defaults(self, acc: PrivacyAccountant) -> PrivacyAccountant:
        # no budget of its own is the default budget, never unlimited
        if acc.epsilon_budget is None:
            acc.epsilon_budget = self.default_epsilon
        if acc.delta_budget is None:
            acc.delta_budget = self.default_delta
        return acc

    def _accountant(self, data: dict[str, Any], key: str) -> PrivacyAccountant:
        d = data["collections"].get(key)
        return self._with_defaults(PrivacyAccountant() if d is None else PrivacyAccountant.from_dict(d))

    # ------------------------------------------------------------------ API
    def accountant(self, collection: str) -> PrivacyAccountant:
        """The collection's accountant as stored, with the default budget where it has none."""
        data = self._read()
        return self._accountant(data, self._resolve(data, self._key(collection)))

    def adopt(self, key: str, name: str, label: str | None = None) -> None:
        """Bind the ledger key ``key`` (a collection id) to its ``name``: a legacy entry kept under
        ``name`` (and not yet bound to an id) moves to ``key``; ``name`` becomes an alias of ``key``."""
        key, name = self._key(key), self._key(name)
        with self._locked():
            data = self._read()
            aliases = data.setdefault("aliases", {})
            names = data.setdefault("names", {})
            changed = False
            legacy = data["collections"].get(name)
            if key != name and legacy is not None and name not in names and key not in data["collections"]:
                data["collections"][key] = data["collections"].pop(name)
                changed = True
            if key != name and aliases.get(name) != key:
                aliases[name] = key
                changed = True
            if label is not None and names.get(key) != label:
                names[key] = label
                changed = True
            if changed:
                self._write(data)

    def set_budget(self, collection: str, epsilon: float | None, delta: float | None = None,
                   delta_slack: float | None = None) -> dict[str, Any]:
        """Set (or change) a collection's total budget; what was spent is kept. ``None`` is the
        default budget (there is no unlimited)."""
        with self._locked():
            data = self._read()
            key = self._resolve(data, self._key(collection))
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

    def spend(self, collection: str, epsilon: float, delta: float, label: str | None = None) -> tuple[float, float]:
        """Check and record one release atomically; raises :class:`BudgetExceededError` (nothing recorded)."""
        with self._locked():
            data = self._read()
            key = self._resolve(data, self._key(collection))
            d = data["collections"].get(key)
            acc = PrivacyAccountant() if d is None else PrivacyAccountant.from_dict(d)
            defaults = acc.epsilon_budget is None, acc.delta_budget is None
            after = self._with_defaults(acc).spend(epsilon, delta, label=label or collection)
            # store the budget as set (None = "the default"), so a later default change applies
            acc.epsilon_budget = None if defaults[0] else acc.epsilon_budget
            acc.delta_budget = None if defaults[1] else acc.delta_budget
            data["collections"][key] = acc.to_dict()
            self._write(data)
        return after

    def account(self, key: str, label: str | None = None) -> "LedgerAccount":
        """An accountant-like view of one entry (``spend(epsilon, delta, label=None)``), for
        :class:`~pm_vector.client.query.PrivateKNN` and :class:`~pm_vector.client.PrivateMail`."""
        return LedgerAccount(self, self._key(key), label)

    def status(self, collection: str) -> dict[str, Any]:
        data = self._read()
        key = self._resolve(data, self._key(collection))
        stored = data["collections"].get(key)
        acc = self._accountant(data, key)
        eps, delta = acc.total(acc.delta_slack)
        default = stored is None or stored.get("epsilon_budget") is None
        return {"collection": collection, "key": key, "name": (data.get("names") or {}).get(key),
                "epsilon_budget": acc.epsilon_budget, "delta_budget": acc.delta_budget, "default_budget": default,
                "delta_slack": acc.delta_slack, "releases": len(acc), "epsilon_spent": eps, "delta_spent": delta,
                "epsilon_remaining": max(0.0, acc.epsilon_budget - eps), "path": str(self.path)}

    def collections(self) -> list[str]:
        return sorted(self._read()["collections"])


class MemoryBudget(PrivacyBudget):
    """A :class:`PrivacyBudget` kept in memory (same defaults and checks, nothing on disk): for
    benchmarks and tests that must not touch the user's ledger. Forgotten when the object goes."""

    def __init__(self, *, default_epsilon: float | None = None, default_delta: float | None = None):
        super().__init__(Path(os.devnull), default_epsilon=default_epsilon, default_delta=default_delta)
        self.path = Path("<memory>")
        self._data: dict[str, Any] = {"version": _VERSION, "collections": {}}

    @contextmanager
    def _locked(self) -> Iterator[None]:
        yield

    def _read(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._data))

    def _write(self, data: dict[str, Any]) -> None:
        self._data = json.loads(json.dumps(data))


class LedgerAccount:
    """One ledger entry seen as an accountant: ``spend(epsilon, delta, label=None)`` charges it."""

    def __init__(self, budget: PrivacyBudget, key: str, label: str | None = None):
        self.budget, self.key, self.label = budget, key, label

    def spend(self, epsilon: float, delta: float = 0.0, label: str | None = None) -> tuple[float, float]:
        return self.budget.spend(self.key, epsilon, delta, label=self.label or label)

    def status(self) -> dict[str, Any]:
        return self.budget.status(self.key)
