"""Rebuild an attached collection from its table: ``resync`` (``pm-vector attach NAME --resync``),
after DDL marked it broken (:mod:`pm_vector.db.store.capture`). SQL: ``pm_vector.pm_attach_resync``
(``sql/0020_capture.sql``); the queue it fills is applied by :func:`pm_vector.db.store.attach.sync`."""

from __future__ import annotations

from typing import Any

from ..errors import translate_sql_error
from ..postgres import connect
from ..core.collection import collection_row
from .attach import sync


def resync(collection: str, *, embed_fn_extend=None, url: str | None = None) -> dict[str, Any]:
    """Rebuild an attached collection's items from its table and clear the broken mark: the columns
    are checked (and recorded) again, the triggers made again, every row of the table queued as an
    update and every item whose row is gone as a delete, in one transaction; then :func:`sync`
    applies the queue as any sync does (new and changed rows replace their items, gone rows erase
    theirs, in the active run too). Returns the sync's counts with ``rows`` (the table's rows
    queued) and ``gone`` (items whose row is gone)."""
    with connect(url) as conn:
        collection_row(conn, collection, lock="FOR UPDATE")  # (unknown: CollectionNotFoundError; not attached: PM001)
        try:
            queued = conn.execute("SELECT pm_vector.pm_attach_resync(%s)", [collection]).fetchone()[0]
            conn.commit()
        except Exception as exc:  # noqa: BLE001 - SQL errors become pm_vector's
            conn.rollback()
            err = translate_sql_error(exc)
            if err is exc:
                raise
            raise err from exc
    out = sync(collection, embed_fn_extend=embed_fn_extend, url=url)
    out["rows"], out["gone"] = int(queued["rows"]), int(queued["gone"])
    return out
