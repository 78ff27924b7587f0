"""The database layer's old module paths (kept for one release) re-export the moved names, so code
written against ``pm_vector.db.server``, ``.engine``, ``.cluster``, ``.migrate``, ``.recovery``,
``.replicas``, ``.kahm_common`` and ``.resolution`` (the README's example) keeps working; their
``stop``/``upgrade`` are the package face's, which also clear the engines."""

import importlib

import pytest

from pm_vector.db import postgres

MOVED = {
    "pm_vector.db.server": ("pm_vector.db.postgres.config", ["home", "pgdata_dir", "external_url", "mode", "libpq_url",
                                                             "sqlalchemy_url", "redact", "EMBEDDED_DATABASE", "ENV_URL"]),
    "pm_vector.db.engine": ("pm_vector.db.postgres.engine", ["connect", "connection", "get_engine", "session_scope",
                                                             "dispose_engines", "forget_checks"]),
    "pm_vector.db.migrate": ("pm_vector.db.postgres.migrate", ["execute_sql_file", "head_revision", "current_revision",
                                                               "upgrade_to_head", "alembic_config", "sql_dir",
                                                               "migrations_dir", "MIGRATION_LOCK_KEY"]),
    "pm_vector.db.cluster": ("pm_vector.db.postgres.cluster", ["start", "status", "topology", "coordinator_url",
                                                               "replica_urls", "replica_lag_bytes",
                                                               "standalone_database", "register_shard", "_pgdata",
                                                               "_running", "_stop_node"]),
    "pm_vector.db.recovery": ("pm_vector.db.postgres.recovery", ["postmaster_state", "wait_until_ready", "log_tail",
                                                                 "log_progress", "quiet_pg_ctl_timeout"]),
    "pm_vector.db.replicas": ("pm_vector.db.postgres.replicas", ["ReadRouter"]),
    "pm_vector.db.kahm_common": ("pm_vector.db.kahm.store", ["model_outputs_allowed", "raw_distances_allowed",
                                                             "NoKAHMModelError", "KINDS", "_load", "_transaction"]),
    "pm_vector.db.resolution": ("pm_vector.db.resolve.resolution", ["resolve", "explain_resolution", "public_anchor",
                                                                    "client_frame", "class_frames",
                                                                    "post_process_release", "resolve_paper",
                                                                    "explain_paper"]),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_reexports_the_moved_names(old):
    new, names = MOVED[old]
    o, n = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(o, name) is getattr(n, name), name


def test_old_server_paths_keep_their_private_and_lifecycle_names():
    from pm_vector.db import server
    from pm_vector.db.postgres import embedded, pgvector
    from pm_vector.db.postgres import server as new_server

    assert server._system_user is embedded.system_user and server._locked is embedded.locked
    assert server._postmaster is embedded.postmaster and server._fast_initdb is embedded.fast_initdb
    assert server.ensure_pgvector is pgvector.ensure_pgvector
    assert server.database_url is new_server.database_url and server.status is new_server.status
    assert server.stop is postgres.stop and server.upgrade is postgres.upgrade  # they clear the engines
    from pm_vector.db import cluster

    assert cluster.stop is postgres.stop_cluster
