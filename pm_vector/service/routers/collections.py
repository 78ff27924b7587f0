"""``GET /collections`` (the collections a key may use), ``GET /collections/{name}`` (one, with
its active embedding run) and ``GET /collections/{name}/sync`` (how far behind an attached
table's sync is; admin keys)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from .. import schemas
from ..auth import in_scope
from ..deps import ADMIN_SCOPED, AUTH, NEG, CallerDep
from ..errors import ApiError
from ..media import respond
from ...db.store.payloads import high_of, limit_of
from ... import db
from ...db.store.attach import sync_status as _status
from ...errors import InvalidInputError

router = APIRouter()


def _public_collection(c: dict[str, Any]) -> dict[str, Any]:
    keep = ("name", "feature_dim", "metric", "labels", "allow_raw_features", "n_items", "active_run_id",
            "active_embedding_dim", "active_since", "n_anchors", "n_dummies", "created_at", "uuid")
    out = {k: c.get(k) for k in keep}
    if out["allow_raw_features"] is None:
        out["allow_raw_features"] = bool((c.get("settings") or {}).get("allow_raw_features", False))
    out["description"] = (c.get("settings") or {}).get("description")
    # the bound of one item's payload (compact JSON bytes): what a client's byte budget counts per candidate
    out["max_payload_bytes"] = limit_of(c)
    # what the payloads stored may take: min(bound, the high-water mark of the payloads ever written), the
    # bound when the collection keeps no mark (pm_vector.db.store.payloads); a client plans with it
    out["payload_bytes_max"] = high_of(c)
    return out


@router.get("/collections", dependencies=NEG, tags=["collections"])
def collections(request: Request, caller: CallerDep):
    """The collections this key may use."""
    return respond(request, {"collections": [_public_collection(c) for c in db.list_collections()
                                             if in_scope(caller, c["name"])]})


@router.get("/collections/{name}", dependencies=AUTH + NEG, tags=["collections"])
def describe(name: str, request: Request):
    """One collection and its active embedding run."""
    c = _public_collection(db.collection_info(name))
    run = None
    if c["active_run_id"] is not None:
        r = db.run_info(c["active_run_id"])
        run = {k: r.get(k) for k in ("run_id", "status", "params", "seed", "embedding_dim", "n_items",
                                    "n_anchors", "anchor_set_id", "finished_at", "duration")}
    return respond(request, {**c, "active_run": run})


@router.get("/collections/{name}/sync", dependencies=ADMIN_SCOPED + NEG, response_model=schemas.SyncStatus,
            tags=["collections"])
def sync_status(name: str, request: Request):
    """How far behind the sync of an attached table is (admin keys): the changes queued and not yet
    applied, when the oldest was queued and how many seconds it has waited (``lag_s``; null when
    nothing is queued), and ``broken``: why its queries are refused, if they are. 404 for an unknown
    collection, 409 ``not_attached`` for one that is not an attached table."""
    try:
        return respond(request, _status(name))
    except InvalidInputError as exc:  # (the only one: the collection is not an attached table)
        raise ApiError(409, "not_attached", str(exc)) from None
