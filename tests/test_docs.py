"""The documentation: the README stays a five-minute read that starts with the two commands, and
the MkDocs site builds with ``--strict`` (a broken link, a missing anchor, a page left out of the
navigation or an API reference that no longer resolves fails it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

TWO_COMMANDS = [
    "```bash",
    "bash .ci/install && .venv/bin/pm-vector demo      # install, then the main job on the embedded PostgreSQL",
    ".venv/bin/python -m pytest -q                     # run the tests (real embedded PostgreSQL + pgvector)",
    "```",
]


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move detail to docs/"
    assert lines[0] == "# pm_vector"
    first_block = [line for line in lines[1:] if line.strip()][:4]
    assert first_block == TWO_COMMANDS
    # CI runs exactly the README's test command
    assert ".venv/bin/python -m pytest -q" in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_links_to_docs_resolve():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert any(t.startswith("docs/") for t in local)
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


def test_mkdocs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # the CLI reference imports pm_vector.cli from this tree (the hook), installed or not
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        "mkdocs build --strict failed (install the docs extra: pip install -e '.[docs]'):\n"
        + proc.stdout[-4000:] + proc.stderr[-8000:])
    site = tmp_path / "site"
    # the generated references are there, with content
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "pm-vector bench privacy" in cli and "pm-vector db start" in cli
    api = (site / "reference" / "api" / "index.html").read_text()
    assert 'id="pm_vector.db.ingest"' in api and 'id="pm_vector.client.Client"' in api
    # the benchmark plots are served from pm_vector/bench/figures/
    for png in (ROOT / "pm_vector" / "bench" / "figures").glob("*.png"):
        assert (site / "figures" / png.name).is_file()
