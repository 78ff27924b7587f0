"""Collections: create, describe, list and drop.

A collection is a label set (or public partitions, :mod:`pm_vector.db.store.partitioned`), a
feature dimension and metric, and its settings (``allow_raw_features``, the payload bound, the
runs kept). Every function validates its input before it writes and raises the exceptions of
:mod:`pm_vector.db.errors`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..errors import CollectionExistsError, CollectionNotFoundError
from ..postgres import connect, session_scope
from ..core.collection import collection_row, iso_datetime
from ._validate import collection_spec


def create_collection(name: str, dim: int, labels: Iterable[int] | None, metric: str = "l2",
                      allow_raw_features: bool = False, *, description: str | None = None,
                      hnsw_m: int = 16, hnsw_ef_construction: int = 64, keep_previous_runs: int = 1,
                      settings: Mapping[str, Any] | None = None, partitions: int | None = None,
                      max_payload_bytes: int | None = None) -> dict[str, Any]:
    """Create a collection and return :func:`collection_info` of it.

    ``dim``: feature dimension (1-16,000; above 2,000 features are stored as ``halfvec``).
    ``labels``: the label set (integers). ``metric``: ``l2`` | ``cosine`` | ``ip`` for the
    embedding search. ``allow_raw_features``: whether raw item features may be returned to
    clients (:func:`fetch_items`). ``hnsw_m`` / ``hnsw_ef_construction``: HNSW build options of
    the runs' indexes. ``keep_previous_runs``: superseded successful runs kept (tables and all)
    after a switch, for rollback and for queries in flight. ``settings``: extra JSON settings.
    ``max_payload_bytes``: the bound on each item's payload, in bytes of compact JSON (0..65,536;
    None: ``settings["max_payload_bytes"]`` if given, else 256); an admin changes it with
    :func:`~pm_vector.db.store.payloads.set_max_payload_bytes` (:mod:`pm_vector.db.store.payloads`).

    ``labels=None``: a collection **without labels** whose classes are ``partitions`` (default
    10) public partitions ``0..C-1`` (:mod:`pm_vector.db.store.partitioned`): its first anchor set
    registered without labels fits them (k-means of the public anchor's features), then anchor,
    dummy and item rows are labelled by their nearest partition (ingest them with labels=None).
    """
    spec = collection_spec(name, dim, labels, metric, allow_raw_features, description=description, hnsw_m=hnsw_m,
                            hnsw_ef_construction=hnsw_ef_construction, keep_previous_runs=keep_previous_runs,
                            settings=settings, partitions=partitions, max_payload_bytes=max_payload_bytes)
    import sqlalchemy.exc

    from .models import Collection  # lazy: start-up (the ORM models import sqlalchemy, ~0.5-1 s)

    try:
        with session_scope() as s:
            s.add(Collection(**spec))
    except sqlalchemy.exc.IntegrityError as exc:
        if "uq_collections_name" in str(exc):
            raise CollectionExistsError(
                f"a collection named {name!r} already exists; pick another name or drop_collection({name!r}) "
                "first.") from None
        raise
    return collection_info(name)


def _info_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    d = {k: iso_datetime(v) for k, v in dict(row).items()}
    d["labels"] = [int(v) for v in d["labels"]]
    return d


def collection_info(name: str) -> dict[str, Any]:
    """One collection (a row of the ``pm_vector.pm_collections`` view) as a dict.

    Keys: id, name, feature_dim, feature_type, metric, labels, allow_raw_features, settings,
    n_items, active_run_id, active_embedding_dim, active_since, anchor_set_id, n_anchors,
    dummy_set_id, n_dummies, created_at, updated_at.
    """
    from sqlalchemy import text

    with session_scope() as s:
        row = s.execute(text("SELECT v.*, c.uuid::text AS uuid FROM pm_vector.pm_collections v "
                                 "JOIN pm_vector.collections c USING (id) WHERE v.name = :n"), {"n": name}).mappings().first()
    if row is None:
        raise CollectionNotFoundError(
            f"unknown collection {name!r}; list_collections() shows the existing ones.")
    return _info_dict(row)


def list_collections() -> list[dict[str, Any]]:
    """All collections (see :func:`collection_info`), by name."""
    from sqlalchemy import text

    with session_scope() as s:
        rows = s.execute(text("SELECT v.*, c.uuid::text AS uuid FROM pm_vector.pm_collections v "
                                  "JOIN pm_vector.collections c USING (id) ORDER BY v.name")).mappings().all()
    return [_info_dict(r) for r in rows]


def collection_uuid(name: str) -> str | None:
    """The collection's stable, random id (migration 0007) as text; None for an unknown name.

    Information for clients (it names the collection as this server knows it, and changes when the
    collection is dropped and re-created); it never selects a client's privacy budget, which is
    keyed by the server's origin as the client configured it
    (:meth:`pm_vector.client.http.Client.budget_key`)."""
    with connect() as conn:
        row = conn.execute("SELECT uuid::text FROM pm_vector.collections WHERE name = %s", [name]).fetchone()
    return None if row is None else row[0]


def drop_collection(name: str, *, missing_ok: bool = False) -> dict[str, Any]:
    """Delete a collection with its items, anchor sets, runs (and their tables); one transaction.

    Returns ``{"name", "dropped", "n_items", "n_runs"}``. The request log keeps its rows
    (their ``collection_id`` becomes NULL).
    """
    with connect() as conn:
        try:
            coll = collection_row(conn, name, lock="FOR UPDATE")
        except CollectionNotFoundError:
            if missing_ok:
                return {"name": name, "dropped": False, "n_items": 0, "n_runs": 0}
            raise
        cid = coll["id"]
        n_items = conn.execute("SELECT count(*) FROM pm_vector.items WHERE collection_id = %s", [cid]).fetchone()[0]
        runs = [r[0] for r in conn.execute("SELECT id FROM pm_vector.embedding_runs WHERE collection_id = %s",
                                           [cid]).fetchall()]
        conn.execute("UPDATE pm_vector.collections SET active_run_id = NULL WHERE id = %s", [cid])
        for rid in runs:
            conn.execute("SELECT pm_vector.pm_drop_run_tables(%s)", [rid])
        if (coll["settings"] or {}).get("attached"):  # its capture triggers on the user's table go too
            conn.execute("SELECT pm_vector.pm_detach_table(%s)", [name])
        conn.execute("DELETE FROM pm_vector.collections WHERE id = %s", [cid])
        conn.commit()
    return {"name": name, "dropped": True, "n_items": int(n_items), "n_runs": len(runs)}
