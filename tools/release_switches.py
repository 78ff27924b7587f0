"""Count the places in pm_vector/ that switch on a release (issue #37): an AST walk, not a grep.

A place that switches on a release is one of:

* a comparison (``==``, ``!=``, ``in``, ``not in``, ``is``, ``is not``) with, on either side, a
  release's name string (``"location"``, ``"cells"``, ``"gaussian"``, ...), a request format
  string (``"pm_vector.cells/1"``, ...), a ``*_FORMAT`` constant, or a request class -- alone or
  inside a tuple, list or set literal;
* a ``case`` of a ``match`` whose pattern is one of those values or a request class
  (``case CellRequest(): ...``);
* an ``isinstance`` (or ``issubclass``) check against a request class.

Modules named ``releases.py`` and modules inside a ``releases/`` package are the table
(:mod:`pm_vector.protocol.releases`) and are not counted. Each node counts once.

Usage::

    python tools/release_switches.py [--max N] [--root DIR] [-v]

prints the count per file (and with ``-v`` each place) and the total; with ``--max N`` it exits 1
when the total is above N. ``tests/test_release_switches.py`` runs it with the current ceiling.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared walk beside it, run or loaded by path
from _ast_count import ROOT, above_ceiling, modules, parser, print_counts  # noqa: E402

#: the release names of the table (and the name the paper's protocol goes by on the client)
RELEASE_NAMES = frozenset({"location", "cells", "gaussian", "class-rows", "privatemail", "privatemail-release"})
#: the request formats (the values of pm_vector/protocol/formats.py)
FORMATS = frozenset({"pm_vector.privatemail/1", "pm_vector.privatemail-release/1", "pm_vector.class-rows/1",
                     "pm_vector.cells/1", "pm_vector.location/1"})
#: the request classes (and their old names)
REQUEST_CLASSES = frozenset({"LocationRequest", "CellRequest", "ClassRowsRequest", "PrivateMailRequest",
                             "ReleaseRequest", "QueryRequest"})
#: the ``*_FORMAT`` constants of the request formats (pm_vector/protocol/formats.py; the product
#: codes' PQ_FORMAT is a document's format, not a release's)
FORMAT_CONSTANTS = frozenset({"PRIVATEMAIL_FORMAT", "RELEASE_FORMAT", "CLASS_ROWS_FORMAT", "CELL_FORMAT",
                              "LOCATION_FORMAT"})
_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_release_value(node: ast.AST) -> bool:
    """A release's name or format string, a ``*_FORMAT`` constant or a request class, or a literal
    collection holding one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in RELEASE_NAMES or node.value in FORMATS
    name = _name(node)
    if name is not None:
        return name in FORMAT_CONSTANTS or name in REQUEST_CLASSES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_release_value(e) for e in node.elts)
    return False


def _is_request_class(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_request_class(e) for e in node.elts)
    return _name(node) in REQUEST_CLASSES


def _pattern_switches(p: ast.AST) -> bool:
    if isinstance(p, ast.MatchValue):
        return _is_release_value(p.value)
    if isinstance(p, ast.MatchClass):
        return _name(p.cls) in REQUEST_CLASSES
    if isinstance(p, ast.MatchOr):
        return any(_pattern_switches(q) for q in p.patterns)
    if isinstance(p, ast.MatchAs) and p.pattern is not None:
        return _pattern_switches(p.pattern)
    return False


def switches(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of every place in ``tree`` that switches on a release (module doc)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(isinstance(op, _OPS) for op in node.ops) and any(
                    _is_release_value(x) for x in [node.left, *node.comparators]):
                out.append((node.lineno, "comparison"))
        elif isinstance(node, ast.match_case):
            if _pattern_switches(node.pattern):
                out.append((node.pattern.lineno, "match case"))
        elif isinstance(node, ast.Call) and _name(node.func) in ("isinstance", "issubclass") \
                and len(node.args) == 2 and _is_request_class(node.args[1]):
            out.append((node.lineno, _name(node.func)))
    return sorted(out)


def is_table(path: Path) -> bool:
    """Modules named ``releases.py`` or inside a ``releases/`` package: the table, not counted."""
    return path.name == "releases.py" or "releases" in path.parts[:-1]


def count(root: Path = ROOT, package: str = "pm_vector") -> dict[str, list[tuple[int, str]]]:
    """file (relative to ``root``) -> its places, for every file of ``package`` with at least one."""
    found: dict[str, list[tuple[int, str]]] = {}
    for path, source in modules(root, package, skip=is_table):
        places = switches(ast.parse(source, filename=path))
        if places:
            found[path] = places
    return found


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("-v", "--verbose", action="store_true", help="print every place, not only the counts")
    args = ap.parse_args(argv)
    found = count(args.root)
    total = sum(len(v) for v in found.values())
    print_counts({path: len(places) for path, places in found.items()},
                 (lambda path: [f"        {path}:{line}  {what}" for line, what in found[path]]) if args.verbose else None)
    print(f"{total:4d}  total in {len(found)} files")
    return 1 if above_ceiling(total, args.max, f"{total} places switch on a release, above the ceiling {args.max}; look "
                              "the release up in pm_vector/protocol/releases.py (by_name, by_format, by_request) "
                              "instead.") else 0


if __name__ == "__main__":
    sys.exit(main())
