"""SQL built from parts, never pasted (issue #35, build item 3; issue #37, build item 5): in pm_vector

* no call of ``execute``, ``executemany`` or ``copy`` (a connection's, a cursor's) whose SQL is an
  f-string with interpolated values, a ``%``-format, a ``.format`` of a string or a ``+`` of a
  string with something else -- directly, through a variable assigned so in the same function, or
  inside ``sql.SQL(...)``;
* no SQL text built so anywhere else either (:func:`sql_text`): a helper returning a fragment or a
  statement that another function executes (``live_sql``, ``feature_sql``), a template filled
  with ``.format``, a string passed to a COPY helper -- any pasted string whose words read as SQL
  (``SELECT``, ``FROM``, ``WHERE``, ``JOIN``, ``DELETE FROM``, ...), an exception's message aside;
* no run table named by pasting (:func:`run_names`): ``run_{id}_...`` in any pasted string, SQL
  words or not (``t = f"pm_vector.run_{rid}_locations"``); :func:`pm_vector.db.run_tables.run_table`
  is the one home of that name, a ``sql.Identifier``

-- none, anywhere in pm_vector, bench included (issue #37 paid the debt the allow-list counted: about 100
statements in 34 modules, mostly run tables named by pasting their integer id). An identifier goes
through ``psycopg.sql.Identifier`` (a run's table through :func:`pm_vector.db.run_tables.run_table`),
a constant of the code through ``sql.Literal`` or a parameter.

Nothing is imported: the modules are read with :mod:`ast`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pm_vector

ROOT = Path(pm_vector.__file__).parent
CALLS = {"execute", "executemany", "copy"}
#: the one home of a run table's name (``run_<id>_<kind>``), as a ``sql.Identifier``
NAMES_HOME = "db/run_tables.py"
#: SQL words (upper case, as pm_vector writes its SQL) that make a pasted string SQL text
SQL_WORDS = re.compile(r"\b(SELECT|INSERT INTO|UPDATE \S+ (AS \S+ )?SET|DELETE FROM|(CREATE|DROP|ALTER) (TEMP|TABLE|INDEX|"
                       r"FOREIGN|UNIQUE|UNLOGGED)|ANALYZE|COPY|FROM|WHERE|JOIN|NOT EXISTS|ORDER BY|GROUP BY|REINDEX|"
                       r"TRUNCATE|VALUES|AND|OR|ON CONFLICT|GRANT|REVOKE)\b")


def _is_str(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def pasted(node) -> bool:
    """Does ``node`` build SQL text by pasting values into it?"""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _is_str(node.left) or pasted(node.left)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        if pasted(node.left) or pasted(node.right):
            return True
        strs = [_is_str(node.left) or isinstance(node.left, ast.JoinedStr),
                _is_str(node.right) or isinstance(node.right, ast.JoinedStr)]
        return any(strs) and not all(strs)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _is_str(node.func.value) or pasted(node.func.value)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "SQL":
        return bool(node.args) and pasted(node.args[0])  # sql.SQL(f"...") pastes as well
    if isinstance(node, ast.IfExp):
        return pasted(node.body) or pasted(node.orelse)
    return False


def _sql_arg(call: ast.Call):
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg in ("query", "statement")), None)


def _text(node) -> str:
    """The literal text of a string, an f-string, or a ``+`` of them (the pasted parts left out)."""
    if _is_str(node):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if _is_str(v))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + " " + _text(node.right)
    return ""


def _pasted_text(node) -> str | None:
    """The literal text of ``node`` when it pastes values into a string (None: it does not)."""
    if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in node.values):
        return _text(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _is_str(node.left):
        return node.left.value
    if isinstance(node, ast.Attribute) and node.attr == "format" and _is_str(node.value):  # a template's format
        return node.value.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and pasted(node):
        return _text(node)
    return None


def _messages(tree) -> set[int]:
    """ids of the nodes inside an exception's message (a ``raise``, a call of ``...Error(...)``)."""
    out = set()
    for n in ast.walk(tree):
        name = getattr(getattr(n, "func", None), "id", None) or getattr(getattr(n, "func", None), "attr", None) or ""
        if isinstance(n, ast.Raise) or (isinstance(n, ast.Call) and name.endswith(("Error", "Exception", "Warning"))):
            out |= {id(m) for m in ast.walk(n)}
    return out


def sql_text(tree) -> set[int]:
    """Lines of pasted strings whose words read as SQL, wherever they are built."""
    skip = _messages(tree)
    return {n.lineno for n in ast.walk(tree) if id(n) not in skip
            and (t := _pasted_text(n)) is not None and SQL_WORDS.search(t)}


def run_names(tree) -> set[int]:
    """Lines of f-strings that paste a run table's name: ``run_`` followed by an interpolated value."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            vs = n.values
            if any(_is_str(a) and a.value.endswith("run_") and isinstance(b, ast.FormattedValue)
                   for a, b in zip(vs, vs[1:])):
                out.add(n.lineno)
    return out


def scan(path: Path) -> list[int]:
    """Line numbers of the pasted SQL of one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = sql_text(tree)
    if not str(path).endswith(NAMES_HOME):
        found |= run_names(tree)
    for scope in ast.walk(tree):
        if not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(ast.walk(scope))
        assigned: dict[str, list] = {}
        for n in nodes:
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                value = n.value if not isinstance(n, ast.AugAssign) else ast.BinOp(
                    left=ast.Constant(""), op=n.op, right=n.value)
                for t in targets:
                    if isinstance(t, ast.Name) and value is not None:
                        assigned.setdefault(t.id, []).append(value)
        for n in nodes:
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in CALLS:
                arg = _sql_arg(n)
                if arg is None:
                    continue
                if pasted(arg) or (isinstance(arg, ast.Name) and any(pasted(v) for v in assigned.get(arg.id, []))):
                    found.add(n.lineno)
    return sorted(found)


def test_no_sql_is_pasted():
    found = {str(p.relative_to(ROOT)): scan(p) for p in sorted(ROOT.rglob("*.py"))}
    found = [f"{k}: lines {v}" for k, v in found.items() if v]
    assert not found, ("SQL pasted from values (build it with psycopg.sql.SQL / Identifier / Literal, a run's table "
                       "with pm_vector.db.run_tables.run_table, or pass the value as a parameter): " + "; ".join(found))


def test_the_scan_finds_each_form():
    """The scan can fail: each pasted form is found, the composed and parameterised ones are not."""
    import textwrap

    src = textwrap.dedent('''
        def f(conn, cur, t, c, sql):
            conn.execute(f"SELECT {c} FROM t")                   # 3
            cur.execute("SELECT %s FROM t" % c)                  # 4
            cur.executemany("SELECT {} FROM t".format(c), [])    # 5
            conn.execute("SELECT " + c + " FROM t")              # 6
            q = f"DELETE FROM {t}"
            conn.execute(q)                                      # 8
            conn.execute(sql.SQL(f"SELECT {c}"))                 # 9
            cur.copy(f"COPY {t} TO STDOUT")                      # 10
            conn.execute("SELECT %s", [c])
            conn.execute(sql.SQL("SELECT {} FROM {}").format(sql.Identifier(c), sql.Identifier(t)))
            conn.execute("SELECT 1 " "FROM t")

        def live(run_sql):
            return f"NOT EXISTS (SELECT 1 FROM z WHERE z.run_id = {run_sql})"  # 16

        def table(rid):
            t = f"pm_vector.run_{int(rid)}_locations"                        # 19
            raise ValueError(f"no rows FROM {t}")
        TEMPLATE = "SELECT {} FROM pm_vector.items".format                     # 21
        ''')
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.py"
        p.write_text(src)
        assert scan(p) == [3, 4, 5, 6, 7, 8, 9, 10, 16, 19, 21]
