"""Every CLI failure prints ``error: ...`` and what to do, never a traceback (issue 25, item 11):
the database refusing mid-command (a read-only session: a real refusal, from PostgreSQL), and
the messages for a full disk and a stopped database (PostgreSQL's own exception classes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="module")
def home(pm_home):
    """The session's embedded server (tests/conftest.py)."""
    return pm_home


def _cli(args, tmp_path: Path, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **env}
    return subprocess.run([sys.executable, "-c", "from pm_vector.cli import main; main()", *args], cwd=tmp_path,
                          env=full, capture_output=True, text=True, timeout=300)


def test_ingest_and_embed_refused_by_the_database_print_error_not_a_traceback(home, tmp_path):
    from pm_vector import db

    db.start()
    np.save(tmp_path / "X.npy", np.random.default_rng(0).random((20, 4)))
    np.save(tmp_path / "y.npy", np.arange(20) % 2)
    ro = {"PGOPTIONS": "-c default_transaction_read_only=on"}
    r = _cli(["ingest", "clifail", "--features", "X.npy", "--labels", "y.npy", "--create"], tmp_path, **ro)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: the database refused") and "read-only" in r.stderr, r.stderr
    assert "clifail" not in [c["name"] for c in db.list_collections()]  # nothing was kept
    rng = np.random.default_rng(1)
    db.create_collection("clifail", 4, [0, 1])
    db.ingest("clifail", rng.random((30, 4)), np.arange(30) % 2)
    db.register_anchor_set("clifail", rng.random((12, 4)), np.arange(12) % 2, role="anchor")
    db.register_anchor_set("clifail", rng.random((12, 4)), np.arange(12) % 2, role="dummy")
    r = _cli(["embed", "clifail"], tmp_path, **ro)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and "read-only" in r.stderr, r.stderr
    assert db.collection_info("clifail").get("active_run_id") is None
    r = _cli(["embed", "clifail"], tmp_path, PM_VECTOR_DEBUG="1", **ro)
    assert r.returncode != 0 and "Traceback" in r.stderr  # for the operator who asks for it


def test_messages_of_a_full_disk_and_a_stopped_database():
    import errno

    import psycopg
    from psycopg_pool import PoolTimeout

    from pm_vector.cli.failures import describe

    try:
        try:
            raise psycopg.errors.DiskFull("could not extend file: No space left on device")
        except psycopg.Error as inner:
            raise RuntimeError("ingest failed") from inner
    except RuntimeError as exc:
        msg = describe(exc)
    assert msg.startswith("the disk is full") and "Free space" in msg
    assert describe(OSError(errno.ENOSPC, "No space left on device")).startswith("the disk is full")
    assert describe(psycopg.OperationalError("server closed the connection")).startswith("the database stopped")
    assert describe(PoolTimeout("no connection")).startswith("the database stopped")
    assert "PM_VECTOR_DEBUG=1" in describe(KeyError("x"))
