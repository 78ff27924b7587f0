"""The places in pm_vector/ that switch on a release, counted by tools/release_switches.py (an AST
walk, issue #37): at most the current ceiling, and the walk finds what it says it finds."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "release_switches.py"

#: the count today (the issue's target was at most 5; 52 before the table): none. A new place fails
#: this test: look the release up in pm_vector/protocol/releases.py (its request type's own properties,
#: e.g. ``release_only``, ``rows``, or a field of the release's row) instead of switching on it.
CEILING = 0


def _module():
    spec = importlib.util.spec_from_file_location("release_switches", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pm_vector_switches_on_a_release_at_most_the_ceiling():
    out = subprocess.run([sys.executable, str(SCRIPT), "--max", str(CEILING)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1].split()[0].isdigit()


def test_the_script_exits_non_zero_above_the_ceiling(tmp_path):
    (tmp_path / "pm_vector").mkdir()
    (tmp_path / "pm_vector" / "m.py").write_text('def f(req):\n    return req.release == "cells"\n')
    out = subprocess.run([sys.executable, str(SCRIPT), "--root", str(tmp_path), "--max", "0"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 1 and "error:" in out.stderr and "pm_vector/m.py" in out.stdout


def test_each_kind_of_switch_is_found_once():
    m = _module()
    src = '''
if req.release == "cells": pass
if fmt in (CELL_FORMAT, "x"): pass
if d.get("format") != "pm_vector.location/1": pass
if isinstance(req, (CellRequest, int)): pass
if type(req) is ClassRowsRequest: pass
match name:
    case "gaussian": pass
    case "other": pass
match req:
    case LocationRequest(): pass
'''
    kinds = [w for _, w in m.switches(ast.parse(src))]
    assert kinds.count("comparison") == 4 and kinds.count("isinstance") == 1 and kinds.count("match case") == 2


def test_what_is_not_a_switch_is_not_counted():
    m = _module()
    src = '''
x = {"cells": 1}[name]
if noise == NOISE: pass
if d.get("format") != PQ_FORMAT: pass
if calibration in ("l1", "other"): pass
rel = releases.by_name("cells")
if isinstance(x, dict): pass
'''
    assert m.switches(ast.parse(src)) == []


def test_the_table_is_not_counted():
    m = _module()
    assert m.is_table(Path("pm_vector/protocol/releases.py"))
    assert m.is_table(Path("pm_vector/client/releases/location.py"))
    assert not m.is_table(Path("pm_vector/client/http.py"))
    found = m.count(ROOT)
    assert not any(m.is_table(Path(f)) for f in found)
