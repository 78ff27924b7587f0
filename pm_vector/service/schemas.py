"""Pydantic models of the HTTP API (they make the OpenAPI schema at ``/openapi.json``). The resolve
body and its answers are built from the table of releases: :mod:`pm_vector.service.resolve_body`
(the request documents' models are in :mod:`pm_vector.protocol.wire`, the answers' in
:mod:`pm_vector.protocol.answers_wire`)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

from pydantic import BaseModel, Field, StrictBool, StrictInt

from ..db.runs.merge import RULE
from ..protocol.wire import Int64, matrix  # Int64: a PostgreSQL bigint, strictly an integer


class ErrorBody(BaseModel):
    error: str = Field(description="Machine-readable error kind, e.g. 'invalid_input', 'unauthorized'.")
    message: str = Field(description="What was wrong and how to fix it. Nothing was written.")


class Health(BaseModel):
    status: str
    version: str
    database: str = "ok"
    limits: dict[str, Any]
    database_error: Optional[str] = None


class DistancesBody(BaseModel):
    """``/kahm/distances``: the feature dimension is checked against the collection by
    :func:`pm_vector.db.kahm.roles.party_distances`."""

    model_config = {"extra": "forbid", "strict": True}
    features: matrix("features", "Query rows of the collection's feature dimension.")
    model_id: Optional[Annotated[int, Field(strict=True, ge=1, lt=2 ** 63)]] = Field(
        None, description="A stored KAHM model; default the current one.")


class PartyDistances(BaseModel):
    """:func:`pm_vector.db.kahm.roles.party_distances` as JSON: class keys are strings, infinite distances null."""

    party: str
    model_id: int
    n_features: int
    classes: list[int]
    distances: dict[str, list[Optional[float]]] = Field(
        description="Per class (the key is the class label as a string), the distance value of each query row "
                    "(Definition 6); null where it is infinite.")


class KAHMModels(BaseModel):
    collection: str
    models: list[dict[str, Any]]


class AnchorDocument(BaseModel):
    collection: str
    anchor_ids: list[Any]
    features: list[list[float]]
    labels: list[int]
    dummy_features: list[list[float]]
    dummy_labels: list[int]
    frame: dict[str, Any] = Field(description="The active run's AnchorFrame params, seed and anchor embedding.")
    collection_uuid: str | None = Field(None, description="The collection's stable id (new when the collection is "
                                                          "re-created); information only, not a budget key.")
    partitions: dict[str, Any] | None = Field(None, description="A collection without labels: its public "
                                              "partitions (centroids fit on the public anchor); a query's row is "
                                              "its nearest partition. None for a labelled collection.")


class SyncStatus(BaseModel):
    """:func:`pm_vector.db.sync_status` of an attached collection (the view ``pm_vector.attach_status``)."""

    collection: str
    source_table: str = Field(description="The attached table as the attach recorded it, e.g. 'app.documents' "
                                          "(a table of pgvector's schema, usually public, by its name alone).")
    queued: int = Field(description="Changes of the table queued and not yet applied (0: up to date).")
    oldest_queued_at: Optional[str] = Field(None, description="When the oldest queued change was queued (ISO "
                                            "8601); null when nothing is queued.")
    lag_s: Optional[float] = Field(None, description="Seconds the oldest queued change has waited for a sync; "
                                   "null when nothing is queued.")
    rejected: int = Field(0, description="Keys whose last change the sync rejected (a label that is not an integer "
                          "or not in the set, a NULL vector or another dimension, a payload over the bounds, a vector "
                          "the run cannot place): not served until their row's next change (pm_vector.attach_rejected).")
    broken: Optional[str] = Field(None, description="Why the collection is refused (its table changed under it: "
                                  "a tracked column dropped, renamed or retyped, the table rewritten or dropped); "
                                  "null when it is not. `pm-vector attach NAME --resync` mends it.")
    broken_at: Optional[str] = Field(None, description="Since when (ISO 8601); null when it is not broken.")
    pending_purge: int = Field(0, description="Deleted or replaced items whose rows the derived tables still hold "
                               "(tombstoned: in no answer since their delete's commit; purged by the next merge, "
                               "`pm-vector merge NAME`).")
    purge_age_s: Optional[float] = Field(None, description="Seconds since the oldest pending purge's delete; null "
                                         "when nothing is pending.")


class ItemsBody(BaseModel):
    ids: list[Int64]
    include_features: StrictBool = False
    model_config = {"extra": "forbid"}


class JobBody(BaseModel):
    params: dict[str, Any] = Field(default_factory=lambda: {"n_components": 8},
                                   description="AnchorFrame keyword arguments.")
    seed: StrictInt = Field(0, description="The run's public seed (0..2**63-1).")
    model_config = {"extra": "forbid"}


class Job(BaseModel):
    job_id: str
    collection: str
    status: str = Field(description="queued, running, succeeded, failed, or interrupted (the service stopped "
                                    "before it finished; the previous run keeps serving).")
    key_id: Optional[int] = None
    stage: Optional[str] = None
    done: int = 0
    total: int = 0
    stages: dict[str, Any] = {}
    params: dict[str, Any] = {}
    seed: int = 0
    result: Optional[dict[str, Any]] = None
    error: Optional[str] = None
    created_at: float
    started_at: Optional[float] = None
    finished_at: Optional[float] = None


class DeleteItemsBody(BaseModel):
    """Exactly one of ``ids`` (item ids) and ``external_ids``."""

    ids: Optional[list[Int64]] = None
    external_ids: Optional[list[str]] = None
    missing_ok: bool = Field(False, description="Delete the ids that exist and skip the others (else 404, "
                                                "nothing deleted).")
    model_config = {"extra": "forbid"}


def _rule_field(key: str, description: str):
    """A merge rule's key as a body field: strict, within :data:`pm_vector.db.runs.merge.RULE`'s bounds."""
    _, lo, hi = RULE[key]
    kind = Annotated[int, Field(strict=True, ge=lo, le=hi)] if key == "delta_items" else \
        Annotated[float, Field(strict=True, ge=lo, le=hi, allow_inf_nan=False)]
    return Optional[kind], Field(None, description=description)


_DI, _DI_F = _rule_field("delta_items", "Merge after this many delta items (tombstones and new items; 0: never "
                                        "by this rule).")
_AGE, _AGE_F = _rule_field("age_s", "Merge when the oldest delta item is this many seconds old (0: never by "
                                    "this rule).")
_PAUSE, _PAUSE_F = _rule_field("pause", "Not before the active run has served this many times as long as its "
                                        "build took (0: no pause).")


class MergeRuleBody(BaseModel):
    """``PUT /collections/{name}/merge-rule``: the keys to set (the others keep their values);
    ``reset`` first clears the collection's own values."""

    delta_items: _DI = _DI_F  # type: ignore[valid-type]
    age_s: _AGE = _AGE_F  # type: ignore[valid-type]
    pause: _PAUSE = _PAUSE_F  # type: ignore[valid-type]
    reset: StrictBool = Field(False, description="Clear the collection's own values first (the defaults apply).")
    model_config = {"extra": "forbid"}


class MergeRuleValues(BaseModel):
    delta_items: int
    age_s: float
    pause: float


class MergeRule(BaseModel):
    """:func:`pm_vector.db.merge_rule`: when the service's sync worker merges a collection's delta."""

    collection: str
    rule: MergeRuleValues = Field(description="The rule in force.")
    own: dict[str, float] = Field(description="The keys the collection sets itself.")
    defaults: MergeRuleValues = Field(description="pm_vector.defaults: MERGE_DELTA_ITEMS, MERGE_AGE_S, MERGE_PAUSE.")
    pause_ends_at: Optional[str] = Field(None, description="When the active run's pause ends (ISO 8601); null "
                                                           "without an active run.")
