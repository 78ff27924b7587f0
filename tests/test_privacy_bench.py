"""`bench privacy` in memory: every method answers, the figures order as they must, the plot is a PNG."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pm_vector.bench.metrics import collection_bytes, wire_answer_bytes, wire_bytes
from pm_vector.bench.privacy_bench import (DEFAULT_METHODS, METHODS, BenchConfig, epsilon_json, parse_epsilons,
                                           parse_methods, plot, run)
from pm_vector.datasets import load_dataset, split_dataset
from pm_vector.errors import InvalidInputError

K, KP = 8, 32


@pytest.fixture(scope="module")
def split():
    # the digits default split with fewer queries (fast)
    return split_dataset(load_dataset("digits"), 1000, 300, 150, 80, seed=0)


@pytest.fixture(scope="module")
def result(split):
    cfg = BenchConfig(epsilons=(1.0, 16.0, math.inf), k=K, shortlist=KP, seed=0, methods=METHODS)
    return run(split, cfg)


def rows(result, method):
    return {r["epsilon"]: r for r in result["results"] if r["method"] == method}


def test_every_method_at_every_epsilon(result):
    got = {(r["method"], r["epsilon"]) for r in result["results"]}
    levels = sorted({r["n_cells"] for r in result["results"] if r.get("release") == "cells"})
    for m in METHODS:
        if m in ("raw_knn", "download_all", "label_only"):
            assert (m, None) in got
        elif m in ("download_lists", "download_codes"):
            assert (m, 0.0) in got
        elif m != "partition_only":  # a labelled collection has label_only instead
            assert {(m, 1.0), (m, 16.0), (m, "inf")} <= got
    assert not any(m == "partition_only" for m, _ in got)
    # one row per level for download_lists, per code width for download_codes (digits, 64 features: the
    # residual 16 and 32 bytes and the 64-byte table)
    assert len(result["results"]) == (len(METHODS) - 6) * 3 + 3 + len(levels) + 3
    assert "privatemail_paper" not in DEFAULT_METHODS and "pm_vector_cells" in DEFAULT_METHODS
    for key in ("dataset", "split", "k", "shortlist", "delta", "seed", "class_ceiling", "collection_bytes", "results"):
        assert key in result
    assert result["k"] == K and result["shortlist"] == KP and result["dataset"] == "digits"
    assert result["collection_bytes"] == collection_bytes(1000, 64)
    for r in result["results"]:
        for key in ("nn_recall_at_8", "precision_at_8", "recall_at_8", "distinct_lists_per_class",
                    "distinct_candidate_lists_per_class"):
            assert 0.0 <= r[key] <= 1.0, (r["method"], key, r[key])
        assert r["precision_at_8"] <= r["recall_at_8"]
        assert r["bytes_per_request"] == pytest.approx(r["request_bytes"] + r["response_bytes"])
        assert r["bytes_share_of_collection"] == pytest.approx(r["bytes_per_request"] / result["collection_bytes"])
        assert r["seconds"] >= 0


def test_non_private_references(result):
    raw = rows(result, "raw_knn")[None]
    assert raw["nn_recall_at_8"] == 1.0
    assert raw["precision_at_8"] == pytest.approx(result["class_ceiling"])
    dl = rows(result, "download_all")[None]
    assert dl["nn_recall_at_8"] == 1.0
    # every item's uint32 id and float32 features, as msgpack
    assert dl["bytes_per_request"] == wire_answer_bytes(1, 1000, dim=64)
    assert dl["bytes_share_of_collection"] == pytest.approx(1.0, abs=0.02)


def test_pm_vector_orders(result):
    pm = rows(result, "pm_vector_raw")
    lo = rows(result, "label_only")
    # the noise-free endpoint is far above eps = 1 (digits: ~0.99 vs ~0.5)
    assert pm["inf"]["nn_recall_at_8"] > pm[1.0]["nn_recall_at_8"] + 0.2
    assert pm["inf"]["nn_recall_at_8"] > 0.9
    # the query's features add to what the label alone gives (up to sampling noise at 80 queries)
    for e in (1.0, 16.0, "inf"):
        assert pm[e]["nn_recall_at_8"] >= lo[None]["nn_recall_at_8"] - 0.05, e
    # at eps = 1 the server's answer hardly depends on the features (class hubs), at inf it does
    assert pm["inf"]["distinct_candidate_lists_per_class"] > lo[None]["distinct_candidate_lists_per_class"]
    # the label alone: one list per class
    assert lo[None]["distinct_candidate_lists_per_class"] == pytest.approx(
        np.mean([1 / n for n in np.bincount(result_labels(result)) if n]))
    # k' candidates for each of the 10 class rows, each a uint32 id plus 64 float32 features, as msgpack
    assert pm[1.0]["response_bytes"] == wire_answer_bytes(10, KP, dim=64)
    assert 10 * KP * (4 + 64 * 4) < pm[1.0]["response_bytes"] < 10 * KP * (4 + 64 * 4) + 600


def test_label_free_and_reference(result):
    lf = result["label_free_classifier"]
    assert 0.8 <= lf["accuracy"] <= 1.0
    for r in rows(result, "pm_vector_label_free").values():
        assert r["classifier_accuracy"] == lf["accuracy"]
    ref = rows(result, "reference_ldp")
    assert ref["inf"]["nn_recall_at_8"] > ref[1.0]["nn_recall_at_8"]
    assert ref["inf"]["precision_at_8"] == 1.0  # ranks within the query's class only
    # more epsilon, less noise
    assert ref[16.0]["noise_sigmas"][0] < ref[1.0]["noise_sigmas"][0]


@pytest.mark.slow
def test_reproducible(split):
    cfg = BenchConfig(epsilons=(4.0,), k=K, shortlist=KP, seed=3, methods=("pm_vector_compact", "pm_vector",
                                                                          "pm_vector_cells", "reference_ldp"))
    a, b = run(split, cfg), run(split, cfg)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in a["results"]]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in b["results"]]


def test_parse_epsilons_and_methods():
    assert parse_epsilons("1,4,16,inf") == (1.0, 4.0, 16.0, math.inf)
    assert parse_epsilons(" 0.5 , INF ") == (0.5, math.inf)
    for bad in ("0,1", "-1", "abc", "", "nan"):
        with pytest.raises(InvalidInputError):
            parse_epsilons(bad)
    assert epsilon_json(math.inf) == "inf" and epsilon_json(None) is None and epsilon_json(2) == 2.0
    assert parse_methods("raw_knn,pm_vector") == ("pm_vector_raw", "raw_knn")  # table order; an alias
    assert parse_methods(None) == DEFAULT_METHODS
    with pytest.raises(InvalidInputError, match="nope"):
        parse_methods("pm_vector,nope")


def test_bad_shortlist(split):
    with pytest.raises(InvalidInputError, match="k' "):
        run(split, BenchConfig(epsilons=(1.0,), k=8, shortlist=4, methods=("pm_vector",)))


def test_plot_writes_png(result, tmp_path):
    out = tmp_path / "curves.png"
    plot(result, out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_without_inf_or_non_private(split, tmp_path):
    res = run(split, BenchConfig(epsilons=(2.0,), k=K, shortlist=KP, methods=("reference_ldp",)))
    out = tmp_path / "one.png"
    plot(res, out)
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert np.isfinite(res["results"][0]["nn_recall_at_8"])


def test_the_compact_answer_has_the_rule_s_shape_and_fits_the_budget(result):
    from pm_vector.manifold.codes import compact_answer_shape

    compact, raw = rows(result, "pm_vector_compact"), rows(result, "pm_vector_raw")
    for eps in (1.0, 16.0, "inf"):
        r = compact[eps]
        e = math.inf if eps == "inf" else eps
        assert (r["k_prime"], r["code_bytes"]) == compact_answer_shape(10, r["release"], e, (32, 64))
        assert r["release"] == raw[eps]["release"]
        # the wire: request and answer (uint32 ids and code prefixes of every row), both directions
        assert r["bytes_per_request"] <= 50_000
        assert r["response_bytes"] > 10 * r["k_prime"] * (4 + r["code_bytes"])
    # the cell release takes many candidates with the first stage, the Gaussian's endpoint the whole code
    assert compact[1.0]["code_bytes"] == 32 and compact["inf"]["code_bytes"] == 64
    assert compact[1.0]["k_prime"] > compact["inf"]["k_prime"]
    # digits (64 features): the compact answer's candidates more than make up for the coding loss
    assert compact["inf"]["nn_recall_at_8"] > 0.85 and compact[16.0]["nn_recall_at_8"] > 0.8


def test_download_codes_is_every_code_and_the_codebooks(result):
    dc = {r["code_bytes"]: r for r in result["results"] if r["method"] == "download_codes"}
    assert sorted(dc) == [16, 32, 64]
    for b, r in dc.items():
        assert r["epsilon"] == 0.0 and r["delta"] == 0.0
        # 1,000 items' uint32 ids and codes, plus the codebooks (mean, rotation, float32 centroids: the
        # residual stages of a prefix, or the one table of 64 one-dimensional sub-quantisers)
        books = 4 * (64 + 64 * 64 + (b // 16 if b <= 32 else 1) * 256 * 64)
        assert 1000 * (4 + b) + books < r["bytes_per_request"] < 1000 * (4 + b) + books + 1000
    assert dc[64]["nn_recall_at_8"] > dc[32]["nn_recall_at_8"]
    # the crossover: how many compact requests cost one download
    cross = {(c["method"], c.get("code_bytes")): c for c in result["crossover"]}
    per = max(r["bytes_per_request"] for r in result["results"] if r["method"] == "pm_vector_compact")
    assert cross[("download_codes", 64)]["requests"] == pytest.approx(dc[64]["bytes_per_request"] / per)
    assert cross[("download_codes", 64)]["requests_without_codebooks"] == pytest.approx(
        (dc[64]["bytes_per_request"] - dc[64]["codebook_bytes"]) / per)
    # a prefix needs its residual stages (two for 32 bytes), the 64-byte table only its own centroids
    assert dc[16]["codebook_bytes"] < dc[32]["codebook_bytes"] and dc[64]["codebook_bytes"] < dc[32]["codebook_bytes"]
    assert dc[64]["codebook_bytes"] < dc[64]["bytes_per_request"]


# --------------------------------------------------------------------------- the cell release in the benchmark
def test_rows_say_their_release_and_delta(result):
    for r in result["results"]:
        if r["method"] in ("pm_vector_cells",) and r["epsilon"] != "inf":
            assert r["release"] == "cells" and r["delta"] == 0.0 and r["n_cells"] in result["cell_levels"]
        if r["method"] == "pm_vector_gaussian" and r["epsilon"] != "inf":
            assert r["release"] == "gaussian" and r["delta"] == result["delta"]
        if r["epsilon"] == "inf" or r["method"] == "raw_knn":
            assert r["delta"] is None
        if r["method"] in ("download_all", "download_lists", "download_codes"):
            assert r["delta"] == 0.0
    pm, cells = rows(result, "pm_vector_raw"), rows(result, "pm_vector_cells")
    # the default rule: the cell release at the eps a user picks, the Gaussian's noise-free endpoint
    assert pm[1.0]["release"] == "cells" and pm[16.0]["release"] == "cells" and pm["inf"]["release"] == "gaussian"
    assert pm[16.0]["nn_recall_at_8"] == cells[16.0]["nn_recall_at_8"]
    # at eps 16 the cell release finds the query inside its class: far above the Gaussian release
    assert cells[16.0]["nn_recall_at_8"] > rows(result, "pm_vector_gaussian")[16.0]["nn_recall_at_8"] + 0.1


def test_download_lists_is_the_true_cell_at_eps_zero(result):
    cells = rows(result, "pm_vector_cells")
    dl = {r["n_cells"]: r for r in result["results"] if r["method"] == "download_lists"}
    inf_level = cells["inf"]["n_cells"]
    assert inf_level in dl
    # the table's list at the true cell is the eps = inf answer of the cell release
    assert dl[inf_level]["nn_recall_at_8"] == cells["inf"]["nn_recall_at_8"]
    for K, r in dl.items():
        assert r["epsilon"] == 0.0 and r["table_lists"] == 10 * K
        # the table: every listed item once (uint32 id and features) and C K lists of k' ids, as msgpack
        assert min(KP, 1000) <= r["table_items"] <= 1000
        assert r["bytes_per_request"] == wire_bytes({"item_ids": np.zeros(r["table_items"], np.uint32),
                                                     "features": np.zeros((r["table_items"], 64), np.float32),
                                                     "lists": np.zeros((10, K, KP), np.uint32)})


def test_a_method_that_cannot_run_is_skipped_and_the_others_kept():
    """A class with fewer anchor rows than the KAHM subspace needs: pm_vector_label_free is skipped
    with its reason; every other method's figures are there."""
    small = split_dataset(load_dataset("digits"), 800, 150, 150, 40, seed=0)  # ~15 anchor rows per class
    res = run(small, BenchConfig(epsilons=(4.0,), k=K, shortlist=KP, methods=(
        "pm_vector", "pm_vector_label_free", "label_only", "raw_knn")))
    assert "pm_vector_label_free" in res["skipped"] and "n+1" in res["skipped"]["pm_vector_label_free"]
    assert {r["method"] for r in res["results"]} == {"pm_vector_raw", "label_only", "raw_knn"}
    assert "label_free_classifier" not in res


def test_public_partitions_replace_the_classes(split):
    res = run(split, BenchConfig(epsilons=(4.0, math.inf), k=K, shortlist=KP, partitions=5,
                                 methods=("pm_vector", "label_only", "partition_only", "pm_vector_label_free",
                                          "raw_knn")))
    got = {r["method"] for r in res["results"]}
    assert got == {"pm_vector_raw", "partition_only", "raw_knn"}  # no label to drop, no classifier to ask
    assert res["classes"] == 5 and "partitions" in res["labels"]
    pm, po = rows(res, "pm_vector_raw"), rows(res, "partition_only")
    assert pm[4.0]["release"] == "cells" and pm[4.0]["nn_recall_at_8"] > po[None]["nn_recall_at_8"]


def test_expected_recall_is_the_mean_over_reports(split):
    """The exact expectation over the RR law, against the mean of many sampled runs."""
    cfg = BenchConfig(epsilons=(2.0,), k=K, shortlist=KP, methods=("pm_vector_cells",))
    got = []
    for seed in range(4):
        res = run(split, BenchConfig(**{**cfg.__dict__, "seed": seed}))
        got.append(res["results"][0])
    exp = np.mean([r["expected_nn_recall_at_8"] for r in got])  # the seed also seeds the public cells
    sampled = np.mean([r["nn_recall_at_8"] for r in got])
    assert abs(sampled - exp) < 0.03, (sampled, exp)


def result_labels(result):
    counts = result["split"]["class_counts"]["query"]
    return np.repeat(np.arange(len(counts)), [counts[c] for c in counts])


def test_the_location_release_within_its_budget_and_its_exact_expectation(result):
    """pm_vector_location: one row per epsilon (the default budget), the answer within it, the
    realised recall near the exact expectation, and recall growing with eps."""
    loc = rows(result, "pm_vector_location")
    assert set(loc) == {1.0, 16.0, "inf"}
    for e, r in loc.items():
        assert r["delta"] == (None if e == "inf" else 0.0) and r["release"] == "location"
        assert r["bytes_per_request"] <= r["max_bytes"] == 50_000
        assert abs(r["nn_recall_at_8"] - r["expected_nn_recall_at_8"]) < 0.08
        assert r["expected_nn_recall_at_8"] > 0.5  # digits: 1,000 items, far above chance (8 / 1,000)
    # the noise-free endpoint of the same plan: its true cell's answer
    assert loc["inf"]["expected_nn_recall_at_8"] == pytest.approx(loc["inf"]["true_cell_nn_recall"])
    # the same answers re-ranked by raw features: what the codes cost (never less than the codes give
    # on these digits, and exactly the answer's share of the true 8 nearest, so at most 1)
    for r in loc.values():
        raw = r["expected_nn_recall_at_8_raw_rerank"]
        assert r["expected_nn_recall_at_8"] - 0.01 <= raw <= 1.0
