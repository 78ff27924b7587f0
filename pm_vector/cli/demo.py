"""``pm-vector demo``: end to end on the embedded server, through the real service and client."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import PMVectorError
from ._service_common import echo_json, fail, parse_floats, progress_bar, err


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
    from ..bench.demo import run_demo

    eps = parse_floats(epsilons)
    if wire not in ("msgpack", "json"):
        raise typer.BadParameter(f"--wire must be msgpack or json, not {wire!r}.")
    try:
        with progress_bar(disable=not sys.stderr.isatty()) as bar:
            tasks: dict[str, int] = {}

            def prog(name: str, done: int, total: int) -> None:
                if name not in tasks:
                    tasks[name] = bar.add_task(name, total=total)
                bar.update(tasks[name], completed=done, total=total)

            res = run_demo(dataset, eps, n_queries=queries, seed=seed, keep=keep, progress=prog,
                           log=None if as_json else (lambda s: err.print(s)), wire=wire)
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        echo_json(res)
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
