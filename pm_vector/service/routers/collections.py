"""``GET /collections`` (the collections a key may use) and ``GET /collections/{name}`` (one, with
its active embedding run)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ..auth import in_scope
from ..deps import AUTH, NEG, CallerDep
from ..media import respond

router = APIRouter()


def _public_collection(c: dict[str, Any]) -> dict[str, Any]:
    keep = ("name", "feature_dim", "metric", "labels", "allow_raw_features", "n_items", "active_run_id",
            "active_embedding_dim", "active_since", "n_anchors", "n_dummies", "created_at", "uuid")
    out = {k: c.get(k) for k in keep}
    if out["allow_raw_features"] is None:
        out["allow_raw_features"] = bool((c.get("settings") or {}).get("allow_raw_features", False))
    out["description"] = (c.get("settings") or {}).get("description")
    return out


@router.get("/collections", dependencies=NEG, tags=["collections"])
def collections(request: Request, caller: CallerDep):
    """The collections this key may use."""
    from ... import db

    return respond(request, {"collections": [_public_collection(c) for c in db.list_collections()
                                             if in_scope(caller, c["name"])]})


@router.get("/collections/{name}", dependencies=AUTH + NEG, tags=["collections"])
def describe(name: str, request: Request):
    """One collection and its active embedding run."""
    from ... import db

    c = _public_collection(db.collection_info(name))
    run = None
    if c["active_run_id"] is not None:
        r = db.run_info(c["active_run_id"])
        run = {k: r.get(k) for k in ("run_id", "status", "params", "seed", "embedding_dim", "n_items",
                                    "n_anchors", "anchor_set_id", "finished_at", "duration")}
    return respond(request, {**c, "active_run": run})
