"""A private embedded PostgreSQL + pgvector for test sessions (shared by tests/db and tests/service)."""


ENV_KEYS = ("PM_VECTOR_HOME", "PM_VECTOR_DATABASE_URL", "PM_VECTOR_EMBEDDED_FAST")


def embedded_home(tmp_path_factory, name: str):
    """Generator for a session fixture: a private embedded PostgreSQL + pgvector in a fresh
    PM_VECTOR_HOME (PM_VECTOR_EMBEDDED_FAST=1: initdb --no-sync, fsync off), stopped and the
    environment restored at the end; PM_VECTOR_DATABASE_URL is unset meanwhile."""
    import os

    home = tmp_path_factory.mktemp(name)
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ["PM_VECTOR_HOME"] = str(home)
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    os.environ["PM_VECTOR_EMBEDDED_FAST"] = "1"
    from pm_vector.db import postgres

    st = postgres.start()
    assert st["running"] and st["schema_up_to_date"], st
    yield home
    postgres.dispose_engines()
    os.environ["PM_VECTOR_HOME"] = str(home)
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    postgres.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
