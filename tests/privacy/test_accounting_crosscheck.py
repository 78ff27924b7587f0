"""The request's calibration against the audited libraries: OpenDP's zCDP-to-(eps, delta)
conversion certifies the rho the release uses, Google's dp-accounting gives the project's analytic
Gaussian, and `pm-vector bench accounting` reports the noise the release really adds."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from pm_vector.bench.accounting import opendp_epsilon, run
from pm_vector.cli import app
from pm_vector.privacy.class_rows import ClassRowsGaussianMechanism, unit_noise_scale
from pm_vector.privacy.discrete import zcdp_rho_for, zcdp_to_delta


@pytest.mark.parametrize("eps,delta", [(0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-5), (16.0, 1e-5), (8.0, 1e-9)])
def test_opendp_certifies_the_release_rho(eps, delta):
    rho = zcdp_rho_for(eps, delta)
    e = opendp_epsilon(rho, delta)
    assert e <= eps * (1 + 1e-9)          # the audited conversion certifies the target
    assert e >= eps * (1 - 1e-4)          # and ours is not looser than it
    assert opendp_epsilon(rho * 1.01, delta) > eps  # a larger rho would not be certified
    assert zcdp_to_delta(rho, eps) <= delta


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0, 16.0])
def test_dp_accounting_gaussian_matches_the_analytic_gaussian(eps):
    import dp_accounting

    assert math.isclose(dp_accounting.get_sigma_gaussian(eps, 1e-5) * math.sqrt(2), unit_noise_scale(eps, 1e-5),
                        rel_tol=1e-6)


def test_bench_accounting_reports_the_release_noise():
    out = run((1.0, 4.0, 16.0), 1e-5, 16)
    assert out["adopted"] == "zcdp"
    for r in out["rows"]:
        m = ClassRowsGaussianMechanism(r["epsilon"], 1e-5, np.ones(3), 16)
        assert r["sigma_zcdp"] == m.noise_scale_
        assert math.isclose(r["sigma_pld"], r["sigma_pld_check"], rel_tol=1e-6)
        assert 1.0 < r["ratio"] < 1.15 and r["opendp_epsilon"] <= r["epsilon"]
    res = CliRunner().invoke(app, ["bench", "accounting", "--epsilons", "1,16", "--json"])
    assert res.exit_code == 0, res.output
    assert [r["epsilon"] for r in json.loads(res.stdout)["rows"]] == [1.0, 16.0]
    bad = CliRunner().invoke(app, ["bench", "accounting", "--delta", "0"])
    assert bad.exit_code == 2
    timed = CliRunner().invoke(app, ["bench", "accounting", "--epsilons", "1", "--dim", "4", "--timing", "--json"])
    assert timed.exit_code == 0, timed.output
    row = json.loads(timed.stdout)["rows"][0]
    assert row["release_ms_csprng"] > 0 and row["release_ms_pcg64"] > 0
