"""The ``pm-vector`` command line (typer): one sub-application per concern."""

from __future__ import annotations

import typer

from .bench import bench_app
# each registers its commands on bench_app, in this order (the order of `pm-vector bench --help`)
from . import bench_kahm  # noqa: F401  bench kahm
from . import bench_cluster  # noqa: F401  bench cluster
from . import bench_accounting  # noqa: F401  bench accounting
from . import bench_service  # noqa: F401  bench outage / bench memory
from . import bench_writes  # noqa: F401  bench writes
from .db import db_app, embed, merge
from .items import attach, items_app, sync, sync_status
from .kahm import kahm_app

app = typer.Typer(help="pm_vector: differentially private nearest-neighbour search in PostgreSQL/pgvector.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(bench_app, name="bench")
app.add_typer(db_app, name="db")
app.add_typer(kahm_app, name="kahm")
app.add_typer(items_app, name="items")
app.command("attach")(attach)
app.command("sync")(sync)
app.command("sync-status")(sync_status)
app.command("embed")(embed)
app.command("merge")(merge)

from .service import register as _register_service  # noqa: E402  serve, keys, query, demo, ingest, bench load

_register_service(app)


def main() -> None:
    """``pm-vector``: every failure prints ``error: ...`` and what to do (cli/failures.py)."""
    from .failures import run

    run(app)
