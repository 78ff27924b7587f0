"""The capture of an attached table, from pm_vector's side (migration 0020, ``sql/0020_capture.sql``):
the "broken" mark and the resync.

The triggers on the table queue its changes with canonical keys (``pm_vector.pm_attach_key``: one
text per supported key type, the one home of the key's text for the capture, the initial items and
the sync). When the table changes under the collection -- a tracked column dropped, renamed or
retyped, the table rewritten by ``ALTER COLUMN ... TYPE ... USING`` or dropped -- the event
triggers (or, without them, :func:`check_attached` before each sync batch) mark the collection
broken: ``settings -> 'broken' = {"reason", "at"}``. A broken collection's queries and syncs are
refused with :class:`pm_vector.db.errors.CollectionBrokenError` (the service's 409
``collection_broken``) until :func:`pm_vector.db.store.resync.resync` (``pm-vector attach NAME
--resync``) rebuilds its items from the table.
"""

from __future__ import annotations

from typing import Any, Mapping

from psycopg.types.json import Jsonb

from ..errors import CollectionBrokenError


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
    return Jsonb(v)
