"""Imports inside functions in pm_vector/, counted by tools/local_imports.py (an AST walk, issue #37):
at most the ceiling, each of a HEAVY package or marked ``# lazy: <reason>``; and what the light entry
points (the client, ``pm-vector --help``) import."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "local_imports.py"

#: the count today (798 before, 752 of them neither heavy nor marked): the imports of heavy
#: third-party packages where they are used, and a few ``# lazy:`` marks (start-up costs measured).
#: A new local import of anything else fails: put it at the top of its module.
CEILING = 47


def _module():
    spec = importlib.util.spec_from_file_location("local_imports", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def _run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_pm_vector_local_imports_at_most_the_ceiling_and_each_with_its_reason():
    out = _run("--max", str(CEILING))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    assert "unmarked" not in out.stdout


def test_an_unmarked_local_import_fails(tmp_path):
    (tmp_path / "pm_vector").mkdir()
    (tmp_path / "pm_vector" / "m.py").write_text("def f():\n    from .errors import InvalidInputError\n"
                                                 "    return InvalidInputError\n")
    out = _run("--root", str(tmp_path))
    assert out.returncode == 1 and "error:" in out.stderr and "pm_vector/m.py:2" in out.stdout


def test_above_the_ceiling_fails(tmp_path):
    (tmp_path / "pm_vector").mkdir()
    (tmp_path / "pm_vector" / "m.py").write_text("def f():\n    import torch\n\ndef g():\n    import faiss\n")
    assert _run("--root", str(tmp_path), "--max", "2").returncode == 0
    out = _run("--root", str(tmp_path), "--max", "1")
    assert out.returncode == 1 and "above the ceiling 1" in out.stderr


def test_what_counts_and_why():
    m = _module()
    src = '''
import json
from . import top


def f():
    import torch.nn
    from sklearn.cluster import KMeans
    from .. import thing  # lazy: a cycle through pm_vector.x, documented there
    from .other import (a,  # lazy: start-up (~2 s)
                        b)
    import json


class C:
    import os  # a class body at module level runs at import: not local

    def m(self):
        try:
            import psycopg
        except ImportError:
            pass
        g = lambda: None
        def inner():
            from . import y  # lazy:
        return inner
'''
    found = m.local_imports(src, "pm_vector/x.py")
    assert [(f.line, f.reason.split(":")[0]) for f in found] == [
        (7, "heavy"), (8, "heavy"), (9, "lazy"), (10, "lazy"), (12, "unmarked"), (20, "unmarked"), (25, "unmarked")]
    assert found[2].reason == "lazy: a cycle through pm_vector.x, documented there"
    assert found[3].reason == "lazy: start-up (~2 s)"  # a mark on any line of the statement


def _loaded(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_the_client_imports_neither_the_database_nor_the_service():
    mods = _loaded("import pm_vector.client, pm_vector.client.http")
    assert not {m for m in mods if m.startswith(("pm_vector.db", "pm_vector.service", "pm_vector.kahm"))}
    assert not {"sqlalchemy", "alembic", "psycopg", "fastapi", "sklearn", "faiss"} & mods


def test_the_command_line_help_imports_no_command_module():
    mods = _loaded("from pm_vector.cli import app")
    assert {m for m in mods if m.startswith("pm_vector.")} <= {
        "pm_vector.cli", "pm_vector.cli._lazy", "pm_vector.cli.failures", "pm_vector.errors"}
    assert not {"numpy", "torch", "psycopg", "sqlalchemy", "fastapi", "httpx"} & mods
