import json

import numpy as np
from typer.testing import CliRunner

from pm_vector.cli import app

runner = CliRunner()


def test_bench_privacy_json_has_every_method_at_every_epsilon():
    r = runner.invoke(app, ["bench", "privacy", "--dataset", "digits", "--epsilons", "1,10", "--n-server", "300",
                            "--n-anchor", "100", "--n-dummy", "50", "--n-query", "20", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["dataset"] == "digits" and out["split"]["sizes"] == {"server": 300, "anchor": 100, "dummy": 50,
                                                                    "query": 20}
    got = {(x["method"], x["epsilon"]) for x in out["results"]}
    for m in ("privatemail", "privatemail_label_only", "dp_random_projection", "dp_pca"):
        assert {(m, 1.0), (m, 10.0)} <= got
    assert {("raw_knn", None), ("smlq_nonprivate", None)} <= got
    for x in out["results"]:
        assert 0 <= x["precision_at_8"] <= x["recall_at_8"] <= 1
    raw = next(x for x in out["results"] if x["method"] == "raw_knn")
    assert raw["recall_at_8"] > 0.9


def test_bench_privacy_on_user_files_and_table_output(tmp_path):
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 16)) * 3
    y = np.repeat(np.arange(3), 100)
    X = centers[y] + rng.standard_normal((300, 16))
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    r = runner.invoke(app, ["bench", "privacy", "--features", str(tmp_path / "X.npy"), "--labels",
                            str(tmp_path / "y.npy"), "--epsilons", "1"])
    assert r.exit_code == 0, r.output
    assert "privatemail_label_only" in r.stdout and "recall@8" in r.stdout


def test_bench_privacy_errors_are_clear(tmp_path):
    r = runner.invoke(app, ["bench", "privacy", "--epsilons", "0,1"])
    assert r.exit_code != 0 and "positive" in r.output
    r = runner.invoke(app, ["bench", "privacy", "--features", str(tmp_path / "missing.npy")])
    assert r.exit_code != 0 and "--labels" in r.output
    r = runner.invoke(app, ["bench", "privacy", "--dataset", "nope"])
    assert r.exit_code != 0 and "nope" in r.output


def test_bench_kahm_privacy_json_shape():
    r = runner.invoke(app, ["bench", "kahm", "--part", "privacy", "--datasets", "digits", "--max-items", "600",
                            "--noise-seed", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert "timings" not in out and out["privacy"]
    for row in out["privacy"]:
        assert row["dataset"] == "digits"
        assert {"epsilon", "n", "accuracy_def12", "accuracy_def15", "mis_def12", "mis_def15"} <= set(row)
        assert 0 <= row["accuracy_def12"] <= 1 and 0 <= row["accuracy_def15"] <= 1
    r = runner.invoke(app, ["bench", "kahm", "--part", "nope"])
    assert r.exit_code != 0 and "--part" in r.output
