"""``pm-vector bench merge``: a single-row writer's commits a second alone and beside a bulk merge,
at normal and at the background priority (table and JSON)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from .bench import run_printing, bench_app, fail
from ..bench.merge_bench import run


@bench_app.command("merge")
def merge(
    collection: str = typer.Argument(..., help="A collection with an active run: it is merged three times (three new runs)."),
    dim: int = typer.Option(128, min=1, max=16000, help="Floats in each row the writer commits."),
    alone_s: float = typer.Option(10.0, "--alone-seconds", min=2.0, max=600.0,
                                  help="The writer's seconds alone before the merges (half of it between them)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """A plain writer's commits a second alone, beside a busy process per core at SCHED_IDLE (the
    control: no merge), then beside a merge at normal priority, one whose
    process alone is at SCHED_IDLE, and one at the service's background priority (its process and,
    where it may, its server backends at SCHED_IDLE).

    Example: pm-vector bench merge docs --json
    """
    try:
        result = run_printing(lambda say: run(collection, dim=dim, alone_s=alone_s, progress=say), as_json)
    except RuntimeError as e:
        fail(str(e))
    if result is None:
        return
    t = Table(title=f"a single-row writer beside a merge of {collection!r} (commits a second)")
    for c in ("phase", "median", "p10", "min", "merge s", "backends idle", "WAL MB", "whole pages"):
        t.add_column(c, justify="right")
    t.add_row("alone", *(f"{result['alone'].get(k, float('nan')):.0f}" for k in ("median", "p10", "min")), "", "", "", "")
    t.add_row("idle_load (no merge)", *(f"{result['idle_load']['writer'].get(k, float('nan')):.0f}"
                                        for k in ("median", "p10", "min")), "", "", "", "")
    if "background_load" in result:
        b = result["background_load"]
        t.add_row(f"background_load (CPUs {','.join(map(str, b['cpus']))}, no merge)",
                  *(f"{b['writer'].get(k, float('nan')):.0f}" for k in ("median", "p10", "min")), "", "", "", "")
    for ph in ("normal", "process_idle", "background"):
        r = result[ph]
        t.add_row(ph, *(f"{r['writer'].get(k, float('nan')):.0f}" for k in ("median", "p10", "min")),
                  f"{r['merge_s']:.1f}", str(r.get("sessions_idle")), f"{r['wal_mb']:.0f}", str(r["wal_fpi"]))
    Console().print(t)
    Console().print(f"background median over process_idle's: {result['ratio_median']}")
