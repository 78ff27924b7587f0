"""``pm-vector serve | keys | query | demo | ingest`` and ``pm-vector bench load``: the service's commands.

:func:`register` adds them to the main application (and ``load`` to the ``bench`` group).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import PMVectorError

err = Console(stderr=True)
keys_app = typer.Typer(help="API keys of the HTTP service (stored hashed; the key is shown once).",
                       no_args_is_help=True)


def _fail(msg: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(code)


def _json_value(v):
    """What json cannot write itself: numpy arrays and scalars (a msgpack answer's) as lists and
    numbers, anything else as its str."""
    import numpy as np

    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return str(v)


def _echo_json(obj) -> None:
    typer.echo(json.dumps(obj, default=_json_value))


def _floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, e.g. 0.5,1,4; got {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise typer.BadParameter("epsilons must be positive numbers, e.g. 0.5,1,4")
    return vals


def _progress(disable: bool) -> Progress:
    return Progress(TextColumn("{task.description:<22}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=err, transient=True, disable=disable)


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
    from ..service.runner import serve as _serve
    from ..service.settings import ServiceSettings

    try:
        st = ServiceSettings.from_env(host=host, port=port, max_rows=max_rows, max_dim=max_dim,
                                      max_body_bytes=max_body_bytes, pool_max=pool_max,
                                      rate_per_minute=rate_per_minute,
                                      request_log_retention_days=request_log_retention_days,
                                      auth=False if no_auth else None)
    except PMVectorError as e:
        _fail(str(e))
    if not st.auth:
        err.print("[yellow]warning:[/] API keys are not required (--no-auth / PM_VECTOR_SERVICE_AUTH=0).")
    _serve(st, log_level=log_level)


# ----------------------------------------------------------------------------- keys

@keys_app.command("create")
def keys_create(name: str = typer.Option(..., help="Who or what the key is for."),
                role: str = typer.Option("query", help="query (collections, anchor, resolve, KAHM distances) or "
                                                       "admin (also items, jobs, keys)."),
                collection: Optional[list[str]] = typer.Option(None, "--collection", help="A collection the key may "
                                                               "use (repeat; default: every collection)."),
                rate_per_minute: Optional[int] = typer.Option(None, help="The key's own request limit per minute "
                                                              "(default: the service's)."),
                as_json: bool = typer.Option(False, "--json", help="Print the key record as JSON.")):
    """Create an API key and print it (only this once). Keys are query keys unless --role admin.

    Example: pm-vector keys create --name alice-laptop --collection digits
    """
    from ..service.auth import create_key

    try:
        rec = create_key(name, role=role, collections=collection or None, rate_per_minute=rate_per_minute)
    except PMVectorError as e:
        _fail(str(e))
    if as_json:
        _echo_json(rec)
        return
    scope = ", ".join(rec["collections"]) if rec["collections"] else "every collection"
    err.print(f"created {rec['role']} key {rec['id']} ({rec['name']}; {scope}); store it now, it is not shown again:")
    typer.echo(rec["key"])


@keys_app.command("list")
def keys_list(as_json: bool = typer.Option(False, "--json", help="Print JSON."),
              all_keys: bool = typer.Option(True, "--all/--active", help="Include revoked keys.")):
    """List API keys (id, name, prefix, role, collections, rate, created, revoked) -- never the keys themselves.

    Example: pm-vector keys list --active
    """
    from ..service.auth import list_keys

    try:
        rows = list_keys(include_revoked=all_keys)
    except PMVectorError as e:
        _fail(str(e))
    if as_json:
        _echo_json(rows)
        return
    t = Table(title="API keys")
    for c in ("id", "name", "prefix", "role", "collections", "rate/min", "created", "revoked"):
        t.add_column(c)
    for r in rows:
        t.add_row(str(r["id"]), r["name"], r["prefix"], r["role"], ", ".join(r["collections"] or ["*"]),
                  str(r["rate_per_minute"] or "-"), str(r["created_at"])[:19], str(r["revoked_at"] or "")[:19])
    Console().print(t)


@keys_app.command("revoke")
def keys_revoke(key: str = typer.Argument(..., help="The key's id or prefix (pmv_xxxxxxxx)."),
                as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Revoke an API key; requests with it are refused from now on.

    Example: pm-vector keys revoke 3
    """
    from ..service.auth import revoke_key

    try:
        rec = revoke_key(key)
    except PMVectorError as e:
        _fail(str(e))
    if as_json:
        _echo_json(rec)
    else:
        err.print(f"revoked key {rec['id']} ({rec['name']}, {rec['prefix']}).")


# ----------------------------------------------------------------------------- query

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
    release: str = typer.Option("auto", help="pm_vector protocol: auto (the public rule: the cell release below "
                                             "eps 512 when the collection serves it), cells (one reported public "
                                             "cell per class; pure eps, delta 0) or gaussian (noised class rows)."),
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
    import numpy as np

    from ..client.budget import PrivacyBudget
    from ..client.http import Client, ServiceError

    try:
        X = np.load(features, allow_pickle=False)
    except (OSError, ValueError) as e:
        _fail(f"cannot read {features}: {e}")
    X = np.atleast_2d(X)
    if X.ndim != 2 or not 0 <= row < X.shape[0]:
        _fail(f"{features} has shape {X.shape}; --row must select one of its rows.")
    ledger = PrivacyBudget(budget_file)
    try:
        with Client(url, api_key, budget=ledger) as c:
            if budget is not None:  # the ledger is keyed by the server's origin (--url), not by the collection
                key = c.budget_key()
                acc = ledger.accountant(key)
                ledger.set_budget(key, budget, acc.delta_budget, acc.delta_slack)
            opts = ({"shortlist": shortlist, "release": release, "n_cells": n_cells,
                     "answer": "features" if raw_features else "compact"} if protocol == "pm_vector" else {})
            res = c.query(collection, X[row], label, epsilon=epsilon, delta=delta, k=k, rerank=rerank,
                          protocol=protocol, **opts)
    except ServiceError as e:
        _fail(str(e))
    except PMVectorError as e:
        _fail(str(e))
    except Exception as e:  # noqa: BLE001 - network errors
        import httpx

        if isinstance(e, httpx.HTTPError):
            _fail(f"cannot reach {url}: {e}")
        raise
    if as_json:
        _echo_json(res)
        return
    how = res.get("release") or protocol
    how += f", K={res['n_cells']}" if res.get("n_cells") else ""
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


# ----------------------------------------------------------------------------- demo

def demo(
    dataset: str = typer.Option("digits", help="Built-in dataset: digits or fashion-mnist."),
    epsilons: str = typer.Option("1,4,16", help="Comma-separated epsilons."),
    queries: Optional[int] = typer.Option(None, help="Queries per epsilon (default: 60 digits, 40 fashion-mnist)."),
    seed: int = typer.Option(0, help="Seed of the split and of the frame (public)."),
    keep: bool = typer.Option(False, help="Keep the demo collection in the database."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
    wire: str = typer.Option("msgpack", help="The client's wire format: msgpack or json."),
):
    """End to end on the embedded server: collection, ingest, anchor + dummy pool, embedding job, the real
    service on loopback, private queries through the real client, and a recall/precision/latency table.

    Example: pm-vector demo --dataset digits --epsilons 1,4,16 --json
    """
    from ..service.demo import run_demo

    eps = _floats(epsilons)
    if wire not in ("msgpack", "json"):
        raise typer.BadParameter(f"--wire must be msgpack or json, not {wire!r}.")
    try:
        with _progress(disable=not sys.stderr.isatty()) as bar:
            tasks: dict[str, int] = {}

            def prog(name: str, done: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=total)
                bar.update(tasks[name], completed=done, total=total)

            res = run_demo(dataset, eps, n_queries=queries, seed=seed, keep=keep, progress=prog,
                           log=None if as_json else (lambda s: err.print(s)), wire=wire)
    except PMVectorError as e:
        _fail(str(e))
    if as_json:
        _echo_json(res)
        return
    t = Table(title=f"{res['dataset']}: private k-NN through the service (k=8, delta={res['delta']:g}, "
                    f"{res['sizes']['query']} queries per row)")
    for c in ("method", "epsilon", "nn_recall@8", "precision@8", "recall@8", "distinct lists/class",
              "bytes/request", "query p50 (ms)", "of which HTTP resolve"):
        t.add_column(c, justify="right" if c != "method" else "left")
    npv = res["nonprivate"]
    t.add_row("non-private k-NN", "-", "1.000", f"{npv['precision_at_8']:.3f}", f"{npv['recall_at_8']:.3f}", "-",
              "-", "-", "-")
    for r in res["results"]:
        t.add_row(f"pm_vector ({r.get('release', 'gaussian')})", f"{r['epsilon']:g}", f"{r['nn_recall_at_8']:.3f}", f"{r['precision_at_8']:.3f}",
                  f"{r['recall_at_8']:.3f}", f"{r['distinct_lists_per_class']:.2f}", f"{r['bytes_per_request']:,.0f}",
                  f"{r['query_p50_ms']:.1f}", f"{r['resolve_p50_ms']:.1f}")
    Console(width=max(Console().width, 150)).print(t)
    ex = res.get("same_class_examples")
    if ex:
        for q in ex["queries"]:
            err.print(f"eps={ex['epsilon']:g}, class {ex['label']}, query {q['query']}: answer {q['answer']}; "
                      f"{len(set(q['answer']) & set(q['exact']))} of the exact 8 nearest")
    err.print("nn_recall@8 = share of the exact (non-private) 8 nearest items that come back; precision@8 = share "
              "of the query's class; query p50: building the private request locally + the HTTP round trip + the "
              "client's re-rank.")
    err.print(f"wire {res['wire']}: bytes/request = the resolve's request and answer as sent on the wire; the public "
              f"anchor document {res['anchor_document_bytes']:,} bytes (once per run)")
    err.print(f"embedding job {res['job_seconds']:.1f} s; total {res['seconds']:.1f} s")


# ----------------------------------------------------------------------------- ingest

def _read_table(path: Path, what: str = "features"):
    """A .npy (never unpickled) or .parquet file as a real-valued or integer array; a clear error
    (exit 2, no traceback) for anything else: unreadable, truncated, pickled, complex, strings."""
    import numpy as np

    if not path.is_file():
        _fail(f"{path}: no such file (--{what}).")
    if path.suffix == ".npy":
        with open(path, "rb") as fh:
            magic = fh.read(6)
        if magic != b"\x93NUMPY":  # np.load would take it for a pickle
            _fail(f"{path}: not a .npy file (no numpy header); write it with np.save, or use .parquet.")
        try:
            a = np.load(path, allow_pickle=False)
        except ValueError as e:
            if "allow_pickle" in str(e) or "Object arrays" in str(e):
                _fail(f"{path}: holds Python objects (a pickled array), which pm_vector never loads (unpickling "
                      "runs code). Save a plain numeric array: np.save(path, np.asarray(X, dtype=np.float32)).")
            _fail(f"{path}: not a readable .npy file ({e}); it may be truncated or not made by numpy.save. "
                  "Write it again with np.save.")
        except (EOFError, OSError) as e:
            _fail(f"{path}: not a readable .npy file ({e.__class__.__name__}: {e}); it may be truncated. "
                  "Write it again with np.save.")
        return _real_array(a, path, what)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # noqa: F401
        except ImportError:
            _fail(f"{path} is Parquet, which needs pyarrow; it is not installed. Install it (pip install pyarrow) "
                  "or convert to .npy (numpy.save).")
        try:
            tbl = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
            _fail(f"{path}: not a readable Parquet file ({e.__class__.__name__}: {e}).")
        cols = [np.asarray(c.to_numpy(zero_copy_only=False)) for c in tbl.columns]
        if len(cols) == 1 and cols[0].dtype == object:
            try:
                return _real_array(np.stack([np.asarray(v) for v in cols[0]]), path, what)
            except ValueError as e:
                _fail(f"{path}: its list column has rows of different lengths or non-numbers ({e}).")
        for c in cols:
            _real_array(c, path, what)
        return _real_array(np.column_stack(cols) if len(cols) > 1 else cols[0], path, what)
    _fail(f"{path}: unsupported file type {path.suffix!r}; use .npy (or .parquet with pyarrow).")


def _real_array(a, path: Path, what: str):
    """``a`` if its dtype is real numbers (float, int, bool); else a clear error naming the fix."""
    kind = a.dtype.kind
    if kind in "fiub":
        return a
    if kind == "c":
        _fail(f"{path}: --{what} has complex values (dtype {a.dtype}); pm_vector stores real numbers and will not "
              "drop the imaginary part silently. Save the real values you mean (e.g. np.real(X) or "
              "np.hstack([X.real, X.imag])).")
    if kind in "US":
        _fail(f"{path}: --{what} holds strings (dtype {a.dtype}); give numbers (labels as integers: map class "
              "names to 0..C-1 first).")
    _fail(f"{path}: --{what} has dtype {a.dtype}, not real numbers; save a float or integer array.")


def ingest(
    collection: str = typer.Argument(..., help="Collection name."),
    features: Path = typer.Option(..., help="Features: .npy (rows x dims) or .parquet (needs pyarrow)."),
    labels: Optional[Path] = typer.Option(None, help="Integer labels: .npy or .parquet, one per row; omit it for "
                                          "a collection without labels (each row gets its nearest public partition)."),
    role: str = typer.Option("items", help="items (searched), anchor (public anchor set) or dummy (public pool)."),
    create: bool = typer.Option(False, help="Create the collection first (labels = the distinct labels given)."),
    allow_raw_features: bool = typer.Option(False, help="With --create: clients may fetch raw item features."),
    partitions: Optional[int] = typer.Option(None, min=2, help="With --create and no --labels: a collection without "
                                             "labels with this many public partitions (default 10), fit on its "
                                             "first anchor set."),
    normalize: bool = typer.Option(True, help="Rescale rows to unit norm (the protocol assumes unit rows)."),
    batch_size: int = typer.Option(10_000, min=1, help="Rows per COPY batch (items; all batches are one "
                                   "transaction)."),
    payloads: Optional[Path] = typer.Option(None, help="Items: a JSON-lines file, one JSON value per line for each "
                                            "row (null: none), returned with every candidate of an answer."),
    max_payload_bytes: Optional[int] = typer.Option(None, help="With --create: the bound on each payload, bytes "
                                                    "of compact JSON (default 256)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Load items, an anchor set or a dummy pool into a collection (all-or-nothing).

    Example: pm-vector ingest mycoll --features X.npy --labels y.npy --create && pm-vector ingest mycoll \\
    --features A.npy --labels ya.npy --role anchor

    Without labels: pm-vector ingest mycoll --features A.npy --role anchor --create --partitions 10 &&
    pm-vector ingest mycoll --features X.npy (the anchor first: it fits the partitions)

    With payloads: pm-vector ingest mycoll --features X.npy --labels y.npy --payloads P.jsonl
    """
    import numpy as np

    from .. import db

    if role not in ("items", "anchor", "dummy"):
        _fail("--role must be items, anchor or dummy.")
    X = _read_table(features, "features")
    y = None if labels is None else _read_table(labels, "labels")
    if partitions is not None and (labels is not None or not create):
        _fail("--partitions goes with --create and no --labels (it makes a collection without labels).")
    if payloads is not None and role != "items":
        _fail("--payloads goes with --role items (anchor and dummy rows are public and carry no payload).")
    if max_payload_bytes is not None and not create:
        _fail("--max-payload-bytes goes with --create (an admin changes it later: pm-vector db payload-limit).")
    try:
        X = np.asarray(X, dtype=np.float64)
        y = None if y is None else np.asarray(y).ravel()
        if X.ndim != 2 or (y is not None and X.shape[0] != y.shape[0]):
            _fail(f"features have shape {X.shape} and labels {None if y is None else y.shape}: need (n, d) and "
                  "(n,).")
        if not np.all(np.isfinite(X)):
            _fail(f"features row {int(np.argwhere(~np.isfinite(X))[0][0])} has NaN or infinite values; clean or "
                  "drop those rows. Nothing was written.")
        if normalize:
            n = np.linalg.norm(X, axis=1, keepdims=True)
            if np.any(n == 0):
                _fail(f"row {int(np.flatnonzero(n == 0)[0])} is all zeros and cannot be normalised.")
            X = X / n
        out: dict = {}
        create_kw = None
        if create:
            from .._validation import as_labels

            create_kw = {"labels": None if y is None else np.unique(as_labels(y, y.shape[0], "labels")).tolist(),
                         "allow_raw_features": allow_raw_features, "max_payload_bytes": max_payload_bytes}
            if y is None:
                create_kw["partitions"] = partitions
        pay = None
        if payloads is not None:
            from ..db.store.payloads import read_jsonl

            pay = read_jsonl(payloads)
            if len(pay) != X.shape[0]:
                _fail(f"{payloads}: {len(pay)} line(s) for {X.shape[0]} feature row(s); give one JSON value per row. "
                      "Nothing was written.")
        with _progress(disable=as_json or not sys.stderr.isatty()) as bar:
            task = bar.add_task(f"ingest {role}", total=X.shape[0])
            if role == "items":
                # the collection is created in the ingest's transaction: a failed or killed ingest leaves none
                r = db.ingest(collection, X, y, payloads=pay, progress=lambda d, t: bar.update(task, completed=d),
                              create=create_kw, batch_size=batch_size)
                if create:
                    out["created"] = collection
                out.update({"collection": collection, "role": role, "ingest_id": r["ingest_id"],
                            "n_rows": r["n_rows"]})
            else:
                if create:
                    out["created"] = db.create_collection(collection, X.shape[1], **create_kw)["name"]
                try:
                    r = db.register_anchor_set(collection, X, y, role=role)
                except BaseException:
                    if create:  # do not leave an empty collection that blocks the retry
                        db.drop_collection(collection, missing_ok=True)
                    raise
                out.update({**r, "role": role})
    except PMVectorError as e:
        _fail(str(e))
    if as_json:
        _echo_json(out)
    else:
        err.print(f"{out['n_rows']} {role} row(s) written to {collection}.")


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
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Bounded load test of the service on loopback: throughput, p50/p95, errors and CPU per request
    (service, database, load generator apart) per C.

    Example: pm-vector bench load --classes 10 --concurrency 16 --workers 2 --requests 2000 --duration 20 --json
    """
    from ..service.loadtest import run_load

    try:
        cs = tuple(int(v) for v in classes.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter("--classes: comma-separated integers, e.g. 10,100") from None
    if url is not None and not api_key:
        _fail("--url needs --api-key (or PM_VECTOR_API_KEY).")
    try:
        res = run_load(cs, concurrency=concurrency, requests=requests, duration=duration, n_distinct=distinct,
                       epsilon=epsilon, url=url, api_key=api_key, pool_max=pool_max, workers=workers,
                       log=None if as_json else (lambda s: err.print(s)))
    except (PMVectorError, ValueError) as e:
        _fail(str(e))
    if as_json:
        _echo_json(res)
        return
    t = Table(title=f"load test: {concurrency} concurrent clients, <= {requests} requests / {duration:g} s per C "
                    f"({os.cpu_count()} CPUs)")
    for c in ("C", "rows/request", "requests", "ok", "errors", "req/s", "p50 ms", "p95 ms", "server CPU ms/req",
              "db CPU ms/req", "generator CPU ms/req"):
        t.add_column(c, justify="right")
    cpu = (lambda v: "-" if v is None else f"{v:.2f}")
    for r in res["results"]:
        t.add_row(str(r["classes"]), str(r["rows_per_request"]), str(r["requests"]), str(r["ok"]), str(r["errors"]),
                  f"{r['throughput_rps']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}",
                  cpu(r.get("server_cpu_ms_per_request")), cpu(r.get("db_cpu_ms_per_request")),
                  cpu(r.get("generator_cpu_ms_per_request")))
    Console().print(t)


def register(app: typer.Typer) -> None:
    """Add the service's commands to ``app`` (and ``load`` to its ``bench`` group); idempotent."""
    have = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for name, fn in (("serve", serve), ("query", query), ("demo", demo), ("ingest", ingest)):
        if name not in have:
            app.command(name)(fn)
    if "keys" not in have:
        app.add_typer(keys_app, name="keys")
    from .bench import bench_app

    if not any(c.name == "load" for c in bench_app.registered_commands):
        bench_app.command("load")(load)
