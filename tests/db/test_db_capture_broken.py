"""DDL that changes an attached table marks its collection broken (issue #35, finding 3d): DROP
COLUMN, ALTER COLUMN ... TYPE ... USING (a rewrite), DROP TABLE. Queries and syncs are refused with
an error naming the collection and the reason, sync-status shows it, and a resync rebuilds the
items from the table and clears the mark."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import sql

from test_db_attach import _ids_of, _served, _vec, user_table  # noqa: F401  (fixture)
from test_db_locations import _request, lserved  # noqa: F401  (fixture)


def _attach(db, cname, t):
    db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding",
                    label_column="category", payload_columns=["title"], dim=6)


def _refused(db, cname, reason: str):
    from pm_vector.db.errors import CollectionBrokenError
    from pm_vector.db.resolve.frame import run_row

    with db.connect() as c, pytest.raises(CollectionBrokenError, match=f"collection '{cname}' is broken: .*{reason}"):
        run_row(c, cname)
    with pytest.raises(CollectionBrokenError, match=reason):
        db.sync(cname)
    st = db.sync_status(cname)
    assert st["broken"] and re.search(reason, st["broken"]) and st["broken_at"]


@pytest.mark.slow
def test_drop_column_breaks_queries_are_refused_and_resync_rebuilds(db, cname, conn, user_table):  # noqa: F811
    from dbtest_helpers import make_extend_fn

    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.db.store.resync import resync
    from test_db_erase import _row_requests

    t, X, y = user_table
    T = sql.Identifier(t)
    _attach(db, cname, t)
    rid = _served(db, cname, X, y)
    reqs = _row_requests(cname, X, y, n=2)
    conn.execute(sql.SQL("ALTER TABLE public.{} DROP COLUMN title").format(T))
    _refused(db, cname, "column title of .* was dropped or renamed")
    from pm_vector.db.errors import CollectionBrokenError

    with pytest.raises(CollectionBrokenError, match="title"):
        resolve(cname, reqs[0], log=False)
    # the table changes meanwhile (still captured: the key, vector and label are as recorded)
    conn.execute(sql.SQL("DELETE FROM public.{} WHERE id = 3").format(T))
    conn.execute(sql.SQL("UPDATE public.{} SET embedding = %s::vector WHERE id = 4").format(T), [_vec(X[30])])
    conn.execute(sql.SQL("ALTER TABLE public.{} ADD COLUMN title text DEFAULT 'back'").format(T))
    out = resync(cname, embed_fn_extend=make_extend_fn())
    assert out["rows"] == 401 and out["gone"] == 1  # (3: its delete queued before, with its vector)
    assert db.sync_status(cname)["broken"] is None and db.sync_status(cname)["queued"] == 0
    have = _ids_of(conn, cname)
    assert "3" not in have and len(have) == 399
    items = {r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{int(rid)}_items").fetchall()}
    assert items == set(have.values())
    assert db.fetch_items(cname, [have["5"]])["payloads"] == [{"title": "back"}]
    assert all(len(r["item_ids"]) for q in reqs for r in resolve(cname, q, log=False)["rows"])


def test_alter_type_using_and_drop_table_break(db, cname, conn, user_table):  # noqa: F811
    from pm_vector.db.store.resync import resync

    t, X, y = user_table
    T = sql.Identifier(t)
    _attach(db, cname, t)
    conn.execute(sql.SQL("DELETE FROM public.{} WHERE id > 1000").format(T))
    conn.execute(sql.SQL("ALTER TABLE public.{} ALTER COLUMN embedding TYPE vector(6) USING embedding").format(T))
    _refused(db, cname, "rewritten|changed type")
    out = resync(cname)
    assert db.sync_status(cname)["broken"] is None and len(_ids_of(conn, cname)) == 400 and out["replaced"] == 400
    # a payload column retyped without a rewrite (text -> varchar): its type changed
    conn.execute(sql.SQL("ALTER TABLE public.{} ALTER COLUMN title TYPE varchar").format(T))
    _refused(db, cname, "column title of .* changed type from text to character varying")
    resync(cname)
    conn.execute(sql.SQL("DROP TABLE public.{}").format(T))
    _refused(db, cname, "was dropped")
    from pm_vector.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="is gone: drop the collection"):
        resync(cname)


def test_without_event_triggers_the_sync_sees_the_change(db, cname, conn, user_table):  # noqa: F811
    """(a migration run by a role that is not a superuser has no event triggers)"""
    t, X, y = user_table
    _attach(db, cname, t)
    from pm_vector.db import postgres

    admin = psycopg.connect(postgres.admin_url(), autocommit=True)  # (an event trigger is a superuser's)
    admin.execute("ALTER EVENT TRIGGER pm_vector_attach_ddl DISABLE")
    try:
        conn.execute(sql.SQL("ALTER TABLE public.{} DROP COLUMN title").format(sql.Identifier(t)))
        assert db.sync_status(cname)["broken"] is None
    finally:
        admin.execute("ALTER EVENT TRIGGER pm_vector_attach_ddl ENABLE")
        admin.close()
    from pm_vector.db.errors import CollectionBrokenError

    with pytest.raises(CollectionBrokenError, match="column title of .* was dropped"):
        db.sync(cname)  # the sync's own check before its batch marks it
    _refused(db, cname, "column title of .* was dropped")


def test_the_service_answers_409_naming_the_reason():
    from pm_vector.db.errors import CollectionBrokenError
    from pm_vector.service.errors import _status_of

    assert _status_of(CollectionBrokenError("docs", "table public.d was dropped")) == (409, "collection_broken")


def test_cli_sync_status_shows_it_and_attach_resync_mends_it(db, cname, conn, user_table):  # noqa: F811
    from typer.testing import CliRunner

    from pm_vector.cli import app

    runner = CliRunner()
    t, X, y = user_table
    _attach(db, cname, t)
    conn.execute(sql.SQL("ALTER TABLE public.{} RENAME COLUMN title TO heading").format(sql.Identifier(t)))
    out = runner.invoke(app, ["sync-status", cname])
    assert out.exit_code == 0 and "BROKEN since" in out.output and "column title of" in out.output
    assert f"pm-vector attach {cname} --resync" in out.output
    out = runner.invoke(app, ["sync", cname])
    assert out.exit_code != 0 and "error:" in out.output and "is broken" in out.output
    # the service's pass leaves it out (no failure a second in its log): its queue waits for the resync
    from pm_vector.db.store.attach import sync_pending

    conn.execute(sql.SQL("DELETE FROM public.{} WHERE id = 7").format(sql.Identifier(t)))
    assert db.sync_status(cname)["queued"] == 1 and cname not in sync_pending()
    out = runner.invoke(app, ["attach", cname, "--resync"])  # the column is still missing: said, non-zero
    assert out.exit_code != 0 and "error:" in out.output and "has no column 'title'" in out.output
    conn.execute(sql.SQL("ALTER TABLE public.{} RENAME COLUMN heading TO title").format(sql.Identifier(t)))
    out = runner.invoke(app, ["attach", cname, "--resync"])
    assert out.exit_code == 0, out.output
    assert "resynced" in out.output and "401 row(s)" in out.output and "399 replaced" in out.output
    out = runner.invoke(app, ["sync-status", cname])
    assert out.exit_code == 0 and "up to date" in out.output
    out = runner.invoke(app, ["attach", "no_such_" + cname, "--resync"])
    assert out.exit_code != 0 and "error:" in out.output and "Traceback" not in out.output


@pytest.mark.slow
def test_a_repeated_location_query_is_refused_once_broken(db, conn, lserved):
    """The one-round-trip path of a repeated request (its answer cached) checks the mark too."""
    from pm_vector.db.errors import CollectionBrokenError
    from pm_vector.db.resolve.resolution import resolve

    name = lserved["name"]
    req = _request(lserved, 2.0, lserved["split"].query[0][0], max_bytes=20_000)
    with db.connect() as c:
        resolve(name, req, conn=c, log=True)
        assert resolve(name, req, conn=c, log=True)["cached"]
        conn.execute("UPDATE pm_vector.collections SET settings = settings || '{\"broken\": {\"reason\": \"test\"}}' "
                     "WHERE name = %s", [name])
        try:
            with pytest.raises(CollectionBrokenError, match=f"collection '{name}' is broken: test"):
                resolve(name, req, conn=c, log=True)
        finally:
            conn.execute("UPDATE pm_vector.collections SET settings = settings - 'broken' WHERE name = %s", [name])
        assert resolve(name, req, conn=c, log=True)["cached"]


@pytest.mark.slow
def test_deletes_while_broken_keep_their_vectors_or_the_resync_says_it_cannot(db, cname, conn, user_table):  # noqa: F811
    """A retype the capture can still read (vector -> halfvec): marked broken, yet a delete keeps the
    vector its item was built from, and the resync erases it from the run. A type it cannot read
    (bytea): a row deleted then is gone with its vector, and the resync refuses, naming the key."""
    from dbtest_helpers import make_extend_fn

    from pm_vector.db.store.resync import resync
    from pm_vector.errors import InvalidInputError

    t, X, y = user_table
    T = sql.Identifier(t)
    _attach(db, cname, t)
    rid = _served(db, cname, X, y)
    conn.execute(sql.SQL("DELETE FROM public.{} WHERE id > 1000").format(T))
    conn.execute(sql.SQL("ALTER TABLE public.{} ALTER COLUMN embedding TYPE halfvec(6)").format(T))
    conn.execute(sql.SQL("DELETE FROM public.{} WHERE id = 3").format(T))
    assert db.sync_status(cname)["broken"]
    resync(cname, embed_fn_extend=make_extend_fn())
    have = _ids_of(conn, cname)
    items = {r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{int(rid)}_items").fetchall()}
    assert "3" not in have and items == set(have.values()) and len(have) == 399
    conn.execute(sql.SQL("ALTER TABLE public.{} ALTER COLUMN embedding TYPE bytea USING embedding::text::bytea").format(T))
    conn.execute(sql.SQL("DELETE FROM public.{} WHERE id = 4").format(T))
    conn.execute(sql.SQL("ALTER TABLE public.{} ALTER COLUMN embedding TYPE halfvec(6) "
                         "USING convert_from(embedding, 'UTF8')::halfvec(6)").format(T))
    with pytest.raises(InvalidInputError, match=r"keys 4\) are gone together with the vectors"):
        resync(cname)
    assert db.sync_status(cname)["broken"]
