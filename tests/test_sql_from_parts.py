"""SQL built from parts, never pasted (issue #35, build item 3): no call of ``execute``,
``executemany`` or ``copy`` in pm_vector (a connection's, a cursor's) whose SQL is an f-string with
interpolated values, a ``%``-format, a ``.format`` of a string or a ``+`` of a string with something
else -- directly, through a variable assigned so in the same function, or inside ``sql.SQL(...)``
-- except those counted in ``tests/sql_from_parts_allow.txt``.

The allow-list is debt, not a licence (issue #37): each line is a module and how many such calls it
holds today (run tables named by an integer run id, mostly). A new pasted statement fails this test;
a module that loses one must lower its count (the test says so), so the list only shrinks. The
attach and sync path (``db/store/attach.py``, ``sync*.py``, ``db/core/features.py``, ``cli/items.py``) is
not in it: every name there goes through ``psycopg.sql.Identifier`` / ``Literal``.

Nothing is imported: the modules are read with :mod:`ast`."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pm_vector

ROOT = Path(pm_vector.__file__).parent
ALLOW = Path(__file__).parent / "sql_from_parts_allow.txt"
CALLS = {"execute", "executemany", "copy"}
#: the attach / sync path: never in the allow-list
CLEAN = {"db/store/attach.py", "db/store/sync.py", "db/store/sync_items.py", "db/store/sync_rows.py",
         "db/core/features.py", "cli/items.py"}


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


def scan(path: Path) -> list[int]:
    """Line numbers of the pasted statements of one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
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


def _allowed() -> Counter:
    out = Counter()
    for line in ALLOW.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            path, n = line.split()
            out[path] = int(n)
    return out


def test_no_sql_is_pasted_beyond_the_allow_list():
    allowed = _allowed()
    assert not CLEAN & set(allowed), "the attach / sync path builds every statement from parts"
    found = {str(p.relative_to(ROOT)): scan(p) for p in sorted(ROOT.rglob("*.py"))}
    found = {k: v for k, v in found.items() if v}
    over = [f"{k}: lines {v} ({len(v)} found, {allowed.get(k, 0)} allowed)" for k, v in found.items()
            if len(v) > allowed.get(k, 0)]
    assert not over, ("SQL pasted from values (build it with psycopg.sql.SQL / Identifier / Literal, or pass the "
                      "value as a parameter): " + "; ".join(over))
    under = [f"{k}: {len(found.get(k, []))} found, {n} allowed" for k, n in allowed.items()
             if len(found.get(k, [])) < n]
    assert not under, "lower these counts in tests/sql_from_parts_allow.txt (debt paid): " + "; ".join(under)


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
        ''')
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "m.py"
        p.write_text(src)
        assert scan(p) == [3, 4, 5, 6, 8, 9, 10]
