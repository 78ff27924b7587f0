"""A wheel (non-editable install) carries the migrations and SQL, and pm_vector finds them there."""

import glob
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _data_files() -> dict[str, list[str]]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return cfg["tool"]["setuptools"]["data-files"]


def test_data_files_cover_every_migration_and_sql_file():
    shipped = {Path(f) for pats in _data_files().values() for p in pats for f in glob.glob(str(ROOT / p))}
    needed = {Path(p) for p in glob.glob(str(ROOT / "migrations" / "versions" / "*.py"))}
    needed |= {Path(p) for p in glob.glob(str(ROOT / "sql" / "*.sql"))}
    needed |= {ROOT / "migrations" / "env.py", ROOT / "migrations" / "script.py.mako"}
    assert needed and needed <= shipped, sorted(str(p) for p in needed - shipped)


def test_installed_copies_are_found_without_the_source_tree(tmp_path, monkeypatch):
    from pm_vector.db.postgres import migrate

    head = migrate.head_revision()  # from the source tree
    prefix = tmp_path / "prefix"
    for dest, pats in _data_files().items():
        d = prefix / dest
        d.mkdir(parents=True, exist_ok=True)
        for p in pats:
            for f in glob.glob(str(ROOT / p)):
                shutil.copy(f, d)
    monkeypatch.setattr(migrate, "_REPO_ROOT", tmp_path / "no_source_tree")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.delenv("PM_VECTOR_MIGRATIONS_DIR", raising=False)
    monkeypatch.delenv("PM_VECTOR_SQL_DIR", raising=False)
    assert migrate.migrations_dir() == prefix / "share" / "pm_vector" / "migrations"
    assert migrate.sql_dir() == prefix / "share" / "pm_vector" / "sql"
    assert migrate.head_revision() == head
