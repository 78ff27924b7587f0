"""The ``pm-vector`` command line (typer): one sub-application per concern, one module each.

Each command module imports what it needs at its top; the app lists them in :data:`COMMANDS` and
imports one only when one of its commands runs (:mod:`pm_vector.cli._lazy`), so ``pm-vector --help``
imports none of them.
"""

from __future__ import annotations

import typer

from ._lazy import lazy_group
from .failures import run

#: the commands of ``pm-vector``, in the order of its ``--help``: name -> (module, attribute)
COMMANDS = {
    "attach": ("pm_vector.cli.items", "attach"),
    "sync": ("pm_vector.cli.items", "sync"),
    "sync-status": ("pm_vector.cli.items", "sync_status"),
    "embed": ("pm_vector.cli.db", "embed"),
    "merge": ("pm_vector.cli.db", "merge"),
    "serve": ("pm_vector.cli.service", "serve"),
    "query": ("pm_vector.cli.service", "query"),
    "demo": ("pm_vector.cli.demo", "demo"),
    "ingest": ("pm_vector.cli.ingest", "ingest"),
    "bench": ("pm_vector.cli.bench", "bench_app"),
    "db": ("pm_vector.cli.db", "db_app"),
    "kahm": ("pm_vector.cli.kahm", "kahm_app"),
    "items": ("pm_vector.cli.items", "items_app"),
    "keys": ("pm_vector.cli.keys", "keys_app"),
}

app = typer.Typer(help="pm_vector: differentially private nearest-neighbour search in PostgreSQL/pgvector.",
                  cls=lazy_group(COMMANDS), no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)


@app.callback()
def _root() -> None:
    """pm_vector: differentially private nearest-neighbour search in PostgreSQL/pgvector."""


def main() -> None:
    """``pm-vector``: every failure prints ``error: ...`` and what to do (cli/failures.py)."""
    run(app)
