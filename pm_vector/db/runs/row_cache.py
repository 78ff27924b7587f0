"""The cell rows a syncing process read or wrote, kept in its memory from one sync batch to the
next (:mod:`pm_vector.db.runs.array_rows`).

A batch of a few changes reads nearly every cell row of the run (an erased item, or an item whose
class count changed, is listed in most of them), rows the same process had read or written in its
batch before. :class:`Kept` gives them back instead, held as if read in the batch's transaction.
At 100,000 items a batch of 5 changes took 0.73 s instead of 1.13 s, one of 25 1.78 s instead of
2.03 s (``python -m pm_vector.bench.attach_bench --seconds 0 --batch-sizes 5,25,100
--compare-kept-rows``).

Kept rows are never trusted on the strength of a version alone:

* an entry is keyed by the database, the table, the run's creation time and its class rows'
  ``graph_version``, which every change of the run's items increases in the changing transaction
  (as for :mod:`pm_vector.db.runs.item_cache`); a change made by another process makes it miss;
* every row kept carries the ``xmin`` it had when the batch that kept it ended (read back after
  its writes); a new batch reads the ``xmin`` of every row of the table (keys only: no array is
  read) and drops each kept row whose ``xmin`` differs, or that the table no longer holds. So a row
  changed by anything at all -- even without the version -- is read again;
* an entry is taken out of the cache when a batch uses it (the batch changes its rows in place),
  and a batch's rows are kept only after its transaction committed: a batch that fails leaves
  nothing behind, and the next reads the rows from the table;
* only runs whose rows are all on this node (not sharded) are kept, and only while the rows fit in
  :data:`MAX_BYTES`.

The location rows are not kept: a batch reads few of their parts (by key), and holding all of
them (860,488 parts at 100,000 items) made every read test each held part in Python and every batch
read every part's ``xmin``; with them kept a batch of 5 changes took 3.0 s instead of 2.4 s.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Iterable, Mapping

from psycopg import sql

from ..run_tables import TableName, run_table
from . import array_rows, item_cache

#: bytes of rows kept by one process (a table whose rows take more is not kept)
MAX_BYTES = 512 << 20

_cache: "OrderedDict[tuple, dict]" = OrderedDict()
_lock = threading.Lock()

#: rows this process's batches took from the cache instead of reading them (for tests and benchmarks)
reused = 0

#: each kept table's key columns
_KEYS = {"cells": ("level", "label", "cell")}


def _nbytes(rows: Iterable[array_rows.ArrayRow]) -> int:
    return sum(r.item_ids.nbytes + r.hubs.nbytes + r.chubs.nbytes + 64 for r in rows)


def _xmins(conn, table: sql.Composable, keys: tuple[str, ...]) -> dict[tuple, str]:
    """Every row's key and ``xmin`` (the arrays are not read)."""
    return {tuple(int(v) for v in r[:-1]): r[-1] for r in conn.execute(
        sql.SQL("SELECT {}, xmin::text FROM {}").format(sql.SQL(", ").join(map(sql.Identifier, keys)), table)).fetchall()}


class Kept:
    """The kept rows of one batch's runs: :meth:`seed` at the start (inside
    :func:`pm_vector.db.runs.array_rows.deferred`), :meth:`collect` at the end of its work (still inside),
    :meth:`keep` after the commit (nothing kept without it)."""

    def __init__(self, conn, runs: Iterable[tuple[int, Mapping[str, Any] | None]]):
        self.tables: dict[TableName, tuple[int, str]] = {}  # table -> (run id, kind)
        self.before: dict[int, tuple] = {}  # run id -> its version's key when the batch began
        self._got: dict[TableName, dict] = {}
        for rid, doc in runs:
            doc = doc or {}
            if doc.get("shards") or doc.get("status") != "ready":
                continue
            k = item_cache.key(conn, int(rid), doc)
            if k is None:
                continue
            self.before[int(rid)] = k
            if (doc.get("cells") or {}).get("status") == "ready":
                self.tables[run_table(rid, "cells")] = (int(rid), "cells")

    def seed(self, conn) -> int:
        """The rows kept for the runs' current versions, held for ``conn`` as if read now (those whose
        ``xmin`` still is the one kept). Returns how many rows were seeded."""
        global reused
        n = 0
        for t, (rid, kind) in self.tables.items():
            with _lock:
                entry = _cache.pop(self.before[rid] + (t,), None)
            if entry is None:
                continue
            now = _xmins(conn, t, _KEYS[kind])
            rows = {k: r for k, r in entry["rows"].items() if now.get(k) is not None and now[k] == entry["xmin"].get(k)}
            array_rows.seed(conn, t, rows, complete=entry["complete"] and len(rows) == len(now))
            n += len(rows)
        with _lock:
            reused += n
        return n

    def collect(self, conn) -> None:
        """At the end of the batch's work, still inside ``array_rows.deferred``: its writes done, the rows
        it holds and their ``xmin`` (read back), to keep if it commits."""
        array_rows.flush(conn)
        self._got = {}
        for t, (rid, kind) in self.tables.items():
            held = array_rows.held(conn, t)
            if held is None or not held[0]:
                continue
            rows, complete = held
            if _nbytes(rows.values()) > MAX_BYTES:
                continue
            now = _xmins(conn, t, _KEYS[kind])
            self._got[t] = {"rows": {k: r for k, r in rows.items() if k in now},
                            "xmin": {k: now[k] for k in rows if k in now}, "complete": complete and len(rows) == len(now)}

    def keep(self, after: Mapping[int, tuple | None]) -> None:
        """After the commit: the collected rows under each run's version as the batch left it (``after``:
        run id -> its :func:`pm_vector.db.runs.item_cache.key`, read before the commit)."""
        with _lock:
            for t, entry in self._got.items():
                k = after.get(self.tables[t][0])
                if k is None:
                    continue
                for old in [o for o in _cache if o[:4] == k[:4] and o[-1] == t]:  # one version per table
                    del _cache[old]
                _cache[k + (t,)] = entry
            total = sum(_nbytes(e["rows"].values()) for e in _cache.values())
            while _cache and total > MAX_BYTES:
                _, e = _cache.popitem(last=False)
                total -= _nbytes(e["rows"].values())
        self._got = {}


def forget(run_id: int | None = None) -> None:
    """Drop the rows kept of a run's tables (of every run with None)."""
    with _lock:
        for k in [k for k in _cache if run_id is None or k[3] == int(run_id)]:
            del _cache[k]


def kept_rows() -> int:
    """How many rows this process keeps (for tests and benchmarks)."""
    with _lock:
        return sum(len(e["rows"]) for e in _cache.values())

