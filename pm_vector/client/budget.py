"""A client's persistent privacy budget: one :class:`~pm_vector.privacy.PrivacyAccountant` per server.

The ledger is a JSON file (default ``$PM_VECTOR_HOME/client/budget.json``, ``PM_VECTOR_HOME``
defaulting to ``~/.local/share/pm_vector``)::

    {"version": 1, "collections": {"<key>": PrivacyAccountant.to_dict(), ...},
     "names": {"<key>": "<label>", ...}}

(``"collections"`` keeps its version-1 name; its entries are ledger keys.)

**Keys are chosen by the client, never by a server.** :class:`~pm_vector.client.http.Client`
charges ``"origin:<scheme>://<host>:<port>"`` (:func:`origin_key`): the origin of the base URL
*as the user configured it*, normalised (lower case, default port written out, path dropped,
every loopback name -- ``localhost``, ``127.0.0.0/8``, ``::1`` -- one host). One server can
combine the answers of all its collections, so one budget covers a server, not one collection.
Nothing a server sends (a collection id, a run id, a renamed, dropped or re-created collection)
selects or opens an entry. :class:`~pm_vector.client.query.PrivateKNN` and
:class:`~pm_vector.client.PrivateMail` used on their own (no ``accountant``) charge the single
key :data:`LOCAL_KEY`; give them ``accountant=client.account()`` (or any
:meth:`PrivacyBudget.account`) to charge a Client's server instead (a request built that way
and sent with :meth:`Client.resolve <pm_vector.client.http.Client.resolve>` is charged again
there: the ledger over-counts, never under-counts).

A ledger written by an earlier client (entries ``"uuid:<collection id>"`` labelled
``"<collection>@<base url>"``) is carried over: the first time a client uses an origin key, the
spends of every such entry whose base URL has that origin move into it (:meth:`PrivacyBudget.fold`).

**Default budget.** An entry without a budget of its own is *not* unlimited: it gets
``epsilon = 10`` and ``delta = 1e-4`` in total (:data:`DEFAULT_EPSILON_BUDGET`,
:data:`DEFAULT_DELTA_BUDGET`; e.g. ten queries at epsilon 1, delta 1e-5 to one server),
overridable per entry with :meth:`PrivacyBudget.set_budget` (``pm-vector query --budget``), per
ledger with ``PrivacyBudget(default_epsilon=..., default_delta=...)``, or per environment with
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

import ipaddress
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from ..errors import InvalidInputError
from ..privacy.accountant import PrivacyAccountant
from .settings import DEFAULT_DELTA_BUDGET, DEFAULT_EPSILON_BUDGET, ENV_DELTA, ENV_EPSILON  # noqa: F401
from .settings import settings as _settings

_VERSION = 1
#: the key PrivateKNN / PrivateMail charge when used on their own (no accountant)
LOCAL_KEY = "local"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK = "localhost"


def server_origin(url: str) -> str:
    """``scheme://host:port`` of ``url``, normalised: scheme and host in lower case (IDNA for
    non-ASCII names, no trailing dot), the default port written out, user, path, query and
    fragment dropped, IPv6 in its compressed form, and every loopback address or ``localhost``
    name written ``localhost`` (one machine: one budget). Only ``http`` and ``https``."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidInputError("the service URL must be a non-empty string like 'http://127.0.0.1:8000'.")
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as e:
        raise InvalidInputError(f"the service URL {url!r:.80} is not a valid URL ({e}).") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise InvalidInputError(f"the service URL {url!r:.80} must be http:// or https:// with a host, e.g. "
                                "'http://127.0.0.1:8000'.")
    host = parts.hostname.lower().rstrip(".")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        host = _LOOPBACK if ip.is_loopback else (f"[{ip.compressed}]" if ip.version == 6 else ip.compressed)
    elif host == _LOOPBACK or host.endswith("." + _LOOPBACK):
        host = _LOOPBACK
    else:
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidInputError(f"the service URL {url!r:.80} has a host name that is not valid.") from None
    return f"{scheme}://{host}:{port if port is not None else _DEFAULT_PORTS[scheme]}"


def origin_key(url: str) -> str:
    """The ledger key of the server at ``url``: ``"origin:" + server_origin(url)``."""
    return "origin:" + server_origin(url)


def default_path() -> Path:
    """The ledger's default file, ``$PM_VECTOR_HOME/client/budget.json`` (:mod:`pm_vector.client.settings`)."""
    return _settings().ledger_path


class PrivacyBudget:
    """Per-key (per-server) (epsilon, delta) ledger on disk, with a default budget (module doc).

    ``default_epsilon`` / ``default_delta``: the total budget of an entry that has none of its
    own (None: ``$PM_VECTOR_EPSILON_BUDGET`` / ``$PM_VECTOR_DELTA_BUDGET``, else
    :data:`DEFAULT_EPSILON_BUDGET` / :data:`DEFAULT_DELTA_BUDGET`).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, default_epsilon: float | None = None,
                 default_delta: float | None = None):
        self.path = Path(path) if path is not None else default_path()
        if default_epsilon is None or default_delta is None:
            env = _settings()
            default_epsilon = env.epsilon_budget if default_epsilon is None else default_epsilon
            default_delta = env.delta_budget if default_delta is None else default_delta
        eps, dlt = default_epsilon, default_delta
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
    def _key(key: str) -> str:
        if not isinstance(key, str) or not key:
            raise InvalidInputError("a budget is kept per ledger key: give one (Client.budget_key(), or "
                                    f"{LOCAL_KEY!r} for PrivateKNN / PrivateMail used on their own).")
        return key

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
    def accountant(self, key: str) -> PrivacyAccountant:
        """The entry's accountant as stored, with the default budget where it has none."""
        data = self._read()
        return self._accountant(data, self._resolve(data, self._key(key)))

    def fold(self, key: str, origin: str, label: str | None = None) -> int:
        """Carry an earlier client's entries over to ``key``: every entry ``"uuid:<id>"`` whose label
        (``"<collection>@<base url>"``) names a base URL of server origin ``origin``
        (:func:`server_origin`) gives its spends to ``key`` and is removed, with the name aliases
        that pointed to it; ``key``'s own budget is kept (the default if it has none). ``label``
        is stored as ``key``'s name. Returns how many entries were folded; writes only on a change."""
        key = self._key(key)
        data = self._read()
        names = data.get("names") or {}
        if not any(self._legacy_origin(k, names) == origin for k in data["collections"]) and \
                (label is None or names.get(key) == label):
            return 0
        with self._locked():
            data = self._read()
            names = data.setdefault("names", {})
            folded = [k for k in data["collections"] if k != key and self._legacy_origin(k, names) == origin]
            entry = data["collections"].get(key) or PrivacyAccountant().to_dict()
            for k in folded:
                entry["spends"] = list(entry.get("spends") or []) + list(data["collections"].pop(k).get("spends") or [])
                names.pop(k, None)
            if folded:
                data["collections"][key] = entry
                aliases = data.get("aliases") or {}
                for a in [a for a, t in aliases.items() if t in folded]:
                    del aliases[a]
            if label is not None:
                names[key] = label
            self._write(data)
        return len(folded)

    @staticmethod
    def _legacy_origin(key: str, names: dict[str, str]) -> str | None:
        """The server origin of an earlier client's ``"uuid:..."`` entry, from its label."""
        label = names.get(key)
        if not key.startswith("uuid:") or not isinstance(label, str) or "@" not in label:
            return None
        try:
            return server_origin(label.rsplit("@", 1)[1])
        except InvalidInputError:
            return None

    def set_budget(self, key: str, epsilon: float | None, delta: float | None = None,
                   delta_slack: float | None = None) -> dict[str, Any]:
        """Set (or change) an entry's total budget; what was spent is kept. ``None`` is the
        default budget (there is no unlimited)."""
        with self._locked():
            data = self._read()
            entry = self._resolve(data, self._key(key))
            old = data["collections"].get(entry)
            acc = PrivacyAccountant(epsilon, delta, delta_slack)  # validates
            if old is not None:
                prev = PrivacyAccountant.from_dict(old)
                acc._spends = list(prev.spends)
            data["collections"][entry] = acc.to_dict()
            self._write(data)
        return self.status(key)

    def check(self, key: str, epsilon: float, delta: float) -> tuple[float, float]:
        """Totals after a release of (epsilon, delta), or :class:`BudgetExceededError`. Records nothing."""
        return self.accountant(key).check(epsilon, delta)

    def spend(self, key: str, epsilon: float, delta: float, label: str | None = None) -> tuple[float, float]:
        """Check and record one release atomically; raises :class:`BudgetExceededError` (nothing recorded)."""
        with self._locked():
            data = self._read()
            entry = self._resolve(data, self._key(key))
            d = data["collections"].get(entry)
            acc = PrivacyAccountant() if d is None else PrivacyAccountant.from_dict(d)
            defaults = acc.epsilon_budget is None, acc.delta_budget is None
            after = self._with_defaults(acc).spend(epsilon, delta, label=label or key)
            # store the budget as set (None = "the default"), so a later default change applies
            acc.epsilon_budget = None if defaults[0] else acc.epsilon_budget
            acc.delta_budget = None if defaults[1] else acc.delta_budget
            data["collections"][entry] = acc.to_dict()
            self._write(data)
        return after

    def account(self, key: str, label: str | None = None) -> "LedgerAccount":
        """An accountant-like view of one entry (``spend(epsilon, delta, label=None)``), for
        :class:`~pm_vector.client.query.PrivateKNN` and :class:`~pm_vector.client.PrivateMail`."""
        return LedgerAccount(self, self._key(key), label)

    def status(self, key: str) -> dict[str, Any]:
        """The entry's budget, what was spent and what remains (``key``: the entry's ledger key)."""
        data = self._read()
        entry = self._resolve(data, self._key(key))
        stored = data["collections"].get(entry)
        acc = self._accountant(data, entry)
        eps, delta = acc.total(acc.delta_slack)
        default = stored is None or stored.get("epsilon_budget") is None
        return {"key": entry, "name": (data.get("names") or {}).get(entry),
                "epsilon_budget": acc.epsilon_budget, "delta_budget": acc.delta_budget, "default_budget": default,
                "delta_slack": acc.delta_slack, "releases": len(acc), "epsilon_spent": eps, "delta_spent": delta,
                "epsilon_remaining": max(0.0, acc.epsilon_budget - eps), "path": str(self.path)}

    def keys(self) -> list[str]:
        """The ledger's keys (one per server, and :data:`LOCAL_KEY`)."""
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
