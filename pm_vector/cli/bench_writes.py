"""``pm-vector bench writes``: a mixed stream of writes while private queries run, side by side
with plain pgvector HNSW (table and JSON; :mod:`pm_vector.bench.writes_bench`); ``bench
writes-recall``: the recall and answer time with the stream's delta, after its merge and after a
full job (:mod:`pm_vector.bench.writes_recall`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .bench import bench_app, fail, run_printing
from ..bench import writes_recall
from ..bench.machine import PARTS
from ..bench.writes_bench import WritesConfig, check_config, run
from ..bench.writes_plot import plot as draw
from ..errors import PMVectorError


def _rates(rate: float, rates: str | None) -> tuple[float, ...]:
    if not rates:
        return (rate,)
    try:
        got = tuple(float(v) for v in rates.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, e.g. 10,30,100; got {rates!r}",
                                 param_hint="--rates") from None
    if not got or any(not (v > 0) or v == float("inf") for v in got):
        raise typer.BadParameter("expected positive changes a second, e.g. 10,30,100", param_hint="--rates")
    return got


def _cell(v, fmt: str = "{}") -> str:
    return "" if v is None else fmt.format(v)


def _table(result: dict) -> Table:
    cfg = result["config"]
    t = Table(title=f"writes: {cfg['items']:,} x {cfg['dim']}, {cfg['seconds']:g} s a rate, path {cfg['path']}, "
                    f"batch {cfg['batch']}, {cfg['queries_concurrency']} query threads")
    for c in ("system", "rate", "changes/s", "delay p50/p99 s", "query p50/p99 ms", "seen/outside/checked",
              "changes", "errors", "cores busy, ms/change", "merge s, delta", "writer merging/behind, pause >="):
        t.add_column(c, justify="left" if c == "system" else "right")
    for row in result["by_rate"]:
        for system, short in (("pm_vector", "pm_vector"), ("pgvector_hnsw", "pgvector")):
            s = row.get(system)
            if s is None:
                continue
            t.add_row(short, f"{s['rate']:g}", f"{s['changes_per_s']:g}",
                      f"{_cell(s['delay_p50_s'], '{:.2f}')}/{_cell(s['delay_p99_s'], '{:.2f}')}",
                      f"{_cell(s['query_p50_ms'])}/{_cell(s['query_p99_ms'])}",
                      f"{s['observed']}/{s.get('not_in_answer', 0)}/{s['checked']}", str(s["n_changes"]),
                      str(s["errors"]), f"{_cell(s.get('cpu_busy_cores'))}, {_cell(s.get('cpu_ms_per_change'))}",
                      "" if system != "pm_vector" else
                      f"{_cell(s.get('merge_s'), '{}') or '-'}, {_cell(s.get('delta_size')) or '-'}",
                      f"{_cell(s.get('writer_while_merging')) or '-'}/{_cell(s.get('writer_behind')) or '-'}, "
                      f"{_cell(s.get('pause_bound')) or '-'}")
    sat = (result.get("pgvector_hnsw") or {}).get("max_commits_per_s")
    if sat is not None:
        t.caption = (f"pgvector HNSW saturated: {sat:g} single-row commits a second, over its "
                     f"{cfg['saturate_s']:g} s saturating phase")
    return t


def _parts_table(result: dict) -> Table | None:
    """The CPU a change of each stream, by part (:class:`pm_vector.bench.machine.CpuParts`), and of it
    in the server's processes; None when no stream has them."""
    rows = [(row, system, s) for row in result["by_rate"] for system in ("pm_vector", "pgvector_hnsw")
            if (s := row.get(system)) is not None and s.get("cpu_ms_per_change_by_part")]
    if not rows:
        return None
    t = Table(title="CPU a change, by part: ms (of it in the server's processes)")
    for c in ("system", "rate") + PARTS:
        t.add_column(c, justify="left" if c == "system" else "right")
    for _row, system, s in rows:
        by, srv = s["cpu_ms_per_change_by_part"], s["cpu_ms_per_change_in_server"] or {}
        t.add_row(system.replace("_hnsw", ""), f"{s['rate']:g}",
                  *(f"{by[p]:.3f}" + (f" ({srv[p]:.3f})" if srv.get(p) else "") for p in PARTS))
    return t


@bench_app.command("writes")
def writes(
    items: int = typer.Option(20_000, "--items", min=200, help="Items of the collection (and of the pgvector table)."),
    dim: int = typer.Option(128, "--dim", min=2, max=2000, help="Dimension of the synthetic vectors."),
    rate: float = typer.Option(10.0, "--rate", help="Changes a second (inserts, updates, deletes: a third each)."),
    rates: str = typer.Option(None, "--rates", help="Several rates, comma-separated (e.g. 10,30,100): a stream "
                              "each, one after the other; replaces --rate."),
    seconds: float = typer.Option(60.0, "--seconds", min=0.1, help="Length of each stream."),
    compare_pgvector: bool = typer.Option(False, "--compare-pgvector", help="The same stream against a plain "
                                          "pgvector HNSW table of the same shape, in the same run."),
    queries_concurrency: int = typer.Option(2, "--queries-concurrency", min=0, help="Threads sending private "
                                            "queries during each stream."),
    batch: int = typer.Option(1, "--batch", min=1, help="pm_vector's changes a transaction (pgvector: always 1)."),
    path: str = typer.Option("attached", "--path", help="How pm_vector is written: attached (a table you change "
                             "by SQL, the service's sync worker applying it) or api (ingest / update_items / "
                             "delete_items)."),
    epsilon: float = typer.Option(16.0, "--epsilon", help="eps of the private queries and of the checks' plan."),
    anchors: int = typer.Option(1000, "--anchors", min=20, help="Rows of the public anchor set."),
    drain: float = typer.Option(300.0, "--drain", help="Seconds to keep checking after a stream's writer stopped."),
    saturate: float = typer.Option(10.0, "--saturate", min=0, help="Seconds of pgvector's saturating phase "
                                   "(its most single-row commits a second); 0: none."),
    match_pgvector: bool = typer.Option(False, "--match-pgvector", help="pgvector's saturating phase first, then "
                                        "one stream of both systems at the single-row commits a second it measured "
                                        "(replaces --rate; needs --compare-pgvector)."),
    merge: bool = typer.Option(True, "--merge/--no-merge", help="Time the merge of each stream's delta after it "
                               "(--no-merge: none, merge_s empty; the sync worker still merges when it is due)."),
    database_url: str = typer.Option(None, "--database-url", help="A PostgreSQL with pgvector to run on (default: "
                                     "PM_VECTOR_DATABASE_URL, else the embedded server)."),
    plot: Path = typer.Option(None, "--plot", help="Write delay p99 against the rate to this PNG (give --rates)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data and of the stream."),
    reuse: bool = typer.Option(False, "--reuse", help="Keep the prepared collection (and pgvector's table) for the "
                               "next run with the same --items, --dim, --anchors and --seed, and reuse one kept "
                               "by the run before (attached path; the set-up of 100,000 items is paid once)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """A mixed stream of inserts, updates and deletes at --rate while private queries run; the
    commit-to-answer delay of every change, and the same for plain pgvector HNSW.

    Set up on the database: --items clustered vectors of --dim, pm_vector's collection (queried by
    the location release), written through --path; a change's delay is from its commit until a
    resolve of its own cell's location request holds it (a delete: no longer holds it); for
    pgvector until ORDER BY v <-> q LIMIT 8 by its vector does (an even sample of at most 200
    changes a stream is checked; a new item placed but ranked outside its cell's answer counts as
    not_in_answer, apart from the delays). Reports per system changes/s sustained, delay p50/p99,
    query p50/p99, pgvector's saturated single-row commits a second (docs/benchmarks.md, "Writes").

    Example: pm-vector bench writes --items 20000 --dim 128 --rate 10 --seconds 60 --compare-pgvector --json
    """
    if plot is not None and plot.suffix.lower() != ".png":
        raise typer.BadParameter(f"the plot is written as PNG; give a .png file name (got {str(plot)!r}).",
                                 param_hint="--plot")
    cfg = WritesConfig(items=items, dim=dim, rates=_rates(rate, rates), seconds=seconds,
                       compare_pgvector=compare_pgvector, queries_concurrency=queries_concurrency, batch=batch,
                       path=path, epsilon=epsilon, anchors=anchors, drain_s=drain, saturate_s=saturate, seed=seed,
                       reuse=reuse, merge=merge, match_pgvector=match_pgvector)
    try:
        check_config(cfg)
    except PMVectorError as e:
        fail(str(e))
    if database_url:
        os.environ["PM_VECTOR_DATABASE_URL"] = database_url
    result = run_printing(lambda progress: run(cfg, progress), False)
    if plot is not None:
        draw(result, plot)
    if as_json:
        typer.echo(json.dumps(result))
        return
    con = Console()
    if not con.is_terminal and con.width < 120:  # piped: the table whole, not cut to 80 columns
        con = Console(width=120)
    con.print(_table(result))
    parts = _parts_table(result)
    if parts is not None:
        con.print(parts)
    bad = [s for r in result["by_rate"] for s in (r.get("pm_vector"), r.get("pgvector_hnsw")) if s]
    if any(s["errors"] or s["unobserved"] for s in bad):
        Console(stderr=True).print("some changes were not seen or some calls failed: see --json (error_samples).")


def _recall_table(result: dict) -> Table:
    cfg, cmp = result["config"], result["compare"]
    d = result["delta_size"]
    t = Table(title=f"writes-recall: {cfg['items']:,} x {cfg['dim']}, {result['stream']['changes']:,} changes "
                    f"(delta: {d['new_items']:,} new items, {d['tombstones']:,} tombstones), {cfg['queries']} queries, "
                    f"{cfg['max_bytes']:,} B plan")
    for c in ("eps", "state", "nn_recall@8 (se)", "- full (se)", "answer B", "answer p50/p99 ms", "level, S, b"):
        t.add_column(c, justify="right")
    for eps in cfg["epsilons"]:
        e = f"eps_{eps:g}"
        for st in writes_recall.STATES:
            s = result["states"][st][e]
            diff = cmp[e].get(f"{st}_minus_full")
            t.add_row(f"{eps:g}", st, f"{s['nn_recall_at_8']:.4f} ({s['se']:.4f})",
                      "" if diff is None else f"{diff['diff']:+.4f} ({diff['se']:.4f})",
                      f"{s['answer_bytes_mean']:,.0f}", f"{_cell(s['answer_p50_ms'])}/{_cell(s['answer_p99_ms'])}",
                      f"{s['level']}, {s['candidates']}, {s['code_bytes']}")
    t.caption = (f"merge {result['merge_s']} s, full job {result['full_job_s']} s; answer p50 delta / merged, "
                 "delta / full: " + ", ".join(f"eps {eps:g} {cmp[f'eps_{eps:g}']['ratio_p50_vs_merged']}, "
                                             f"{cmp[f'eps_{eps:g}']['ratio_p50_vs_full']}" for eps in cfg["epsilons"]))
    return t


@bench_app.command("writes-recall")
def writes_recall_command(
    items: int = typer.Option(20_000, "--items", min=200, help="Items of the collection."),
    dim: int = typer.Option(128, "--dim", min=2, max=2000, help="Dimension of the synthetic vectors."),
    changes: int = typer.Option(10_000, "--changes", min=1, help="Changes of the mixed stream (inserts, updates, "
                                "deletes: a third each) applied through the write path, no merge."),
    epsilons: str = typer.Option("4,16", "--epsilons", help="Comma-separated eps of the location release."),
    queries: int = typer.Option(1000, "--queries", min=2, help="Query vectors (the recall's standard error is "
                                "over them)."),
    latency_reports: int = typer.Option(200, "--latency-reports", min=1, help="Reports resolved (each answer "
                                        "built) for the answer time of each state."),
    max_bytes: int = typer.Option(50_000, "--max-bytes", help="The plan's byte budget (the default 50 kB)."),
    batch: int = typer.Option(100, "--batch", min=1, help="Changes a transaction, each applied by a sync."),
    anchors: int = typer.Option(1000, "--anchors", min=20, help="Rows of the public anchor set."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data and of the stream."),
    reuse: bool = typer.Option(False, "--reuse", help="Use (and keep) the collection bench writes --reuse prepares "
                               "for the same --items, --dim, --anchors and --seed."),
    database_url: str = typer.Option(None, "--database-url", help="A PostgreSQL with pgvector to run on (default: "
                                     "PM_VECTOR_DATABASE_URL, else the embedded server)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """nn_recall@8 of the location release with --changes in the delta, after the merge and after a
    full job on the same final data; the answer time with that delta and with an empty one.

    Set up as bench writes (an attached table), apply the mixed stream through the write path
    (each --batch a transaction and a sync), then measure three states on the same final data:
    the delta, the merge, a full embedding job. The recall is the exact expectation over the
    release's law of every report's answer (resolved by the server, re-ranked by the codes as the
    client does), over --queries queries, with its standard error and the paired differences to
    the full job (docs/benchmarks.md, "Writes").

    Example: pm-vector bench writes-recall --items 100000 --dim 128 --changes 10000 --epsilons 4,16 --reuse --json
    """
    try:
        eps = tuple(float(v) for v in epsilons.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, e.g. 4,16; got {epsilons!r}",
                                 param_hint="--epsilons") from None
    cfg = writes_recall.RecallConfig(items=items, dim=dim, changes=changes, epsilons=eps, queries=queries,
                                     latency_reports=latency_reports, max_bytes=max_bytes, batch=batch,
                                     anchors=anchors, seed=seed, reuse=reuse)
    try:
        writes_recall.check_config(cfg)
    except PMVectorError as e:
        fail(str(e))
    if database_url:
        os.environ["PM_VECTOR_DATABASE_URL"] = database_url
    result = run_printing(lambda progress: writes_recall.run(cfg, progress), False)
    if as_json:
        typer.echo(json.dumps(result))
        return
    con = Console()
    if not con.is_terminal and con.width < 120:
        con = Console(width=120)
    con.print(_recall_table(result))
