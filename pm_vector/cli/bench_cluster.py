"""``pm-vector bench cluster``: one node against a local cluster (shards + replica), side by side
(table and JSON)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from .bench import parse_ints, run_with_spinner, bench_app, err


@bench_app.command("cluster")
def cluster_bench(
    items: int = typer.Option(200_000, help="Server items of each temporary collection."),
    anchors: int = typer.Option(1000, help="Public anchor rows."),
    rows: str = typer.Option("10,100", help="Request sizes C (= classes), comma-separated."),
    dim: int = typer.Option(64, help="Feature dimension of the synthetic data."),
    shards: int = typer.Option(2, help="Shards of the local cluster."),
    replicas: int = typer.Option(1, help="Streaming replicas of the coordinator."),
    repeats: int = typer.Option(30, help="Timed requests per C and configuration (after 3 warm-up requests)."),
    epsilon: float = typer.Option(4.0, help="epsilon of the clients' releases."),
    shortlist: int = typer.Option(128, help="k' candidates per row."),
    seed: int = typer.Option(0, help="Seed of the data, the split and the clients (reproducible)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """One node against a local cluster (shards + replica), side by side in one run.

    Starts a private local cluster, loads the same synthetic collection into a single-node database
    and into the cluster, and reports ingest rows/s, embedding job seconds, resolve p50/p95 per C,
    the replica's statement time, the coordinator's fan-out overhead, per-shard scan time, and
    whether both give the same answers. Everything is removed at the end.

    Example: pm-vector bench cluster --items 200000 --rows 10,100 --json
    """
    from ..bench.cluster import ClusterBenchConfig, run

    cfg = ClusterBenchConfig(items=items, anchors=anchors, rows=parse_ints(rows, "--rows"), dim=dim, shards=shards,
                             replicas=replicas, repeats=repeats, epsilon=epsilon, shortlist=shortlist, seed=seed)
    result = run_with_spinner("cluster", run, cfg, as_json)
    if result is None:
        return
    t = Table(title=f"cluster: {items:,} items, {dim} dims, eps {epsilon:g}, k'={shortlist}, {repeats} requests "
                    f"per C (ms); same answers: {result['same_answers']}")
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
    err.print(result["machine"]["note"])
