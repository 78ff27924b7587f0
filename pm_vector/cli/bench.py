"""``pm-vector bench ...``: benchmarks that print a table and, with --json, one JSON object."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ..errors import PMVectorError

bench_app = typer.Typer(help="Benchmarks: each prints a table, or one JSON object with --json.", no_args_is_help=True)
err = Console(stderr=True)

DEFAULT_SIZES = {"digits": (1000, 300, 150, 300), "fashion-mnist": (10000, 1000, 500, 500),
                 "fashion-mnist-70k": (68000, 1000, 500, 500)}


def fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(2)


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
    methods: str = typer.Option(None, help="Comma-separated subset of: pm_vector_compact (the default answer), "
                                "pm_vector_raw (alias pm_vector), pm_vector_cells, pm_vector_cells_label, "
                                "pm_vector_gaussian, pm_vector_label_free, label_only, partition_only, "
                                "reference_ldp, privatemail_paper, dp_random_projection, dp_pca, raw_knn, "
                                "download_codes, download_lists, download_all (default: all but privatemail_paper "
                                "and the dp_ projections)."),
    code_bytes: int = typer.Option(64, "--code-bytes", help="pm_vector_compact / download_codes: bytes of an item's "
                                   "compact code, 8 to 64 (two stages when even and >= 16: the first is the "
                                   "prefix the cell release sends)."),
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
    import time

    from ..bench.privacy_bench import DEFAULT_SHORTLIST, BenchConfig, parse_epsilons, parse_methods, plot as draw
    from ..bench.privacy_bench import run
    from ..datasets import load_arrays, load_dataset, split_dataset, subsample
    from ..manifold.partitions import DEFAULT_PARTITIONS

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
    from ..manifold.codes import MAX_CODE_BYTES, MIN_CODE_BYTES

    if not MIN_CODE_BYTES <= code_bytes <= MAX_CODE_BYTES:
        raise typer.BadParameter(f"the code size must be {MIN_CODE_BYTES} to {MAX_CODE_BYTES} bytes; got {code_bytes}.",
                                 param_hint="--code-bytes")
    try:
        if partitions is not None and partitions < 2:
            fail("--partitions must be at least 2.")
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
        given = (n_server, n_anchor, n_dummy, n_query)
        sizes = tuple(g if g is not None else d for g, d in zip(given, sizes))
        split = split_dataset(ds, *sizes, seed=seed)
        unlabelled = unlabeled or (features is not None and labels is None)
        if partitions is not None and not unlabelled:
            fail("--partitions applies to a collection without labels (--features without --labels, or --unlabeled).")
        cfg = BenchConfig(epsilons=eps, delta=delta, k=k, shortlist=shortlist or kp_default, seed=seed, methods=chosen,
                          max_prior=max_prior, graph_degree=graph_degree, n_cells=cells, code_bytes=code_bytes,
                          code_stages=2 if code_bytes % 2 == 0 and code_bytes >= 16 else 1,
                          partitions=(partitions or DEFAULT_PARTITIONS) if unlabelled else None)
        err.print(f"dataset {ds.name}: {ds.n_items} items, {ds.dim} dims, "
                  f"{f'{cfg.partitions} public partitions (no labels)' if cfg.partitions else f'{ds.n_classes} classes'}"
                  "; split "
                  f"server/anchor/dummy/query = {sizes}, seed {seed}; k'={cfg.shortlist}, k={k}")
        t0 = time.perf_counter()
        result = run(split, cfg, progress=lambda m: err.print(f"[{time.perf_counter() - t0:7.1f}s] {m}",
                                                              highlight=False, soft_wrap=True))
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
        elif r["method"] == "pm_vector_compact":
            rel = (f"cells K={r['n_cells']}" if rel == "cells" else rel) + f", {r['k_prime']}x{r['code_bytes']} B"
        elif rel == "cells":
            rel = f"cells K={r['n_cells']}"
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


def _ints(text: str, what: str) -> tuple[int, ...]:
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
    shortlist: int = typer.Option(128, help="k' candidates per row of a pm_vector request."),
    graph_degree: int = typer.Option(16, help="Neighbours per item in the pm_vector shortlist's raw k-NN graph."),
    max_prior: int = typer.Option(512, help="Prior items the pm_vector shortlist weights one by one per row "
                                  "(the default of new collections, pm_vector.shortlist.MAX_PRIOR)."),
    seed: int = typer.Option(0, help="Seed of the data, the split and the clients (reproducible)."),
    release: str = typer.Option("gaussian", help="pm_vector release(s) timed beside the paper's: gaussian (noised "
                                                 "class rows), cells (one reported public cell per class) or both."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """Latency: client step, server resolution (one statement) and plain pgvector k-NN, p50/p95.

    Builds temporary collections on the database (the embedded server by default), times the
    PrivateMail client step, resolve() of each request (align + all C rows in one pm_knn_batch
    statement + request log) and C plain HNSW queries on the raw features, and drops it all.

    Example: pm-vector bench latency --items 100000 --rows 10,100 --json
    """
    from ..bench.latency import LatencyConfig, run

    cfg = LatencyConfig(items=items, anchors=anchors, rows=_ints(rows, "--rows"), data=data, dim=dim, k=k,
                        repeats=repeats, epsilon=epsilon, shortlist=shortlist, graph_degree=graph_degree,
                        max_prior=max_prior, seed=seed, release=release)
    result = _run_with_spinner("latency", run, cfg, as_json)
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
    err.print(f"load average before/after: {result['load_average']['before']} / {result['load_average']['after']}")


def _run_printing(run, as_json: bool):
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


def _run_with_spinner(name: str, run, cfg, as_json: bool):
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
    from ..bench.scale import ScaleConfig, run

    cfg = ScaleConfig(sizes=_ints(sizes, "--sizes"), anchors=anchors, dim=dim, classes=classes,
                      n_components=n_components, repeats=repeats, hnsw_m=hnsw_m,
                      hnsw_ef_construction=hnsw_ef_construction, maintenance_work_mem=maintenance_work_mem, seed=seed,
                      graph=graph, graph_exact_max_items=graph_exact_max_items, recall_sample=recall_sample)
    result = _run_with_spinner("scale", run, cfg, as_json)
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


@bench_app.command("kahm")
def kahm(
    part: str = typer.Option("all", help="all, timings (Table 11), privacy (Table 5); and, through the database "
                             "(not in all): anchor (the private query protocol on a DP fabricated anchor vs a public "
                             "one), federation (federated vs centralised classification), scores (resolve latency "
                             "with vs without class scores)."),
    datasets: str = typer.Option("mnist,fashion-mnist,digits", help="Comma-separated: mnist, fashion-mnist, digits."),
    max_items: int = typer.Option(5000, help="Images per dataset (stratified subsample)."),
    repeats: int = typer.Option(3, help="Timed fits per Table 11 size (the median is reported)."),
    seed: int = typer.Option(0, help="Seed of the data, the splits and the random Table 11 matrices."),
    noise_seed: int = typer.Option(None, help="Seed of the DP noise (default: the OS CSPRNG; a seed is not private)."),
    anchor_epsilons: str = typer.Option("1,4,16", help="--part anchor: epsilons of the fabricated anchor (per "
                                        "item with --anchor-unit row, per element with element); --part federation: "
                                        "per-element epsilons of the fabricated models."),
    anchor_unit: str = typer.Option("row", help="--part anchor: privacy unit(s) of the fabricated anchor, "
                                    "comma-separated: row (each item row clipped to L2 norm 1, epsilon per item), "
                                    "element (value range 0,1; an item costs p x epsilon)."),
    n_queries: int = typer.Option(None, help="--part anchor: held-out queries per dataset (default 200)."),
    stopping_rule: bool = typer.Option(False, "--stopping-rule", help="--part anchor: fabricate with the paper's "
                                       "stopping rule (eq 92, r from the original rows) instead of 5 fixed steps."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
):
    """KAHM: accuracy and membership-inference score of the Def. 12 / Def. 15 classifiers over
    Table 5's (eps, n) grid, and fit times over Table 11's sizes beside the paper's.

    Example: pm-vector bench kahm --part timings --json
    """
    from ..bench.kahm_bench import run_kahm_benchmark

    parts = ("all", "timings", "privacy", "anchor", "federation", "scores")
    if part not in parts:
        fail(f"--part must be one of {', '.join(parts)}; got {part!r}.")
    names = [d.strip() for d in datasets.split(",") if d.strip()]
    if part == "anchor":
        _kahm_anchor(names, anchor_epsilons, n_queries, seed, noise_seed, as_json, None if stopping_rule else 5,
                     anchor_unit)
        return
    if part in ("federation", "scores"):
        _kahm_roles(part, names, anchor_epsilons, seed, noise_seed, as_json)
        return
    result = _run_printing(lambda say: run_kahm_benchmark(part, names, max_items=max_items, repeats=repeats,
                                                          seed=seed, noise_seed=noise_seed, progress=say), as_json)
    if result is None:
        return
    if result.get("timings"):
        t = Table(title="KAHM fit time vs the paper's MATLAB times (Table 11)")
        for c in ("N", "p", "seconds", "paper seconds", "speed-up"):
            t.add_column(c, justify="right")
        for r in result["timings"]:
            ps = r.get("paper_seconds")
            t.add_row(str(r["N"]), str(r["p"]), f"{r['seconds']:.3f}", "-" if ps is None else f"{ps:g}",
                      "-" if not ps else f"{ps / r['seconds']:.1f}x")
        Console().print(t)
    if result.get("privacy"):
        t = Table(title="KAHM classifiers under DP (Table 5 grid): accuracy and membership-inference score")
        for c in ("dataset", "epsilon", "n", "acc Def.12", "acc Def.15", "MIS Def.12", "MIS Def.15"):
            t.add_column(c, justify="right" if c != "dataset" else "left")
        for r in result["privacy"]:
            t.add_row(r["dataset"], f"{r['epsilon']:g}", str(r["n"]), f"{r['accuracy_def12']:.4f}",
                      f"{r['accuracy_def15']:.4f}", f"{r['mis_def12']:.5f}", f"{r['mis_def15']:.5f}")
        Console().print(t)


def _kahm_anchor(names, anchor_epsilons: str, n_queries, seed: int, noise_seed, as_json: bool,
                 smoothing_steps: int | None, anchor_unit: str = "row") -> None:
    from ..bench.anchor_bench import ANCHOR_SIZES, run_anchor_benchmark

    names = [d for d in names if d in ANCHOR_SIZES]
    if not names:
        fail(f"--part anchor runs on {', '.join(ANCHOR_SIZES)}; pass --datasets with one of them.")
    try:
        eps = [float(e) for e in anchor_epsilons.split(",") if e.strip()]
    except ValueError:
        fail(f"--anchor-epsilons must be comma-separated numbers; got {anchor_epsilons!r}.")
    units = [u.strip() for u in anchor_unit.split(",") if u.strip()]
    if not units or any(u not in ("row", "element") for u in units):
        fail(f"--anchor-unit must be row, element or row,element; got {anchor_unit!r}.")
    result = _run_printing(lambda say: run_anchor_benchmark(names, anchor_epsilons=eps, units=units,
                                                            n_queries=n_queries, seed=seed,
                                                            noise_seed=noise_seed, smoothing_steps=smoothing_steps,
                                                            progress=say), as_json)
    if result is None:
        return
    t = Table(title="Private queries on a DP fabricated anchor vs a public anchor (client epsilon "
                    f"{result['config']['client_epsilon']:g}, through PostgreSQL)")
    for c in ("eps/item", "dataset", "anchor", "unit", "pm_vector nn_recall@8",
              "pm_vector precision@8", "paper recall@8", "paper precision@8"):
        t.add_column(c, justify="left" if c in ("dataset", "anchor") else "right")
    for r in result["raw_knn"]:
        t.add_row("-", r["dataset"], "raw k-NN (no privacy)", "-", "1.000", f"{r['precision_at_8']:.3f}",
                  f"{r['recall_at_8']:.3f}", f"{r['precision_at_8']:.3f}")
    for r in result["anchor"]:
        unit = "-" if r["unit"] is None else (f"row (L2 <= {r['clip_norm']:g})" if r["unit"] == "row" else
                                              "element [{:g}, {:g}], eps {:g}".format(*r["value_range"],
                                                                                      r["anchor_epsilon"]))
        t.add_row("-" if r["per_item_epsilon"] is None else f"{r['per_item_epsilon']:g}", r["dataset"], r["anchor"],
                  unit,
                  f"{r['pm_vector']['nn_recall_at_8']:.3f}", f"{r['pm_vector']['precision_at_8']:.3f}",
                  f"{r['recall_at_8']:.3f}", f"{r['precision_at_8']:.3f}")
    Console().print(t)


def _kahm_roles(part: str, names, epsilons: str, seed: int, noise_seed, as_json: bool) -> None:
    from ..bench.kahm_roles_bench import run_federation_benchmark, run_scores_benchmark

    if part == "federation":
        ds = names[0] if len(names) == 1 else "mnist"
        try:
            eps = [float(e) for e in epsilons.split(",") if e.strip()]
        except ValueError:
            fail(f"--anchor-epsilons must be comma-separated numbers; got {epsilons!r}.")
        result = _run_printing(lambda say: run_federation_benchmark(ds, epsilons=eps, seed=seed, noise_seed=noise_seed,
                                                                    progress=say), as_json)
    else:
        ds = names[0] if len(names) == 1 else "fashion-mnist"
        result = _run_printing(lambda say: run_scores_benchmark(ds, seed=seed, progress=say), as_json)
    if result is None:
        return
    if part == "federation":
        t = Table(title=f"Federated (eq. 104, {result['config']['n_parties']} collections) vs centralised KAHM "
                        f"classification, {result['config']['dataset']}")
        for c in ("models", "eps/element", "federated acc", "centralised acc", "agreement", "party shares"):
            t.add_column(c, justify="left" if c == "models" else "right")
        for r in result["federation"]:
            t.add_row(r["kind"], "-" if r["epsilon"] is None else f"{r['epsilon']:g}", f"{r['federated_accuracy']:.3f}",
                      f"{r['centralised_accuracy']:.3f}", f"{r['agreement']:.3f}",
                      " / ".join(f"{v:.2f}" for v in r["winning_party_share"]))
    else:
        r = result["scores"]
        t = Table(title=f"Resolve with vs without KAHM class scores ({r['items']:,} items, {r['requests']} requests)")
        for c in ("p50 with scores (ms)", "p50 without (ms)", "ratio", "model MB", "fit+score+write s"):
            t.add_column(c, justify="right")
        t.add_row(f"{r['resolve_ms_p50_with_scores']:.1f}", f"{r['resolve_ms_p50_without']:.1f}", f"{r['ratio']:.2f}",
                  f"{r['model_bytes'] / 1e6:.0f}", f"{r['model_fit_score_write_seconds']:.1f}")
    Console().print(t)


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

    cfg = ClusterBenchConfig(items=items, anchors=anchors, rows=_ints(rows, "--rows"), dim=dim, shards=shards,
                             replicas=replicas, repeats=repeats, epsilon=epsilon, shortlist=shortlist, seed=seed)
    result = _run_with_spinner("cluster", run, cfg, as_json)
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


@bench_app.command("accounting")
def accounting(
    epsilons: str = typer.Option("1,4,16", help="Epsilons of one request, comma-separated."),
    delta: float = typer.Option(1e-5, help="delta of one request."),
    dim: int = typer.Option(16, help="Coordinates per row d (the sensitivity's rounding term)."),
    timing: bool = typer.Option(False, "--timing", help="Also time one request's release (10 rows x d): "
                                "CSPRNG against PCG64, median CPU ms."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """The request's noise under its zCDP calibration against the continuous Gaussian's exact
    profile (dp-accounting), and OpenDP's epsilon for the request's rho.

    Example: pm-vector bench accounting --epsilons 1,4,16 --json
    """
    from ..bench.accounting import run

    try:
        eps = [float(e) for e in epsilons.split(",") if e.strip()]
    except ValueError:
        fail(f"--epsilons must be comma-separated numbers; got {epsilons!r}.")
    result = _run_printing(lambda say: run(eps, delta, dim, timing=timing), as_json)
    if result is None:
        return
    t = Table(title=f"noise of one request (units of a row's diameter; d={result['dim']}, G={result['grid_steps']}); "
                    f"adopted: {result['adopted']}")
    for c in ("epsilon", "delta", "sigma zCDP (used)", "sigma Gaussian PLD", "ratio", "noise saved",
              "OpenDP eps for rho") + (("release ms CSPRNG", "release ms PCG64") if timing else ()):
        t.add_column(c, justify="right")
    for r in result["rows"]:
        t.add_row(f"{r['epsilon']:g}", f"{r['delta']:g}", f"{r['sigma_zcdp']:.4f}", f"{r['sigma_pld']:.4f}",
                  f"{r['ratio']:.4f}", f"{r['noise_saved']:.1%}", f"{r['opendp_epsilon']:.6f}",
                  *((f"{r['release_ms_csprng']:.2f}", f"{r['release_ms_pcg64']:.2f}") if timing else ()))
    Console().print(t)
    err.print(f"not adopted for the discrete release: {result['why_not_pld']}")
