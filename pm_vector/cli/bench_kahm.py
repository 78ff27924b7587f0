"""``pm-vector bench kahm``: the KAHM roles' accuracy, membership-inference score and cost (table and
JSON); registered on the ``bench`` group after ``scale`` (:mod:`pm_vector.cli`)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from .bench import run_printing, bench_app, fail
from ..bench.anchor_bench import ANCHOR_SIZES, run_anchor_benchmark
from ..bench.kahm_bench import run_kahm_benchmark
from ..bench.kahm_roles_bench import run_federation_benchmark, run_scores_benchmark


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
    result = run_printing(lambda say: run_kahm_benchmark(part, names, max_items=max_items, repeats=repeats,
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
    result = run_printing(lambda say: run_anchor_benchmark(names, anchor_epsilons=eps, units=units,
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
    if part == "federation":
        ds = names[0] if len(names) == 1 else "mnist"
        try:
            eps = [float(e) for e in epsilons.split(",") if e.strip()]
        except ValueError:
            fail(f"--anchor-epsilons must be comma-separated numbers; got {epsilons!r}.")
        result = run_printing(lambda say: run_federation_benchmark(ds, epsilons=eps, seed=seed, noise_seed=noise_seed,
                                                                    progress=say), as_json)
    else:
        ds = names[0] if len(names) == 1 else "fashion-mnist"
        result = run_printing(lambda say: run_scores_benchmark(ds, seed=seed, progress=say), as_json)
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
