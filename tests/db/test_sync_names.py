"""Names on the attach and sync path (issue #35, findings 2 and 7): the table's names -- table, key,
vector, label and payload columns -- with quotes, semicolons, unicode and reserved words attach and
sync (hypothesis-generated), the injection column name is a literal column name, the collection's
name goes through the one name check (Python, the SQL function, the CLI), and what the CLI prints
of a name, a key or a reason can never forge a line."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st
from psycopg import sql
from typer.testing import CliRunner

from test_db_attach import _vec

runner = CliRunner()

INJECTION = "t',(select max(key_hash)from pm_vector_service.api_keys),'u"
BAD_NAMES = ["x\r\nX-Evil: 1", "docs\u200b", "\uff44\uff4f\uff43\uff53"]  # CR LF, zero-width space, fullwidth

# a name PostgreSQL can hold: no NUL, at most 63 bytes (NAMEDATALEN); quotes, semicolons, spaces,
# unicode and SQL's reserved words among them
_name = st.one_of(
    st.sampled_from(["select", "from", "user", "order", "table", "a\"b", "a;b", "it's", "x y", "Ünï", "名前", INJECTION]),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00", min_codepoint=1), min_size=1, max_size=12),
).filter(lambda s: len(s.encode("utf-8")) <= 63)


def _attach_sync_roundtrip(db, conn, table, key, vec, label, pay):
    """A table named so, attached, changed (insert, vector update, payload update, delete) and
    synced: the collection follows, and the payload's key is the column's name, literally."""
    cname = "n_" + uuid.uuid4().hex[:10]
    tbl = sql.Identifier("public", table)
    k, v, lab, p = (sql.Identifier(x) for x in (key, vec, label, pay))
    conn.execute(sql.SQL("CREATE TABLE {} ({} text PRIMARY KEY, {} vector(3), {} int, {} text)").format(tbl, k, v, lab, p))
    rows = [("a", "[1,0,0]", 0, "one"), ("b", "[0,1,0]", 1, "two"), ("c", "[0,0,1]", 0, "three")]
    for r in rows:  # (no parameters: psycopg would read a '%' of a name as a placeholder)
        conn.execute(sql.SQL("INSERT INTO {} VALUES ({})").format(tbl, sql.SQL(", ").join(map(sql.Literal, r))))
    conn.commit()
    try:
        out = db.attach_table(cname, table=tbl.as_string(conn), id_column=key, vector_column=vec, label_column=label,
                              payload_columns=[pay], labels=[0, 1])
        assert out["items"] == 3 and not out.get("rejected")
        conn.execute(sql.SQL("INSERT INTO {} VALUES ('d', '[1,1,0]', 1, 'four')").format(tbl))
        conn.execute(sql.SQL("UPDATE {} SET {} = '[1,0,1]' WHERE {} = 'a'").format(tbl, v, k))
        conn.execute(sql.SQL("UPDATE {} SET {} = 'TWO' WHERE {} = 'b'").format(tbl, p, k))
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} = 'c'").format(tbl, k))
        conn.commit()
        res = db.sync(cname)
        assert (res["applied"], res["inserted"], res["replaced"], res["payloads"], res["deleted"]) == (4, 1, 1, 1, 1)
        assert not res.get("rejected")
        got = dict(conn.execute("SELECT i.external_id, i.payload FROM pm_vector.items i JOIN pm_vector.collections c "
                                "ON c.id = i.collection_id WHERE c.name = %s", [cname]).fetchall())
        assert got == {"a": {pay: "one"}, "b": {pay: "TWO"}, "d": {pay: "four"}}
    finally:
        conn.rollback()
        db.drop_collection(cname, missing_ok=True)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(tbl))
        conn.commit()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(_name, min_size=5, max_size=5, unique=True))
@example(names=["my table", "key;id", "vec\"tor", "select", "author's note"])
@example(names=["t", "id", "embedding", "category", INJECTION])
@example(names=["t%s", "k%b", "v%", "l%\u00e9", "p%s"])  # a '%' is no placeholder
def test_any_names_attach_and_sync(db, conn, names):
    """Finding 2: a payload column named ``author's note`` failed every sync with a syntax error (the
    deletes behind it never applied), and the injection column name put an API key's hash into the
    payload; any names of the table and its columns now attach and sync."""
    _attach_sync_roundtrip(db, conn, *names)


def test_the_collection_name_is_checked_on_every_way_in(db, conn):
    """Finding 7: attach_table skipped the collection-name check."""
    from pm_vector.cli import app
    from pm_vector.db.store._names import NAME_PATTERN
    from pm_vector.errors import InvalidInputError

    t = "nm_" + uuid.uuid4().hex[:8]
    conn.execute(f"CREATE TABLE public.{t} (id bigint PRIMARY KEY, embedding vector(3))")
    conn.execute(f"INSERT INTO public.{t} VALUES (1, '[1,2,3]')")
    conn.commit()
    try:
        for bad in BAD_NAMES:
            with pytest.raises(InvalidInputError, match="invalid collection name"):
                db.attach_table(bad, table=f"public.{t}", id_column="id", vector_column="embedding")
            with pytest.raises(psycopg.errors.CheckViolation, match="ck_collections_name_chars"):
                conn.execute("SELECT pm_vector.pm_attach_table(%s, %s::regclass, 'id', 'embedding')", [bad, f"public.{t}"])
            conn.rollback()
            r = runner.invoke(app, ["attach", bad, "--table", f"public.{t}", "--id-column", "id",
                                    "--vector-column", "embedding"])
            assert r.exit_code != 0 and "error:" in r.output and "invalid collection name" in r.output
            assert not any(line.startswith("X-Evil") for line in r.output.splitlines()), r.output
            assert conn.execute("SELECT count(*) FROM pm_vector.collections WHERE name = %s", [bad]).fetchone()[0] == 0
        # the constraint is the Python rule (one rule, two places that hold it)
        src = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = "
                           "'ck_collections_name_chars'").fetchone()[0]
        assert f"^(?:{NAME_PATTERN.pattern})$" in src
        for name in ["ok_1", "a.b:c-d", "x" * 128, "-x", "x" * 129, "a b", "é"]:
            ok = bool(conn.execute("SELECT %s ~ '^(?:[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127})$'", [name]).fetchone()[0])
            assert ok == bool(NAME_PATTERN.fullmatch(name)), name
    finally:
        conn.rollback()
        conn.execute(f"DROP TABLE IF EXISTS public.{t}")
        conn.commit()


def test_the_cli_never_prints_a_forged_line(db, cname, conn):
    """Finding 7: ``pm-vector sync-status`` printed a forged line. A key, a reason, a table or a
    collection name (one made before the check) is printed escaped, on its own line."""
    from pm_vector.cli import app
    from pm_vector.cli.items import _status_line

    t = "fg_" + uuid.uuid4().hex[:8]
    conn.execute(f"CREATE TABLE public.{t} (id text PRIMARY KEY, embedding vector(3), category text)")
    conn.execute(f"INSERT INTO public.{t} VALUES ('a', '[1,2,3]', '0')")
    conn.commit()
    try:
        db.attach_table(cname, table=f"public.{t}", id_column="id", vector_column="embedding",
                        label_column="category", labels=[0])
        conn.execute(f"INSERT INTO public.{t} VALUES (%s, '[1,2,3]', %s)", ["k\r\nX-Evil: 1", "0\nX-Evil: 2"])
        conn.execute(f"INSERT INTO public.{t} VALUES (%s, NULL, '0')", ["z\u200b\u2028X-Evil: 3"])
        conn.commit()
        r = runner.invoke(app, ["sync", cname])
        assert r.exit_code == 0, r.output
        lines = r.output.splitlines()
        assert re.match(r"2 change\(s\): 0 new, .* 2 rejected$", lines[0]) and len(lines) == 3, r.output
        assert not [ln for ln in lines if ln.startswith("X-Evil")]
        assert "k\\r\\nX-Evil: 1" in r.output and "z\\u200b\\u2028X-Evil: 3" in r.output
        r = runner.invoke(app, ["sync-status", cname])
        lines = r.output.splitlines()
        assert r.exit_code == 0 and lines[0].endswith("up to date; 2 rejected") and len(lines) == 3, r.output
        assert not [ln for ln in lines if ln.startswith("X-Evil")]
        forged = _status_line({"collection": "x\r\nX-Evil: 1", "source_table": "t\u2029X-Evil: 2", "queued": 0,
                               "lag_s": None, "rejected": 0})
        assert forged == "x\\r\\nX-Evil: 1 (t\\u2029X-Evil: 2): up to date" and len(forged.splitlines()) == 1
    finally:
        db.drop_collection(cname, missing_ok=True)
        conn.execute(f"DROP TABLE IF EXISTS public.{t}")
        conn.commit()


def test_odd_names_with_an_active_run(db, cname, conn):
    """The names above with a run: the job reads the vectors by key from the table, and a sync
    erases and places items (the run's items read back from the table) under the same names; the
    raw features read back by key (``fetch_items``) too."""
    import numpy as np
    from dbtest_helpers import make_embed_fn, make_extend_fn

    table, key, vec, label, pay = 'my "docs"; drop', "key;id%s", "vec'tor", "select", "author's note"
    tbl = sql.Identifier("public", table)
    k, v, lab, p = (sql.Identifier(x) for x in (key, vec, label, pay))
    rng = np.random.default_rng(2)
    y = rng.integers(0, 3, 200)
    X = rng.normal(size=(200, 6)) + 2.0 * np.eye(6)[y]
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    conn.execute(sql.SQL("CREATE TABLE {} ({} bigint PRIMARY KEY, {} vector(6), {} int, {} text)").format(tbl, k, v, lab, p))
    for i in range(200):
        conn.execute(sql.SQL("INSERT INTO {} VALUES ({}, {}::vector, {}, {})").format(
            tbl, sql.Literal(i + 1), sql.Literal(_vec(X[i])), sql.Literal(int(y[i])), sql.Literal(f"doc {i + 1}")))
    conn.commit()
    try:
        db.attach_table(cname, table=tbl.as_string(conn), id_column=key, vector_column=vec, label_column=label,
                        payload_columns=[pay])
        db.register_anchor_set(cname, X[:60], y[:60])
        db.register_anchor_set(cname, X[60:80], y[60:80], role="dummy")
        rid = db.run_embedding_job(cname, {"k": 3}, 1, embed_fn=make_embed_fn())["run_id"]
        conn.execute(sql.SQL("INSERT INTO {} VALUES (500, {}::vector, 1, 'new')").format(tbl, sql.Literal(_vec(X[3]))))
        conn.execute(sql.SQL("UPDATE {} SET {} = {}::vector WHERE {} = 7").format(tbl, v, sql.Literal(_vec(X[9])), k))
        conn.execute(sql.SQL("DELETE FROM {} WHERE {} = 8").format(tbl, k))
        conn.commit()
        out = db.sync(cname, embed_fn_extend=make_extend_fn())
        assert (out["inserted"], out["replaced"], out["deleted"], out["rejected"]) == (1, 1, 1, [])
        ids = dict(conn.execute("SELECT i.external_id, i.id FROM pm_vector.items i JOIN pm_vector.collections c "
                                "ON c.id = i.collection_id WHERE c.name = %s", [cname]).fetchall())
        # the run's live items: its rows minus the delta's tombstones (the deleted and replaced items, whose
        # rows leave at the next merge)
        in_run = {r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{int(rid)}_items").fetchall()}
        in_run -= {r[0] for r in conn.execute("SELECT item_id FROM pm_vector.delta_tombstones WHERE run_id = %s",
                                              [int(rid)]).fetchall()}
        assert "8" not in ids and ids["500"] in in_run and ids["7"] in in_run and len(in_run) == 200
        # the raw features read back by key from the table named so (a '%' in the key's name: the ids go
        # as literals, not parameters; issue #37: fetch_items failed with "the query has 3 placeholders")
        conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(settings, '{allow_raw_features}', 'true') "
                     "WHERE name = %s", [cname])
        conn.commit()
        got = db.fetch_items(cname, [ids["500"], ids["7"]], include_features=True)
        assert got["external_ids"] == ["500", "7"]
        assert np.allclose(got["features"], X[[3, 9]], atol=1e-6)
    finally:
        conn.rollback()
        db.drop_collection(cname, missing_ok=True)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(tbl))
        conn.commit()
