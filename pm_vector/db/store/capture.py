"""The capture of an attached table, from pm_vector's side (migration 0020, ``sql/0020_capture.sql``):
the "broken" mark and the resync.

The triggers on the table queue its changes with canonical keys (``pm_vector.pm_attach_key``: one
text per supported key type, the one home of the key's text for the capture, the initial items and
the sync). When the table changes under the collection -- a tracked column dropped, renamed or
retyped, the table rewritten by ``ALTER COLUMN ... TYPE ... USING`` or dropped -- the event
triggers (or, without them, :func:`check_attached` before each sync batch) mark the collection
broken: ``settings -> 'broken' = {"reason", "at"}``. A broken collection's queries and syncs are
refused with :class:`pm_vector.db.errors.CollectionBrokenError` (the service's 409
``collection_broken``) until :func:`resync` (``pm-vector attach NAME --resync``) rebuilds its items
from the table.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import CollectionBrokenError, translate_sql_error
from ..postgres import connect
from ._common import collection_row


def refuse_broken(coll: Mapping[str, Any]) -> None:
    """CollectionBrokenError when the collection row carries the mark."""
    broken = (coll.get("settings") or {}).get("broken")
    if broken:
        raise CollectionBrokenError(coll["name"], str(broken.get("reason")), broken.get("at"))


def check_attached(conn, coll: Mapping[str, Any]) -> None:
    """Before a sync batch (the collection row locked by the caller): refused when marked; else the
    table's tracked columns checked against the catalog (``pm_attach_check``) -- a table or column
    that changed is marked (committed at once, so that it outlives the refusal) and refused."""
    refuse_broken(coll)
    att = coll["settings"]["attached"]
    reason = conn.execute("SELECT pm_vector.pm_attach_check(%s::jsonb, %s::oid)",
                          [_json(att), att.get("relid")]).fetchone()[0]
    if reason is not None:
        conn.execute("SELECT pm_vector.pm_attach_mark_broken(%s, %s)", [coll["id"], reason])
        conn.commit()
        raise CollectionBrokenError(coll["name"], reason)


def _json(v):
    from psycopg.types.json import Jsonb

    return Jsonb(v)


def resync(collection: str, *, embed_fn_extend=None, url: str | None = None) -> dict[str, Any]:
    """Rebuild an attached collection's items from its table and clear the broken mark: the columns
    are checked (and recorded) again, the triggers made again, every row of the table queued as an
    update and every item whose row is gone as a delete, in one transaction; then :func:`sync`
    applies the queue as any sync does (new and changed rows replace their items, gone rows erase
    theirs, in the active run too). Returns the sync's counts with ``rows`` (the table's rows
    queued) and ``gone`` (items whose row is gone)."""
    from .attach import sync

    with connect(url) as conn:
        coll = collection_row(conn, collection, lock="FOR UPDATE")
        if not (coll["settings"] or {}).get("attached"):
            from .attach import _not_attached

            raise _not_attached(collection)
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
