import json

import numpy as np
import pytest
from typer.testing import CliRunner

from pm_vector.cli import app

runner = CliRunner()


FAST = ["--dataset", "digits", "--n-server", "400", "--n-anchor", "150", "--n-dummy", "50", "--queries", "30"]
ROW_FIELDS = {"method", "epsilon", "nn_recall_at_8", "precision_at_8", "recall_at_8", "bytes_per_request",
              "bytes_share_of_collection", "distinct_lists_per_class", "distinct_candidate_lists_per_class", "seconds"}


def test_bench_privacy_json_shape_and_inf(tmp_path):
    png = tmp_path / "curves.png"
    r = runner.invoke(app, ["bench", "privacy", *FAST, "--epsilons", "1,inf", "--shortlist", "16",
                            "--methods", "pm_vector,label_only,reference_ldp,dp_pca,raw_knn,download_all",
                            "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {"dataset", "split", "k", "shortlist", "delta", "seed", "class_ceiling", "collection_bytes",
            "results"} <= set(out)
    assert out["dataset"] == "digits" and out["k"] == 8 and out["shortlist"] == 16 and out["delta"] == 1e-5
    assert out["split"]["sizes"] == {"server": 400, "anchor": 150, "dummy": 50, "query": 30}
    assert out["collection_bytes"] == 400 * (8 + 4 * 64)
    got = {(x["method"], x["epsilon"]) for x in out["results"]}
    assert got == {(m, e) for m in ("pm_vector_raw", "reference_ldp", "dp_pca") for e in (1.0, "inf")} | {
        ("raw_knn", None), ("download_all", None), ("label_only", None)}
    for x in out["results"]:
        assert ROW_FIELDS <= set(x)
        assert 0 <= x["precision_at_8"] <= x["recall_at_8"] <= 1 and 0 <= x["nn_recall_at_8"] <= 1
    by = {(x["method"], x["epsilon"]): x for x in out["results"]}
    assert by[("raw_knn", None)]["nn_recall_at_8"] == 1.0
    # the collection as msgpack: uint32 ids and float32 features
    assert 400 * (4 + 4 * 64) < by[("download_all", None)]["bytes_per_request"] < 400 * (4 + 4 * 64) + 200
    assert by[("pm_vector_raw", "inf")]["nn_recall_at_8"] > by[("pm_vector_raw", 1.0)]["nn_recall_at_8"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plot written" in r.stderr


def test_bench_privacy_defaults_per_dataset():
    r = runner.invoke(app, ["bench", "privacy", *FAST, "--epsilons", "4", "--methods", "raw_knn", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["shortlist"] == 32  # digits default k'


def test_bench_privacy_on_user_files_and_table_output(tmp_path):
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 16)) * 3
    y = np.repeat(np.arange(3), 100)
    X = centers[y] + rng.standard_normal((300, 16))
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    r = runner.invoke(app, ["bench", "privacy", "--features", str(tmp_path / "X.npy"), "--labels",
                            str(tmp_path / "y.npy"), "--epsilons", "1,inf", "--shortlist", "16",
                            "--methods", "pm_vector,label_only,reference_ldp,raw_knn"])
    assert r.exit_code == 0, r.output
    assert "label_only" in r.stdout and "nn_recall@8" in r.stdout and "inf" in r.stdout


def test_bench_privacy_errors_are_clear(tmp_path):
    r = runner.invoke(app, ["bench", "privacy", "--epsilons", "0,1"])
    assert r.exit_code != 0 and "positive" in r.output
    r = runner.invoke(app, ["bench", "privacy", "--epsilons", "1,abc"])
    assert r.exit_code != 0 and "inf" in r.output
    r = runner.invoke(app, ["bench", "privacy", "--methods", "pm_vector,nope"])
    assert r.exit_code != 0 and "nope" in r.output
    r = runner.invoke(app, ["bench", "privacy", "--plot", str(tmp_path / "x.jpg")])
    assert r.exit_code != 0 and ".png" in r.output
    r = runner.invoke(app, ["bench", "privacy", *FAST, "--shortlist", "4", "--methods", "pm_vector"])
    assert r.exit_code != 0 and "shortlist" in r.output
    r = runner.invoke(app, ["bench", "privacy", "--features", str(tmp_path / "missing.npy")])
    assert r.exit_code != 0 and "missing.npy" in r.output.replace("\n", "")  # rich folds a long path
    r = runner.invoke(app, ["bench", "privacy", "--labels", str(tmp_path / "y.npy")])
    assert r.exit_code != 0 and "--features" in r.output
    r = runner.invoke(app, ["bench", "privacy", *FAST, "--partitions", "5"])
    assert r.exit_code != 0 and "without labels" in r.output
    r = runner.invoke(app, ["bench", "privacy", "--dataset", "nope"])
    assert r.exit_code != 0 and "nope" in r.output


def test_bench_privacy_code_bytes():
    r = runner.invoke(app, ["bench", "privacy", *FAST, "--n-anchor", "300", "--n-server", "300", "--epsilons", "4",
                            "--code-bytes", "16", "--code-widths", "", "--methods", "pm_vector_compact,download_codes",
                            "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["config"]["code_bytes"] == 16 and out["config"]["code_stages"] == 2
    compact = next(x for x in out["results"] if x["method"] == "pm_vector_compact")
    assert compact["code_bytes"] == 8 and compact["release"] == "cells" and compact["bytes_per_request"] <= 50_000
    assert sorted(x["code_bytes"] for x in out["results"] if x["method"] == "download_codes") == [8, 16]
    for bad in ("7", "257"):
        r = runner.invoke(app, ["bench", "privacy", *FAST, "--code-bytes", bad])
        assert r.exit_code != 0 and "--code-bytes" in r.output
    for bad in ("16", "64,64", "x"):  # not above the residual 32 bytes, twice, not a number
        r = runner.invoke(app, ["bench", "privacy", *FAST, "--code-widths", bad])
        assert r.exit_code != 0 and "--code-widths" in r.output
    # an anchor too small for 256 centroids per sub-quantiser: the compact methods say why, the rest run
    r = runner.invoke(app, ["bench", "privacy", *FAST, "--epsilons", "4", "--methods", "pm_vector_compact,raw_knn",
                            "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert "256" in out["skipped"]["pm_vector_compact"] and [x["method"] for x in out["results"]] == ["raw_knn"]


@pytest.mark.slow
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


def _blobs(tmp_path, n=600, labels=True):
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((4, 16)) * 3
    y = np.repeat(np.arange(4), n // 4)
    np.save(tmp_path / "X.npy", centers[y] + rng.standard_normal((n, 16)))
    if labels:
        np.save(tmp_path / "y.npy", y)


def test_bench_privacy_max_items_applies_to_own_features(tmp_path):
    _blobs(tmp_path)
    r = runner.invoke(app, ["bench", "privacy", "--features", str(tmp_path / "X.npy"), "--labels",
                            str(tmp_path / "y.npy"), "--max-items", "200", "--epsilons", "4", "--shortlist", "8",
                            "--methods", "raw_knn", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["split"]["n_items"] == 200


def test_bench_privacy_without_labels_uses_public_partitions(tmp_path):
    _blobs(tmp_path, labels=False)
    r = runner.invoke(app, ["bench", "privacy", "--features", str(tmp_path / "X.npy"), "--partitions", "6",
                            "--epsilons", "4,inf", "--shortlist", "16", "--json",
                            "--methods", "pm_vector,pm_vector_cells,label_only,partition_only,raw_knn"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["classes"] == 6 and "partitions" in out["labels"]
    got = {(x["method"], x["epsilon"]) for x in out["results"]}
    assert ("partition_only", None) in got and ("pm_vector_cells", 4.0) in got
    assert not any(m == "label_only" for m, _ in got)
    # a labelled set with --unlabeled: the same, its labels dropped
    r = runner.invoke(app, ["bench", "privacy", *FAST, "--unlabeled", "--epsilons", "4", "--json",
                            "--methods", "pm_vector,partition_only"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["classes"] == 10 and {x["method"] for x in out["results"]} == {"pm_vector_raw", "partition_only"}


def test_bench_resolve_refuses_bad_options_before_building_anything():
    """`bench resolve` checks its options first: `error: ...`, exit 2, no traceback, nothing built."""
    for args, says in ((["--items", "10"], "items"), (["--reports", "0"], "reports"),
                       (["--items", "2000", "--delta-changes", "3000"], "more than"),
                       (["--epsilon", "0"], "epsilon")):
        r = runner.invoke(app, ["bench", "resolve", *args])
        assert r.exit_code == 2 and "error:" in r.output and says in r.output, (args, r.output)
        assert "Traceback" not in r.output
