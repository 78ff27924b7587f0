"""How far behind the sync of an attached table is (migration 0019): the view
``pm_vector.attach_status``, ``pm_vector.db.sync_status`` and ``pm-vector sync-status`` count the
queued changes and the oldest one's wait, read the oldest through the ``(collection_id, seq)``
index, go back to "up to date" after a sync, refuse an unknown or unattached collection, and are
the owner's only; the downgrade drops the view and the upgrade brings it back."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid

import pytest
from typer.testing import CliRunner

from test_db_attach import _vec, user_table  # noqa: F401  (fixture)

runner = CliRunner()


def _attach(db, cname, t):
    db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding", label_column="category",
                    payload_columns=["title"], dim=6)


def _queue(conn, cname):
    """The collection's queue rows, oldest first: (seq, queued_at)."""
    return conn.execute("SELECT a.seq, a.queued_at FROM pm_vector.attach_changes a JOIN pm_vector.collections c "
                        "ON c.id = a.collection_id WHERE c.name = %s ORDER BY a.seq", [cname]).fetchall()


def test_sync_status_counts_the_queue_and_the_oldest_changes_wait(db, cname, conn, user_table):  # noqa: F811
    t, X, _y = user_table
    _attach(db, cname, t)
    st = db.sync_status(cname)
    assert st == {"collection": cname, "source_table": st["source_table"], "queued": 0, "oldest_queued_at": None,
                  "lag_s": None, "rejected": 0, "broken": None, "broken_at": None, "pending_purge": 0,
                  "purge_age_s": None}
    assert st["source_table"].split(".")[-1] == t  # the table, as settings -> 'attached' names it
    stored = conn.execute("SELECT settings -> 'attached' ->> 'table' FROM pm_vector.collections WHERE name = %s",
                          [cname]).fetchone()[0]
    assert st["source_table"] == stored
    # three changes, a second apart from the status: an insert, a vector update, a delete
    conn.execute(f"INSERT INTO public.{t} VALUES (2001, %s::vector, 2, 'new')", [_vec(X[10])])
    conn.execute(f"UPDATE public.{t} SET embedding = %s::vector WHERE id = 7", [_vec(X[20])])
    conn.execute(f"DELETE FROM public.{t} WHERE id = 9")
    time.sleep(1.0)
    t0 = time.monotonic()
    st = db.sync_status(cname)
    asked = time.monotonic() - t0
    queue = _queue(conn, cname)
    assert st["queued"] == len(queue) == 3
    oldest = dt.datetime.fromisoformat(st["oldest_queued_at"])
    assert oldest == queue[0][1]  # the lowest seq's time, which the sync applies first
    now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    assert 1.0 <= st["lag_s"] <= (now - oldest).total_seconds() + asked + 1e-3
    assert st["lag_s"] < 60
    # a later reading: the same oldest change, a longer wait
    time.sleep(0.2)
    again = db.sync_status(cname)
    assert again["oldest_queued_at"] == st["oldest_queued_at"] and again["lag_s"] >= st["lag_s"] + 0.2
    # without a name: every attached collection, this one among them (the same numbers)
    listed = {r["collection"]: r for r in db.sync_status()}
    assert listed[cname]["queued"] == 3 and listed[cname]["oldest_queued_at"] == st["oldest_queued_at"]
    assert all(r["queued"] >= 0 for r in listed.values())
    assert list(listed) == sorted(listed)
    # the sync applies the queue: up to date, no lag
    assert db.sync(cname)["applied"] == 3
    st = db.sync_status(cname)
    assert (st["queued"], st["oldest_queued_at"], st["lag_s"]) == (0, None, None)


def test_sync_status_refuses_an_unknown_or_unattached_collection(db, cname):
    from pm_vector.db.errors import CollectionNotFoundError
    from pm_vector.errors import InvalidInputError

    with pytest.raises(CollectionNotFoundError, match="unknown collection 'no_such_collection_x'"):
        db.sync_status("no_such_collection_x")
    db.create_collection(cname, 3, [0, 1])
    with pytest.raises(InvalidInputError, match=f"collection '{cname}' is not attached to a table"):
        db.sync_status(cname)
    assert cname not in {r["collection"] for r in db.sync_status()}  # only attached collections are listed


def test_the_oldest_change_is_read_through_the_index(db, cname, conn, user_table):  # noqa: F811
    """A collection queued behind another's backlog of 10,000 changes: the view finds either's oldest
    change with ONE entry of the (collection_id, seq) index under a Limit, never by walking the
    queue (``WHERE collection_id = c.id ORDER BY seq LIMIT 1`` walked the primary key through the
    10,005 older changes of the other collection here)."""
    t, _X, _y = user_table
    _attach(db, cname, t)
    for _ in range(25):  # 400 rows x 25 payload updates, queued for cname
        conn.execute(f"UPDATE public.{t} SET title = title || '.' WHERE id <= 400")
    late = "late_" + uuid.uuid4().hex[:8]  # a second collection of the same table, attached after them
    _attach(db, late, t)
    try:
        conn.execute(f"UPDATE public.{t} SET title = 'x' WHERE id <= 5")  # queued for both
        conn.execute("ANALYZE pm_vector.attach_changes")
        big, small = db.sync_status(cname), db.sync_status(late)
        assert (big["queued"], small["queued"]) == (10_005, 5)
        assert small["oldest_queued_at"] > big["oldest_queued_at"] and small["lag_s"] < big["lag_s"]
        assert dt.datetime.fromisoformat(small["oldest_queued_at"]) == _queue(conn, late)[0][1]
        q = "SELECT * FROM pm_vector.attach_status WHERE collection = %s"
        for name in (cname, late):
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + q, [name]).fetchone()[0][0]["Plan"]
            text = "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + q, [name]).fetchall())
            limits = [n for n in _nodes(plan) if n["Node Type"] == "Limit"]
            assert len(limits) == 1 and limits[0]["Actual Rows"] == 1, text
            under = list(_nodes(limits[0]))
            scans = [n for n in under if n["Node Type"] in ("Index Scan", "Index Only Scan", "Seq Scan",
                                                           "Bitmap Heap Scan")]
            assert [n.get("Index Name") for n in scans] == ["ix_attach_changes_collection_seq"], text
            assert scans[0]["Actual Rows"] == 1 and not scans[0].get("Rows Removed by Filter"), text
            assert not any(n["Node Type"] == "Sort" for n in under), text
            # the filter on the name reaches the collections scan: one collection's queue is counted
            assert any(n.get("Relation Name") == "collections" and n.get("Actual Rows") == 1 for n in _nodes(plan))
    finally:
        db.drop_collection(late, missing_ok=True)


def _nodes(n):
    yield n
    for c in n.get("Plans", []):
        yield from _nodes(c)


def test_the_view_is_the_owners_only(db, conn):
    """It names the users' tables and shows their change rates: PUBLIC and the query role get nothing."""
    assert conn.execute("SELECT has_table_privilege(current_user, 'pm_vector.attach_status', 'SELECT')").fetchone()[0]
    acl = conn.execute("SELECT relacl::text[] FROM pg_class WHERE oid = 'pm_vector.attach_status'::regclass"
                       ).fetchone()[0] or []
    assert not [a for a in acl if a.startswith("=")]  # nothing for PUBLIC
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'pm_vector_query'").fetchone():
        assert not conn.execute("SELECT has_table_privilege('pm_vector_query', 'pm_vector.attach_status', "
                                "'SELECT')").fetchone()[0]
        # (the privilege matrix, migration 0022, gives it the tables an answer reads)
        assert conn.execute("SELECT has_table_privilege('pm_vector_query', 'pm_vector.collections', "
                            "'SELECT')").fetchone()[0]


def test_the_downgrade_drops_the_view_and_the_upgrade_brings_it_back(fresh_url):
    import psycopg
    from alembic import command

    from pm_vector.db import postgres
    from pm_vector.db.postgres.migrate import alembic_config, current_revision, head_revision, upgrade_to_head

    with psycopg.connect(fresh_url, autocommit=True) as c:
        postgres.ensure_pgvector(c)
    upgrade_to_head(fresh_url)
    view = "SELECT to_regclass('pm_vector.attach_status') IS NOT NULL"
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert c.execute(view).fetchone()[0] and current_revision(c) == head_revision()
    command.downgrade(alembic_config(fresh_url), "0018_location_parts")
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert not c.execute(view).fetchone()[0] and current_revision(c) == "0018_location_parts"
        assert c.execute("SELECT to_regclass('pm_vector.attach_changes') IS NOT NULL").fetchone()[0]  # 0016's stays
    assert upgrade_to_head(fresh_url)["from_revision"] == "0018_location_parts"
    with psycopg.connect(fresh_url, autocommit=True) as c:
        assert c.execute(view).fetchone()[0]
        assert c.execute("SELECT count(*) FROM pm_vector.attach_status").fetchone()[0] == 0


def test_the_cli_says_each_collections_queue_and_lag(db, cname, conn, user_table):  # noqa: F811
    from pm_vector.cli import app

    t, X, _y = user_table
    _attach(db, cname, t)
    src = db.sync_status(cname)["source_table"]
    r = runner.invoke(app, ["sync-status", cname])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"{cname} ({src}): up to date"
    conn.execute(f"INSERT INTO public.{t} VALUES (2001, %s::vector, 2, 'new')", [_vec(X[10])])
    conn.execute(f"DELETE FROM public.{t} WHERE id = 9")
    time.sleep(0.3)
    r = runner.invoke(app, ["sync-status", cname])
    assert r.exit_code == 0, r.output
    m = re.fullmatch(rf"{re.escape(cname)} \({re.escape(src)}\): 2 queued, oldest (\d+\.\d) s ago", r.stdout.strip())
    assert m and 0.3 <= float(m.group(1)) < 60, r.stdout
    r = runner.invoke(app, ["sync-status", cname, "--json"])
    got = json.loads(r.stdout)
    assert r.exit_code == 0 and got["collection"] == cname and got["queued"] == 2 and got["lag_s"] >= 0.3
    assert dt.datetime.fromisoformat(got["oldest_queued_at"]) == _queue(conn, cname)[0][1]
    # no name: every attached collection, a line each (and a JSON list)
    r = runner.invoke(app, ["sync-status"])
    assert r.exit_code == 0 and any(re.fullmatch(rf"{re.escape(cname)} \(.*\): 2 queued, oldest .* s ago", ln)
                                    for ln in r.stdout.splitlines()), r.stdout
    r = runner.invoke(app, ["sync-status", "--json"])
    assert [x["queued"] for x in json.loads(r.stdout) if x["collection"] == cname] == [2]
    db.sync(cname)
    r = runner.invoke(app, ["sync-status", cname])
    assert r.stdout.strip() == f"{cname} ({src}): up to date"


def test_the_cli_refuses_an_unknown_or_unattached_collection(db):
    from pm_vector.cli import app

    r = runner.invoke(app, ["sync-status", "no_such_collection_x"])
    assert r.exit_code == 2 and r.output.count("error:") == 1 and "Traceback" not in r.output
    assert "unknown collection 'no_such_collection_x'" in r.output and "pm-vector sync-status" in r.output
    name = "plain_" + uuid.uuid4().hex[:8]
    db.create_collection(name, 3, [0, 1])
    try:
        r = runner.invoke(app, ["sync-status", name])
        assert r.exit_code == 2 and "error:" in r.output and "is not attached to a table" in r.output
    finally:
        db.drop_collection(name, missing_ok=True)
