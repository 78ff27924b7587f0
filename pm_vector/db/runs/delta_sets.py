"""A run's delta sets -- its tombstoned ids and the items its delta placed -- as this process last read
them, moved forward by the writes this process made since, so that a syncing process does not read
them whole for every batch (:mod:`pm_vector.db.runs.run_nearest`, the delta's estimate).

Both sets grow with the delta until the merge (70,000 ids each a stream of 5 minutes at 100,000
items, bounded by the merge's threshold); reading them whole cost a sync pass about 65 ms of the
database's time at that size, in every pass (``SELECT item_id FROM delta_tombstones ...`` and the
placed ids' ``array_agg``). Every write of a run's delta increases its ``delta_version`` by one
(:func:`pm_vector.db.runs.delta.bump`, holding the run's row until its transaction ends, so the
writes of one run follow each other in the versions' order); each of this process's writes records
what it changed with the version it set and its transaction (:func:`wrote`). A held state at
version ``v`` moves to ``v + 1`` only by a record of version ``v + 1`` whose transaction committed
(``pg_xact_status``) or is the caller's own; any other version -- another process's write, a record
this process no longer holds, a transaction rolled back -- makes the sets be read whole again
(:meth:`DeltaSets.current`). So the sets :meth:`DeltaSets.current` returns are exactly those the
caller's transaction would read, at every point of it.

A record of a transaction that rolled back is dropped unapplied (its version may be taken again by
a later write), and so is one whose status the database cannot tell (too old, or a transaction it
never saw: another server at the same address; asked without the error ``pg_xact_status`` raises
for it). The records are keyed by the run's creation time too, and bounded (:data:`MAX_RECORDS`,
the oldest out: a gap then reads the sets whole). Like every cache keyed by a run's versions, this
takes a run's versions to follow one history: after a failover to a replica that had not received
every write, restart the service (docs/operations.md).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

#: records of this process's delta writes kept per run, not yet folded into a held state
MAX_RECORDS = 256
#: runs whose records are kept (least recently written out)
MAX_RUNS = 64

_lock = threading.Lock()
_records: "OrderedDict[tuple, list[Record]]" = OrderedDict()


@dataclass(frozen=True)
class Record:
    """One delta write of this process: the ``version`` it set the run's ``delta_version`` to, its
    transaction ``xid`` (``pg_current_xact_id()`` as text), the ids it tombstoned, the items it placed
    and the items whose entries it removed."""

    version: int
    xid: str
    dead: np.ndarray
    placed: np.ndarray
    unplaced: np.ndarray


def tombstoned(conn, run_id: int, ids=None) -> np.ndarray:
    """The run's tombstoned ids (of ``ids`` when given), ascending, as the caller's transaction reads them."""
    if ids is None:
        rows = conn.execute("SELECT item_id FROM pm_vector.delta_tombstones WHERE run_id = %s ORDER BY 1",
                            [int(run_id)]).fetchall()
    else:
        rows = conn.execute("SELECT item_id FROM pm_vector.delta_tombstones WHERE run_id = %s AND item_id = ANY(%s) "
                            "ORDER BY 1", [int(run_id), [int(i) for i in np.asarray(ids).tolist()]]).fetchall()
    return np.array([r[0] for r in rows], dtype=np.int64)


def placed(conn, run_id: int, level: int | None) -> np.ndarray:
    """The ids of the items the delta placed in the run (their entries at one published level; none
    without one), ascending."""
    if level is None:
        return np.zeros(0, np.int64)
    row = conn.execute("SELECT coalesce(array_agg(item_id ORDER BY item_id), '{}') FROM pm_vector.delta_entries "
                       "WHERE run_id = %s AND level = %s", [int(run_id), int(level)]).fetchone()
    return np.asarray(row[0], np.int64)


def _ids(a) -> np.ndarray:
    return np.unique(np.asarray(a, np.int64).reshape(-1))


def run_key(conn, run_id: int, created) -> tuple:
    """The records' key of a run: the database, the run and its creation time (a run id of another
    database at the same address -- one created again -- is another run)."""
    info = conn.info
    return info.host, info.port, info.dbname, int(run_id), str(created)


def wrote(conn, run_id: int, created, version: int, xid: str, *, dead=(), placed=(), unplaced=()) -> None:
    """Record a delta write of the caller's transaction to run ``run_id`` (created at ``created``;
    module doc): the version its bump set and its transaction, with what it changed."""
    rec = Record(int(version), str(xid), _ids(dead), _ids(placed), _ids(unplaced))
    k = run_key(conn, run_id, created)
    with _lock:
        got = _records.setdefault(k, [])
        _records.move_to_end(k)
        got.append(rec)
        del got[:-MAX_RECORDS]
        while len(_records) > MAX_RUNS:
            _records.popitem(last=False)


def _status(conn, xids: list[str]) -> dict[str, str | None]:
    """Each transaction's status: 'committed', 'aborted', 'in progress', or None when the database
    cannot tell -- too old, or not one of its transactions at all (a later one than it has seen:
    another server at the same address, e.g. a replica promoted behind the old primary), which
    ``pg_xact_status`` would refuse with an error."""
    if not xids:
        return {}
    return dict(conn.execute("SELECT x, CASE WHEN x::xid8 < pg_snapshot_xmax(pg_current_snapshot()) "
                             "THEN pg_xact_status(x::xid8) END FROM unnest(%s::text[]) AS x", [xids]).fetchall())


def _found(held: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``held`` (ascending, unique) where ``ids`` (ascending, unique) would go, and the
    mask of ``ids`` that ``held`` has."""
    at = np.searchsorted(held, ids)
    return at, (at < held.size) & (held[np.minimum(at, held.size - 1)] == ids) if held.size else np.zeros(ids.size, bool)


def _with(held: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``held`` and ``ids`` (both ascending, unique), ascending, unique: one copy (no sort)."""
    if not ids.size:
        return held
    at, has = _found(held, ids)
    return np.insert(held, at[~has], ids[~has])


def _without(held: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``held`` (ascending, unique) less ``ids`` (ascending, unique): one copy."""
    if not ids.size or not held.size:
        return held
    at, has = _found(held, ids)
    return np.delete(held, at[has]) if has.any() else held


def _apply(dead: np.ndarray, delta: np.ndarray, rec: Record) -> tuple[np.ndarray, np.ndarray]:
    return _with(dead, rec.dead), _without(_with(delta, rec.placed), rec.unplaced)


class DeltaSets:
    """A run's tombstoned ids (``dead``) and placed items (``delta``), both ascending, at
    ``version`` as transaction ``xid`` read them (None: a committed state), or nothing held."""

    def __init__(self):
        self.version: int | None = None
        self.xid: str | None = None
        self.dead = np.zeros(0, np.int64)
        self.delta = np.zeros(0, np.int64)
        #: the ids the last :meth:`current` tombstoned past the held state (ascending; every id of its
        #: ``dead`` not in the held state's), or None when it read the sets whole
        self.fresh: np.ndarray | None = None

    def current(self, conn, run_id: int, created, level: int | None, version: int,
                xid: str | None) -> tuple[np.ndarray, np.ndarray]:
        """``(dead, delta)`` as the caller's transaction reads them, the run (created at ``created``)
        having ``delta_version`` ``version`` in it and ``xid`` its transaction
        (``pg_current_xact_id_if_assigned()``, None when it has written nothing): the held sets moved
        forward by this process's records, or read whole."""
        k = run_key(conn, run_id, created)
        with _lock:
            recs = sorted(_records.get(k, ()), key=lambda r: r.version)
        ok = self.version is not None
        foreign = sorted({r.xid for r in recs if r.xid != xid} | ({self.xid} if ok and self.xid not in (None, xid) else set()))
        status = _status(conn, foreign) if ok else {}
        if ok and self.xid is not None and self.xid != xid:
            if status.get(self.xid) != "committed":  # (read inside a transaction that rolled back, or unknown)
                ok = False
            else:
                self.xid = None
        dead, delta, at = self.dead, self.delta, self.version
        fresh = []
        used = []
        for r in recs if ok else ():
            mine = r.xid == xid
            st = "mine" if mine else status.get(r.xid)
            if st not in ("mine", "committed"):
                if st != "in progress":
                    used.append(r)  # (rolled back, or too old to tell: never applied; its version may be taken again)
                continue
            if r.version <= at:
                if not mine:
                    used.append(r)  # (in the held state already)
                continue
            if r.version != at + 1:
                break
            dead, delta = _apply(dead, delta, r)
            fresh.append(r.dead)
            at = r.version
            if not mine:
                self.dead, self.delta, self.version = dead, delta, at
                used.append(r)
        if not ok or at != int(version):
            dead, delta = tombstoned(conn, run_id), placed(conn, run_id, level)
            self.dead, self.delta, self.version, self.xid = dead, delta, int(version), xid
            used = [r for r in recs if r.xid != xid and status.get(r.xid) in ("committed", "aborted")]
            self.fresh = None
        else:
            self.fresh = _ids(np.concatenate(fresh)) if fresh else np.zeros(0, np.int64)
        gone = {id(r) for r in used}
        with _lock:
            if gone and k in _records:
                _records[k] = [r for r in _records[k] if id(r) not in gone]
        return dead, delta
