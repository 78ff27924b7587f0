"""What a process keeps between location answers (:mod:`pm_vector.db.resolve.location_resolution`):
built answers, and the parts a miss builds from that no write of the delta changes.

* :class:`AnswerCache` (:data:`CACHE`): built answers, keyed by the run, its data versions
  (``delta_version`` among them: every write of the delta + 1) and the request's public fields.
  Under a stream of writes the version moves with every sync pass, so nearly every answer is built.
* :class:`TombstoneSets` (:data:`DEAD`): a run's tombstones at one ``delta_version``, read with the
  version in one statement: whole, or, when a set of an earlier version is held, only the tombstones
  of the versions after it (each records its version: migration 0033), joined to it (:func:`join_sets`).
* :class:`BaseRows` (:data:`ROWS`): a run's **base** location row of a cell (its parts joined) and the
  first entries of its top-hubs row. The delta's writes never change them (they write tombstones and
  delta entries beside them, :mod:`pm_vector.db.runs.delta`); the writes that do -- the erasure and
  extension of a run that does not take the delta -- increase the run's ``graph_version`` in their
  transaction, and a merge is a new run. So they are keyed by (database, run, its creation time,
  ``graph_version``). A miss then reads only the cell's delta entries (and the tombstones when no set
  of the version is held): at 100,000 items its first statement took 1.7 ms with the row and top
  hubs in it (``docs/benchmarks.md``, "Where a resolve spends its time").
* :data:`TOPS` (a :class:`BaseRows`): the top hubs a miss ranks, less the tombstones of one
  ``delta_version`` (:func:`pm_vector.shortlist.live_top`), keyed as the rows with that version and the
  prefix's length: the same for every answer built at that version, filtered once (65,536 top hubs
  against 324,000 tombstones took about 1 ms an answer when each answer filtered them).
* :class:`CodeSlices` (:data:`CODES`): the published slice (offset, width) of each run item's product
  code. A run item's code never changes (a changed item is a new item, an id is never reused), so
  they are keyed as the rows (the erasure of a run without the delta deletes codes: its
  ``graph_version``), with the offset and width, and by id; a miss reads only the codes it does not
  hold.

A part read for a miss is kept only once the answer built on it is kept (the caller's
:meth:`Pending.keep`: the known path's log statement found the run at the version the part was
keyed under; the full path read it in the snapshot that read the version), so nothing read in a
state a write changed since is held under an older version. Every part is a function of public
values and of the run's data, as the answers themselves; each cache is bounded in bytes, least
recently used out, and :func:`forget_runs` drops a collection's other runs' parts when a process
first answers from a new run (a merge's: the deleted items' codes and rows leave memory with it, as
they leave the tables)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable, Iterable

import numpy as np

#: bytes of answers one process keeps (the least recently used go first)
CACHE_BYTES = 256 << 20
#: bytes of base rows and top hubs one process keeps
ROWS_BYTES = 128 << 20
#: bytes of top hubs less the tombstones one process keeps (about 1 MB a version at 65,536 top hubs)
TOPS_BYTES = 16 << 20
#: bytes of code slices one process keeps (an entry counted with its dictionary's overhead)
CODES_BYTES = 64 << 20
#: a code slice's bytes in memory beyond its own (the bytes object, its id, the dictionary's slot)
CODE_OVERHEAD = 160
#: runs' tombstone sets this process holds (the least recently used go first)
DEAD_KEEP = 32


class _Bounded:
    """Entries in least-recently-used order, bounded in bytes, behind one lock."""

    def __init__(self, max_bytes: int, bytes_of):
        self.max_bytes = int(max_bytes)
        self._d: OrderedDict = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._bytes_of = bytes_of  # (what an entry as stored counts)

    def drop_where(self, pred) -> None:
        """Drop every entry whose key satisfies ``pred``."""
        with self._lock:
            for k in [k for k in self._d if pred(k)]:
                self._bytes -= self._bytes_of(self._d.pop(k))

    def clear(self) -> None:
        with self._lock:
            self._d.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        return self._bytes


class _Lru(_Bounded):
    """A thread-safe LRU bounded in bytes (each value put with its size)."""

    def __init__(self, max_bytes: int):
        super().__init__(max_bytes, lambda stored: stored[1])
        self.hits = self.misses = 0

    def get(self, key):
        with self._lock:
            v = self._d.get(key)
            if v is None:
                self.misses += 1
                return None
            self._d.move_to_end(key)
            self.hits += 1
            return v[0]

    def put(self, key, value, size: int) -> None:
        with self._lock:
            if size > self.max_bytes:
                return
            old = self._d.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._d[key] = (value, int(size))
            self._bytes += int(size)
            while self._bytes > self.max_bytes:
                _, (_, s) = self._d.popitem(last=False)
                self._bytes -= s

class AnswerCache(_Lru):
    """Built answers, bounded in bytes. Keys are public values only; an answer already held stays."""

    def __init__(self, max_bytes: int = CACHE_BYTES):
        super().__init__(max_bytes)

    def put(self, key, value, size: int) -> None:
        with self._lock:
            if key in self._d:
                return
        super().put(key, value, size)


class TombstoneSets:
    """The tombstone sets of runs, each at one ``delta_version``, held by this process. The set of
    (database, run, version) is a function of the database state: every write of a run's tombstones
    bumps its ``delta_version`` in the same transaction, and they go only with the run. So a miss
    reads it (with the version, in its first statement) only when the set of the version it is built
    on is not held, and every other answer built at that version uses it: an answer read every
    tombstone of its run before (about 6,600 at 100,000 items after 10,000 changes, to rank a row of
    1,700 entries at eps 16)."""

    def __init__(self, keep: int = DEAD_KEEP):
        self.keep = int(keep)
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.reads = 0

    def get(self, key: tuple) -> np.ndarray | None:
        """The set held under ``key`` (a run's identity and a ``delta_version``), or None."""
        with self._lock:
            got = self._d.get(key)
            if got is not None:
                self._d.move_to_end(key)
            return got

    def latest(self, run_key: tuple, below: int) -> tuple[int, np.ndarray] | None:
        """The set of run ``run_key`` held at the highest version below ``below``, with its version, or
        None: a miss at version ``below`` reads only the tombstones of the later versions
        (``delta_tombstones.version``, migration 0033) and joins them to it (:func:`join_sets`)."""
        n = len(run_key)
        with self._lock:
            best = None
            for k in self._d:
                if len(k) == n + 1 and k[:n] == run_key and k[n] < below and (best is None or k[n] > best[n]):
                    best = k
            return None if best is None else (int(best[n]), self._d[best])

    def put(self, key: tuple, dead: np.ndarray) -> None:
        """Hold ``dead`` (ascending) under ``key``: the version it was read at, in the same snapshot."""
        dead.flags.writeable = False
        with self._lock:
            self.reads += 1
            self._d[key] = dead
            while len(self._d) > self.keep:
                self._d.popitem(last=False)

    def drop_where(self, pred) -> None:
        with self._lock:
            for k in [k for k in self._d if pred(k)]:
                del self._d[k]

    def clear(self) -> None:
        with self._lock:
            self._d.clear()


def join_sets(held: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The ascending union of two ascending id sets (the tombstones held at one version, and those of
    the versions after it): ``new`` put in its places, O(len(held)); an id in both kept once."""
    new = np.asarray(new, np.int64)
    if new.size == 0:
        return held
    out = np.insert(held, np.searchsorted(held, new), new)
    if out.size > 1 and not bool((out[1:] > out[:-1]).all()):
        out = np.unique(out)
    return out


class BaseRows(_Lru):
    """Base rows ``(run key, level, cell) -> (ids, hubs, chubs)`` and top-hubs prefixes
    ``(run key, "top") -> (ids, chubs, complete)`` (``complete``: the whole row; else its first
    entries), arrays read-only. The run key holds the run's ``graph_version`` (module doc)."""

    def __init__(self, max_bytes: int = ROWS_BYTES):
        super().__init__(max_bytes)


class CodeSlices(_Bounded):
    """Per (run key, offset, width): item id -> its code's slice, bounded in bytes over all keys
    (the least recently used key's slices go first)."""

    def __init__(self, max_bytes: int = CODES_BYTES):
        # (key -> dict id -> bytes)
        super().__init__(max_bytes, lambda stored: sum(len(s) + CODE_OVERHEAD for s in stored.values()))

    def get_many(self, key: Hashable, ids: Iterable[int]) -> list[bytes | None]:
        """Each id's slice held under ``key``, or None."""
        with self._lock:
            d = self._d.get(key)
            if d is None:
                return [None for _ in ids]
            self._d.move_to_end(key)
            return [d.get(i) for i in ids]

    def put_many(self, key: Hashable, slices: dict[int, bytes]) -> None:
        with self._lock:
            d = self._d.setdefault(key, {})
            self._d.move_to_end(key)
            for i, s in slices.items():
                if i not in d:
                    d[i] = s
                    self._bytes += len(s) + CODE_OVERHEAD
            while self._bytes > self.max_bytes and self._d:
                k, old = next(iter(self._d.items()))
                if k == key and len(self._d) == 1:  # one key past the bound: its oldest half out
                    for i in list(old)[:max(1, len(old) // 2)]:
                        self._bytes -= len(old.pop(i)) + CODE_OVERHEAD
                    continue
                self._d.popitem(last=False)
                self._bytes -= self._bytes_of(old)


#: this process's answers
CACHE = AnswerCache()
#: this process's tombstone sets
DEAD = TombstoneSets()
#: this process's base rows and top hubs
ROWS = BaseRows()
#: this process's top hubs less the tombstones of a version
TOPS = BaseRows(TOPS_BYTES)
#: this process's code slices
CODES = CodeSlices()

#: (database, port, collection id) -> the run key this process last answered from
_RUN_OF: dict[tuple, tuple] = {}
_run_lock = threading.Lock()


def forget_runs(coll_key: tuple, run_key: tuple) -> None:
    """Note that collection ``coll_key`` (database, port, collection id) answers from ``run_key``
    (database, port, run id, creation time, ``graph_version``); when it answered from another run
    or version before, drop that one's rows and codes (a merge replaced the run, an erasure changed
    it: the deleted items' parts leave memory too)."""
    with _run_lock:
        old = _RUN_OF.get(coll_key)
        if old == run_key:
            return
        _RUN_OF[coll_key] = run_key
    if old is None:
        return
    stale = lambda k: k[:len(old)] == old  # noqa: E731
    ROWS.drop_where(stale)
    TOPS.drop_where(stale)
    CODES.drop_where(stale)


class Pending:
    """Parts a miss read, kept (:meth:`keep`) only once the answer built on them is kept."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, Any, int]] = []
        self.tops: list[tuple[Any, Any, int]] = []
        self.codes: list[tuple[Hashable, dict[int, bytes]]] = []

    def keep(self) -> None:
        for key, value, size in self.rows:
            ROWS.put(key, value, size)
        for key, value, size in self.tops:
            TOPS.put(key, value, size)
        for key, slices in self.codes:
            if slices:
                CODES.put_many(key, slices)


def clear_all() -> None:
    """Empty every cache of this process (a benchmark timing answers built from the tables)."""
    CACHE.clear()
    DEAD.clear()
    ROWS.clear()
    TOPS.clear()
    CODES.clear()
    with _run_lock:
        _RUN_OF.clear()
