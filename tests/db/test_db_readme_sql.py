"""README.md's SQL example runs as written: on a collection ``digits`` made as the README's Python
and command-line examples make it (scikit-learn's digits, the demo's split, one embedding job), every
statement of its ``sql`` block runs, and the default release's lookup (``pm_location_shortlist``)
answers a published level with its candidates, ranked (issue #37, build item 6: the example showed
the class-rows ``pm_cell_shortlist`` with an undefined ``reports``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _sql_statements() -> list[str]:
    block = re.search(r"```sql\n(.*?)```", README.read_text(), re.S)
    assert block, "README.md has no sql block"
    text = "\n".join(line.split("--", 1)[0] for line in block.group(1).splitlines())
    return [s.strip() for s in text.split(";") if s.strip()]


def test_readme_sql_shows_the_default_release():
    statements = _sql_statements()
    assert any("pm_location_shortlist(" in s for s in statements)
    assert not any("pm_cell_shortlist" in s for s in statements)


@pytest.fixture
def digits(db):
    from pm_vector.bench.demo import DEMO_SIZES, prepare_collection
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    db.drop_collection("digits", missing_ok=True)
    split = split_dataset(load_dataset("digits"), *DEMO_SIZES["digits"], seed=0)
    prepare_collection("digits", split)
    db.run_embedding_job("digits", {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
    yield split
    db.drop_collection("digits", missing_ok=True)


def test_readme_sql_runs_against_the_collection(db, conn, digits):
    results = [conn.execute(s).fetchall() for s in _sql_statements()]
    lookup = [s for s in _sql_statements() if "pm_location_shortlist(" in s]
    assert len(lookup) == 1
    args = re.search(r"pm_location_shortlist\('digits',\s*(\d+),\s*(\d+),\s*([\d.]+),\s*(\d+)\)", lookup[0])
    assert args, lookup[0]
    level, cell, candidates = int(args.group(1)), int(args.group(2)), int(args.group(4))
    published = conn.execute(
        "SELECT r.class_rows -> 'locations' -> 'levels' FROM pm_vector.embedding_runs r "
        "JOIN pm_vector.collections c ON c.active_run_id = r.id WHERE c.name = 'digits'").fetchone()[0]
    assert level in published and 0 <= cell < level
    rows = results[_sql_statements().index(lookup[0])]
    n_items = len(digits.server[1])
    assert [r[0] for r in rows] == list(range(1, min(candidates, n_items) + 1))  # ranked, as many as asked
    assert len({r[1] for r in rows}) == len(rows) and all(str(r[2]).startswith("digits-") for r in rows)
