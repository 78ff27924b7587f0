"""``pm-vector bench accounting``: one request's noise under its zCDP calibration against the
Gaussian's exact privacy-loss profile (table and JSON)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from .bench import run_printing, bench_app, err, fail
from ..bench.accounting import run


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
    try:
        eps = [float(e) for e in epsilons.split(",") if e.strip()]
    except ValueError:
        fail(f"--epsilons must be comma-separated numbers; got {epsilons!r}.")
    result = run_printing(lambda say: run(eps, delta, dim, timing=timing), as_json)
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
