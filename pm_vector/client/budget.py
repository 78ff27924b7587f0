"""A client's persistent privacy budget: one :class:`~pm_vector.privacy.PrivacyAccountant` per server.

The ledger (default ``$PM_VECTOR_HOME/client/budget.json``, ``PM_VECTOR_HOME`` defaulting to
``~/.local/share/pm_vector``) is an SQLite database in WAL mode, kept beside that name with the
suffix ``.sqlite3`` (``budget.sqlite3``; a ledger path without the ``.json`` suffix is the
database itself). Every release is one appended row (``spends``: key, epsilon, delta, label,
time); an entry's budget and name are one row of ``entries``, aliases rows of ``aliases``. A spend
costs the same after 12,000 spends as after one: nothing is rewritten.

A JSON ledger written by an earlier client (version 1: ``{"version": 1, "collections": {"<key>":
PrivacyAccountant.to_dict(), ...}, "names": {...}, "aliases": {...}}``) is carried over on first
use: its entries and spends are added to the database and the file is renamed
``<name>.json.migrated`` in the same locked transaction (a crash between the two adds its spends
again: the ledger over-counts, never under-counts). :meth:`PrivacyBudget.export` gives the
ledger in that JSON form.

**Keys are chosen by the client, never by a server.** :class:`~pm_vector.client.http.Client`
charges ``"origin:<scheme>://<host>:<port>"`` (:func:`origin_key`): the origin of the base URL
*as the user configured it*, normalised (lower case, default port written out, path dropped,
every loopback name -- ``localhost``, ``127.0.0.0/8``, ``::1`` -- one host). One server can
combine the answers of all its collections, so one budget covers a server, not one collection.
Nothing a server sends (a collection id, a run id, a renamed, dropped or re-created collection)
selects or opens an entry. :class:`~pm_vector.client.query.PrivateKNN` and
:class:`~pm_vector.client.PrivateMail`, :class:`~pm_vector.client.cell_client.PrivateCellKNN` and
:class:`~pm_vector.client.location.PrivateLocationKNN` used on their own (no ``accountant``) charge
the single key :data:`LOCAL_KEY`, whatever the collection's name, frames or cells; give them ``accountant=client.account()`` (or any
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

Several processes may share a ledger: every change is one ``BEGIN IMMEDIATE`` transaction (the
database's write lock: a spend reads the entry's totals, checks the budget and appends its row
while no other writer can), committed with ``synchronous=FULL`` (on disk before the noise is
drawn). :meth:`PrivacyBudget.spend` checks the budget and records the release *before* the noise
is drawn: a refused query raises :class:`~pm_vector.errors.BudgetExceededError` and nothing is
released or sent. A recorded release stays recorded if the request then fails in transit (the
ledger over-counts rather than under-counts), except where the transport proves that no byte of
the request left (:meth:`PrivacyBudget.withdraw`, called by the client for a ``ConnectError``,
``ConnectTimeout`` or ``PoolTimeout`` before anything was written; the request and its draw are
discarded). :class:`MemoryBudget` is the same ledger kept in memory (benchmarks, tests).
"""

from __future__ import annotations

import ipaddress
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from ..errors import InvalidInputError
from ..privacy.accountant import PrivacyAccountant, Spend
from .settings import DEFAULT_DELTA_BUDGET, DEFAULT_EPSILON_BUDGET, ENV_DELTA, ENV_EPSILON  # noqa: F401
from .settings import settings as _settings

_VERSION = 1
#: the key PrivateKNN, PrivateMail, PrivateCellKNN and PrivateLocationKNN charge when used on their own
#: (no accountant): the caller's, never derived from anything a server publishes
LOCAL_KEY = "local"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK = "localhost"
#: how long a spend waits for another process's write lock on the ledger
LOCK_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, epsilon_budget REAL, delta_budget REAL,
                                    delta_slack REAL, name TEXT);
CREATE TABLE IF NOT EXISTS spends (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, epsilon REAL NOT NULL,
                                   delta REAL NOT NULL, label TEXT, at REAL NOT NULL,
                                   withdrawn INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS spends_by_key ON spends (key, withdrawn, epsilon, delta);
CREATE TABLE IF NOT EXISTS aliases (alias TEXT PRIMARY KEY, key TEXT NOT NULL);
"""


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
    """The ledger's default name, ``$PM_VECTOR_HOME/client/budget.json`` (:mod:`pm_vector.client.settings`;
    its database is ``budget.sqlite3`` beside it)."""
    return _settings().ledger_path


def _wal(db: sqlite3.Connection) -> None:
    """Put the ledger in WAL mode (persistent in the file) unless it already is.

    Switching a fresh file to WAL takes an exclusive lock, and SQLite answers ``database is
    locked`` at once, without its busy handler, when another process is opening the same fresh
    file: so the switch is retried until :data:`LOCK_TIMEOUT_S`. A file already in WAL mode
    takes no lock here."""
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005 + 0.02 * (time.monotonic() % 1.0))


class PrivacyBudget:
    """Per-key (per-server) (epsilon, delta) ledger on disk, with a default budget (module doc).

    ``path``: the ledger (None: :func:`default_path`); ``self.store`` is its SQLite database.
    ``default_epsilon`` / ``default_delta``: the total budget of an entry that has none of its
    own (None: ``$PM_VECTOR_EPSILON_BUDGET`` / ``$PM_VECTOR_DELTA_BUDGET``, else
    :data:`DEFAULT_EPSILON_BUDGET` / :data:`DEFAULT_DELTA_BUDGET`).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, default_epsilon: float | None = None,
                 default_delta: float | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.store = self.path.with_suffix(".sqlite3") if self.path.suffix == ".json" else self.path
        if default_epsilon is None or default_delta is None:
            env = _settings()
            default_epsilon = env.epsilon_budget if default_epsilon is None else default_epsilon
            default_delta = env.delta_budget if default_delta is None else default_delta
        eps, dlt = default_epsilon, default_delta
        PrivacyAccountant(eps, dlt)  # validates: finite, > 0, delta < 1
        self.default_epsilon, self.default_delta = float(eps), float(dlt)
        self._recorders = threading.local()

    # ------------------------------------------------------------------ store
    def _legacy(self) -> Path | None:
        """The JSON ledger an earlier client kept under this name, if any."""
        if self.path.suffix == ".json":
            return self.path
        if self.store.is_file():
            with open(self.store, "rb") as f:
                json_text = f.read(1) == b"{"
            if json_text:  # a JSON ledger at the very path: moved aside, then carried over
                aside = self.store.with_name(self.store.name + ".json")
                try:
                    os.replace(self.store, aside)
                except FileNotFoundError:  # another process moved it first
                    pass
                return aside
        return None

    def _connect(self) -> sqlite3.Connection:
        self.store.parent.mkdir(parents=True, exist_ok=True)
        legacy = self._legacy()
        db = sqlite3.connect(str(self.store), timeout=LOCK_TIMEOUT_S, isolation_level=None)
        try:
            _wal(db)
            db.execute("PRAGMA synchronous=FULL")  # a spend is on disk before its noise is drawn
            if not getattr(self, "_schema_ok", False):
                db.executescript(_SCHEMA)
                self._schema_ok = True
            if legacy is not None and legacy.is_file():
                self._migrate(db, legacy)
        except BaseException:
            db.close()
            raise
        return db

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[sqlite3.Connection]:
        """One transaction (``write``: under the database's write lock, ``BEGIN IMMEDIATE``)."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        finally:
            self._close(db)

    def _close(self, db: sqlite3.Connection) -> None:
        db.close()

    def _migrate(self, db: sqlite3.Connection, legacy: Path) -> None:
        """Carry an earlier client's JSON ledger over (module doc), under the write lock."""
        db.execute("BEGIN IMMEDIATE")
        try:
            try:
                text = legacy.read_text(encoding="utf-8")
            except FileNotFoundError:  # another process carried it over first
                db.execute("ROLLBACK")
                return
            data = _legacy_data(text, legacy)
            names, aliases = data.get("names") or {}, data.get("aliases") or {}
            for key, d in data["collections"].items():
                acc = PrivacyAccountant.from_dict(d)
                db.execute("INSERT OR IGNORE INTO entries (key, epsilon_budget, delta_budget, delta_slack, name) "
                           "VALUES (?, ?, ?, ?, ?)", (str(key), acc.epsilon_budget, acc.delta_budget,
                                                      acc.delta_slack, names.get(key)))
                db.executemany("INSERT INTO spends (key, epsilon, delta, label, at) VALUES (?, ?, ?, ?, ?)",
                               [(str(key), sp.epsilon, sp.delta, sp.label, 0.0) for sp in acc.spends])
            for a, t in aliases.items():
                db.execute("INSERT OR IGNORE INTO aliases (alias, key) VALUES (?, ?)", (str(a), str(t)))
            os.replace(legacy, legacy.with_name(legacy.name + ".migrated"))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @staticmethod
    def _key(key: str) -> str:
        if not isinstance(key, str) or not key:
            raise InvalidInputError("a budget is kept per ledger key: give one (Client.budget_key(), or "
                                    f"{LOCAL_KEY!r} for PrivateKNN / PrivateMail used on their own).")
        return key

    @staticmethod
    def _resolve(db: sqlite3.Connection, key: str) -> str:
        """``key`` itself if it is an entry, else the entry a name alias points to, else ``key``."""
        if db.execute("SELECT 1 FROM entries WHERE key = ?", (key,)).fetchone():
            return key
        row = db.execute("SELECT key FROM aliases WHERE alias = ?", (key,)).fetchone()
        return row[0] if row else key

    def _with_defaults(self, acc: PrivacyAccountant) -> PrivacyAccountant:
        # no budget of its own is the default budget, never unlimited
        if acc.epsilon_budget is None:
            acc.epsilon_budget = self.default_epsilon
        if acc.delta_budget is None:
            acc.delta_budget = self.default_delta
        return acc

    @staticmethod
    def _stored(db: sqlite3.Connection, key: str) -> PrivacyAccountant:
        """The entry's accountant as stored (budgets None where it has none), its spends read as
        one group per distinct (epsilon, delta) in the order of their first release (what the
        composition needs: the sums, and the first release's parameters)."""
        row = db.execute("SELECT epsilon_budget, delta_budget, delta_slack FROM entries WHERE key = ?",
                         (key,)).fetchone()
        acc = PrivacyAccountant(*(row or (None, None, None)))
        spends: list[Spend] = []
        for e, d, n in db.execute("SELECT epsilon, delta, count(*) FROM spends WHERE key = ? AND withdrawn = 0 "
                                  "GROUP BY epsilon, delta ORDER BY min(id)", (key,)):
            spends += [Spend(float(e), float(d))] * int(n)
        acc._spends = spends
        return acc

    # ------------------------------------------------------------------ API
    def accountant(self, key: str) -> PrivacyAccountant:
        """The entry's accountant as stored, with the default budget where it has none."""
        with self._tx(write=False) as db:
            return self._with_defaults(self._stored(db, self._resolve(db, self._key(key))))

    def fold(self, key: str, origin: str, label: str | None = None) -> int:
        """Carry an earlier client's entries over to ``key``: every entry ``"uuid:<id>"`` whose label
        (``"<collection>@<base url>"``) names a base URL of server origin ``origin``
        (:func:`server_origin`) gives its spends to ``key`` and is removed, with the name aliases
        that pointed to it; ``key``'s own budget is kept (the default if it has none). ``label``
        is stored as ``key``'s name. Returns how many entries were folded."""
        key = self._key(key)
        with self._tx() as db:
            rows = db.execute("SELECT key, name FROM entries WHERE key LIKE 'uuid:%' AND key != ?", (key,)).fetchall()
            folded = [k for k, name in rows if self._legacy_origin(k, name) == origin]
            if folded or label is not None:
                db.execute("INSERT OR IGNORE INTO entries (key) VALUES (?)", (key,))
            for k in folded:
                db.execute("UPDATE spends SET key = ? WHERE key = ?", (key, k))
                db.execute("DELETE FROM entries WHERE key = ?", (k,))
                db.execute("DELETE FROM aliases WHERE key = ?", (k,))
            if label is not None:
                db.execute("UPDATE entries SET name = ? WHERE key = ?", (label, key))
        return len(folded)

    @staticmethod
    def _legacy_origin(key: str, label: Any) -> str | None:
        """The server origin of an earlier client's ``"uuid:..."`` entry, from its label."""
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
        acc = PrivacyAccountant(epsilon, delta, delta_slack)  # validates
        with self._tx() as db:
            entry = self._resolve(db, self._key(key))
            db.execute("INSERT INTO entries (key, epsilon_budget, delta_budget, delta_slack) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT (key) DO UPDATE SET epsilon_budget = excluded.epsilon_budget, "
                       "delta_budget = excluded.delta_budget, delta_slack = excluded.delta_slack",
                       (entry, acc.epsilon_budget, acc.delta_budget, acc.delta_slack))
        return self.status(key)

    def check(self, key: str, epsilon: float, delta: float) -> tuple[float, float]:
        """Totals after a release of (epsilon, delta), or :class:`BudgetExceededError`. Records nothing."""
        return self.accountant(key).check(epsilon, delta)

    def spend(self, key: str, epsilon: float, delta: float, label: str | None = None) -> tuple[float, float]:
        """Check and record one release atomically; raises :class:`BudgetExceededError` (nothing recorded)."""
        with self._tx() as db:
            entry = self._resolve(db, self._key(key))
            after = self._with_defaults(self._stored(db, entry)).spend(epsilon, delta, label=label or key)
            db.execute("INSERT OR IGNORE INTO entries (key) VALUES (?)", (entry,))
            cur = db.execute("INSERT INTO spends (key, epsilon, delta, label, at) VALUES (?, ?, ?, ?, ?)",
                             (entry, float(epsilon), float(delta), label or key, time.time()))
            spend_id = int(cur.lastrowid)
        for spends in getattr(self._recorders, "stack", ()):
            spends.append(spend_id)
        return after

    @contextmanager
    def recording(self) -> Iterator[list[int]]:
        """The ids of the spends this thread records through this ledger inside the block (what
        :meth:`withdraw` takes)."""
        stack = self._recorders.__dict__.setdefault("stack", [])
        spends: list[int] = []
        stack.append(spends)
        try:
            yield spends
        finally:
            stack.remove(spends)

    def withdraw(self, spend_ids) -> int:
        """Withdraw recorded spends (ids from :meth:`recording`) whose release provably never
        left the machine: a request that was charged, not one byte of it written, and discarded
        with its draw. Never for a request that may have been sent. Returns how many."""
        ids = [int(i) for i in spend_ids]
        if not ids:
            return 0
        with self._tx() as db:
            return db.executemany("UPDATE spends SET withdrawn = 1 WHERE withdrawn = 0 AND id = ?",
                                  [(i,) for i in ids]).rowcount

    def account(self, key: str, label: str | None = None) -> "LedgerAccount":
        """An accountant-like view of one entry (``spend(epsilon, delta, label=None)``), for
        :class:`~pm_vector.client.query.PrivateKNN` and :class:`~pm_vector.client.PrivateMail`."""
        return LedgerAccount(self, self._key(key), label)

    def status(self, key: str) -> dict[str, Any]:
        """The entry's budget, what was spent and what remains (``key``: the entry's ledger key)."""
        with self._tx(write=False) as db:
            entry = self._resolve(db, self._key(key))
            row = db.execute("SELECT epsilon_budget, name FROM entries WHERE key = ?", (entry,)).fetchone()
            acc = self._with_defaults(self._stored(db, entry))
        eps, delta = acc.total(acc.delta_slack)
        default = row is None or row[0] is None
        return {"key": entry, "name": None if row is None else row[1],
                "epsilon_budget": acc.epsilon_budget, "delta_budget": acc.delta_budget, "default_budget": default,
                "delta_slack": acc.delta_slack, "releases": len(acc), "epsilon_spent": eps, "delta_spent": delta,
                "epsilon_remaining": max(0.0, acc.epsilon_budget - eps), "path": str(self.store)}

    def keys(self) -> list[str]:
        """The ledger's keys (one per server, and :data:`LOCAL_KEY`)."""
        with self._tx(write=False) as db:
            return sorted(r[0] for r in db.execute("SELECT key FROM entries"))

    def export(self) -> dict[str, Any]:
        """The whole ledger in the JSON form of version 1 (module doc), withdrawn spends left out:
        a backup, or what an earlier client reads."""
        out: dict[str, Any] = {"version": _VERSION, "collections": {}, "names": {}, "aliases": {}}
        with self._tx(write=False) as db:
            for key, eb, dbud, ds, name in db.execute("SELECT key, epsilon_budget, delta_budget, delta_slack, name "
                                                      "FROM entries ORDER BY key").fetchall():
                spends = [{"epsilon": e, "delta": d, "label": lab} for e, d, lab in db.execute(
                    "SELECT epsilon, delta, label FROM spends WHERE key = ? AND withdrawn = 0 ORDER BY id", (key,))]
                out["collections"][key] = {"version": 1, "epsilon_budget": eb, "delta_budget": dbud,
                                           "delta_slack": ds, "spends": spends}
                if name is not None:
                    out["names"][key] = name
            out["aliases"] = dict(db.execute("SELECT alias, key FROM aliases").fetchall())
        return out


def _legacy_data(text: str, path: Path) -> dict[str, Any]:
    """A version-1 JSON ledger's document, checked."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"the privacy ledger {path} is not valid JSON ({e}); restore it from a "
                                "backup rather than deleting it (deleting forgets what was spent).") from None
    if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("collections"), dict):
        raise InvalidInputError(f"the privacy ledger {path} is not a version-{_VERSION} ledger.")
    return data


class MemoryBudget(PrivacyBudget):
    """A :class:`PrivacyBudget` kept in memory (same defaults and checks, nothing on disk): for
    benchmarks and tests that must not touch the user's ledger. Forgotten when the object goes."""

    def __init__(self, *, default_epsilon: float | None = None, default_delta: float | None = None):
        super().__init__(Path(os.devnull), default_epsilon=default_epsilon, default_delta=default_delta)
        self.path = self.store = Path("<memory>")
        self._db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._db.executescript(_SCHEMA)
        self._lock = threading.RLock()

    def _connect(self) -> sqlite3.Connection:
        self._lock.acquire()
        return self._db

    def _close(self, db: sqlite3.Connection) -> None:
        self._lock.release()


class LedgerAccount:
    """One ledger entry seen as an accountant: ``spend(epsilon, delta, label=None)`` charges it."""

    def __init__(self, budget: PrivacyBudget, key: str, label: str | None = None):
        self.budget, self.key, self.label = budget, key, label

    def spend(self, epsilon: float, delta: float = 0.0, label: str | None = None) -> tuple[float, float]:
        return self.budget.spend(self.key, epsilon, delta, label=self.label or label)

    def status(self) -> dict[str, Any]:
        return self.budget.status(self.key)
