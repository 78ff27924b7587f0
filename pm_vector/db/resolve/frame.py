"""The public side of a collection's active run: its anchor set, dummy pool and anchor frame.

A client needs three public things to build a PrivateMail request against a collection:

* the **anchor set** the active run was built with -- ids, features, labels. The stable id of
  row ``i`` of anchor set ``S`` is the string ``"S:i"`` (:func:`anchor_id`); a request lists
  these ids, in order, for its anchor rows;
* the current **dummy pool** (the newest anchor set of role ``dummy``): public items, disjoint
  from the anchors, from which the client draws one dummy row per other class;
* the **frame**: the run's AnchorFrame parameters and public seed (and the stored anchor
  embedding, so the client can check that its rebuilt frame is the run's).

``public_anchor(collection)`` returns the first two as a :class:`~pm_vector.protocol.PublicAnchor`
and the third as a dict; ``client_frame(collection)`` rebuilds the fitted
:class:`~pm_vector.manifold.AnchorFrame` and checks it against the stored anchor embedding.

Nothing here is private: the anchor set, the dummy pool, the parameters and the seed are
published by the server; the frame depends on them only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from psycopg import sql
from psycopg.rows import dict_row

from ...errors import FrameMismatchError, InvalidInputError  # noqa: F401  (FrameMismatchError: its old home)
# the one rebuild of the public frame, its tolerance and its error
from ...protocol.frame import FRAME_TOLERANCE, rebuild_frame  # noqa: F401
from .. import _binary
from ..core.collection import collection_row, load_anchor_set
from ..postgres import connect
from ..errors import DatabaseError, NoActiveRunError, CollectionNotFoundError, ClassRowsUnavailableError
from ..run_tables import run_table
from ...manifold.class_frames import ClassFrames
from ...protocol.anchor import PublicAnchor
from ..store.capture import refuse_broken


def anchor_id(anchor_set_id: int, position: int) -> str:
    """The stable id of row ``position`` of anchor set ``anchor_set_id``: ``"S:i"``."""
    return f"{int(anchor_set_id)}:{int(position)}"


def anchor_ids(anchor_set_id: int, n: int) -> list[str]:
    """The ids of the ``n`` rows of anchor set ``anchor_set_id``, in row order."""
    s = int(anchor_set_id)
    return [f"{s}:{i}" for i in range(int(n))]


@dataclass(frozen=True)
class RunFrame:
    """What the server needs of an active run to resolve requests (immutable once the run
    succeeded, so it is cached per database and run)."""

    collection: str
    collection_id: int
    run_id: int
    run_created_at: Any
    anchor_set_id: int
    params: dict
    seed: int
    embedding_dim: int
    metric: str
    anchor_ids: list
    anchor_embedding: np.ndarray  # (A, k) float64, from the stored float32
    anchor_labels: np.ndarray
    classes: np.ndarray
    _frame: list = field(default_factory=list, repr=False, compare=False)  # lazily fitted AnchorFrame

    def frame(self, anchor_features: np.ndarray | None = None):
        """The run's fitted AnchorFrame (rebuilt once, verified, cached)."""
        if not self._frame:
            if anchor_features is None:
                with connect() as conn:
                    coll = collection_row(conn, self.collection)
                    anchor_features = load_anchor_set(conn, coll, "anchor", self.anchor_set_id).features
            self._frame.append(rebuild_frame(anchor_features, self.anchor_labels, self.params, self.seed,
                                             self.anchor_embedding, run_id=self.run_id))
        return self._frame[0]


_cache: dict[tuple, RunFrame] = {}
_cache_lock = threading.Lock()
_CACHE_MAX = 64


_META_SQL = (
    "SELECT c.id, c.name, c.feature_dim, c.feature_type, c.metric, c.labels, c.settings, c.active_run_id, "
    "r.anchor_set_id, r.params, r.seed, r.embedding_dim, r.created_at AS run_created_at, r.class_rows, "
    # the delta's version (sql/0023_delta.sql): every write of the delta + 1, in every cached answer's key
    "r.delta_version, "
    # the run row's version: any change of its class_rows document is a new tuple, a new xmin
    "r.xmin::text AS run_xmin, "
    # (a raw model that an erasure took out of service serves no scores: None, as without a model)
    "CASE WHEN m.kind = 'raw' AND m.erased_at IS NOT NULL THEN NULL ELSE m.id END AS kahm_model_id, "
    "m.classes AS kahm_classes, m.kind AS kahm_kind "
    "FROM pm_vector.collections c LEFT JOIN pm_vector.embedding_runs r ON r.id = c.active_run_id "
    # the current KAHM model (newest), whose stored item scores come back with resolved rows
    "LEFT JOIN LATERAL (SELECT k.id, k.classes, k.kind, k.erased_at FROM pm_vector.kahm_models k WHERE k.collection_id = c.id "
    "ORDER BY k.id DESC LIMIT 1) m ON true "
    "WHERE c.name = %s")


def run_row(conn, collection: str) -> dict[str, Any]:
    """Collection + active run metadata in one query: ``{"coll": ..., "run": ...}``.
    Raises CollectionNotFoundError / NoActiveRunError."""
    if not isinstance(collection, str):
        raise InvalidInputError(f"collection must be a name (str), got {type(collection).__name__}.")
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(_META_SQL, [collection])
        row = cur.fetchone()
    if row is None:
        raise CollectionNotFoundError(
            f"unknown collection {collection!r}; list_collections() (or `SELECT name FROM pm_vector.pm_collections`) "
            "shows the existing ones.")

    refuse_broken(row)
    if row["active_run_id"] is None:
        raise NoActiveRunError(
            f"collection {collection!r} has no active embedding run yet, so there is nothing to resolve against; "
            f"run `pm-vector embed {collection}` (or pm_vector.db.run_embedding_job) first.")
    run = {"id": row["active_run_id"], "anchor_set_id": row["anchor_set_id"], "params": row["params"],
           "seed": row["seed"], "embedding_dim": row["embedding_dim"], "created_at": row["run_created_at"]}
    if run["anchor_set_id"] is None:  # pragma: no cover - jobs always record it
        raise NoActiveRunError(f"the active run of collection {collection!r} has no recorded anchor set.")
    return {"coll": row, "run": run}


def run_frame(conn, collection: str, meta: Mapping[str, Any] | None = None) -> RunFrame:
    """The :class:`RunFrame` of the collection's active run, read on ``conn`` (cached per
    database, run id and run creation time: a succeeded run never changes)."""
    meta = meta or run_row(conn, collection)
    coll, run = meta["coll"], meta["run"]
    pg = conn.pgconn  # (conn.info.dsn parses the connection string: too slow per request)
    key = (pg.host, pg.port, pg.db, int(run["id"]), str(run["created_at"]), collection)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    k = int(run["embedding_dim"])
    vtype = "vector" if k <= 2000 else "halfvec"
    buf = _binary.copy_out(conn, sql.SQL("SELECT position, embedding FROM {} ORDER BY position").format(
        run_table(run["id"], "anchors")))
    d = _binary.decode([("position", "int4", 0), ("embedding", vtype, k)], buf)
    labels = np.array([r[0] for r in conn.execute(
        "SELECT label FROM pm_vector.anchors WHERE anchor_set_id = %s ORDER BY position",
        [run["anchor_set_id"]]).fetchall()], dtype=np.int64)
    n = labels.shape[0]
    if d["position"].shape[0] != n or np.any(d["position"] != np.arange(n)):
        raise DatabaseError(f"run {run['id']} of collection {collection!r} does not hold one embedding per anchor "
                            f"of anchor set {run['anchor_set_id']}; re-run the embedding job.")
    rf = RunFrame(collection=collection, collection_id=int(coll["id"]), run_id=int(run["id"]),
                  run_created_at=run["created_at"], anchor_set_id=int(run["anchor_set_id"]),
                  params=dict(run["params"] or {}), seed=int(run["seed"]), embedding_dim=k, metric=coll["metric"],
                  anchor_ids=anchor_ids(run["anchor_set_id"], n),
                  anchor_embedding=d["embedding"].astype(np.float64), anchor_labels=labels,
                  classes=np.unique(labels))
    with _cache_lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.pop(next(iter(_cache)))
        _cache[key] = rf
    return rf


def clear_cache() -> None:
    """Forget cached run frames (they are keyed by run and never stale; this frees memory)."""
    with _cache_lock:
        _cache.clear()


def _class_rows_docs(conn, run_id: int):
    """``(class_frames, class_rows)`` documents of a run; ``(None, None or the reason)`` when the
    run has no class rows."""
    row = conn.execute("SELECT class_frames, class_rows FROM pm_vector.embedding_runs WHERE id = %s",
                       [int(run_id)]).fetchone()
    if row is None:
        return None, None
    frames, doc = row
    if not doc or doc.get("status") != "ready":
        return None, doc
    return frames, doc


def class_frames(collection: str):
    """The :class:`~pm_vector.manifold.class_frames.ClassFrames` of the collection's active run
    (fit on its public anchor set by the embedding job), as a client rebuilds them from
    :func:`public_anchor`'s ``frame_info["class_frames"]``. Raises ClassRowsUnavailableError
    when the run has none (a run built before class rows, or an anchor set that cannot give
    frames)."""
    with connect() as conn:
        meta = run_row(conn, collection)
        frames, doc = _class_rows_docs(conn, meta["run"]["id"])
        conn.rollback()
    if frames is None:
        raise ClassRowsUnavailableError(
            f"the active run {meta['run']['id']} of collection {collection!r} has no class frames"
            f"{' (' + doc['error'] + ')' if doc and doc.get('error') else ' (built before class rows existed)'}; "
            "run a new embedding job for the collection.")
    return ClassFrames.from_dict(frames)


def public_anchor(collection: str):
    """``(PublicAnchor, frame_info)`` of the collection's active run.

    The :class:`~pm_vector.protocol.PublicAnchor` holds the run's anchor set (ids ``"S:i"``,
    features, labels) and the current dummy pool. ``frame_info``: ``collection``, ``run_id``,
    ``anchor_set_id``, ``dummy_set_id``, ``params`` and ``seed`` (AnchorFrame's keyword
    arguments and public seed), ``embedding_dim``, ``metric``, ``classes`` and
    ``anchor_embedding`` (``(A, k)``, as stored) -- everything a client needs to rebuild the
    run's frame (:func:`client_frame`) -- and, for class-rows requests, ``class_frames`` (the
    run's ``ClassFrames.to_dict()``, or None), ``class_rows`` (its parameters, class order,
    class sizes, frames digest and ``codes``: the codes' widths and digest) and
    ``product_codes`` (the published :class:`~pm_vector.manifold.codes.ProductCodes` of the
    items' codes, fit on the public anchor set only, as :func:`pm_vector.protocol.published_codes.pack`
    writes it; None when the run has none): a client re-ranks a compact answer's candidates by
    their asymmetric distances to its query; and
    ``public_cells`` (the run's :class:`~pm_vector.manifold.public_cells.PublicCells` document, fit on the
    public anchor set only, for cell requests; its digest and levels are ``class_rows["cells"]``;
    None when the run serves no cells) and ``public_locations`` (the location release's cells of the
    whole anchor, likewise; its digest and levels are ``class_rows["locations"]``). Raises CollectionNotFoundError, NoActiveRunError,
    NoAnchorSetError (no dummy pool registered).
    """
    with connect() as conn:
        meta = run_row(conn, collection)
        rf = run_frame(conn, collection, meta)
        coll = meta["coll"]
        anchors = load_anchor_set(conn, coll, "anchor", rf.anchor_set_id)
        dummies = load_anchor_set(conn, coll, "dummy", None)
        class_frames_doc, class_rows_doc = _class_rows_docs(conn, rf.run_id)
        projection_doc = cells_doc = locations_doc = None
        if class_frames_doc is not None and ((class_rows_doc or {}).get("codes") or {}).get("status") == "ready":
            projection_doc = conn.execute("SELECT public_projection FROM pm_vector.embedding_runs WHERE id = %s",
                                          [rf.run_id]).fetchone()[0]
        if class_frames_doc is not None and ((class_rows_doc or {}).get("cells") or {}).get("status") == "ready":
            cells_doc = conn.execute("SELECT public_cells FROM pm_vector.embedding_runs WHERE id = %s",
                                     [rf.run_id]).fetchone()[0]
        if class_frames_doc is not None and ((class_rows_doc or {}).get("locations") or {}).get("status") == "ready":
            locations_doc = conn.execute("SELECT public_locations FROM pm_vector.embedding_runs WHERE id = %s",
                                         [rf.run_id]).fetchone()[0]
        conn.rollback()
    pa = PublicAnchor(list(rf.anchor_ids), anchors.features, anchors.labels, dummies.features, dummies.labels)
    info = {"collection": collection, "run_id": rf.run_id, "anchor_set_id": rf.anchor_set_id,
            "dummy_set_id": dummies.anchor_set_id, "params": dict(rf.params), "seed": rf.seed,
            "embedding_dim": rf.embedding_dim, "metric": rf.metric, "classes": rf.classes.tolist(),
            "anchor_embedding": rf.anchor_embedding.copy(),
            # class-rows requests: ClassFrames.from_dict(info["class_frames"]) + the dummy pool above
            # build a pm_vector.client.query.PrivateKNN (None when the run has no class rows)
            "class_frames": class_frames_doc, "class_rows": class_rows_doc,
            # the items' published codes: published_codes.unpack(info["product_codes"],
            # info["class_rows"]["codes"]["digest"])
            "product_codes": projection_doc,
            # the cell release: PublicCells.from_dict(info["public_cells"]), whose digest() is
            # info["class_rows"]["cells"]["digest"] (None when the run serves no cells)
            "public_cells": cells_doc,
            # the location release: PublicCells.from_dict(info["public_locations"]) (one class), whose
            # digest() is info["class_rows"]["locations"]["digest"] (None when the run serves none)
            "public_locations": locations_doc}
    return pa, info


def client_frame(collection: str, anchor=None, frame_info: Mapping[str, Any] | None = None):
    """The fitted :class:`~pm_vector.manifold.AnchorFrame` of the collection's active run,
    rebuilt from public data (anchor set, parameters, seed) exactly as a client would.

    Checks that it reproduces the stored anchor embedding to ``FRAME_TOLERANCE`` and raises
    :class:`FrameMismatchError` otherwise. Pass ``anchor, frame_info`` from
    :func:`public_anchor` to avoid reading them again.
    """
    if anchor is None or frame_info is None:
        anchor, frame_info = public_anchor(collection)
    return rebuild_frame(anchor.features, anchor.labels, frame_info["params"], frame_info["seed"],
                         frame_info["anchor_embedding"], run_id=frame_info["run_id"])
