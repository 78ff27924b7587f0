"""Fixtures of the database tests, on the session's embedded PostgreSQL + pgvector (``pm_home``,
tests/conftest.py: one server per test run, shared with tests/service and the CLI tests)."""

from __future__ import annotations

import uuid

import pytest


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


@pytest.fixture
def fresh_url(db):
    """The URL of a new, empty database on the session's server (dropped afterwards)."""
    import psycopg
    from psycopg import sql

    from pm_vector.db import postgres

    name = "mig_" + uuid.uuid4().hex[:8]
    admin = postgres.admin_url().replace(f"/{postgres.EMBEDDED_DATABASE}?", "/postgres?")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield admin.replace("/postgres?", f"/{name}?")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def digits_collection(db, cname):
    """``cname`` made a collection of 300 digits with its anchor and dummy sets, no run yet."""
    from pm_vector.datasets import load_dataset, split_dataset

    ds = load_dataset("digits")
    sp = split_dataset(ds, 300, 100, 100, 100, seed=2)
    db.create_collection(cname, ds.dim, ds.classes.tolist())
    db.ingest(cname, *sp.server)
    db.register_anchor_set(cname, *sp.anchor)
    db.register_anchor_set(cname, *sp.dummy, role="dummy")
    return cname
