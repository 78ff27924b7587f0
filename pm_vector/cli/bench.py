"""``pm-vector bench ...``: benchmarks that print a table and, with --json, one JSON object.

This module holds the ``bench`` group and its shared helpers, and ``privacy``, ``latency`` and
``scale``; ``kahm``, ``cluster`` and ``accounting`` (:mod:`pm_vector.cli.bench_kahm`,
:mod:`~pm_vector.cli.bench_cluster`, :mod:`~pm_vector.cli.bench_accounting`), ``outage`` and
``memory`` (:mod:`~pm_vector.cli.bench_service`) and ``load`` (:mod:`~pm_vector.cli.service`)
register themselves on the group, whose table :data:`BENCH_COMMANDS` imports them when they run."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..errors import PMVectorError
from ._lazy import lazy_group
from ..bench.latency import LatencyConfig
from ..bench.privacy_bench import DEFAULT_SHORTLIST, BenchConfig, parse_epsilons, parse_methods, plot as draw
from ..bench.scale import ScaleConfig
from ..bench import latency as latency_bench, privacy_bench, scale as scale_bench
from ..datasets import load_arrays, load_dataset, split_dataset, subsample
from ..db.runs.class_rows import params as class_rows_params
from ..manifold.codes import MAX_CODE_BYTES, MIN_CODE_BYTES
from ..manifold.partitions import DEFAULT_PARTITIONS
from ..protocol import releases

#: the benchmarks of other modules, in the order of ``pm-vector bench --help`` (after this module's)
BENCH_COMMANDS = {
    "kahm": ("pm_vector.cli.bench_kahm", "bench_app"),
    "cluster": ("pm_vector.cli.bench_cluster", "bench_app"),
    "accounting": ("pm_vector.cli.bench_accounting", "bench_app"),
    "outage": ("pm_vector.cli.bench_service", "bench_app"),
    "memory": ("pm_vector.cli.bench_service", "bench_app"),
    "hostile": ("pm_vector.cli.bench_service", "bench_app"),
    "writes": ("pm_vector.cli.bench_writes", "bench_app"),
    "resolve": ("pm_vector.cli.bench_resolve", "bench_app"),
    "writes-recall": ("pm_vector.cli.bench_writes", "bench_app"),
    "merge": ("pm_vector.cli.bench_merge", "bench_app"),
    "load": ("pm_vector.cli.service", "load"),
}
bench_app = typer.Typer(help="Benchmarks: each prints a table, or one JSON object with --json.",
                        cls=lazy_group(BENCH_COMMANDS), no_args_is_help=True)
err = Console(stderr=True)

DEFAULT_SIZES = {"digits": (1000, 300, 150, 300), "fashion-mnist": (10000, 1000, 500, 500),
                 "fashion-mnist-70k": (68000, 1000, 500, 500)}


def fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(2)


def _privacy_options(epsilons: str, methods: str | None, plot: Path | None, code_bytes: int, code_widths: str) -> tuple:
    """``bench privacy``'s options checked as typer parameters: returns (the epsilons, the methods)."""
    try:
        eps = parse_epsilons(epsilons)
    except PMVectorError as e:
        raise typer.BadParameter(str(e), param_hint="--epsilons") from None
    try:
        chosen = parse_methods(methods)
    except PMVectorError as e:
        raise typer.BadParameter(str(e), param_hint="--methods") from None
    if plot is not None and plot.suffix.lower() != ".png":
        raise typer.BadParameter(f"the plot is written as PNG; give a .png file name (got {str(plot)!r}).",
                                 param_hint="--plot")

    if not MIN_CODE_BYTES <= code_bytes <= MAX_CODE_BYTES:
        raise typer.BadParameter(f"the code size must be {MIN_CODE_BYTES} to {MAX_CODE_BYTES} bytes; got {code_bytes}.",
                                 param_hint="--code-bytes")

    try:
        widths = tuple(int(w) for w in code_widths.split(",") if w.strip()) if code_widths.strip() else ()
        class_rows_params(override={"code_bytes": code_bytes, "code_widths": widths})
    except (ValueError, PMVectorError) as e:
        raise typer.BadParameter(f"{e}", param_hint="--code-widths") from None
    return eps, chosen, widths


def _privacy_config(eps, delta: float, k: int, shortlist: int, seed: int, chosen, max_prior: int, graph_degree: int,
                    cells: int | None, code_bytes: int, code_widths: tuple, max_bytes: str, partitions: int | None,
                    unlabelled: bool):
    """``bench privacy``'s :class:`~pm_vector.bench.privacy_bench.BenchConfig` from its options (the
    code's stages from its size: 16-byte stages when a multiple of 16; without labels, public
    partitions, 10 by default)."""
    return BenchConfig(epsilons=eps, delta=delta, k=k, shortlist=shortlist, seed=seed, methods=chosen,
                       max_prior=max_prior, graph_degree=graph_degree, n_cells=cells, code_bytes=code_bytes,
                       code_stages=(code_bytes // 16 if code_bytes % 16 == 0 and code_bytes >= 32 else
                                    2 if code_bytes % 2 == 0 and code_bytes >= 16 else 1),
                       code_widths=code_widths, max_bytes=parse_ints(max_bytes, "--max-bytes"),
                       partitions=(partitions or DEFAULT_PARTITIONS) if unlabelled else None)


def _privacy_split(dataset: str, features: Path | None, labels: Path | None, max_items: int | None, seed: int,
                   given: tuple) -> tuple:
    """``bench privacy``'s data: the built-in dataset or the user's files (subsampled), split into
    server / anchor / dummy / query parts (the sizes ``given``, else the dataset's defaults, else
    shares of its items). Returns (dataset, sizes, split, the default shortlist k')."""
    if features is not None or labels is not None:
        if features is None:
            fail("--labels needs --features (the features file the labels belong to).")
        ds = load_arrays(features, labels)
        if max_items is not None:
            ds = subsample(ds, max_items, seed)
        sizes = None
        kp_default = 32
    else:
        ds = load_dataset(dataset, max_items=max_items, seed=seed)
        sizes = DEFAULT_SIZES.get(dataset)
        kp_default = DEFAULT_SHORTLIST.get(dataset, 32)
    if sizes is None:
        n = ds.n_items
        sizes = (int(n * 0.6), max(ds.n_classes * 3, int(n * 0.15)), max(ds.n_classes, int(n * 0.05)),
                 min(500, int(n * 0.15)))
    sizes = tuple(g if g is not None else d for g, d in zip(given, sizes))
    return ds, sizes, split_dataset(ds, *sizes, seed=seed), kp_default


@bench_app.command("privacy")
def privacy(
    dataset: str = typer.Option("digits", help="Built-in dataset: digits, fashion-mnist (10,000 server items) or "
                                "fashion-mnist-70k (all 70,000 images: 68,000 server items)."),
    features: Path = typer.Option(None, help="Your own features (.npy, rows x dims); with --labels, or without "
                                  "them as a collection without labels (public partitions replace the classes)."),
    labels: Path = typer.Option(None, help="Your own integer labels (.npy, one per row)."),
    unlabeled: bool = typer.Option(False, "--unlabeled", help="Drop the labels: public partitions (k-means of the "
                                   "public anchor) replace the classes, as for a collection without labels."),
    partitions: int = typer.Option(None, "--partitions", help="Public partitions of a collection without labels "
                                   "(default 10)."),
    cells: int = typer.Option(None, "--cells", help="pm_vector_cells: a fixed level K instead of the public rule."),
    epsilons: str = typer.Option("1,2,4,8,16,64,inf", help="Comma-separated epsilons; inf = each method's "
                                 "noise-free endpoint."),
    delta: float = typer.Option(1e-5, help="delta of every private method."),
    shortlist: int = typer.Option(None, "--shortlist", help="k': candidates per request row that the client "
                                  "re-ranks (default: digits 32, fashion-mnist 128, own files 32)."),
    k: int = typer.Option(8, "--k", help="Neighbours after the client's re-rank."),
    max_prior: int = typer.Option(512, help="pm_vector: prior items weighted one by one per row (the server's "
                                  "settings['class_rows']['max_prior'])."),
    graph_degree: int = typer.Option(16, help="pm_vector: neighbours per item in the server's raw k-NN graph "
                                     "(settings['class_rows']['graph_degree'])."),
    methods: str = typer.Option(None, help="Comma-separated subset of: pm_vector_location (the default release), "
                                "pm_vector_compact (the class-rows compact answer), "
                                "pm_vector_raw (alias pm_vector), pm_vector_cells, pm_vector_cells_label, "
                                "pm_vector_gaussian, pm_vector_label_free, label_only, partition_only, "
                                "reference_ldp, privatemail_paper, dp_random_projection, dp_pca, raw_knn, "
                                "download_codes, download_lists, download_all (default: all but privatemail_paper "
                                "and the dp_ projections)."),
    code_bytes: int = typer.Option(32, "--code-bytes", help="bytes of an item's residual code stages, 8 to 256 "
                                   "(stages of 16 bytes when a multiple of 16; each stage's prefix is a width)."),
    code_widths: str = typer.Option("64,96,128,160,192,256", "--code-widths", help="comma-separated widths of the "
                                    "single-stage code tables (each above --code-bytes, at most 256 and the "
                                    "feature dimension): with the residual prefixes, the widths the location "
                                    "release chooses from; the class-rows answers take the 32- and 64-byte widths."),
    max_bytes: str = typer.Option("50000", "--max-bytes", help="pm_vector_location: comma-separated byte budgets "
                                  "of one request on the wire, both ways (one row per budget and epsilon)."),
    n_server: int = typer.Option(None, help="Server items (default per dataset)."),
    n_anchor: int = typer.Option(None, help="Public anchor rows."),
    n_dummy: int = typer.Option(None, help="Public dummy pool."),
    n_query: int = typer.Option(None, "--n-query", "--queries", help="Queries."),
    max_items: int = typer.Option(None, help="Subsample the dataset (or your --features) first (stratified)."),
    seed: int = typer.Option(0, help="Seed of the split and of every mechanism (benchmarks are reproducible)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
    plot: Path = typer.Option(None, "--plot", help="Write nn_recall@k and precision@k against epsilon to this PNG."),
):
    """Privacy-utility benchmark: nearest-neighbour recall of pm_vector and its baselines against epsilon.

    Every method returns k' candidates for the same queries and the client re-ranks them by raw
    features to k; nn_recall@k is the share of the exact non-private k nearest items recovered.

    Example: pm-vector bench privacy --dataset fashion-mnist --json --plot out.png
    """
    eps, chosen, widths = _privacy_options(epsilons, methods, plot, code_bytes, code_widths)
    try:
        if partitions is not None and partitions < 2:
            fail("--partitions must be at least 2.")
        ds, sizes, split, kp_default = _privacy_split(dataset, features, labels, max_items, seed,
                                                      (n_server, n_anchor, n_dummy, n_query))
        unlabelled = unlabeled or (features is not None and labels is None)
        if partitions is not None and not unlabelled:
            fail("--partitions applies to a collection without labels (--features without --labels, or --unlabeled).")
        cfg = _privacy_config(eps, delta, k, shortlist or kp_default, seed, chosen, max_prior, graph_degree, cells,
                              code_bytes, widths, max_bytes, partitions, unlabelled)
        err.print(f"dataset {ds.name}: {ds.n_items} items, {ds.dim} dims, "
                  f"{f'{cfg.partitions} public partitions (no labels)' if cfg.partitions else f'{ds.n_classes} classes'}"
                  "; split "
                  f"server/anchor/dummy/query = {sizes}, seed {seed}; k'={cfg.shortlist}, k={k}")
        t0 = time.perf_counter()
        result = privacy_bench.run(split, cfg, progress=lambda m: err.print(
            f"[{time.perf_counter() - t0:7.1f}s] {m}", highlight=False, soft_wrap=True))
        if plot is not None:
            draw(result, plot)
            err.print(f"plot written to {plot}")
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(result))
        return
    _print_privacy_table(result)


def _print_privacy_table(result: dict) -> None:
    k = result["k"]
    kb = result["collection_bytes"] / 1e3
    t = Table(title=f"{result['dataset']}: k'={result['shortlist']} candidates re-ranked to {k}, "
                    f"delta={result['delta']:g} (class ceiling {result['class_ceiling']:.3f}, collection {kb:,.0f} kB)")
    for c in ("method", "epsilon", "delta", "release", f"nn_recall@{k}", f"precision@{k}", "distinct k'",
              "kB/request", "share", "seconds"):
        t.add_column(c, justify="right" if c != "method" else "left", no_wrap=True)
    for r in result["results"]:
        e, d = r["epsilon"], r.get("delta")
        rel = r.get("release", "")
        if r["method"] == "download_lists":
            rel = f"table K={r['n_cells']}"
        elif r["method"] == "download_codes":
            rel = f"codes {r['code_bytes']} B"
        elif r["method"] == "pm_vector_location":
            rel = releases.describe(r, "location")
        elif r["method"] == "pm_vector_compact":
            rel = releases.describe(r) + f", {r['k_prime']}x{r['code_bytes']} B"
        elif rel:
            rel = releases.describe(r)  # e.g. "cells K=64"
        t.add_row(r["method"], "-" if e is None else (e if isinstance(e, str) else f"{e:g}"),
                  "-" if d is None else f"{d:g}", rel,
                  f"{r[f'nn_recall_at_{k}']:.3f}", f"{r[f'precision_at_{k}']:.3f}",
                  f"{r['distinct_candidate_lists_per_class']:.2f}",
                  f"{r['bytes_per_request'] / 1e3:,.1f}",
                  f"{r['bytes_share_of_collection']:.3f}", f"{r['seconds']:.2f}")
    Console(width=max(Console().width, 140)).print(t)
    for m, why in (result.get("skipped") or {}).items():
        err.print(f"[yellow]{m} skipped:[/] {why}")
    lf = result.get("label_free_classifier")
    if lf:
        err.print(f"label-free client: {lf['classifier']}, accuracy {lf['accuracy']:.3f} on the queries")


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v.replace("_", "")) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"{what}: expected comma-separated integers, e.g. 10,100; got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise typer.BadParameter(f"{what}: expected positive integers, e.g. 10,100")
    return vals


def _spinner(enabled: bool):
    return Progress(console=err, transient=True, disable=not enabled)


@bench_app.command("latency")
def latency(
    items: int = typer.Option(100_000, help="Server items of the temporary collection."),
    anchors: int = typer.Option(1000, help="Public anchor rows."),
    rows: str = typer.Option("10,100", help="Request sizes C (query rows = classes), comma-separated."),
    data: str = typer.Option("synthetic", help="synthetic (clustered, 100 fine classes) or fashion-mnist (C = 10)."),
    dim: int = typer.Option(128, help="Feature dimension of the synthetic data."),
    k: int = typer.Option(8, help="Neighbours per query row."),
    repeats: int = typer.Option(50, help="Timed requests per C (after 5 warm-up requests)."),
    epsilon: float = typer.Option(1.0, help="epsilon of the clients' releases."),
    shortlist: int = typer.Option(128, help="k' candidates per row of a full answer (and of the plain k' "
                                            "baseline); a compact answer's k' is the public rule's."),
    answer: str = typer.Option("compact", help="pm_vector answers timed: compact (the default answer: ids and "
                                               "code prefixes, k' by the public rule) or full (k' = --shortlist, "
                                               "with external ids, labels and payloads)."),
    graph_degree: int = typer.Option(16, help="Neighbours per item in the pm_vector shortlist's raw k-NN graph."),
    max_prior: int = typer.Option(512, help="Prior items the pm_vector shortlist weights one by one per row "
                                  "(the default of new collections, pm_vector.shortlist.MAX_PRIOR)."),
    seed: int = typer.Option(0, help="Seed of the data, the split and the clients (reproducible)."),
    release: str = typer.Option("all", help="pm_vector release(s) timed beside the paper's: location (one "
                                            "reported cell of the whole collection, the default release), cells "
                                            "(one reported cell per class), gaussian (noised class rows), both "
                                            "(cells and gaussian) or all."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """Latency: client step, server resolution (one statement) and plain pgvector k-NN, p50/p95.

    Builds temporary collections on the database (the embedded server by default), times the
    PrivateMail client step, resolve() of each request (align + all C rows in one pm_knn_batch
    statement + request log) and C plain HNSW queries on the raw features, and drops it all.

    Example: pm-vector bench latency --items 100000 --rows 10,100 --json
    """
    cfg = LatencyConfig(items=items, anchors=anchors, rows=parse_ints(rows, "--rows"), data=data, dim=dim, k=k,
                        repeats=repeats, epsilon=epsilon, shortlist=shortlist, graph_degree=graph_degree,
                        max_prior=max_prior, seed=seed, release=release, answer=answer)
    result = run_with_spinner("latency", latency_bench.run, cfg, as_json)
    if result is None:
        return
    t = Table(title=f"latency: {result['items']:,} items ({result['data']}, {result['dim']} dims), "
                    f"{result['anchors']} anchors, k={result['k']}, {repeats} requests per C (ms)")
    for c in ("C", "protocol", "client p50", "resolve p50", "resolve p95", "plain p50", "ratio", "plain k' p50",
              "ratio k'", "statements"):
        t.add_column(c, justify="right")
    for r in result["results"]:
        pm = r.get("pm_vector")
        if pm:
            t.add_row(str(r["rows"]), f"pm_vector (k'={pm['shortlist']})", f"{pm['client_p50_ms']:.1f}",
                      f"{pm['resolve_p50_ms']:.1f}", f"{pm['resolve_p95_ms']:.1f}", f"{r['plain_p50_ms']:.1f}",
                      f"{pm['ratio']:.2f}", f"{r['plain_kprime_p50_ms']:.1f}", f"{pm['ratio_kprime']:.2f}",
                      f"{pm['prior_knn_statements_per_request']:g} k-NN + {pm['shortlist_statements_per_request']:g}")
        lo = r.get("location")
        if lo:
            t.add_row(str(r["rows"]), f"location (M={lo['level']}, {lo['candidates']}x{lo['code_bytes']} B)",
                      f"{lo['client_p50_ms']:.1f}", f"{lo['resolve_p50_ms']:.1f}", f"{lo['resolve_p95_ms']:.1f}",
                      f"{r['plain_p50_ms']:.1f}", f"{lo['ratio']:.2f}", "", "", f"{lo['answers_built']} built")
        ce = r.get("cells")
        if ce:
            t.add_row(str(r["rows"]), f"cells (K={ce['n_cells']}, k'={ce['shortlist']})", f"{ce['client_p50_ms']:.1f}",
                      f"{ce['resolve_p50_ms']:.1f}", f"{ce['resolve_p95_ms']:.1f}", f"{r['plain_p50_ms']:.1f}",
                      f"{ce['ratio']:.2f}", f"{r['plain_kprime_p50_ms']:.1f}", f"{ce['ratio_kprime']:.2f}",
                      f"{ce['statements_per_request']:g}")
        t.add_row(str(r["rows"]), "privatemail_paper", f"{r['client_p50_ms']:.1f}", f"{r['resolve_p50_ms']:.1f}",
                  f"{r['resolve_p95_ms']:.1f}", f"{r['plain_p50_ms']:.1f}", f"{r['ratio']:.2f}", "", "",
                  f"{r['knn_statements_per_request']:g}")
    Console().print(t)
    for r in result["results"]:
        parts = ", ".join(f"{a} {b:.1f}" for a, b in r["resolve_parts_p50_ms"].items())
        err.print(f"C={r['rows']}: resolve p50 parts (ms): {parts}")
        pm = r.get("pm_vector") or {}
        if pm.get("resolve_parts_p50_ms"):
            parts = ", ".join(f"{a} {b:.1f}" for a, b in pm["resolve_parts_p50_ms"].items())
            err.print(f"C={r['rows']}: pm_vector resolve p50 parts (ms, max_prior {pm['max_prior']}): {parts}")
        ce = r.get("cells") or {}
        if ce.get("resolve_parts_p50_ms"):
            parts = ", ".join(f"{a} {b:.1f}" for a, b in ce["resolve_parts_p50_ms"].items())
            err.print(f"C={r['rows']}: cells resolve p50 parts (ms, K {ce['n_cells']}): {parts}")
    err.print(f"load average before/after: {result['load_average']['before']} / {result['load_average']['after']}; "
              f"shared_buffers {result['setup'].get('shared_buffers')}")


def run_printing(run, as_json: bool):
    """``run(progress)`` with progress lines on stderr (none with --json); with --json print the
    result and return None. A PMVectorError becomes a clear failure."""
    try:
        result = run(None if as_json else (lambda m: err.print(m)))
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(result))
        return None
    return result


def run_with_spinner(name: str, run, cfg, as_json: bool):
    """Run a database benchmark behind a spinner; with --json print it and return None."""
    try:
        with _spinner(sys.stderr.isatty()) as bar:
            task = bar.add_task(name, total=None)
            result = run(cfg, progress=lambda m: bar.update(task, description=m))
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(result))
        return None
    return result


@bench_app.command("scale")
def scale(
    sizes: str = typer.Option("10000,50000,200000", help="Item counts, comma-separated."),
    anchors: int = typer.Option(1000, help="Public anchor rows."),
    dim: int = typer.Option(128, help="Feature dimension of the synthetic data."),
    classes: int = typer.Option(10, help="Labels (a divisor of 100)."),
    n_components: int = typer.Option(16, help="Embedding dimension (AnchorFrame n_components)."),
    repeats: int = typer.Option(1, help="Jobs per size (the median is reported)."),
    hnsw_m: int = typer.Option(16, help="HNSW m of the run's index."),
    hnsw_ef_construction: int = typer.Option(64, help="HNSW ef_construction of the run's index."),
    maintenance_work_mem: str = typer.Option(None, help="maintenance_work_mem of the index build (default: the "
                                             "job's, sized by the number of items)."),
    seed: int = typer.Option(0, help="Seed of the data and of the frame."),
    graph: str = typer.Option("auto", help="The class rows' neighbour graph: auto (exact up to "
                              "--graph-exact-max-items items, faiss HNSW above), exact or hnsw."),
    graph_exact_max_items: int = typer.Option(None, help="Largest collection whose graph auto computes exactly "
                                              "(default: the project's, 50,000)."),
    recall_sample: int = typer.Option(1000, help="Items whose stored neighbour lists are checked against the "
                                      "exact ones (0: no recall)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """Scale: the default embedding job's time, peak memory and graph recall against the number of items.

    Example: pm-vector bench scale --sizes 125000,250000,500000,1000000 --dim 128 --json
    """
    cfg = ScaleConfig(sizes=parse_ints(sizes, "--sizes"), anchors=anchors, dim=dim, classes=classes,
                      n_components=n_components, repeats=repeats, hnsw_m=hnsw_m,
                      hnsw_ef_construction=hnsw_ef_construction, maintenance_work_mem=maintenance_work_mem, seed=seed,
                      graph=graph, graph_exact_max_items=graph_exact_max_items, recall_sample=recall_sample)
    result = run_with_spinner("scale", scale_bench.run, cfg, as_json)
    if result is None:
        return
    t = Table(title=f"scale: embedding job ({result['anchors']} anchors, {result['dim']} dims); "
                    f"time per doubling {result['time_per_doubling']:.2f}x")
    for c in ("items", "seconds", "per doubling", "peak MB", "job +MB", "class rows s", "index s", "graph",
              "graph recall"):
        t.add_column(c, justify="right")
    for r in result["results"]:
        pd = r.get("time_per_doubling_from_previous")
        rec = r.get("graph_recall")
        t.add_row(f"{r['items']:,}", f"{r['seconds']:.1f}", "" if pd is None else f"{pd:.2f}", f"{r['peak_mb']:.0f}",
                  f"{r['job_delta_mb']:.0f}", f"{r['stages_s'].get('class_rows_s', float('nan')):.1f}",
                  f"{r['index_s']:.1f}", str(r.get("graph_method")), "" if rec is None else f"{rec:.3f}")
    Console().print(t)
