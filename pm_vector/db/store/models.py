"""SQLAlchemy 2.0 typed models of pm_vector's schema (schema ``pm_vector``).

The schema itself is created by the alembic migrations in ``migrations/``; these models
mirror it (a test compares them with the migrated database) and are used for reads and small
writes. Bulk data goes through binary COPY (:mod:`pm_vector.db.store.api`).

Storage design
--------------
Collections of different feature and embedding dimensions live side by side:

* **Raw features** (``items``, ``anchors``) sit in shared tables, in *untyped* pgvector
  columns: ``features vector`` for collections of up to 2,000 dimensions and
  ``features_half halfvec`` above (half the storage; HNSW indexes ``halfvec`` up to 4,000
  dimensions should one ever be wanted). Exactly one of the two is set (CHECK), and a
  statement-level trigger checks, once per INSERT/COPY statement, that every row has its
  collection's dimension, storage column and a label from the collection's label set. Raw
  features are read in bulk (the job) or by id, never searched, so they need no vector index.

* **Embeddings** are what queries search, so they get typed columns and HNSW indexes: every
  embedding run has its own two tables, ``pm_vector.run_<id>_items (item_id, embedding
  vector(k))`` and ``pm_vector.run_<id>_anchors (position, embedding vector(k))``
  (``halfvec(k)`` above 2,000), created by ``pm_vector.pm_create_run_tables`` and indexed by
  ``pm_vector.pm_build_run_indexes`` (both SQL functions installed by the migrations), and
  dropped with the run. A collection's ``active_run_id`` says which run serves queries.

  Why per-run tables rather than one shared embedding table with per-run partial expression
  indexes ``((embedding::vector(k))) WHERE run_id = X``: a run is written, indexed, switched
  to and dropped as a unit. Building a run's index then locks and scans only that run's
  table (a shared table's CREATE INDEX would block every other writer and scan all runs),
  dropping a failed or superseded run is a ``DROP TABLE`` (no DELETE of millions of rows, no
  bloat, no VACUUM), the planner needs no predicate matching on literal run ids, and a
  half-written run is simply a table nothing points at. The cost is dynamic SQL in the
  search functions (the table name depends on the active run), which they need anyway.
  These tables are not ORM classes; :func:`run_items_table` / :func:`run_anchors_table` give
  SQLAlchemy Core ``Table`` objects for them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from pgvector.sqlalchemy import HALFVEC, VECTOR
from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSON, JSONB, REAL
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from ..run_tables import run_table_name

SCHEMA = "pm_vector"
NOW = text("now()")


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class Collection(Base):
    __tablename__ = "collections"
    __table_args__ = (
        UniqueConstraint("name", name="uq_collections_name"),
        UniqueConstraint("uuid", name="uq_collections_uuid"),
        CheckConstraint("feature_dim BETWEEN 1 AND 16000", name="ck_collections_feature_dim"),
        CheckConstraint("feature_type IN ('vector', 'halfvec')", name="ck_collections_feature_type"),
        CheckConstraint("metric IN ('l2', 'cosine', 'ip')", name="ck_collections_metric"),
        CheckConstraint("cardinality(labels) >= 1", name="ck_collections_labels"),
        CheckConstraint("length(name) BETWEEN 1 AND 128", name="ck_collections_name"),
        # migration 0021 (NOT VALID): _names.NAME_PATTERN
        CheckConstraint("name ~ '^(?:[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127})$'", name="ck_collections_name_chars"),
        ForeignKeyConstraint(["id", "active_run_id"],
                             [f"{SCHEMA}.embedding_runs.collection_id", f"{SCHEMA}.embedding_runs.id"],
                             name="fk_collections_active_run", use_alter=True),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    feature_dim: Mapped[int] = mapped_column(Integer)
    feature_type: Mapped[str] = mapped_column(Text)  # 'vector' | 'halfvec'
    metric: Mapped[str] = mapped_column(Text)  # 'l2' | 'cosine' | 'ip'
    labels: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    settings: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    # the collection's stable, random id: the key of the clients' privacy ledgers (migration 0007)
    uuid: Mapped[Any] = mapped_column(PG_UUID(as_uuid=True), server_default=text("gen_random_uuid()"))
    active_run_id: Mapped[Optional[int]] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)

    runs: Mapped[list["EmbeddingRun"]] = relationship(
        back_populates="collection", foreign_keys="EmbeddingRun.collection_id",
        viewonly=True)


class Ingest(Base):
    __tablename__ = "ingests"
    __table_args__ = (
        CheckConstraint("status IN ('running', 'succeeded', 'failed')", name="ck_ingests_status"),
        Index("ix_ingests_collection_status", "collection_id", "status"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    collection_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="CASCADE", name="fk_ingests_collection"))
    status: Mapped[str] = mapped_column(Text, server_default="running")
    n_rows: Mapped[int] = mapped_column(Integer, server_default="0")
    n_written: Mapped[int] = mapped_column(Integer, server_default="0")
    error: Mapped[Optional[str]] = mapped_column(Text)
    worker: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)
    finished_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime(timezone=True))


class Item(Base):
    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("collection_id", "external_id", name="uq_items_collection_external_id"),
        # <= 1 since migration 0015: an attached collection's items keep no features (the user's table has them)
        CheckConstraint("num_nonnulls(features, features_half) <= 1", name="ck_items_one_feature_column"),
        Index("ix_items_collection_id", "collection_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    collection_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="CASCADE", name="fk_items_collection"))
    external_id: Mapped[Optional[str]] = mapped_column(Text)
    label: Mapped[int] = mapped_column(BigInteger)
    features: Mapped[Optional[Any]] = mapped_column(VECTOR())
    features_half: Mapped[Optional[Any]] = mapped_column(HALFVEC())
    payload: Mapped[Optional[Any]] = mapped_column(JSONB)
    # the ingest that wrote the row (no foreign key: it would cost a lookup per COPY row)
    ingest_id: Mapped[Optional[int]] = mapped_column(BigInteger)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)


class AnchorSet(Base):
    __tablename__ = "anchor_sets"
    __table_args__ = (
        CheckConstraint("role IN ('anchor', 'dummy')", name="ck_anchor_sets_role"),
        Index("ix_anchor_sets_collection_role", "collection_id", "role", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    collection_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="CASCADE", name="fk_anchor_sets_collection"))
    role: Mapped[str] = mapped_column(Text)  # 'anchor' | 'dummy'
    n_rows: Mapped[int] = mapped_column(Integer)
    description: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)
    # how the set was made (None: registered by the user; a dict for a DP fabricated anchor)
    provenance: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)

    anchors: Mapped[list["Anchor"]] = relationship(order_by="Anchor.position",
                                                   viewonly=True)


class Anchor(Base):
    __tablename__ = "anchors"
    __table_args__ = (
        CheckConstraint("position >= 0", name="ck_anchors_position"),
        CheckConstraint("num_nonnulls(features, features_half) = 1", name="ck_anchors_one_feature_column"),
    )

    anchor_set_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.anchor_sets.id", ondelete="CASCADE", name="fk_anchors_anchor_set"),
        primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    label: Mapped[int] = mapped_column(BigInteger)
    features: Mapped[Optional[Any]] = mapped_column(VECTOR())
    features_half: Mapped[Optional[Any]] = mapped_column(HALFVEC())


class EmbeddingRun(Base):
    __tablename__ = "embedding_runs"
    __table_args__ = (
        UniqueConstraint("collection_id", "id", name="uq_embedding_runs_collection_id_id"),
        CheckConstraint("status IN ('pending', 'running', 'succeeded', 'failed')", name="ck_embedding_runs_status"),
        CheckConstraint("embedding_dim BETWEEN 1 AND 4000", name="ck_embedding_runs_embedding_dim"),
        Index("ix_embedding_runs_collection_status", "collection_id", "status"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    collection_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="CASCADE", name="fk_embedding_runs_collection"))
    anchor_set_id: Mapped[Optional[int]] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.anchor_sets.id", ondelete="CASCADE", name="fk_embedding_runs_anchor_set"))
    status: Mapped[str] = mapped_column(Text, server_default="pending")
    params: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    seed: Mapped[int] = mapped_column(BigInteger)
    embedding_dim: Mapped[Optional[int]] = mapped_column(Integer)
    n_items: Mapped[Optional[int]] = mapped_column(Integer)
    delta_version: Mapped[int] = mapped_column(BigInteger, server_default="0")  # bumped by every delta write
    index_upto: Mapped[Optional[int]] = mapped_column(BigInteger)  # the items index holds ids up to it
    n_anchors: Mapped[Optional[int]] = mapped_column(Integer)
    timings: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    error: Mapped[Optional[str]] = mapped_column(Text)
    worker: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)
    # class-rows requests (migration 0005): the run's ClassFrames document and the class-rows
    # parameters, class order, class sizes, frames digest and status
    class_frames: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON)  # json: verbatim (-0.0 kept)
    class_rows: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)
    public_projection: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON)  # the published ProductCodes document
    # the cell release (migration 0013): the run's PublicCells document (fit on the public anchor set)
    public_cells: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON)  # json: verbatim floats
    public_locations: Mapped[Optional[dict[str, Any]]] = mapped_column(JSON)  # json: verbatim floats
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)
    started_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime(timezone=True))

    collection: Mapped[Collection] = relationship(back_populates="runs", foreign_keys=[collection_id],
                                                  viewonly=True)


class RequestLog(Base):
    """A resolved request: only what the client released (its request JSON), timing, row count."""

    __tablename__ = "request_log"
    __table_args__ = (
        CheckConstraint("status IN ('ok', 'error')", name="ck_request_log_status"),
        Index("ix_request_log_collection_received", "collection_id", "received_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    collection_id: Mapped[Optional[int]] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="SET NULL", name="fk_request_log_collection"))
    collection_name: Mapped[str] = mapped_column(Text)
    run_id: Mapped[Optional[int]] = mapped_column(BigInteger)
    request: Mapped[Any] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(Text, server_default="ok")
    error: Mapped[Optional[str]] = mapped_column(Text)
    row_count: Mapped[Optional[int]] = mapped_column(Integer)
    received_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)
    finished_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime(timezone=True))
    duration_ms: Mapped[Optional[float]] = mapped_column(Float)


class KAHMModel(Base):
    """A stored KAHM classifier (one wide KAHM per class); the newest of a collection serves."""

    __tablename__ = "kahm_models"
    __table_args__ = (
        CheckConstraint("kind IN ('raw', 'noisy', 'fabricated')", name="ck_kahm_models_kind"),
        CheckConstraint("cardinality(classes) >= 1", name="ck_kahm_models_classes"),
        Index("ix_kahm_models_collection_id", "collection_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    collection_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="CASCADE", name="fk_kahm_models_collection"))
    kind: Mapped[str] = mapped_column(Text)  # 'raw' | 'noisy' | 'fabricated'
    params: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    privacy: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)
    classes: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    n_features: Mapped[int] = mapped_column(Integer)
    n_items: Mapped[int] = mapped_column(Integer)
    model: Mapped[bytes] = mapped_column(LargeBinary)
    timings: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    worker: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)
    # migration 0015: set when delete_items erased an item this raw model may hold (it stops serving)
    erased_at: Mapped[Optional[dt.datetime]] = mapped_column(DateTime(timezone=True))


class AttachChange(Base):
    """A change of an attached table's row, queued by its trigger (migration 0015), applied once by
    ``pm-vector sync`` (:mod:`pm_vector.db.store.attach`): op ``I`` insert, ``U`` vector / label
    update, ``P`` other columns, ``D`` delete; ``key`` the row's id column as text."""

    __tablename__ = "attach_changes"
    __table_args__ = (
        CheckConstraint("op IN ('I', 'U', 'P', 'D')", name="attach_changes_op_check"),
        Index("ix_attach_changes_collection_seq", "collection_id", "seq"),
    )

    seq: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    collection_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="CASCADE", name="attach_changes_collection_id_fkey"))
    op: Mapped[str] = mapped_column(Text)
    key: Mapped[str] = mapped_column(Text)
    old_vector: Mapped[Optional[str]] = mapped_column(Text)  # the row's vector before an update / delete
    queued_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=text("clock_timestamp()"))


class AttachRejected(Base):
    """A key of an attached table whose last change the sync could not apply, and why (migration
    0021, :mod:`pm_vector.db.store.sync_rows`); the key's next change is applied as any other."""

    __tablename__ = "attach_rejected"

    collection_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="CASCADE",
                               name="attach_rejected_collection_id_fkey"), primary_key=True)
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    rejected_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True),
                                                     server_default=text("clock_timestamp()"))


class DeltaTombstone(Base):
    """An item of a run that is in no answer since its delete's commit (migration 0023,
    :mod:`pm_vector.db.runs.delta`); its rows leave the run's tables at the next merge."""

    __tablename__ = "delta_tombstones"
    __table_args__ = (Index("delta_tombstones_by_version", "run_id", "version"),)

    run_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.embedding_runs.id", ondelete="CASCADE", name="delta_tombstones_run_id_fkey"),
        primary_key=True)
    item_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)
    #: the run's ``delta_version`` its write made visible, set by the trigger ``pm_tombstone_version``
    #: (migration 0033; NULL: written before it)
    version: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class DeltaEntry(Base):
    """A new item's entry in one location cell of a run, beside the precomputed rows (migration 0023,
    :mod:`pm_vector.db.runs.delta`): its estimated hub counts ``h`` and ``h_r``."""

    __tablename__ = "delta_entries"
    __table_args__ = (Index("delta_entries_by_item", "run_id", "item_id"),)

    run_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.embedding_runs.id", ondelete="CASCADE", name="delta_entries_run_id_fkey"),
        primary_key=True)
    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    cell: Mapped[int] = mapped_column(Integer, primary_key=True)
    item_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    h: Mapped[float] = mapped_column(Float(53))
    h_r: Mapped[float] = mapped_column(Float(53))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)


class KAHMItemScore(Base):
    """Class-matching scores (Definition 8) of one item under one model, in ``classes`` order."""

    __tablename__ = "kahm_item_scores"

    model_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.kahm_models.id", ondelete="CASCADE", name="fk_kahm_item_scores_model"),
        primary_key=True)
    item_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    predicted: Mapped[int] = mapped_column(BigInteger)
    scores: Mapped[list[float]] = mapped_column(ARRAY(REAL))


class KAHMAudit(Base):
    """A membership-inference audit report (eq 69): raw vs fabricated models of a collection."""

    __tablename__ = "kahm_audits"
    __table_args__ = (Index("ix_kahm_audits_collection_id", "collection_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False), primary_key=True)
    collection_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey(f"{SCHEMA}.collections.id", ondelete="CASCADE", name="fk_kahm_audits_collection"))
    params: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    report: Mapped[dict[str, Any]] = mapped_column(JSONB)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)


class Shard(Base):
    """A shard registered on this coordinator: a ``postgres_fdw`` server ``pm_shard_<name>``
    (``pm_vector.pm_register_shard``, :mod:`pm_vector.db.postgres.cluster`)."""

    __tablename__ = "shards"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    server_name: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(Text)
    port: Mapped[int] = mapped_column(Integer)
    dbname: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), server_default=NOW)


# ------------------------------------------------------------------------ per-run tables (Core)

def vector_type(dim: int):
    """The pgvector SQLAlchemy type for ``dim`` dimensions: ``VECTOR(dim)`` up to 2,000, else ``HALFVEC(dim)``."""
    return VECTOR(dim) if dim <= 2000 else HALFVEC(dim)


def run_items_table(run_id: int, embedding_dim: int, metadata: MetaData | None = None) -> Table:
    """``pm_vector.run_<run_id>_items (item_id bigint PK, embedding vector(k))`` as a Core table."""
    return Table(run_table_name(run_id, "items"), metadata or MetaData(schema=SCHEMA),
                 Column("item_id", BigInteger, primary_key=True),
                 Column("embedding", vector_type(embedding_dim), nullable=False))


def run_anchors_table(run_id: int, embedding_dim: int, metadata: MetaData | None = None) -> Table:
    """``pm_vector.run_<run_id>_anchors (position int PK, embedding vector(k))`` as a Core table."""
    return Table(run_table_name(run_id, "anchors"), metadata or MetaData(schema=SCHEMA),
                 Column("position", Integer, primary_key=True),
                 Column("embedding", vector_type(embedding_dim), nullable=False))
