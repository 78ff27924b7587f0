"""``pm-vector db start|stop|status|url|upgrade`` and ``pm-vector embed COLLECTION``.

Results go to stdout (a table, or one JSON object with --json); progress and errors to stderr.
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import PMVectorError

db_app = typer.Typer(help="The PostgreSQL + pgvector database: the embedded server (default) or PM_VECTOR_DATABASE_URL.",
                     no_args_is_help=True)
err = Console(stderr=True)
out = Console()


def fail(msg: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def _emit(data: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(data, default=str))
        return
    t = Table(title=title, show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in data.items():
        t.add_row(str(k), json.dumps(v, default=str) if isinstance(v, (dict, list)) else ("-" if v is None else str(v)))
    out.print(t)


def _call(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except PMVectorError as e:
        fail(str(e))


JSON_OPT = typer.Option(False, "--json", help="Print one JSON object instead of a table.")


@db_app.command("start")
def start(as_json: bool = JSON_OPT):
    """Start the embedded PostgreSQL + pgvector server (or reuse the running one) and migrate it.

    With PM_VECTOR_DATABASE_URL set, starts nothing: checks the connection and pgvector.

    Example: pm-vector db start --json
    """
    from ..db import server

    _emit(_call(server.start), as_json, "pm_vector database")


@db_app.command("stop")
def stop(as_json: bool = JSON_OPT):
    """Stop the embedded server (fast shutdown). Does nothing for an external database.

    Example: pm-vector db stop
    """
    from ..db import server

    _emit(_call(server.stop), as_json, "pm_vector database")


@db_app.command("status")
def status(as_json: bool = JSON_OPT):
    """Where the database is and its state: mode, URL (password hidden), running, versions, schema.

    Never starts anything; exits 0 whether or not the server runs (see "running").

    Example: pm-vector db status --json
    """
    from ..db import server

    _emit(_call(server.status), as_json, "pm_vector database")


@db_app.command("url")
def url(as_json: bool = JSON_OPT,
        hide_password: bool = typer.Option(False, "--hide-password", help="Replace the password by ***.")):
    """Print the libpq URL of the database (starting the embedded server if needed).

    Example: psql "$(pm-vector db url)" -c 'SELECT * FROM pm_vector.pm_collections'
    """
    from ..db import server

    u = _call(server.database_url)
    if hide_password:
        u = server.redact(u)
    if as_json:
        typer.echo(json.dumps({"url": u, "mode": server.mode()}))
    else:
        typer.echo(u)


@db_app.command("upgrade")
def upgrade(as_json: bool = JSON_OPT):
    """Apply pending schema migrations (alembic upgrade head). Needed once for an external database.

    Example: PM_VECTOR_DATABASE_URL=postgresql://me@db.example.org/pm pm-vector db upgrade
    """
    from ..db import server

    _emit(_call(server.upgrade), as_json, "pm_vector schema upgrade")


# ----------------------------------------------------------------------------- embed

def _frame_defaults() -> dict[str, Any]:
    from ..manifold import AnchorFrame

    sig = inspect.signature(AnchorFrame.__init__)
    return {n: p.default for n, p in sig.parameters.items()
            if n not in ("self", "seed", "device") and p.default is not inspect.Parameter.empty
            and isinstance(p.default, (int, float, str, bool))}


def _sigma(v: Optional[str]):
    if v is None or v == "auto":
        return v
    try:
        s = float(v)
    except ValueError:
        raise typer.BadParameter(f"--sigma must be 'auto' or a positive number, got {v!r}") from None
    return s


class _Bar:
    """rich progress on stderr, one task per job stage."""

    STAGES = ("load", "embed", "write", "index", "switch")

    def __init__(self, enabled: bool):
        self.p = Progress(TextColumn("{task.description:>7}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                          console=err, transient=False, disable=not enabled)
        self.tasks: dict[str, Any] = {}

    def __enter__(self):
        self.p.__enter__()
        return self

    def __exit__(self, *exc):
        return self.p.__exit__(*exc)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.p.add_task(stage, total=max(int(total), 1))
        self.p.update(self.tasks[stage], completed=int(done), total=max(int(total), 1))


def embed(
    collection: str = typer.Argument(..., help="The collection to embed."),
    new_items: bool = typer.Option(False, "--new-items",
                                   help="Only embed items ingested after the active run, into that run "
                                        "(out-of-sample extension with the run's own frame)."),
    n_components: Optional[int] = typer.Option(None, help="Embedding dimension (AnchorFrame n_components; default: AnchorFrame's)."),
    sigma: Optional[str] = typer.Option(None, help="Feature-kernel bandwidth: 'auto' (median nearest-anchor distance, "
                                                   "from public data) or a number."),
    label_sigma: Optional[float] = typer.Option(None, help="Label-kernel bandwidth."),
    alpha: Optional[float] = typer.Option(None, help="Weight of the label graph (relative)."),
    n_iter: Optional[int] = typer.Option(None, help="SMLQ iterations of the anchor fit."),
    n_extend_iter: Optional[int] = typer.Option(None, help="Iterations of the out-of-sample extension."),
    n_neighbors: Optional[int] = typer.Option(None, help="Anchors each item sees in the extension."),
    seed: Optional[int] = typer.Option(None, help="Public seed of the frame (stored with the run; default 0)."),
    as_json: bool = JSON_OPT,
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr."),
):
    """Embed a collection's items (the server's SMLQ job), or only its new items.

    Fits the AnchorFrame on the collection's anchor set from the public seed, embeds every item
    (out-of-sample extension), writes and indexes (HNSW) the run, and switches the collection
    to it atomically. A failed or killed job leaves the previous run serving.

    Example: pm-vector embed products --n-components 16 --seed 0 --json

    Example: pm-vector embed products --new-items
    """
    from ..db.jobs import anchor_frame_embed_fn, anchor_frame_extend_fn, embed_new_items, run_embedding_job

    given = {"n_components": n_components, "sigma": _sigma(sigma), "label_sigma": label_sigma, "alpha": alpha,
             "n_iter": n_iter, "n_extend_iter": n_extend_iter, "n_neighbors": n_neighbors}
    given = {k: v for k, v in given.items() if v is not None}
    if new_items:
        if given or seed is not None:
            fail("--new-items extends the active run with its own parameters and seed; the frame options "
                 f"({', '.join('--' + k.replace('_', '-') for k in given) or '--seed'}) apply to a full run only.")
        with _Bar(progress and sys.stderr.isatty()) as bar:
            res = _call(embed_new_items, collection, anchor_frame_extend_fn, progress=bar)
        _emit(res, as_json, f"{collection}: new items embedded")
        return
    params = {**_frame_defaults(), **given}
    with _Bar(progress and sys.stderr.isatty()) as bar:
        info = _call(run_embedding_job, collection, params, 0 if seed is None else seed, bar,
                     embed_fn=anchor_frame_embed_fn)
    if as_json:
        typer.echo(json.dumps(info, default=str))
        return
    keep = ("run_id", "collection", "status", "is_active", "n_items", "n_anchors", "embedding_dim", "anchor_set_id",
            "seed", "params", "timings", "duration", "previous_run_id", "items_missing")
    _emit({k: info.get(k) for k in keep}, False, f"{collection}: embedding run {info.get('run_id')}")
