"""The ``pm-vector`` command line (typer): one sub-application per concern."""

from __future__ import annotations

import typer

from .bench import bench_app
from . import bench_service  # noqa: F401  registers bench outage / bench memory on bench_app
from .db import db_app, embed
from .kahm import kahm_app

app = typer.Typer(help="pm_vector: differentially private nearest-neighbour search in PostgreSQL/pgvector.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
app.add_typer(bench_app, name="bench")
app.add_typer(db_app, name="db")
app.add_typer(kahm_app, name="kahm")
app.command("embed")(embed)

from .service import register as _register_service  # noqa: E402  serve, keys, query, demo, ingest, bench load

_register_service(app)


def main() -> None:
    app()
