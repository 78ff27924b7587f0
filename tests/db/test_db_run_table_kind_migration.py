"""Migration 0026: ``pm_vector.pm_run_table`` names a run's table of any kind of the shape the
Python namer checks (:data:`pm_vector.db.run_tables.KIND`), every kind of the registry and a
test's own, and refuses anything else; its downgrade brings back migration 0015's list, its
upgrade this check."""

from __future__ import annotations

import psycopg
import pytest


def _name(c, kind):
    return c.execute("SELECT pm_vector.pm_run_table(7, %s)", [kind]).fetchone()[0]


def test_0026_down_and_up(fresh_url):
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, upgrade_to_head
    from pm_vector.db.run_tables import run_table
    from pm_vector.db.runs.kinds import KINDS

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        for kind in [*KINDS, "test_marks"]:  # the SQL namer and the Python one agree, a new kind included
            assert _name(c, kind) == run_table(7, kind).as_string(c).replace('"', "")
        for bad in ["Items", "1x", "items; DROP TABLE x", "a" * 41, "", None]:
            with pytest.raises(psycopg.Error, match="lower-case letters"):
                _name(c, bad)
    command.downgrade(alembic_config(fresh_url), "0025_cluster_owner")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert _name(c, "locations") == "pm_vector.run_7_locations"
        with pytest.raises(psycopg.Error, match="kind must be items, anchors"):
            _name(c, "test_marks")
    upgrade_to_head(fresh_url)
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert _name(c, "test_marks") == "pm_vector.run_7_test_marks"
