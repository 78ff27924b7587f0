"""Fixtures and markers of the whole suite.

One embedded PostgreSQL + pgvector per test run (``pm_home``, session-scoped), shared by tests/db,
tests/service and the CLI tests: every test that needs the database asks for ``pm_home`` (or for a
fixture built on it) and keeps its own collection names, keys and ledgers. The cluster tests
(tests/cluster) start their own multi-node servers.

Markers, applied by :func:`pytest_collection_modifyitems`: ``db`` (needs PostgreSQL: tests/db,
tests/cluster, tests/service and every test using ``pm_home``), ``service`` (runs the HTTP service:
tests/service); ``slow`` is set by hand on the tests that take more than ~10 s.
``pytest -m "not slow"`` is the fast subset; ``pytest -m "not db"`` needs no PostgreSQL.
"""

from pathlib import Path

import numpy as np
import pytest

from pmtest_embedded import embedded_home  # tests/pmtest_embedded.py

TESTS = Path(__file__).resolve().parent
DB_FOLDERS = {"db", "cluster", "service"}


def pytest_collection_modifyitems(config, items):
    """``db`` and ``service`` by folder (``db`` also for any test on the session's server); the
    cluster tests are ``slow`` (each module starts several embedded servers of its own)."""
    for item in items:
        try:
            folder = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if folder == "service":
            item.add_marker(pytest.mark.service)
        if folder == "cluster":
            item.add_marker(pytest.mark.slow)
        if folder in DB_FOLDERS or "pm_home" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.db)


@pytest.fixture(scope="session")
def pm_home(tmp_path_factory):
    """The session's one private embedded PostgreSQL + pgvector, in a temporary PM_VECTOR_HOME
    (PM_VECTOR_EMBEDDED_FAST=1; PM_VECTOR_DATABASE_URL unset meanwhile), stopped at the end."""
    yield from embedded_home(tmp_path_factory, "pmhome")


@pytest.fixture(scope="session")
def digits():
    from pm_vector.datasets import load_dataset
    return load_dataset("digits")


@pytest.fixture(scope="session")
def digits_split(digits):
    from pm_vector.datasets import split_dataset
    return split_dataset(digits, 800, 300, 150, 100, seed=0)


@pytest.fixture(scope="session")
def frame(digits_split):
    from pm_vector.manifold import AnchorFrame
    Xa, ya = digits_split.anchor
    return AnchorFrame(8, seed=0).fit(Xa, ya)


@pytest.fixture(scope="session")
def public_anchor(digits_split):
    from pm_vector.client import PublicAnchor
    Xa, ya = digits_split.anchor
    Xd, yd = digits_split.dummy
    return PublicAnchor(list(range(len(ya))), Xa, ya, Xd, yd)



@pytest.fixture(autouse=True)
def _private_budget_ledger(tmp_path, monkeypatch):
    """No test writes the user's real client ledger (~/.local/share/pm_vector/client/budget.json)."""
    monkeypatch.setattr("pm_vector.client.budget.default_path", lambda: tmp_path / "client_budget.json")
