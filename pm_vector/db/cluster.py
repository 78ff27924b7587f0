"""Kept for one release: the module moved to :mod:`pm_vector.db.postgres.cluster`; import from there."""

from .postgres import stop_cluster as stop  # noqa: F401  (the face's: it clears the engines too)
from .postgres.cluster import (  # noqa: F401
    DATABASE, MAX_REPLICAS, MAX_SHARDS, _connect, _pgdata, _running, _start_node, _stop_node, cluster_dir,
    coordinator_url, ensure_running, node_url, register_shard, replica_lag_bytes, replica_urls, standalone_database,
    start, status, topology, topology_file,
)
