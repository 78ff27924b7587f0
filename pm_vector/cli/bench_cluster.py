"""``pm-vector bench cluster``: one node against a local cluster (shards + replica), side by side
(table and JSON)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from ._service_common import parse_floats
from .bench import parse_ints, run_with_spinner, bench_app, err
from ..bench.cluster import PARTS, ClusterBenchConfig, run


@bench_app.command("cluster")
def cluster_bench(
    items: int = typer.Option(200_000, help="Server items of each temporary collection."),
    anchors: int = typer.Option(1000, help="Public anchor rows."),
    rows: str = typer.Option("10,100", help="Request sizes C (= classes), comma-separated (the location part: "
                                            "the first C's collection)."),
    dim: int = typer.Option(64, help="Feature dimension of the synthetic data."),
    shards: int = typer.Option(2, help="Shards of the local cluster."),
    replicas: int = typer.Option(1, help="Streaming replicas of the coordinator."),
    repeats: int = typer.Option(30, help="Timed requests per C, eps and configuration (after 3 warm-up requests)."),
    epsilon: float = typer.Option(4.0, help="epsilon of the class-rows requests."),
    shortlist: int = typer.Option(128, help="k' candidates per row (class-rows requests)."),
    release: str = typer.Option("both", help="What is timed: location (the default release), class_rows, or both."),
    changes: int = typer.Option(200, help="Writes (inserts, updates, deletes) between the location part's two "
                                          "measurements, the same on both deployments; 0: none."),
    feature_updates: bool = typer.Option(True, "--feature-updates/--no-feature-updates",
                                         help="The changes include feature and label updates (20%); off: payload "
                                              "updates instead."),
    location_eps: str = typer.Option("1,4,16", help="eps of the location requests, comma-separated."),
    max_bytes: int = typer.Option(50_000, help="Byte budget of a location request (its plan)."),
    seed: int = typer.Option(0, help="Seed of the data, the split and the clients (reproducible)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """One node against a local cluster (shards + replica), side by side in one run.

    Starts a private local cluster, loads the same synthetic collection into a single-node database
    and into the cluster, and reports ingest rows/s and embedding job seconds; for the location
    release (the default) resolve p50/p95 on one node, the coordinator and the replica, before and
    after a stream of writes, and whether all give the same answers with no deleted item; for
    class-rows requests resolve p50/p95 per C, the replica's statement time, the coordinator's
    fan-out overhead, per-shard scan time and whether both give the same answers. Everything is
    removed at the end.

    Example: pm-vector bench cluster --items 100000 --release location --changes 200 --json
    """
    if release not in PARTS:
        err.print(f"error: --release must be one of {', '.join(PARTS)}; got {release!r}.")
        raise typer.Exit(2)
    if changes < 0:
        err.print(f"error: --changes must be 0 or more; got {changes}.")
        raise typer.Exit(2)
    eps = parse_floats(location_eps)
    cfg = ClusterBenchConfig(items=items, anchors=anchors, rows=parse_ints(rows, "--rows"), dim=dim, shards=shards,
                             replicas=replicas, repeats=repeats, epsilon=epsilon, shortlist=shortlist, seed=seed,
                             release=release, changes=changes, feature_updates=feature_updates, location_epsilons=eps,
                             location_max_bytes=max_bytes)
    result = run_with_spinner("cluster", run, cfg, as_json)
    if result is None:
        return
    if PARTS[release].location:
        _location_table(result, items, dim, repeats, changes)
    if "same_answers" in result:
        _class_rows_table(result, items, dim, epsilon, shortlist, repeats)
    err.print(result["machine"]["note"])


def _location_table(result: dict, items: int, dim: int, repeats: int, changes: int) -> None:
    loc = result["location"]
    plans = ", ".join(f"eps {float(e):g}: M={p['level']} S={p['candidates']} {p['code_bytes']} B"
                      for e, p in loc["plans"].items())
    t = Table(title=f"cluster, location release: {items:,} items, {dim} dims, {loc['max_bytes']:,} B plan ({plans}), "
                    f"{repeats} requests per eps (ms, each answer built); same answers: "
                    f"{result['location_same_answers']}; deleted items in answers: "
                    f"{result['location_deleted_in_answers']}")
    for c in ("phase", "1 node p50", "p95", "coordinator p50", "p95", "coord / 1 node", "replica p50", "p95",
              "same answers"):
        t.add_column(c, justify="right")
    for label, key in (("before changes", "before"), (f"after {changes} changes", "after")):
        if key not in loc:
            continue
        p = loc[key]
        rep = p.get("replica")
        t.add_row(label, f"{p['single']['p50_ms']:.1f}", f"{p['single']['p95_ms']:.1f}",
                  f"{p['cluster']['p50_ms']:.1f}", f"{p['cluster']['p95_ms']:.1f}",
                  f"{p['ratio_coordinator_single_p50']:.2f}",
                  f"{rep['p50_ms']:.1f}" if rep else "-", f"{rep['p95_ms']:.1f}" if rep else "-",
                  str(p["same_answers"]))
    Console().print(t)
    for key in ("before", "after"):
        for node, d in loc.get(key, {}).get("first_difference", {}).items():
            err.print(f"{key}: {loc[key]['reports_differing'][node]} report(s) differ on {node}; first: {d}")
    for node, c in loc.get("changes", {}).items():
        err.print(f"changes on {node}: {c['counts']} in {c['seconds']:.1f} s; updates not placed in the run: "
                  f"{c['updates_not_placed']}")


def _class_rows_table(result: dict, items: int, dim: int, epsilon: float, shortlist: int, repeats: int) -> None:
    t = Table(title=f"cluster, class rows: {items:,} items, {dim} dims, eps {epsilon:g}, k'={shortlist}, {repeats} "
                    f"requests per C (ms); same answers: {result['same_answers']}")
    for c in ("config", "ingest rows/s", "embed s", "C", "resolve p50", "resolve p95", "replica stmt p50",
              "fan-out overhead", "per-shard scan p50"):
        t.add_column(c, justify="right")
    for conf in result["configs"]:
        label = f"{conf['shards']} shard(s) + {conf['replicas']} replica(s)" if conf["shards"] > 1 else "1 node"
        rep = {r["rows"]: r for r in conf.get("replica_shortlist", [])}
        fan = {r["rows"]: r for r in conf.get("fanout", [])}
        per = {r["rows"]: r for r in conf.get("per_shard_scan_ms", [])}
        for r in conf["resolve"]:
            C = r["rows"]
            t.add_row(label, f"{conf['ingest_rows_per_s']:,.0f}", f"{conf['embed_seconds']:.1f}", str(C),
                      f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}",
                      f"{rep[C]['p50_ms']:.1f}" if C in rep else "-",
                      f"{fan[C]['overhead_ms']:.1f}" if C in fan else "-",
                      " / ".join(f"{v:.1f}" for k, v in per[C].items() if k != "rows") if C in per else "-")
    Console().print(t)
    for C, a in result.get("agreement", {}).items():
        cs, rb = a["cluster_vs_single"], a["single_rebuilt_vs_single"]
        err.print(f"C={C}: candidates shared cluster/single {cs['candidates_shared']:.4f} (rows identical "
                  f"{cs['rows_identical']:.3f}); one node, class indexes rebuilt: {rb['candidates_shared']:.4f} "
                  f"({rb['rows_identical']:.3f}); largest class {a['largest_class']}, max_prior {a['max_prior']}")
