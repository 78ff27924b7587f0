"""``pm-vector bench resolve``: the location release's resolve from a freshly started process, over
reports drawn from the release's law, with and without a delta (:mod:`pm_vector.bench.resolve_bench`)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from .bench import bench_app, fail, run_printing
from ..bench.resolve_bench import ResolveConfig, check_config, run
from ..errors import PMVectorError


@bench_app.command("resolve")
def resolve(
    items: int = typer.Option(100_000, "--items", help="Items of the temporary collection (synthetic, 128 dims)."),
    epsilon: float = typer.Option(16.0, "--epsilon", help="eps of the location requests (16: the finest level)."),
    reports: int = typer.Option(1000, "--reports", help="Requests, one held-out query each, its report drawn from "
                                "the release's law."),
    delta_changes: int = typer.Option(0, "--delta-changes", help="Then that many items changed through "
                                      "update_items (no merge), and the same requests timed again."),
    anchors: int = typer.Option(1000, "--anchors", help="Rows of the public anchor set."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data and the clients."),
    collection: str = typer.Option(None, "--collection", help="Time this existing collection instead of a temporary "
                                   "one (kept and never written: no --delta-changes; queries near its own items)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """Resolve p50/p95/p99 of the location release from a FRESH process (an empty answer cache, as a
    service just started), and the share of answers it had to build (misses).

    Builds a temporary collection and its run, draws --reports requests at --epsilon with the real
    client, then a new process resolves each once; with --delta-changes, again after that many
    changes written to the delta. Drops it all.

    Example: pm-vector bench resolve --items 100000 --epsilon 16 --reports 1000 --delta-changes 10000 --json
    (or, on the collection bench writes --reuse kept: --collection NAME)
    """
    cfg = ResolveConfig(items=items, epsilon=epsilon, reports=reports, delta_changes=delta_changes, anchors=anchors,
                        seed=seed, collection=collection)
    try:
        check_config(cfg)
    except PMVectorError as e:
        fail(str(e))
    result = run_printing(lambda progress: run(cfg, progress), as_json)
    if result is None:
        return
    p = result["plan"]
    t = Table(title=f"resolve from a fresh process: {result['items']:,} items, eps {result['epsilon']:g}, level "
                    f"{p['level']}, {p['candidates']} x {p['code_bytes']} B, {p['distinct_reports']} distinct reports (ms)")
    for c in ("phase", "reports", "p50", "p95", "p99", "max", "misses", "miss p50", "miss p99",
              "built again p50 / p99", "CPU a report: first / again"):
        t.add_column(c, justify="right")
    for name, ph in result["phases"].items():
        a = ph["built_again"]
        t.add_row(name, str(ph["reports"]), f"{ph['p50_ms']:.2f}", f"{ph['p95_ms']:.2f}", f"{ph['p99_ms']:.2f}",
                  f"{ph['max_ms']:.2f}", f"{ph['miss_share']:.1%}", f"{ph.get('miss_p50_ms', 0):.2f}",
                  f"{ph.get('miss_p99_ms', 0):.2f}", f"{a['p50_ms']:.2f} / {a['p99_ms']:.2f}",
                  f"{ph['cpu_ms_per_report']:.2f} / {a['cpu_ms_per_report']:.2f}")
    Console().print(t)
