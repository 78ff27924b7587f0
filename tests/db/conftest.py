"""Fixtures of the database tests: one private embedded PostgreSQL + pgvector for the session.

The server lives in a temporary PM_VECTOR_HOME (PM_VECTOR_EMBEDDED_FAST=1: initdb --no-sync,
fsync off) and is stopped at the end. PM_VECTOR_DATABASE_URL is unset for the session.
"""

from __future__ import annotations

import os
import uuid

import pytest

ENV_KEYS = ("PM_VECTOR_HOME", "PM_VECTOR_DATABASE_URL", "PM_VECTOR_EMBEDDED_FAST")


@pytest.fixture(scope="session")
def pm_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("pmhome")
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    os.environ["PM_VECTOR_HOME"] = str(home)
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    os.environ["PM_VECTOR_EMBEDDED_FAST"] = "1"
    from pm_vector.db import engine, server

    st = server.start()
    assert st["running"] and st["schema_up_to_date"], st
    yield home
    engine.dispose_engines()
    os.environ["PM_VECTOR_HOME"] = str(home)
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def db(pm_home):
    """The pm_vector.db package, with the session's embedded server running."""
    import pm_vector.db as pmdb

    return pmdb


@pytest.fixture
def conn(db):
    """A psycopg connection (autocommit) to the session's database."""
    c = db.connect(autocommit=True)
    yield c
    c.close()


@pytest.fixture
def cname(db):
    """A fresh collection name, dropped after the test."""
    name = "t_" + uuid.uuid4().hex[:12]
    yield name
    db.drop_collection(name, missing_ok=True)
