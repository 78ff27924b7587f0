"""``pm-vector sync NAME --every S``: a loop in a process of its own, applying each pass's queued
changes (the run's items kept between passes); ``--passes`` stops it; a collection it cannot sync
(unknown, not attached) stops it at once with ``error: ...``, never a loop of errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from test_db_attach import _ids_of, _vec, user_table  # noqa: F401  (fixture)

runner = CliRunner()


@pytest.mark.slow
def test_sync_every_applies_each_pass_and_stops_after_its_passes(db, cname, conn, user_table):  # noqa: F811
    from pm_vector.cli import app
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    t, X, y = user_table
    db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding", label_column="category",
                    payload_columns=["title"], dim=6)
    db.register_anchor_set(cname, X[:90], y[:90])
    db.register_anchor_set(cname, X[90:120], y[90:120], role="dummy")
    db.run_embedding_job(cname, {"n_components": 3}, 1, embed_fn=anchor_frame_embed_fn)  # the CLI's extension
    conn.execute(f"INSERT INTO public.{t} VALUES (2001, %s::vector, 2, 'new')", [_vec(X[10])])
    conn.execute(f"DELETE FROM public.{t} WHERE id = 9")
    conn.execute(f"UPDATE public.{t} SET title = 'renamed' WHERE id = 8")
    r = runner.invoke(app, ["sync", cname, "--every", "0.1", "--passes", "3", "--json"])
    assert r.exit_code == 0, r.output
    passes = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [p["applied"] for p in passes] == [3, 0, 0]  # each change once, in the first pass
    ids = _ids_of(conn, cname)
    assert "2001" in ids and "9" not in ids
    assert conn.execute("SELECT count(*) FROM pm_vector.attach_changes").fetchone()[0] == 0


def test_sync_every_stops_at_once_on_what_no_pass_can_mend(db):
    from pm_vector.cli import app

    r = runner.invoke(app, ["sync", "no_such_collection_x", "--every", "0.1"])
    assert r.exit_code == 2 and "error:" in r.output and r.output.count("error:") == 1
    r = runner.invoke(app, ["sync", "no_such_collection_x", "--passes", "2"])
    assert r.exit_code == 2 and "--every" in r.output


def _closed_url() -> str:
    """A PostgreSQL URL where nothing listens (a port just freed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://pm@127.0.0.1:{port}/pm_vector?connect_timeout=2"


def test_sync_with_the_database_down_exits_non_zero(db):
    """Finding 11: ``pm-vector sync X --every 1 --passes 1`` exited 0 with the database down."""
    from pm_vector.cli import app

    env = {"PM_VECTOR_DATABASE_URL": _closed_url()}
    for args in (["sync", "docs", "--every", "0.1", "--passes", "1"], ["sync", "docs", "--every", "0.1", "--passes", "2"],
                 ["sync", "docs"]):
        r = runner.invoke(app, args, env=env)
        assert r.exit_code != 0, (args, r.output)
        assert "error:" in r.output and "connect" in r.output and "Traceback" not in r.output, r.output
    # the loop says each failed pass, and the last one ends it: two passes, two errors
    r = runner.invoke(app, ["sync", "docs", "--every", "0.1", "--passes", "2"], env=env)
    assert r.output.count("error:") == 2 and "trying again" in r.output


def test_sync_of_a_collection_that_is_not_attached_exits_non_zero(db, cname):
    """Finding 11: ``sync`` of a collection that is not attached exited 0 silently."""
    from pm_vector.cli import app
    from pm_vector.errors import InvalidInputError

    db.create_collection(cname, 3, [0, 1])
    with pytest.raises(InvalidInputError, match="is not attached to a table"):
        db.sync(cname)
    for args in (["sync", cname], ["sync", cname, "--every", "0.1", "--passes", "2"]):
        r = runner.invoke(app, args)
        assert r.exit_code != 0 and r.output.count("error:") == 1, r.output
        assert f"collection '{cname}' is not attached to a table" in r.output
