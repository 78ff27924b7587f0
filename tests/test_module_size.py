"""No module of pm_vector over 500 lines without a sentence in its docstring saying why."""

from __future__ import annotations

import ast
from pathlib import Path

import pm_vector

LIMIT = 500


def test_long_modules_say_why_in_their_docstring():
    root = Path(pm_vector.__file__).parent
    silent = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        n = text.count("\n")
        if n <= LIMIT:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "500 lines" not in doc:
            silent.append(f"{path.relative_to(root)} ({n} lines)")
    assert not silent, ("modules over 500 lines whose docstring does not say why (split them along their seams, "
                        "or add the sentence): " + ", ".join(silent))
