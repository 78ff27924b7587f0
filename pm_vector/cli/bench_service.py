"""``pm-vector bench outage``, ``bench memory`` and ``bench hostile``: the HTTP service under a
database outage and under large requests, and the client under a malicious server's answers
(table and JSON)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from .bench import run_printing, bench_app, fail
from ..bench.hostile import HostileConfig
from ..bench.memory import MemoryConfig
from ..bench.outage import OutageConfig
from ..bench import hostile as hostile_bench, memory as memory_bench, outage as outage_bench


@bench_app.command("outage")
def outage(
    seconds: float = typer.Option(30.0, "--seconds", min=0.1, max=3600, help="Seconds the database stays dead."),
    interval: float = typer.Option(0.05, help="Pause between the client's requests (s)."),
    settle: float = typer.Option(5.0, help="Seconds the client keeps sending after the first 200."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """The service while its database is SIGKILLed for --seconds and started again.

    In a private PM_VECTOR_HOME: an embedded server, a digits collection, the real service on
    loopback and a client sending resolves (every 5th request GET /health) throughout. Reports the
    503 latency during the outage (median, max), any other status, and the seconds from "the
    database accepts connections" to the first 200.

    Example: pm-vector bench outage --seconds 600 --json
    """
    try:
        cfg = OutageConfig(seconds=seconds, interval=interval, settle=settle)
    except ValueError as e:
        fail(str(e))
    result = run_printing(lambda progress: outage_bench.run(cfg, progress), as_json)
    if result is None:
        return
    t = Table(title=f"outage: database SIGKILLed for {result['outage_s']:g} s (restart took {result['restart_s']:g} s)")
    t.add_column("figure")
    t.add_column("value", justify="right")
    b = result["before_200"]
    t.add_row("resolve 200 before the outage: median / max (ms)", f"{b['median_ms']} / {b['max_ms']}")
    for kind in ("resolve", "health"):
        o = result["outage_503"][kind]
        t.add_row(f"{kind} 503 during the outage: n, median / p90 / max (ms)",
                  f"{o['n']}, {o['median_ms']} / {o.get('p90_ms')} / {o['max_ms']}")
    t.add_row("other statuses during the outage", ", ".join(result["outage_other_statuses"]) or "none")
    t.add_row("database accepts connections -> first resolve 200 (s)", str(result["first_200_after_accept_s"]))
    a = result["after_first_200"]
    t.add_row("requests after the first 200 / not 200", f"{a['requests']} / {a['non_200']}")
    Console().print(t)
    typer.echo(json.dumps(result))


@bench_app.command("memory")
def memory(
    rounds: int = typer.Option(100, help="Rounds of parallel calls."),
    parallel: int = typer.Option(6, help="Simultaneous /kahm/distances calls per round."),
    mb: float = typer.Option(13.0, help="Approximate size of each request body (MB)."),
    dim: int = typer.Option(256, help="Feature dimension of the synthetic collection."),
    items: int = typer.Option(2000, help="Items of the collection (its KAHM model's training rows)."),
    idle_s: float = typer.Option(5.0, help="Seconds to wait after the last round before the last RSS reading."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """The service's resident memory (RSS) after each round of large /kahm/distances calls.

    In a private PM_VECTOR_HOME: a synthetic collection with a KAHM model, `pm-vector serve` in a
    separate process, and --rounds rounds of --parallel calls of about --mb MB each.

    Example: pm-vector bench memory --rounds 100 --parallel 6 --mb 13 --json
    """
    try:
        cfg = MemoryConfig(rounds=rounds, parallel=parallel, mb=mb, dim=dim, items=items, idle_s=idle_s)
    except ValueError as e:
        fail(str(e))
    result = run_printing(lambda progress: memory_bench.run(cfg, progress), as_json)
    if result is None:
        return
    t = Table(title=f"memory: {rounds} rounds x {parallel} parallel /kahm/distances calls of {result['body_mb']} MB "
                    f"({result['rows']} rows x {dim}), {result['seconds']} s; statuses {result['statuses']}")
    t.add_column("round", justify="right")
    t.add_column("RSS (MB)", justify="right")
    s = result["rss_mb"]
    t.add_row("start", f"{result['rss_start_mb']:.0f}")
    for i in sorted({0, 1, 2, 4, 9, 19, 49, 99, len(s) - 1} & set(range(len(s)))):
        t.add_row(str(i + 1), f"{s[i]:.0f}")
    t.add_row(f"{idle_s:g} s idle", f"{result['rss_after_idle_mb']:.0f}")
    t.add_row("max", f"{result['rss_max_mb']:.0f}")
    Console().print(t)
    typer.echo(json.dumps(result))


@bench_app.command("hostile")
def hostile(
    queries: int = typer.Option(60, help="Queries sent (each its own release)."),
    candidates: int = typer.Option(300_000, help="Candidates the malicious server puts in the tampered row."),
    row: int = typer.Option(3, help="The tampered row when it is not the real one (a cell of the cell release)."),
    epsilon: float = typer.Option(40.0, help="The release's eps (large: the real row is the nearest cell)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """Does a malicious server's oversized row time the client by its secret row?

    In a private PM_VECTOR_HOME: a digits collection, the real service on loopback, and a client
    whose transport puts --candidates candidates in one row of every cell answer: the real row
    for every other query, row --row for the rest. The queries' wall times by group, and the
    ratio of the medians.

    Example: pm-vector bench hostile --queries 60 --candidates 300000 --json
    """
    try:
        cfg = HostileConfig(queries=queries, candidates=candidates, row=row, epsilon=epsilon)
    except ValueError as e:
        fail(str(e))
    result = run_printing(lambda progress: hostile_bench.run(cfg, progress), as_json)
    if result is None:
        return
    t = Table(title=f"hostile: {candidates:,} candidates in one row of {result['tampered_answers']} answers, "
                    f"eps {epsilon:g}")
    t.add_column("the tampered row is", justify="left")
    for c in ("queries", "median (s)", "q1 (s)", "q3 (s)", "max (s)"):
        t.add_column(c, justify="right")
    for name, g in (("the real row", result["real_row"]), ("another row", result["other_rows"])):
        t.add_row(name, str(g["n"]), *(str(g.get(k, "")) for k in ("median_s", "q1_s", "q3_s", "max_s")))
    Console().print(t)
    err = Console(stderr=True)
    err.print(f"median ratio (real / other): {result['median_ratio']} (before the whole-answer check: 4.64 s / "
              "0.84 s = 5.5)")
    for text, n in result["outcomes"].items():
        err.print(f"{n} x {text[:160]}")
    typer.echo(json.dumps(result))
