"""What a job carries over from the run it replaces, instead of computing it again: the product
codes of the items that run already holds.

A merge (:mod:`pm_vector.db.runs.merge`) is a new run of the active run's parameters on the current
items, every few thousand changes; most of its items are the active run's, unchanged. When the job
publishes the active run's product codes again (:func:`pm_vector.db.runs.published.of_active_run`:
the same anchor set, parameters and digest), an item's code in the active run's ``run_<id>_codes``
is ``encode`` of its features by those same codes: written by the job that built that run, or by
the write that placed the item in its delta (:func:`pm_vector.db.runs.delta.place`). An item id
never changes its features: an update, and an attached table's changed vector, give the new
version a new id (:mod:`pm_vector.db.store.update`, :mod:`pm_vector.db.store.sync`). A row of the
user's table changed but not synced yet is the exception: the job reads its new vector under the
old id, which the sync then tombstones in the new run; its carried code is the one the active run
served for it until then.

So :func:`codes` reads the active run's codes of the job's items, and the job encodes only the
others (:func:`pm_vector.db.runs.class_rows.build`'s ``carried``): at 130,000 x 128 the codes stage
took 18.6 s of a merge under a writer. It carries nothing when the job fits or takes codes of
another run, or when the stored codes are not of the codes' width. Nothing crosses from a deleted
item: only the ids the job loaded (live at its load) are read, and an item deleted later is
tombstoned in the new run as before.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import psycopg
from psycopg import sql

from .. import _binary
from ..run_tables import run_table
from .published import Published


class Carried(NamedTuple):
    """The codes a job carries (:func:`codes`)."""

    held: np.ndarray  #: a mask of the job's items: those the replaced run holds a code of
    codes: np.ndarray  #: their codes, ``(held.sum(), total_bytes_)`` uint8, in the items' order
    read_s: float  #: the seconds the read of the replaced run's codes took


def codes(conn, published: Published, ids) -> Carried | None:
    """The codes of ``ids`` (the job's items) that the run ``published`` took its codes from holds
    (:class:`Carried`); None when the job does not publish that run's codes again (module doc). Read
    on ``conn``, whose transaction it ends (rolled back: it must hold nothing else; the job then
    holds no snapshot through the build that follows)."""
    rid, pc = published.codes_run, published.codes
    if rid is None or pc is None:
        return None
    t0 = time.perf_counter()
    t = run_table(int(rid), "codes")
    m = int(pc.total_bytes_)
    try:
        if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", [t.as_string(conn)]).fetchone()[0]:
            return None
        got = _binary.decode([("item_id", "int8", 0), ("code", "bytea", m)], _binary.copy_out(
            conn, sql.SQL("SELECT item_id, code FROM {} ORDER BY item_id").format(t)))
    except (ValueError, psycopg.Error):  # codes of another width; the table gone meanwhile: encode them all
        return None
    finally:
        conn.rollback()
    ids = np.asarray(ids, dtype=np.int64)
    have = got["item_id"]
    if have.size == 0 or ids.size == 0:
        return Carried(np.zeros(ids.size, bool), np.zeros((0, m), np.uint8), time.perf_counter() - t0)
    pos = np.minimum(np.searchsorted(have, ids), have.size - 1)
    held = have[pos] == ids
    return Carried(held, got["code"][pos[held]], time.perf_counter() - t0)


def fill_codes(pc, X, carried: Carried | None) -> np.ndarray:
    """Every row's code: the ``carried`` ones as they are, the others ``pc.encode``d."""
    if carried is None:
        return pc.encode(X)
    held, got = carried.held, carried.codes
    out = np.empty((held.shape[0], int(pc.total_bytes_)), dtype=np.uint8)
    out[held] = got
    if not held.all():
        out[~held] = pc.encode(np.asarray(X)[~held])
    return out
