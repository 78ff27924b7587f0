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

DEFAULT_SIZES = {"digits": (1000, 300, 150, 300), "fashion-mnist": (10000, 1000, 500, 500)}


def _floats(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, e.g. 0.1,1,10; got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise typer.BadParameter("epsilons must be positive numbers, e.g. 0.1,1,10")
    return vals


def fail(msg: str) -> None:
    err.print(f"[bold red]error:[/] {msg}")
    raise typer.Exit(2)


@bench_app.command("privacy")
def privacy(
    dataset: str = typer.Option("digits", help="Built-in dataset: digits or fashion-mnist."),
    features: Path = typer.Option(None, help="Your own features (.npy, rows x dims); use with --labels."),
    labels: Path = typer.Option(None, help="Your own integer labels (.npy, one per row)."),
    epsilons: str = typer.Option("0.1,1,10", help="Comma-separated epsilons."),
    delta: float = typer.Option(1e-5, help="delta of every private method."),
    n_server: int = typer.Option(None, help="Server items (default per dataset)."),
    n_anchor: int = typer.Option(None, help="Public anchor rows."),
    n_dummy: int = typer.Option(None, help="Public dummy pool."),
    n_query: int = typer.Option(None, help="Queries."),
    max_items: int = typer.Option(None, help="Subsample the dataset first (stratified)."),
    seed: int = typer.Option(0, help="Seed of the split and of every mechanism (benchmarks are reproducible)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of the table."),
):
    """Privacy-utility benchmark: PrivateMail (Algorithm 1, in memory) against its baselines.

    Example: pm-vector bench privacy --dataset digits --epsilons 0.1,1,10 --json
    """
    from ..bench.privacy_bench import BenchConfig, run
    from ..datasets import load_arrays, load_dataset, split_dataset

    eps = _floats(epsilons)
    try:
        if features is not None or labels is not None:
            if features is None or labels is None:
                fail("--features and --labels go together.")
            ds = load_arrays(features, labels)
            sizes = None
        else:
            ds = load_dataset(dataset, max_items=max_items, seed=seed)
            sizes = DEFAULT_SIZES.get(dataset)
        if sizes is None:
            n = ds.n_items
            sizes = (int(n * 0.6), max(ds.n_classes * 3, int(n * 0.15)), max(ds.n_classes, int(n * 0.05)),
                     min(500, int(n * 0.15)))
        given = (n_server, n_anchor, n_dummy, n_query)
        sizes = tuple(g if g is not None else d for g, d in zip(given, sizes))
        split = split_dataset(ds, *sizes, seed=seed)
        cfg = BenchConfig(epsilons=eps, delta=delta, seed=seed)
        if not as_json:
            err.print(f"dataset {ds.name}: {ds.n_items} items, {ds.dim} dims, {ds.n_classes} classes; split "
                      f"server/anchor/dummy/query = {sizes}, seed {seed}")
        total = 2 + 4 * len(eps)
        with Progress(console=err, transient=True, disable=not sys.stderr.isatty()) as bar:
            task = bar.add_task("benchmark", total=total)
            result = run(split, cfg, progress=lambda m, e: bar.update(task, advance=1, description=f"{m} eps={e}"))
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(result))
        return
    k = cfg.k
    t = Table(title=f"{result['dataset']}: recall/precision@{k}, delta={delta} "
                    f"(chance recall@{k} = {result[f'chance_recall_at_{k}']:.3f})")
    for c in ("method", "epsilon", f"recall@{k}", f"precision@{k}", f"mAP@{k}", "seconds"):
        t.add_column(c, justify="right" if c != "method" else "left")
    for r in result["results"]:
        t.add_row(r["method"], "-" if r["epsilon"] is None else f"{r['epsilon']:g}", f"{r[f'recall_at_{k}']:.3f}",
                  f"{r[f'precision_at_{k}']:.3f}", f"{r[f'map_at_{k}']:.3f}", f"{r['seconds']:.2f}")
    Console().print(t)
