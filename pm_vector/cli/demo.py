"""``pm-vector demo``: end to end on the embedded server, through the real service and client."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..errors import PMVectorError
from ._service_common import echo_json, fail, parse_floats, progress_bar, err
from ..bench.demo import run_demo, summary

#: the table fits this many columns (a terminal narrower than it wraps the headers)
TABLE_WIDTH = 100


def demo(
    dataset: str = typer.Option("digits", help="Built-in dataset: digits (1,000 server items, 64 dims) or "
                                "fashion-mnist (10,000 items, 784 dims: an embedding job of minutes)."),
    epsilons: str = typer.Option("1,4,16", help="Comma-separated epsilons."),
    queries: Optional[int] = typer.Option(None, help="Queries per epsilon (default: 40 fashion-mnist, 60 digits)."),
    max_bytes: Optional[int] = typer.Option(None, "--max-bytes", min=1,
                                            help="Byte budget of one request on the wire (default: 8,000 on "
                                                 "digits, the client's 50,000 on fashion-mnist)."),
    seed: int = typer.Option(0, help="Seed of the split and of the frame (public)."),
    keep: bool = typer.Option(False, help="Keep the demo collection in the database."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
    wire: str = typer.Option("msgpack", help="The client's wire format: msgpack or json."),
):
    """End to end on the embedded server: collection, ingest, anchor + dummy pool, embedding job, the real
    service on loopback, private queries through the real client, and per epsilon: the release, the
    ledger, bytes per request, the share of the collection the answer holds, nn_recall@8 beside the
    label-only ablation, and downloading everything as the reference.

    Example: pm-vector demo --dataset fashion-mnist --epsilons 1,4,16 --queries 20 --json
    """
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
                           log=None if as_json else (lambda s: err.print(s)), wire=wire, max_bytes=max_bytes)
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        echo_json(res)
        return
    _print_table(res)


def _print_table(res: dict) -> None:
    """The demo's table (stdout) and what it shows (stderr)."""
    n = res["sizes"]["server"]
    budget = "50,000" if res.get("max_bytes") is None else f"{res['max_bytes']:,}"  # None: the client's
    t = Table(title=f"{res['dataset']}, {n:,} items: private 8-NN through the service, {budget} B per request, "
                    f"{res['sizes']['query']} queries a row", title_justify="left")
    for c, just in (("eps", "right"), ("release", "left"), ("ledger eps\nrow / all", "right"),
                    ("bytes /\nrequest", "right"), ("answer\nholds", "right"), ("nn_recall\n@8", "right"),
                    ("label\nonly", "right"), ("p50\nms", "right")):
        # numbers never wrap nor shorten: in 80 columns the release and the headers wrap instead
        t.add_column(c, justify=just, no_wrap=c not in ("release", "answer\nholds"),
                     min_width=max(len(w) for w in c.split("\n")))
    for r in res["results"]:
        held = "-" if r.get("share_held") is None else f"{r['candidates']:,} {r['share_held']:.0%}"
        lo = r.get("label_only_nn_recall_at_8")
        t.add_row(f"{r['epsilon']:g}", r["release"], f"{r['epsilon_spent']:g} / {r['ledger_epsilon_spent']:g}",
                  _bytes(r["bytes_per_request"]), held, f"{r['nn_recall_at_8']:.3f}",
                  "-" if lo is None else f"{lo:.3f}", f"{r['query_p50_ms']:.0f}")
    dl = res["download_all"]
    t.add_row("-", "download all", "0", _bytes(dl["bytes"]), f"{dl['n_items']:,} 100%", "1.000", "-", "-")
    Console(width=TABLE_WIDTH).print(t)
    err.print("nn_recall@8: share of the exact (non-private) 8 nearest items that come back; release: the "
              "location release, M its public cells; the answer holds its candidates (ids and code "
              "prefixes), a share of the N items; label only: the same number of the query's class's hubs, re-ranked by the same "
              "codes (the label sent instead of the private report); ledger: eps this row's queries spent "
              "/ all the ledger holds; bytes: request and answer on the wire "
              f"({res['wire']}); p50: the query's wall time.", width=TABLE_WIDTH)
    err.print(summary(res), width=TABLE_WIDTH)
    err.print(f"embedding job {res['job_seconds']:.1f} s; total {res['seconds']:.1f} s", width=TABLE_WIDTH)


def _bytes(n: float) -> str:
    """Bytes as a user reads them: exact below a million, in MB above."""
    return f"{n:,.0f}" if n < 1e6 else f"{n / 1e6:,.1f} MB"
