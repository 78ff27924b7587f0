"""A run's public cells -- the cell release's (``embedding_runs.public_cells``) and the location
release's (``embedding_runs.public_locations``) -- parsed once per process.

Both are fit by the run's job on the public anchor set and never change afterwards, but every sync
batch, erasure and placement used to read and parse the documents again (about 0.2 s a batch at
100,000 items). :func:`get` keeps them by the digest the run's class-rows document publishes for
them, and an entry is kept only after the parsed cells were checked to give that digest: a key
names the content, so runs, databases and servers can share it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Mapping

from psycopg import sql

from ...manifold.public_cells import PublicCells

#: documents kept (least recently used out)
MAX_ENTRIES = 16

#: the class-rows document's part and the run row's column of each kind
_WHERE = {"cells": ("cells", "public_cells"), "locations": ("locations", "public_locations")}

_cache: "OrderedDict[tuple[str, str], Any]" = OrderedDict()
_lock = threading.Lock()


def get(conn, run_id: int, doc: Mapping[str, Any] | None, kind: str):
    """The run's :class:`~pm_vector.manifold.public_cells.PublicCells` of ``kind`` ("cells" or
    "locations"), or None when its class-rows document ``doc`` has them not ready."""
    part, column = _WHERE[kind]
    info = (doc or {}).get(part) or {}
    if info.get("status") != "ready":
        return None
    k = (column, str(info.get("digest")))
    with _lock:
        got = _cache.get(k)
        if got is not None:
            _cache.move_to_end(k)
            return got
    row = conn.execute(sql.SQL("SELECT {} FROM pm_vector.embedding_runs WHERE id = %s").format(sql.Identifier(column)),
                       [int(run_id)]).fetchone()
    if row is None or row[0] is None:
        return None
    cells = PublicCells.from_dict(row[0])
    if cells.digest() == k[1]:
        with _lock:
            _cache[k] = cells
            while len(_cache) > MAX_ENTRIES:
                _cache.popitem(last=False)
    return cells
