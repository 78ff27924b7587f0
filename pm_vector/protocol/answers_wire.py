"""The answer documents of a resolve as pydantic models: what ``/openapi.json`` declares a resolve
answers, and what a test checks real answers against (in both media types).

:class:`RowsAnswer` answers class-rows, cell and paper requests (one entry of ``rows`` per query
row); :class:`LocationAnswer` a location request (one list). In JSON an answer's arrays are lists
and the location answer's ``codes_data`` is base64; in msgpack the arrays travel as
:mod:`pm_vector.protocol.codec`'s array extension and ``codes_data`` as ``bin``: the models
validate both (a bytes field reads base64 from JSON, raw bytes from msgpack). The client checks
an answer by :mod:`pm_vector.protocol.answers` and :func:`~pm_vector.protocol.location.check_location_answer`,
which bound what these models only describe."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .formats import LOCATION_FORMAT


class CodesMeta(BaseModel):
    bytes: int = Field(description="The code prefix of each candidate, in bytes.")
    digest: str = Field(description="The digest of the run's published product codes.")


class ResultRow(BaseModel):
    """One query row's candidates, best first (a compact row: ``row``, ``item_ids``, ``codes`` and
    ``payloads`` when any candidate has one)."""

    model_config = ConfigDict(extra="allow")
    row: Optional[int] = None
    item_ids: list[int]
    codes: Optional[list[list[int]]] = Field(None, description="Compact answers: each candidate's code prefix "
                                             "(k' x bytes, uint8).")
    payloads: Optional[list[Any]] = None
    external_ids: list[Optional[str]] = []
    labels: list[int] = []
    scores: Optional[list[Optional[float]]] = None
    distances: list[Optional[float]] = []
    features: Optional[list[list[float]]] = None
    predicted: Optional[list[Optional[int]]] = Field(
        None, description="With a KAHM model: each returned item's predicted class (Definition 7); null for an "
                          "item ingested after the model was fitted.")
    class_scores: Optional[list[Optional[list[float]]]] = Field(
        None, description="With a KAHM model: each returned item's class-matching scores (Definition 8), in the "
                          "order of the response's kahm.classes; null for an item without scores.")


class RowsAnswer(BaseModel):
    """The answer to a class-rows, cell or paper request."""

    model_config = ConfigDict(extra="allow", title="ResolveResponse")
    collection: str
    run_id: Optional[int] = None
    format: Optional[str] = None
    release: Optional[str] = None
    answer: Optional[Literal["compact", "full"]] = None
    k: Optional[int] = Field(None, description="The paper's requests: neighbours per query row.")
    k_prime: Optional[int] = Field(None, description="Class-rows and cell requests: candidates per row.")
    n_query_rows: Optional[int] = None
    rows: list[ResultRow] = Field(description="One entry per query row, in the request's row order; the client "
                                  "keeps its real row's.")
    kahm: Optional[dict[str, Any]] = Field(None, description="The KAHM model whose scores the rows carry: "
                                           "{\"model_id\", \"classes\"}; null without a model.")
    codes: Optional[CodesMeta] = None
    timings_ms: Optional[dict[str, float]] = None
    request_log_id: Optional[int] = None


class LocationAnswer(BaseModel):
    """The answer to a location request: ``n = min(candidates, n_items)`` distinct item ids, best
    first, ``n x code_bytes`` code bytes and, for a collection with payloads, ``n`` payloads."""

    model_config = ConfigDict(extra="forbid", val_json_bytes="base64", ser_json_bytes="base64")
    collection: str
    run_id: int
    format: Literal[LOCATION_FORMAT]
    release: Literal["location"]
    answer: Literal["compact"]
    level: int
    report: int
    candidates: int
    n_query_rows: Literal[1]
    item_ids: list[int] = Field(description="n distinct item ids (msgpack: a uint32 or int64 array).")
    codes_data: bytes = Field(description="n x code_bytes bytes, the prefix of each item's published code "
                              "(msgpack: bin; JSON: base64).")
    payloads: Optional[list[Any]] = Field(description="n JSON values (null for an item without); null when no item "
                                          "of the list has one.")
    n_items: int = Field(description="The run's items when the list was built.")
    codes: CodesMeta
    cached: bool
    timings_ms: dict[str, float]
    request_log_id: Optional[int] = None


__all__ = ["CodesMeta", "LocationAnswer", "ResultRow", "RowsAnswer"]
