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
from ..db import postgres
from ..db.postgres import cluster, connect, server
from ..db.runs.jobs import anchor_frame_embed_fn, anchor_frame_extend_fn, run_embedding_job
from ..db.runs.merge import merge as _merge, merge_rule as _merge_rule
from ..db.runs.new_items import embed_new_items
from ..db.store.maintenance import cleanup_all, prune_request_log
from ..db.store.payloads import set_max_payload_bytes
from ..manifold import AnchorFrame
from ..service.settings import ServiceSettings

db_app = typer.Typer(help="The PostgreSQL + pgvector database: the embedded server (default) or PM_VECTOR_DATABASE_URL.",
                     no_args_is_help=True)
err = Console(stderr=True)
out = Console()


def fail(msg: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False)
    raise typer.Exit(code)


def emit(data: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(data, default=str))
        return
    t = Table(title=title, show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in data.items():
        t.add_row(str(k), json.dumps(v, default=str) if isinstance(v, (dict, list)) else ("-" if v is None else str(v)))
    out.print(t)


def cli_call(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except PMVectorError as e:
        fail(str(e))


JSON_OPT = typer.Option(False, "--json", help="Print one JSON object instead of a table.")


@db_app.command("start")
def start(as_json: bool = JSON_OPT,
          shards: int = typer.Option(0, "--shards", min=0, help="Start a local cluster: a coordinator and this many "
                                     "shards (embedded servers on loopback ports)."),
          replicas: int = typer.Option(0, "--replicas", min=0, help="With --shards: streaming replicas of the "
                                       "coordinator (resolves are read there).")):
    """Start the embedded PostgreSQL + pgvector server (or reuse the running one) and migrate it.

    With --shards N, a local cluster instead (PM_VECTOR_HOME/cluster): a coordinator, N shards and
    --replicas R replicas; pm_vector then talks to the coordinator. With PM_VECTOR_DATABASE_URL
    set, starts nothing: checks the connection and pgvector.

    Examples: pm-vector db start --json; pm-vector db start --shards 2 --replicas 1
    """
    if shards or replicas:
        if server.external_url():
            fail(f"{server.ENV_URL} is set: a local cluster is for the embedded mode. Register real shards on your "
                 "coordinator with `pm-vector db shard-add NAME URL`.")
        if not shards:
            fail("--replicas needs --shards (a single node has no coordinator to replicate).")
        _emit_cluster(cli_call(cluster.start, shards=shards, replicas=replicas), as_json)
        return
    if cluster.topology() is not None:
        _emit_cluster(cli_call(cluster.start, **_cluster_size(cluster.topology())), as_json)
        return
    # a server recovering from a crash is waited for; say so on stderr
    emit(cli_call(server.start, progress=lambda m: err.print(m, markup=False, highlight=False, soft_wrap=True)),
         as_json, "pm_vector database")


def _cluster_size(topo: dict[str, Any]) -> dict[str, int]:
    return {"shards": sum(n["role"] == "shard" for n in topo["nodes"]),
            "replicas": sum(n["role"] == "replica" for n in topo["nodes"])}


def _emit_cluster(st: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(st, default=str))
        return
    t = Table(title=f"pm_vector local cluster ({st.get('dir', '-')})")
    for col in ("node", "role", "url", "running", "replay lag (bytes)"):
        t.add_column(col, overflow="fold")
    for n in st["nodes"]:
        t.add_row(n["name"], n["role"], n["url"], str(n["running"]), "-" if n["lag_bytes"] is None else str(n["lag_bytes"]))
    out.print(t)


@db_app.command("shard-add")
def shard_add(name: str = typer.Argument(..., help="The shard's name (lower-case letters, digits, _)."),
              url: str = typer.Argument(..., help="postgresql://user[:password]@host:port/db of the shard "
                                        "(pgvector installed there)."),
              query_url: str = typer.Option(None, "--query-url", help="postgresql://pm_vector_query:password@"
                                            "host:port/db: the shard's login for query keys (made on the shard "
                                            "with USAGE on its schema pm_vector: docker/cluster/20-pm-vector-shard.sql); "
                                            "without it query keys cannot reach this shard and the service resolves "
                                            "them as its own role."),
              as_json: bool = JSON_OPT):
    """Register a shard on the coordinator (the database pm_vector talks to): a postgres_fdw server
    owned by pm_vector's owner role, and with --query-url the query role's mappings to the shard's
    query login (docs/operations.md, "Query keys on a cluster").

    Example: pm-vector db shard-add s1 postgresql://pm_vector_owner:PW@10.0.0.12:5432/pm_vector
    --query-url postgresql://pm_vector_query:PW2@10.0.0.12:5432/pm_vector
    """
    with connect(autocommit=True) as conn:
        cli_call(cluster.register_shard, conn, name, url, query_url)
        rows = conn.execute("SELECT name, host, port, dbname FROM pm_vector.shards ORDER BY name").fetchall()
    emit({"shards": [dict(zip(("name", "host", "port", "dbname"), r)) for r in rows]}, as_json, "shards")


@db_app.command("stop")
def stop(as_json: bool = JSON_OPT):
    """Stop the embedded server (fast shutdown), or every node of the local cluster. Does nothing
    for an external database.

    Example: pm-vector db stop
    """
    if not server.external_url() and cluster.topology() is not None:
        emit(cli_call(postgres.stop_cluster), as_json, "pm_vector local cluster")
        return
    emit(cli_call(postgres.stop), as_json, "pm_vector database")


@db_app.command("status")
def status(as_json: bool = JSON_OPT):
    """Where the database is and its state: mode, URL (password hidden), running, versions, schema.

    Never starts anything; exits 0 whether or not the server runs (see "running").

    Example: pm-vector db status --json
    """
    if not server.external_url() and cluster.topology() is not None:
        _emit_cluster(cli_call(cluster.status), as_json)
        return
    emit(cli_call(server.status), as_json, "pm_vector database")


@db_app.command("url")
def url(as_json: bool = JSON_OPT,
        hide_password: bool = typer.Option(False, "--hide-password", help="Replace the password by ***.")):
    """Print the libpq URL of the database (starting the embedded server if needed).

    Example: psql "$(pm-vector db url)" -c 'SELECT * FROM pm_vector.pm_collections'
    """
    u = cli_call(server.database_url)
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
    emit(cli_call(postgres.upgrade), as_json, "pm_vector schema upgrade")


def _retention_days(older_than: Optional[float]) -> Optional[float]:
    """--older-than, else the service's request-log retention (PM_VECTOR_SERVICE_REQUEST_LOG_RETENTION_DAYS,
    default 30); None when that is 0 (keep forever: only rows of dropped collections go)."""
    if older_than is not None:
        return older_than
    days = cli_call(ServiceSettings.from_env).request_log_retention_days
    return float(days) if days > 0 else None


@db_app.command("cleanup")
def cleanup_cmd(as_json: bool = JSON_OPT,
                requests: bool = typer.Option(True, "--requests/--no-requests",
                                              help="Also prune the request log to its retention setting.")):
    """Undo what dead processes left: stale 'running' runs (marked failed, tables dropped), ingests
    of killed processes, tables of failed or deleted runs; and prune the request log to the
    service's retention (PM_VECTOR_SERVICE_REQUEST_LOG_RETENTION_DAYS, default 30) and of dropped
    collections. Never touches what an active run serves.

    Example: pm-vector db cleanup --json
    """
    days = _retention_days(None) if requests else None
    res = cli_call(cleanup_all, prune_requests=requests, retention_days=days)
    res["retention_days"] = days
    if requests and res.get("requests_pruned") is None:
        err.print("note: the request log was not pruned (this installation has no retention module).")
    emit(res, as_json, "pm_vector cleanup")


@db_app.command("prune-requests")
def prune_requests(as_json: bool = JSON_OPT,
                   older_than: Optional[float] = typer.Option(
                       None, "--older-than", min=0.0,
                       help="Delete rows older than this many days (default: the service's retention, "
                            "PM_VECTOR_SERVICE_REQUEST_LOG_RETENTION_DAYS, 30 if unset).")):
    """Delete request-log rows older than the retention (or --older-than DAYS), and rows of
    dropped collections.

    Example: pm-vector db prune-requests --older-than 30
    """
    days = _retention_days(older_than)
    n = cli_call(prune_request_log, days)
    if n is None:
        fail("this installation has no request-log retention (pm_vector.db.store.retention); nothing was deleted.", 1)
    emit({"deleted": n, "older_than_days": days}, as_json, "request log pruned")


@db_app.command("payload-limit")
def payload_limit(collection: str = typer.Argument(..., help="Collection name."),
                  max_payload_bytes: int = typer.Argument(..., help="The new bound on each item's payload, bytes "
                                                          "of compact JSON (0..65536)."),
                  as_json: bool = JSON_OPT):
    """Change a collection's payload bound (admin). Lowering it below a payload already stored is
    refused; new ingests are checked against it (each answer carries every candidate's payload).

    Example: pm-vector db payload-limit mycoll 512
    """
    emit(cli_call(set_max_payload_bytes, collection, max_payload_bytes), as_json, "payload bound")


@db_app.command("merge-rule")
def merge_rule(collection: str = typer.Argument(..., help="Collection name."),
               delta_items: Optional[int] = typer.Option(None, "--delta-items", help="Merge after this many delta "
                                                         "items (tombstones and new items; 0: never by this rule)."),
               age_s: Optional[float] = typer.Option(None, "--age-s", help="Merge when the oldest delta item is this "
                                                     "many seconds old (0: never by this rule)."),
               pause: Optional[float] = typer.Option(None, "--pause", help="Not before the active run has served "
                                                     "this many times as long as its build took (0: no pause)."),
               reset: bool = typer.Option(False, "--reset", help="Clear the collection's own values first (the "
                                          "defaults apply again)."),
               as_json: bool = JSON_OPT):
    """Show, or change, when the service merges a collection's delta (admin). Without options it
    prints the rule in force, the collection's own values, the defaults and when the active run's
    pause ends. A longer pause keeps more of a fast stream's writes; the delta grows meanwhile and
    a deleted item's derived rows wait longer (docs/operations.md, "The merge").

    Example: pm-vector db merge-rule mycoll --pause 10
    """
    emit(cli_call(_merge_rule, collection, delta_items=delta_items, age_s=age_s, pause=pause, reset=reset),
         as_json, f"{collection}: merge rule")


# ----------------------------------------------------------------------------- embed

def frame_defaults() -> dict[str, Any]:
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


class JobProgressBar:
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
    given = {"n_components": n_components, "sigma": _sigma(sigma), "label_sigma": label_sigma, "alpha": alpha,
             "n_iter": n_iter, "n_extend_iter": n_extend_iter, "n_neighbors": n_neighbors}
    given = {k: v for k, v in given.items() if v is not None}
    if new_items:
        if given or seed is not None:
            fail("--new-items extends the active run with its own parameters and seed; the frame options "
                 f"({', '.join('--' + k.replace('_', '-') for k in given) or '--seed'}) apply to a full run only.")
        with JobProgressBar(progress and sys.stderr.isatty()) as bar:
            res = cli_call(embed_new_items, collection, anchor_frame_extend_fn, progress=bar)
        emit(res, as_json, f"{collection}: new items embedded")
        return
    params = {**frame_defaults(), **given}
    with JobProgressBar(progress and sys.stderr.isatty()) as bar:
        info = cli_call(run_embedding_job, collection, params, 0 if seed is None else seed, bar,
                     embed_fn=anchor_frame_embed_fn)
    if as_json:
        typer.echo(json.dumps(info, default=str))
        return
    keep = ("run_id", "collection", "status", "is_active", "n_items", "n_anchors", "embedding_dim", "anchor_set_id",
            "seed", "params", "timings", "duration", "previous_run_id", "items_missing")
    emit({k: info.get(k) for k in keep}, False, f"{collection}: embedding run {info.get('run_id')}")


def merge(collection: str = typer.Argument(..., help="The collection whose delta to merge."),
          as_json: bool = JSON_OPT,
          progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr.")):
    """Merge a collection's delta now (deletes, updates and new items written since its run was built).

    Builds a new run of the active run's parameters on the current items beside the serving one and
    switches to it atomically (answers never wait); the deleted items' rows leave every derived
    table, and superseded runs that hold them are dropped. The service's sync worker merges by
    itself when a merge is due (pm_vector.defaults.MERGE_DELTA_ITEMS / MERGE_AGE_S).

    Example: pm-vector merge products --json
    """
    with JobProgressBar(progress and sys.stderr.isatty()) as bar:
        res = cli_call(_merge, collection, progress=bar)
    emit(res, as_json, f"{collection}: delta merged into run {res.get('run_id')}")
