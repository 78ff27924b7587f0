"""What the counting scripts of tools/ share (``local_imports.py``, ``release_switches.py``): walk
the package's modules, count what an AST walk finds per key, print the counts, compare the total
with a ceiling. Each script says what it counts and why; this module only walks, prints and
compares. Not a module of pm_vector (the scripts read pm_vector, they do not import it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

#: the repository the scripts read by default (the one they sit in)
ROOT = Path(__file__).resolve().parents[1]


def modules(root: Path = ROOT, package: str = "pm_vector",
            skip: Callable[[Path], bool] | None = None) -> Iterator[tuple[str, str]]:
    """``(path relative to root, POSIX; source)`` of every module of ``package`` under ``root``, in
    path order; ``skip(relative path)``: modules left out."""
    for f in sorted((root / package).rglob("*.py")):
        rel = f.relative_to(root)
        if skip is None or not skip(rel):
            yield rel.as_posix(), f.read_text(encoding="utf-8")


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The scripts' command line: ``--max N`` (the ceiling) and ``--root DIR`` (the repository)."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("--max", type=int, default=None, help="exit 1 when the total is above this")
    ap.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    return ap


def print_counts(counts: Mapping[str, int], detail: Callable[[str], Iterable[str]] | None = None) -> None:
    """One line a key, most first (then by key): ``   n  key``, followed by ``detail(key)``'s lines."""
    for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:4d}  {key}")
        for line in (detail(key) if detail is not None else ()):
            print(line)


def above_ceiling(total: int, ceiling: int | None, message: str) -> bool:
    """Is ``total`` above ``ceiling`` (None: no ceiling)? If so, print ``error: <message>`` to stderr."""
    if ceiling is not None and total > ceiling:
        print(f"error: {message}", file=sys.stderr)
        return True
    return False
