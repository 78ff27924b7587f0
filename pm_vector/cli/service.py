"""``pm-vector serve | query`` and ``pm-vector bench load``: the service's commands; :func:`register`
adds them to the main application with ``keys`` (:mod:`pm_vector.cli.keys`), ``demo``
(:mod:`pm_vector.cli.demo`) and ``ingest`` (:mod:`pm_vector.cli.ingest`), and ``load`` to the
``bench`` group.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import httpx
import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from ..errors import PMVectorError, ServiceError
from ._service_common import echo_json, fail, err
from .demo import demo
from .ingest import ingest
from .keys import keys_app
from ..bench.loadtest import run_load
from ..client.budget import PrivacyBudget
from ..client.http import Client
from ..protocol import releases
from ..service.runner import serve as _serve
from ..service.settings import ServiceSettings


# ----------------------------------------------------------------------------- serve

def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0 in a container)."),
    port: int = typer.Option(8000, help="TCP port."),
    max_rows: Optional[int] = typer.Option(None, help="Most rows (query + anchor) of one request's embedding."),
    max_dim: Optional[int] = typer.Option(None, help="Most columns of one request's embedding."),
    max_body_bytes: Optional[int] = typer.Option(None, help="Largest request body in bytes."),
    pool_max: Optional[int] = typer.Option(None, help="Database connections in the pool."),
    rate_per_minute: Optional[int] = typer.Option(None, help="Requests per key per minute (0: no limit; a key "
                                                  "may carry its own)."),
    request_log_retention_days: Optional[int] = typer.Option(None, help="Prune request-log rows older than this "
                                                             "(and those of dropped collections); 0 keeps them."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Accept requests without an API key (local tests only)."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
):
    """Run the HTTP service (FastAPI + uvicorn). OpenAPI schema at /openapi.json, docs at /docs.

    Example: pm-vector keys create --name alice && pm-vector serve --port 8000 --request-log-retention-days 7
    """
    try:
        st = ServiceSettings.from_env(host=host, port=port, max_rows=max_rows, max_dim=max_dim,
                                      max_body_bytes=max_body_bytes, pool_max=pool_max,
                                      rate_per_minute=rate_per_minute,
                                      request_log_retention_days=request_log_retention_days,
                                      auth=False if no_auth else None)
    except PMVectorError as e:
        fail(str(e))
    if not st.auth:
        err.print("[yellow]warning:[/] API keys are not required (--no-auth / PM_VECTOR_SERVICE_AUTH=0).")
    _serve(st, log_level=log_level)


# ----------------------------------------------------------------------------- query

def _print_answer(res: dict, collection: str, k: int, epsilon: float, delta: float, protocol: str, url: str) -> None:
    """A query's answer as a table (rank, item, its external id, label and payload, distance), then
    what was spent and sent."""
    how = releases.describe(res) if res.get("release") else protocol  # e.g. "cells K=64"
    if res.get("bytes_per_request"):
        how += f", {res['bytes_per_request']:,} B"
    t = Table(title=f"{collection}: {k} nearest ({how}; eps={epsilon:g}, delta={res.get('delta', delta):g})")
    cols = [c for c in ("external_ids", "labels", "payloads") if res.get(c) is not None]
    for c in ("rank", "item_id", *[c[:-1] for c in cols], "distance"):
        t.add_column(c, justify="right")
    dist = res.get("distances") or [None] * len(res["item_ids"])
    for i, iid in enumerate(res["item_ids"]):
        t.add_row(str(i + 1), str(iid), *[str(res[c][i]) for c in cols], "-" if dist[i] is None else f"{dist[i]:.4f}")
    Console().print(t)
    b = res.get("budget") or {}
    err.print(f"spent so far on {b.get('name') or url}: eps={b.get('epsilon_spent', 0):.4g} of "
              f"{b.get('epsilon_budget')}; {res['timing']['total_ms']:.0f} ms; "
              f"{res['bytes_sent']:,} bytes sent, {res['bytes_received']:,} received; re-ranked by "
              f"{res.get('reranked') or 'nothing'}")


def query(
    collection: str = typer.Argument(..., help="Collection name."),
    features: Path = typer.Option(..., help="Query features: .npy with one row (or several: pick with --row)."),
    label: Optional[int] = typer.Option(None, help="The query's class label (hidden among one row per class); "
                                                    "without it a classifier fit on the public anchor picks it."),
    epsilon: float = typer.Option(..., help="epsilon of this query's release."),
    delta: float = typer.Option(1e-5, help="delta of this query's release."),
    row: int = typer.Option(0, help="Row of --features to query."),
    k: int = typer.Option(8, help="Neighbours to return."),
    url: str = typer.Option("http://127.0.0.1:8000", envvar="PM_VECTOR_URL", help="Service URL."),
    api_key: str = typer.Option(None, envvar="PM_VECTOR_API_KEY", help="API key (or PM_VECTOR_API_KEY)."),
    budget: Optional[float] = typer.Option(None, help="Set this server's total epsilon budget (all its "
                                                      "collections) first (default 10: $PM_VECTOR_EPSILON_BUDGET)."),
    budget_file: Optional[Path] = typer.Option(None, help="Ledger file (default $PM_VECTOR_HOME/client/budget.json)."),
    shortlist: Optional[int] = typer.Option(None, help="k': candidates the server returns per class row (default: "
                                                       "the public rule of the compact answer; 128 with --features)."),
    protocol: str = typer.Option("pm_vector", help="pm_vector (default) or privatemail_paper (the paper's "
                                                   "calibration, for reproducing it)."),
    release: str = typer.Option("auto", help="pm_vector protocol: auto (the public rule: the location release below "
                                             "eps 512 when the collection serves it), location (one reported public "
                                             "cell of the whole collection; pure eps, delta 0), cells (one reported "
                                             "cell per class) or gaussian (noised class rows)."),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", help="What this query may cost on the wire, both "
                                            "ways, in bytes (the location release's answer size; default 50000)."),
    n_cells: Optional[int] = typer.Option(None, help="The cell release's level K (one of the published levels; "
                                                      "default: the public rule for eps)."),
    rerank: bool = typer.Option(True, help="Re-rank your row's candidates locally (by their product codes, or by "
                                           "their raw features with --features)."),
    raw_features: bool = typer.Option(False, "--raw-features", help="Ask for the candidates' raw features instead of "
                                                                "the compact answer (ids and product codes); only "
                                                                "where the collection allows raw features."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """One private k-NN query against a running service; spends epsilon from your budget ledger.

    Example: pm-vector query digits --features q.npy --label 3 --epsilon 1 --budget 10 --url http://127.0.0.1:8000
    """
    try:
        X = np.load(features, allow_pickle=False)
    except (OSError, ValueError) as e:
        fail(f"cannot read {features}: {e}")
    X = np.atleast_2d(X)
    if X.ndim != 2 or not 0 <= row < X.shape[0]:
        fail(f"{features} has shape {X.shape}; --row must select one of its rows.")
    ledger = PrivacyBudget(budget_file)
    try:
        with Client(url, api_key, budget=ledger) as c:
            if budget is not None:  # the ledger is keyed by the server's origin (--url), not by the collection
                key = c.budget_key()
                acc = ledger.accountant(key)
                ledger.set_budget(key, budget, acc.delta_budget, acc.delta_slack)
            opts = ({"shortlist": shortlist, "release": release, "n_cells": n_cells, "max_bytes": max_bytes,
                     "answer": "features" if raw_features else "compact"} if protocol == "pm_vector" else {})
            res = c.query(collection, X[row], label, epsilon=epsilon, delta=delta, k=k, rerank=rerank,
                          protocol=protocol, **opts)
    except ServiceError as e:  # every non-2xx answer and every malformed one (pm_vector.errors)
        fail(f"the service at {url} answered what cannot be used: {e}")
    except PMVectorError as e:
        fail(str(e))
    except Exception as e:  # noqa: BLE001 - network errors, and never a traceback

        if isinstance(e, httpx.TimeoutException):
            fail(f"{url} did not answer within the timeout ({e or type(e).__name__}); nothing of an answer was "
                  "used. Try again, or check the service.")
        if isinstance(e, httpx.HTTPError):
            notes = " ".join(getattr(e, "__notes__", ()))
            fail(f"cannot reach {url}: {e or type(e).__name__}. {notes}".strip())
        fail(f"the query failed ({type(e).__name__}: {e}); please report this with the command you ran.")
    if as_json:
        echo_json(res)
        return
    _print_answer(res, collection, k, epsilon, delta, protocol, url)


# ----------------------------------------------------------------------------- bench load

def load(
    classes: str = typer.Option("10,100", help="Comma-separated class counts C (10 = digits, others synthetic)."),
    concurrency: int = typer.Option(32, help="Concurrent clients."),
    requests: int = typer.Option(400, help="Stop after this many requests per C ..."),
    duration: float = typer.Option(30.0, help="... or after this many seconds per C, whichever comes first."),
    distinct: int = typer.Option(16, help="Distinct pre-built PrivateMail requests (replayed)."),
    epsilon: float = typer.Option(1.0, help="epsilon of the pre-built requests."),
    pool_max: int = typer.Option(8, help="The service's database pool size."),
    workers: int = typer.Option(1, help="Service processes to start (clients spread over them round robin)."),
    url: Optional[str] = typer.Option(None, help="A running loopback service (default: start one)."),
    api_key: Optional[str] = typer.Option(None, envvar="PM_VECTOR_API_KEY", help="Its API key."),
    changes_rate: float = typer.Option(0.0, help="Changes a second to an attached table during the load (inserts, "
                                                 "updates, deletes; 0: none); reports the service's sync lag."),
    attached_items: int = typer.Option(20_000, help="Rows of that attached table."),
    attached_dim: int = typer.Option(128, help="Dimension of its vector column."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Bounded load test of the service on loopback: throughput, p50/p95, errors and CPU per request
    (service, database, load generator apart) per C; with --changes-rate, the sync lag of an attached
    table changed meanwhile (lag_s of sync_status, sampled, and each change's commit to its sync).

    Example: pm-vector bench load --classes 10 --concurrency 16 --workers 2 --requests 2000 --duration 20 --json
    """
    try:
        cs = tuple(int(v) for v in classes.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter("--classes: comma-separated integers, e.g. 10,100") from None
    if url is not None and not api_key:
        fail("--url needs --api-key (or PM_VECTOR_API_KEY).")
    try:
        res = run_load(cs, concurrency=concurrency, requests=requests, duration=duration, n_distinct=distinct,
                       epsilon=epsilon, url=url, api_key=api_key, pool_max=pool_max, workers=workers,
                       changes_rate=changes_rate, attached_items=attached_items, attached_dim=attached_dim,
                       log=None if as_json else (lambda s: err.print(s)))
    except (PMVectorError, ValueError) as e:
        fail(str(e))
    if as_json:
        echo_json(res)
        return
    t = Table(title=f"load test: {concurrency} concurrent clients, <= {requests} requests / {duration:g} s per C "
                    f"({os.cpu_count()} CPUs)")
    for c in ("C", "release", "answer KiB", "requests", "ok", "errors", "req/s", "p50 ms", "p95 ms", "server CPU ms/req",
              "db CPU ms/req", "generator CPU ms/req"):
        t.add_column(c, justify="right")
    cpu = (lambda v: "-" if v is None else f"{v:.2f}")
    for r in res["results"]:
        t.add_row(str(r["classes"]), str(r["release"]), f"{r['answer_kib']:.1f}", str(r["requests"]), str(r["ok"]),
                  str(r["errors"]),
                  f"{r['throughput_rps']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}",
                  cpu(r.get("server_cpu_ms_per_request")), cpu(r.get("db_cpu_ms_per_request")),
                  cpu(r.get("generator_cpu_ms_per_request")))
    Console().print(t)
    if changes_rate:
        _print_sync_lag(res)


def _print_sync_lag(res: dict) -> None:
    """The attached table's figures of ``bench load --changes-rate``: one row per C."""
    t = Table(title="the sync during the load: an attached table receiving changes (lag_s sampled from sync_status)")
    for c in ("C", "req/s", "errors", "changes", "lag_s p50", "lag_s p99", "lag_s max", "commit to sync p50 s",
              "p99 s", "sync errors"):
        t.add_column(c, justify="right")
    for r in res["results"]:
        s = r["sync"]
        t.add_row(str(r["classes"]), f"{r['throughput_rps']:.1f}", str(r["errors"]), str(s["changes"]),
                  *(str(s["lag_s"][q]) for q in ("p50", "p99", "max")), str(s["delay_s"]["p50"]),
                  str(s["delay_s"]["p99"]), str(s["errors"]))
    Console().print(t)


def register(app: typer.Typer) -> None:
    """Add the service's commands to ``app`` (``pm_vector.cli.app`` has them already, imported when they
    run: ``pm_vector.cli.COMMANDS``); idempotent."""
    have = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for name, fn in (("serve", serve), ("query", query), ("demo", demo), ("ingest", ingest)):
        if name not in have:
            app.command(name)(fn)
    if "keys" not in have:
        app.add_typer(keys_app, name="keys")
