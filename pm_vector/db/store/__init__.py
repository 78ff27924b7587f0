"""The store: what a collection holds and how it gets in and out, without any private query.

Collections (their label set or public partitions, metric, settings), the items and their
payloads, the public anchor and dummy sets, the plain k-NN search, the request log and its
retention. Every function validates its input before it writes and raises the exceptions of
:mod:`pm_vector.db.errors`.

The store is THE write API over items: ingest, delete, update, and an attached table's sync each
change the items and keep every run's derived tables in step in the same transaction, calling
:mod:`pm_vector.db.runs` (the delta's tombstones and entries, new items placed, the erasure of a
run's tables) -- imported at the top of the modules, because the direction is one way: ``store``
sits above ``runs``, and ``runs`` imports nothing of ``store``. What both read of a collection
(its row, anchor sets and items, where raw features come from) and the clean-up of work whose
process died are below both, in :mod:`pm_vector.db.core` (``tests/test_layers.py``). The other
way round -- the write path moved into ``runs`` or a room above both -- would have moved the
bodies of ``deletes``, ``update``, ``bulk``, ``sync`` and ``sync_items``; moving the readers down
moved two small modules and two functions.

Modules:

* :mod:`~pm_vector.db.store.collections` -- create, describe, list and drop collections;
* :mod:`~pm_vector.db.store.anchors` -- the public anchor sets and dummy pools;
* :mod:`~pm_vector.db.store.api` -- items by id and the plain k-NN search (``knn``, ``knn_batch``);
* :mod:`~pm_vector.db.store.request_log` -- the request log (``log_request``, ``list_requests``);
* :mod:`~pm_vector.db.store.bulk` -- bulk ingest: binary COPY in one transaction;
* :mod:`~pm_vector.db.store.payloads` -- per-item payloads and their bound ``max_payload_bytes``;
* :mod:`~pm_vector.db.store.partitioned` -- collections without labels (public partitions);
* :mod:`~pm_vector.db.store.retention` -- pruning the request log;
* :mod:`~pm_vector.db.store.deletes` -- ``delete_items``: items deleted from every run's answers in one
  transaction (a tombstone, or the erasure of the run's tables by :mod:`pm_vector.db.runs.erase`);
  :mod:`~pm_vector.db.store.update` -- ``update_items``;
* :mod:`~pm_vector.db.store.attach` -- a user's table as a collection (``attach_table``, ``sync_status``);
  :mod:`~pm_vector.db.store.sync` -- its queued changes applied (``sync``, ``sync_pending``), with the run's
  items as built (:mod:`~pm_vector.db.store.sync_items`) and what it reads and decides per key, the rejected
  changes (:mod:`~pm_vector.db.store.sync_rows`);
* :mod:`~pm_vector.db.store.maintenance` -- ``cleanup_all``: ``cleanup`` (:mod:`pm_vector.db.core.abandoned`),
  orphan run tables, the log;
* :mod:`~pm_vector.db.store.models` -- the SQLAlchemy models of the schema (the storage design);
* ``_validate``, ``_names`` -- input checks, collection names.
"""

from ..core.collection import AnchorSet
from .anchors import get_anchor_set, register_anchor_set, register_anchor_sets
from .api import fetch_items, knn, knn_batch
from .collections import collection_info, create_collection, drop_collection, list_collections
from .bulk import ingest
from ..core.abandoned import cleanup
from .payloads import set_max_payload_bytes
from .request_log import list_requests, log_request
from .retention import prune_request_log

__all__ = [
    "AnchorSet", "cleanup", "collection_info", "create_collection", "drop_collection", "fetch_items",
    "get_anchor_set", "ingest", "knn", "knn_batch", "list_collections", "list_requests", "log_request",
    "prune_request_log", "register_anchor_set", "register_anchor_sets", "set_max_payload_bytes",
]
