"""``pm-vector bench merge``: a single-row writer's commits a second alone and beside a bulk merge,
at normal and at the background priority (table and JSON)."""

from __future__ import annotations

import os

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
                                  help="The writer's seconds alone, and beside each control, before the merges "
                                       "(half of it between them)."),
    scratch_dir: str | None = typer.Option(None, "--scratch-dir", help="Where the disk controls write their files "
                                    "(default the system's temporary directory): a directory on the server's disk."),
    load_mb: int = typer.Option(200, "--load-mb", min=1, max=4096, help="MB in each file the disk controls write."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """A plain writer's commits a second alone, beside a busy process per core at SCHED_IDLE (the
    control: no merge), beside files written and forced to the disk or written back by the kernel
    (the disk's controls: no merge), then beside a merge at normal priority, one whose process alone
    is at SCHED_IDLE, and one at the service's background priority (its process and, where it may,
    its server backends at SCHED_IDLE). Each phase also gives its COMMITs' milliseconds.

    Example: pm-vector bench merge docs --json
    """
    if scratch_dir is not None and not os.path.isdir(scratch_dir):
        fail(f"--scratch-dir {scratch_dir!r} is not a directory: give one on the server's disk, or leave it out.")
    try:
        result = run_printing(lambda say: run(collection, dim=dim, alone_s=alone_s, scratch_dir=scratch_dir,
                                              load_mb=load_mb, progress=say), as_json)
    except RuntimeError as e:
        fail(str(e))
    except OSError as e:
        fail(f"the disk controls could not write their files ({e}): give a --scratch-dir this user may write to.")
    if result is None:
        return
    t = Table(title=f"a single-row writer beside a merge of {collection!r} (commits a second)")
    for c in ("phase", "median", "p10", "min", "COMMIT ms mean / p99", "merge s", "backends idle", "WAL MB",
              "whole pages"):
        t.add_column(c, justify="right")

    def writer(w: dict) -> list[str]:
        c = w.get("commit_ms") or {}
        return [*(f"{w.get(k, float('nan')):.0f}" for k in ("median", "p10", "min")),
                f"{c['mean']:.3f} / {c['p99']:.2f}" if c else ""]

    t.add_row("alone", *writer(result["alone"]), "", "", "", "")
    t.add_row("idle_load (no merge)", *writer(result["idle_load"]["writer"]), "", "", "", "")
    if "background_load" in result:
        b = result["background_load"]
        t.add_row(f"background_load (CPUs {','.join(map(str, b['cpus']))}, no merge)", *writer(b["writer"]),
                  "", "", "", "")
    for mode in ("flush", "writeback"):
        d = result[f"{mode}_load"]
        t.add_row(f"{mode}_load ({d['mb']} MB files, no merge)", *writer(d["writer"]), "", "", "", "")
    for ph in ("normal", "process_idle", "background"):
        r = result[ph]
        t.add_row(ph, *writer(r["writer"]), f"{r['merge_s']:.1f}", str(r.get("sessions_idle")), f"{r['wal_mb']:.0f}",
                  str(r["wal_fpi"]))
    Console().print(t)
    Console().print(f"background median over process_idle's: {result['ratio_median']}")
