"""``pm-vector bench writes`` (pm_vector.bench.writes_bench) runs end to end, tiny: every change of the
stream is seen by its check, for pm_vector and for plain pgvector, with positive finite delays, and
the JSON has the keys the issue names; bad options fail with ``error:`` before anything is built."""

from __future__ import annotations

import json
import math
import os

import pytest

KEYS = ("rate", "changes_per_s", "delay_p50_s", "delay_p99_s", "query_p50_ms", "query_p99_ms", "n_changes", "errors")


def _seen_all(s: dict, n_min: int) -> None:
    assert s["errors"] == 0, s["error_samples"]
    assert s["n_changes"] >= n_min and s["observed"] == s["checked"] == s["n_changes"] and s["unobserved"] == 0
    assert s["unobserved_by_kind"] == {"insert": 0, "update": 0, "delete": 0}
    assert 0 < s["delay_p50_s"] <= s["delay_p99_s"] <= s["delay_max_s"] and math.isfinite(s["delay_max_s"])
    assert s["queries"] > 0 and 0 < s["query_p50_ms"] <= s["query_p99_ms"]
    assert s["changes_per_s"] > 0
    assert s["checked"] <= 200 and s["check_round_s"]["p50"] is not None


def test_a_stream_checks_an_even_sample_and_scales_the_sustained_rate():
    from pm_vector.bench.writes_summary import summarise
    from pm_vector.bench.writes_stream import sample
    from pm_vector.bench.writes_targets import Change

    spec = [Change("insert", k, k) for k in range(600)]
    sample(spec, 200)
    assert sum(c.checked for c in spec) == 200 and [c.key for c in spec if c.checked][:3] == [0, 3, 6]
    for j, c in enumerate(spec):  # committed at 10 a second, each seen 2 s later
        c.commit_t, c.seen_t = j / 10, j / 10 + 2
    raw = {"t0": 0.0, "committed": spec, "seen": [c for c in spec if c.checked], "errors": [], "query_s": [0.01],
           "samples": [], "rounds": [0.1], "load_average": [0, 0, 0], "cpu": {"busy_s": 12.0, "seconds": 60.0}}

    class Plain:
        def engine_figures(self, samples):
            return {}

    s = summarise(Plain(), raw, 10.0, 60.0)
    assert s["changes_per_s"] == pytest.approx(10.0, rel=0.01) and s["commits_per_s"] == 10.0
    assert s["changes_per_s_sample"] == s["changes_per_s"]
    # a sample seen faster than the writer committed estimates more than was committed: capped there
    for j, c in enumerate(spec):
        c.seen_t = j / 20 + 2
    fast = summarise(Plain(), raw, 10.0, 60.0)
    assert fast["changes_per_s_sample"] == pytest.approx(20.0, rel=0.01) and fast["changes_per_s"] == 10.0
    # the machine's cores busy while the writer ran (12 s of 60: 0.2), per change (12 s over 600)
    assert s["cpu_busy_cores"] == 0.2 and s["cpu_ms_per_change"] == 20.0
    assert s["delay_p50_s"] == s["delay_p99_s"] == 2.0 and s["unobserved"] == 0 and s["checked"] == 200


def test_a_new_item_outside_its_cells_answer_is_counted_apart_not_late():
    """An insert found placed but ranked outside its cell's answer is ``not_in_answer``: done (the
    sustained rate counts it), neither a delay nor ``unobserved``."""
    from pm_vector.bench.writes_summary import summarise
    from pm_vector.bench.writes_stream import sample
    from pm_vector.bench.writes_targets import Change

    spec = [Change("insert" if j % 2 else "delete", j, j) for j in range(100)]
    sample(spec, 100)
    for j, c in enumerate(spec):  # at 10 a second; deletes seen 1 s later, inserts found outside 30 s later
        c.commit_t = j / 10
        if c.kind == "delete":
            c.seen_t = c.commit_t + 1
        else:
            c.outside_t = c.commit_t + 30
    raw = {"t0": 0.0, "committed": spec, "seen": [c for c in spec if c.kind == "delete"],
           "outside": [c for c in spec if c.kind == "insert"], "errors": [], "query_s": [0.01], "samples": [],
           "rounds": [0.1], "load_average": [0, 0, 0], "cpu": {"busy_s": 1.0, "seconds": 10.0}}

    class Plain:
        def engine_figures(self, samples):
            return {}

    s = summarise(Plain(), raw, 10.0, 10.0)
    assert s["not_in_answer"] == 50 and s["not_in_answer_by_kind"] == {"insert": 50, "update": 0, "delete": 0}
    assert s["observed"] == 50 and s["unobserved"] == 0 and s["unobserved_by_kind"]["insert"] == 0
    assert s["delay_p50_s"] == s["delay_p99_s"] == 1.0  # over the changes the answer holds only
    assert s["changes_per_s"] > 0


def test_the_writer_is_counted_apart_while_a_merge_builds_and_between_merges():
    """Commits at 5 a second inside the merges' spans and 10 outside give exactly those figures;
    overlapping spans count once, a span that starts before the window or ends after it counts its
    part inside, one outside the window not at all."""
    from pm_vector.bench.writes_summary import writer_rates

    spans = [(20.0, 40.0), (30.0, 50.0), (90.0, 130.0), (-10.0, -5.0)]
    inside = lambda t: 20 <= t < 50 or 90 <= t < 100  # noqa: E731
    ts = [j / 10 + 0.05 for j in range(1000)]
    commits = [t for t in ts if not inside(t) or round(t * 10 - 0.5) % 2 == 0]
    r = writer_rates(commits, 0.0, 100.0, spans)
    assert r["merges"] == 3 and r["merging_s"] == 40.0
    assert r["writer_while_merging"] == 5.0 and r["writer_between"] == 10.0
    none = writer_rates(commits, 0.0, 100.0, [])
    assert none == {"merges": 0, "merging_s": 0.0, "writer_while_merging": None, "writer_between": 8.0}


def test_the_writers_commits_and_the_wal_are_split_between_merges_and_the_rest():
    """writer_waits: each transaction and each second's WAL on the side of the merges' spans it falls."""
    from pm_vector.bench.writes_summary import writer_waits

    # 100 s, one merge from 40 to 60; a transaction a second: 1 ms statements and 2 ms commits outside
    # the merge, 1 ms and 20 ms inside it; the WAL: 1 MB a second outside, 10 MB a second inside
    # (paused 0.5 s before each transaction outside the merge, not inside it)
    txs = [(t + 0.5, 0.001, 0.020 if 40 <= t + 0.5 < 60 else 0.002, 0.0 if 40 <= t + 0.5 < 60 else 0.5)
           for t in range(100)]
    wal, b = [], 0
    for t in range(101):
        wal.append((float(t), b))
        b += 10_000_000 if 40 <= t < 60 else 1_000_000
    w = writer_waits(txs, wal, 0.0, 100.0, [(40.0, 60.0), (200.0, 300.0)])
    assert w["while_merging"] == {"transactions": 20, "seconds": 20.0, "statements_share": 0.001,
                                  "commit_share": 0.02, "paced_share": 0.0, "statements_ms_p50": 1.0,
                                  "statements_ms_p99": 1.0, "commit_ms_p50": 20.0, "commit_ms_p99": 20.0,
                                  "wal_mb_s": 10.0}
    assert w["between"] == {"transactions": 80, "seconds": 80.0, "statements_share": 0.001, "commit_share": 0.002,
                            "paced_share": 0.5, "statements_ms_p50": 1.0, "statements_ms_p99": 1.0,
                            "commit_ms_p50": 2.0, "commit_ms_p99": 2.0, "wal_mb_s": 1.0}
    none = writer_waits(txs, wal, 0.0, 100.0, [])
    assert none["while_merging"]["transactions"] == 0 and none["while_merging"]["commit_ms_p50"] is None
    assert none["while_merging"]["wal_mb_s"] is None and none["between"]["transactions"] == 100
    assert none["between"]["wal_mb_s"] == pytest.approx(2.8)  # (80 x 1 + 20 x 10) MB over 100 s


def test_each_parts_cores_are_split_between_merges_and_the_rest():
    """``cpu_split``: an interval of the parts' timeline counts on the side its midpoint falls; each
    part's seconds there over the side's seconds; a side under 1 s is None."""
    from pm_vector.bench.writes_summary import cpu_split

    # a sample a second over 0..10; the merge part busy 1 core while a merge builds (2..5), the writer 0.5
    # throughout, and the sync 0.2 only between merges
    tl, acc = [], {"writer": 0.0, "merge": 0.0, "sync": 0.0}
    for t in range(11):
        tl.append((float(t), dict(acc)))
        inside = 2 <= t + 0.5 <= 5
        acc = {"writer": acc["writer"] + 0.5, "merge": acc["merge"] + (1.0 if inside else 0.0),
               "sync": acc["sync"] + (0.0 if inside else 0.2)}
    got = cpu_split(tl, 0.0, 10.0, [(2.0, 5.0)])
    assert got["while_merging"] == {"writer": 0.5, "merge": 1.0, "sync": 0.0}
    assert got["between"] == {"writer": 0.5, "merge": 0.0, "sync": 0.2}
    # the window's end: intervals after it count on neither side; no merge: no side while merging
    assert cpu_split(tl, 0.0, 10.0, [])["while_merging"] is None
    assert cpu_split(tl, 0.0, 4.0, [])["between"]["sync"] == pytest.approx(0.1)  # (2 of its 4 s at 0.2)
    assert cpu_split(tl[:1], 0.0, 10.0, []) is None


def test_a_collections_merges_are_the_runs_that_built_during_the_window(db, digits_collection):
    """pm_vector's spans are its collection's runs that met the window, in epoch seconds: a job's
    run found inside a window around it, and none in a window after it."""
    import time
    from types import SimpleNamespace

    from pm_vector.bench.writes_targets import PmVectorTarget
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    t = time.time()
    db.run_embedding_job(digits_collection, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)
    spans = PmVectorTarget.busy_spans(SimpleNamespace(name=digits_collection), t - 5, time.time() + 5)
    assert len(spans) == 1 and t - 5 < spans[0][0] <= spans[0][1] < time.time() + 5
    assert PmVectorTarget.busy_spans(SimpleNamespace(name=digits_collection), time.time() + 1, time.time() + 9) == []


@pytest.mark.slow
def test_the_stream_is_cut_into_ten_second_buckets():
    """``timeline``: each bucket's commits a second, the share of it inside a merge, each part's cores
    and the WAL a second (an interval of a sampled series in the bucket its midpoint falls in); the
    last bucket runs to the window's end."""
    from pm_vector.bench.writes_summary import timeline

    # 25 s: 100 commits a second in 0..10, 50 in 10..25; a merge from 5 to 12; the writer's part 0.5
    # core throughout, the merge's 1 core from 5 to 12; 1 MB of WAL a second, 3 inside the merge
    commits = [i / 100 for i in range(1000)] + [10 + i / 50 for i in range(750)]
    cpu, acc, wal, b = [], {"writer": 0.0, "merge": 0.0}, [], 0
    for t in range(26):
        cpu.append((float(t), dict(acc)))
        wal.append((float(t), b))
        inside = 5 <= t + 0.5 <= 12
        acc = {"writer": acc["writer"] + 0.5, "merge": acc["merge"] + (1.0 if inside else 0.0)}
        b += 3_000_000 if inside else 1_000_000
    got = timeline(commits, cpu, wal, 0.0, 25.0, [(5.0, 12.0), (40.0, 50.0)])
    assert [g["t"] for g in got] == [0.0, 10.0, 20.0]
    assert [g["commits_s"] for g in got] == [100.0, 50.0, 50.0]
    assert [g["merging"] for g in got] == [0.5, 0.2, 0.0]
    assert got[0]["cores"] == {"writer": 0.5, "merge": 0.5} and got[1]["cores"] == {"writer": 0.5, "merge": 0.2}
    assert got[2]["cores"] == {"writer": 0.5, "merge": 0.0}
    assert [g["wal_mb_s"] for g in got] == [2.0, 1.4, 1.0]
    # no samples: the commits and the merges alone
    bare = timeline(commits, [], [], 0.0, 25.0, [])
    assert [g["cores"] for g in bare] == [None] * 3 and [g["merging"] for g in bare] == [0.0] * 3


def _paced(rate, end, slow):
    """A writer paced at ``rate`` over [0, end) that goes at ``slow(t)`` commits a second at most
    (the commit times: each change when due, or as soon as its slowed writer can)."""
    out, t, j = [], 0.0, 0
    while t < end:
        t = max(t + 1.0 / slow(t), j / rate)
        if t < end:
            out.append(t)
        j += 1
    return out


def test_the_pause_model_reads_the_writers_rate_while_behind_and_one_whole_cycle():
    """Merges at 10-20 s and 60-70 s: the writer goes at 50 a second while one builds and at 150 at
    most otherwise, paced at 100. So it catches up at 150 a second (not at ``writer_between``, which
    counts the paced stretches), the least pause is (100 - 50) / (150 - 100) = 1, and the cycle from
    10 s to 60 s makes up what its merge cost (share 1)."""
    from pm_vector.bench.writes_summary import merge_model, writer_rates

    spans = [(10.0, 20.0), (60.0, 70.0)]
    commits = _paced(100.0, 100.0, lambda t: 50.0 if any(a <= t < b for a, b in spans) else 150.0)
    rates = writer_rates(commits, 0.0, 100.0, spans)
    got = merge_model(commits, 0.0, 100.0, spans, 100.0, rates["writer_while_merging"])
    assert rates["writer_while_merging"] == pytest.approx(50.0, abs=1.0)
    assert rates["writer_between"] < 115.0  # mostly paced at 100
    assert got["writer_behind"] == pytest.approx(150.0, abs=2.0)
    assert got["pause_bound"] == pytest.approx(1.0, abs=0.06)
    assert got["cycle"]["start_s"] == 10.0 and got["cycle"]["seconds"] == 50.0
    assert got["cycle"]["share"] == pytest.approx(1.0, abs=0.01)
    # a writer that cannot go faster than the rate between merges: no pause keeps up
    flat = _paced(100.0, 100.0, lambda t: 50.0 if any(a <= t < b for a, b in spans) else 100.0)
    got = merge_model(flat, 0.0, 100.0, spans, 100.0, writer_rates(flat, 0.0, 100.0, spans)["writer_while_merging"])
    assert got["pause_bound"] == "none" and got["cycle"]["share"] < 0.95
    # a writer that keeps the rate throughout is never behind; one merge start gives no cycle
    even = _paced(100.0, 100.0, lambda t: 1e6)
    got = merge_model(even, 0.0, 100.0, spans[:1], 100.0, 100.0)
    assert got == {"writer_behind": None, "pause_bound": None, "cycle": None}


def test_the_streams_wal_counts_the_checkpoints_and_whole_pages_per_change():
    """``wal_figures``: the checkpoints between the two snapshots, the WAL and the full-page images per
    committed change; None without both snapshots or a change."""
    from pm_vector.bench.writes_summary import wal_figures

    a = {"requested": 10, "timed": 3, "wal_fpi": 1_000}
    z = {"requested": 14, "timed": 4, "wal_fpi": 6_000}
    got = wal_figures([a, z], [(0.0, 5_000_000), (1.0, 7_000_000), (2.0, 25_000_000)], 2_000)
    assert got == {"checkpoints": {"requested": 4, "timed": 1}, "wal_kb_per_change": 10.0, "wal_fpi_per_change": 2.5}
    assert wal_figures([a], [(0.0, 0), (1.0, 1)], 10) is None and wal_figures([a, z], [], 0) is None
    assert wal_figures([a, z], [(0.0, 0)], 10)["wal_kb_per_change"] is None


def test_bench_writes_attached_against_pgvector(db, tmp_path):
    from pm_vector.bench.writes_bench import WritesConfig, run
    from pm_vector.bench.writes_plot import plot

    out = run(WritesConfig(items=2000, dim=16, rates=(5.0,), seconds=5.0, compare_pgvector=True, anchors=300,
                           queries_concurrency=1, saturate_s=2.0, drain_s=120.0))
    json.dumps(out)  # the whole result is JSON
    pm, pg = out["pm_vector"], out["pgvector_hnsw"]
    for s in (pm, pg):
        assert set(KEYS) <= set(s) and s["rate"] == 5.0
        _seen_all(s, 20)
        # the machine's busy cores while the writer ran, and their time per change
        assert 0 < s["cpu_busy_cores"] <= os.cpu_count() and s["cpu_ms_per_change"] > 0
        # whose: every part the run had, and together the machine's busy time
        by = s["cpu_ms_per_change_by_part"]
        assert by["writer"] > 0 and by["queries"] > 0 and by["checks"] > 0
        assert sum(by.values()) == pytest.approx(s["cpu_ms_per_change"], abs=0.01 * len(by))
        # the parts' cores between merges (the whole stream when none built), each at most the machine's cores
        between = s["cpu_cores_split"]["between"]
        assert between["writer"] > 0 and all(0 <= v <= os.cpu_count() for v in between.values())
        srv = s["cpu_ms_per_change_in_server"]
        # (the queries' resolves run in their sessions' backends; the other parts' may be below a tick here)
        assert srv["queries"] > 0 and all(srv[k] <= by[k] + 0.001 for k in by if k != "other")
    # pm_vector's sync process applied its changes; pgvector has none (its sync worker is stopped first)
    assert pm["cpu_ms_per_change_by_part"]["sync"] > 0
    assert pg["cpu_ms_per_change_by_part"]["sync"] == pg["cpu_ms_per_change_by_part"]["merge"] == 0
    # the same stream for both (a writer lagging on a loaded machine may not start the last change before the end)
    assert abs(pm["n_changes"] - pg["n_changes"]) <= 2 and max(pm["n_changes"], pg["n_changes"]) == 25
    # pm_vector's engine figures: the single place of the merge's (None on main) and the sync's status
    assert "merge_s" in pm and "delta_size" in pm and pm["sync_status"]["queued_max"] >= 0
    from pm_vector.db.runs.merge import RULE  # the collection's merge rule in force: the defaults here
    assert pm["merge_rule"] == {k: d for k, (d, _, _) in RULE.items()}
    assert pm["sync_status"]["queued_end"] == 0  # every change applied when the checks ended
    assert pg["max_commits_per_s"] > 0 and pg["saturate_errors"] == 0
    # plain pgvector has no merges: the writer's whole rate is between them
    assert pg["merges"] == 0 and pg["writer_while_merging"] is None and pg["writer_between"] > 0
    # the writer process's transactions, each timed, and the server's WAL, on the side of the merges they fell
    for s in (pm, pg):
        w = s["writer_waits"]
        # (a commit that returned after the window's end is not in it)
        assert s["n_changes"] - 1 <= w["while_merging"]["transactions"] + w["between"]["transactions"] <= s["n_changes"]
        assert 0 < w["between"]["commit_ms_p50"] <= w["between"]["commit_ms_p99"] and w["between"]["wal_mb_s"] > 0
        # the writer, paced at 5 a second, spends most of the stream paused and little of it in the database
        shares = [w["between"][f"{k}_share"] for k in ("statements", "commit", "paced")]
        assert 0 < shares[0] < 0.5 and 0 <= shares[1] < 0.5 and 0.5 < shares[2] < 1 and sum(shares) <= 1.0
    assert pg["writer_waits"]["while_merging"]["transactions"] == 0
    # pm_vector's merges (if one was due) and the time they took agree, and the writer's rate is split between
    assert (pm["merging_s"] > 0) == (pm["merges"] > 0) and (pm["writer_while_merging"] is None) == (pm["merges"] == 0)
    assert (pm["writer_between"] or 0) + (pm["writer_while_merging"] or 0) > 0
    # the server's checkpoints and WAL over each stream; its settings (one server for both systems)
    for s in (pm, pg):
        assert s["wal"]["wal_kb_per_change"] > 0 and s["wal"]["wal_fpi_per_change"] >= 0
        assert min(s["wal"]["checkpoints"].values()) >= 0
        # the stream by 10 s buckets: 5 s of it, the writer's 25 commits in them
        assert len(s["timeline"]) == 1 and s["timeline"][0]["t"] == 0.0
        assert s["timeline"][0]["commits_s"] * 5.0 == pytest.approx(s["n_changes"], abs=1)
        # (the writer's part at 5 a second rounds to 0.0 cores; the checks and the queries do not)
        assert sum(s["timeline"][0]["cores"].values()) > 0 and s["timeline"][0]["wal_mb_s"] >= 0
    assert out["setup"]["server"]["max_wal_size"] and out["setup"]["server"]["full_page_writes"] in ("on", "off")
    # the collection's size the stream left: the 2,000 items and the stream's inserts less its deletes
    for s in (pm, pg):
        assert abs(s["rows_after"] - 2000) <= s["n_changes"]
    # the changes were checked in their own cell at the finest level, the plan's candidates
    st = out["setup"]["pm_vector"]
    assert st["level"] >= 2 and st["candidates"] >= 1 and st["path"] == "attached"
    plot(out, tmp_path / "w.png")
    assert (tmp_path / "w.png").stat().st_size > 1000
    # the command's second table: each system's CPU a change by part
    from rich.console import Console

    from pm_vector.bench.machine import PARTS
    from pm_vector.cli.bench_writes import _parts_table

    con = Console(width=240, record=True)
    con.print(_parts_table(out))
    text = con.export_text()
    assert all(p in text for p in PARTS) and "pm_vector" in text and "pgvector" in text
    assert f"{pm['cpu_ms_per_change_by_part']['sync']:.3f}" in text
    # nothing left behind
    assert not [c for c in db.list_collections() if c["name"].startswith("bench_writes_")]


@pytest.mark.slow
def test_bench_writes_through_the_api_from_the_command_line(db):
    from typer.testing import CliRunner

    from pm_vector.cli import app

    r = CliRunner().invoke(app, ["bench", "writes", "--items", "1000", "--dim", "16", "--rate", "4", "--seconds", "6",
                                 "--path", "api", "--anchors", "200", "--queries-concurrency", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads([line for line in r.output.splitlines() if line.startswith("{")][-1])
    assert "pgvector_hnsw" not in out and out["setup"]["pm_vector"]["path"] == "api"
    # the writer calls the API itself, one call a kind: on a loaded machine it gets through fewer than the 24
    # asked (3 of 16 in 4 s once), and says so in commits_per_s
    s = out["pm_vector"]
    _seen_all(s, 2)
    assert s["n_changes"] <= 24 and s["commits_per_s"] == round(s["n_changes"] / 6, 2)
    assert s["writer_waits"] is None  # (no writer process on the API path)


def test_bench_writes_refuses_bad_options():
    from typer.testing import CliRunner

    from pm_vector.cli import app

    r = CliRunner().invoke(app, ["bench", "writes", "--path", "elsewhere"])
    assert r.exit_code == 2 and "error:" in r.output and "path must be one of" in r.output
    r = CliRunner().invoke(app, ["bench", "writes", "--items", "200", "--rates", "50,50", "--seconds", "60"])
    assert r.exit_code == 2 and "distinct items" in r.output
    r = CliRunner().invoke(app, ["bench", "writes", "--rates", "10,x"])
    assert r.exit_code == 2 and "--rates" in r.output
    r = CliRunner().invoke(app, ["bench", "writes", "--match-pgvector"])
    assert r.exit_code == 2 and "error:" in r.output and "--compare-pgvector" in r.output


@pytest.mark.slow
def test_bench_writes_streams_at_pgvectors_saturated_rate(db):
    """--match-pgvector: pgvector's saturating phase runs first and both systems stream at the rate it
    measured; the keys its uncommitted changes took go back to the stream (none is changed twice)."""
    from pm_vector.bench.writes_bench import WritesConfig, run

    out = run(WritesConfig(items=1500, dim=16, seconds=1.0, compare_pgvector=True, anchors=200, queries_concurrency=1,
                           saturate_s=1.0, drain_s=120.0, match_pgvector=True, merge=False))
    pm, pg = out["pm_vector"], out["pgvector_hnsw"]
    assert pg["max_commits_per_s"] > 0 and out["config"]["rates"] == [pg["max_commits_per_s"]]
    assert pm["rate"] == pg["rate"] == pg["max_commits_per_s"]
    assert pm["errors"] == pg["errors"] == pg["saturate_errors"] == 0 and pm["n_changes"] > 0


@pytest.mark.slow
def test_bench_writes_reuse_keeps_the_prepared_collection_for_the_next_run(db):
    """--reuse: the first run prepares and keeps the collection and pgvector's table, the second
    reuses both (no job), streams on from the state the first left (its victims unchanged items,
    new keys after the last) and every change is seen or found outside its cell's answer."""
    from psycopg import sql

    from pm_vector.bench import writes_reuse
    from pm_vector.bench.writes_bench import WritesConfig, run

    cfg = WritesConfig(items=1000, dim=16, rates=(4.0,), seconds=4.0, compare_pgvector=True, anchors=200,
                       queries_concurrency=1, saturate_s=1.0, drain_s=120.0, reuse=True)
    name = "bench_writes_" + writes_reuse.tag(cfg)
    try:
        first = run(cfg)
        assert first["setup"]["pm_vector"]["reused"] is False and "job_s" in first["setup"]["pm_vector"]
        # the prepare's stages timed; a table just built is not read back (its state is known)
        assert {"load_s", "class_rows_s", "index_s"} <= set(first["setup"]["pm_vector"]["job_stages_s"])
        assert "state_s" not in first["setup"]["pm_vector"] and first["setup"]["pm_vector"]["victims_s"] >= 0
        assert name in [c["name"] for c in db.list_collections()]  # kept
        second = run(cfg)
        assert second["setup"]["pm_vector"]["reused"] is True and "job_s" not in second["setup"]["pm_vector"]
        assert second["setup"]["pm_vector"]["state_s"] >= 0  # the kept table's state read (binary COPY)
        assert second["setup"]["pgvector_hnsw"]["reused"] is True
        # the second run starts from the rows the first left (its rows_after), read back from the table
        assert second["setup"]["pm_vector"]["rows"] == first["pm_vector"]["rows_after"]
        assert first["setup"]["pm_vector"]["rows"] == 1000
        for s in (second["pm_vector"], second["pgvector_hnsw"]):
            assert s["errors"] == 0 and s["unobserved"] == 0, s
            assert s["observed"] + s["not_in_answer"] == s["checked"] == s["n_changes"] >= 8
    finally:
        db.drop_collection(name, missing_ok=True)
        with db.connect(autocommit=True) as c:
            for t in ("docs", "pgv"):
                c.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
                    sql.Identifier("public", f"bench_writes_{t}_{writes_reuse.tag(cfg)}")))


def test_the_stream_keeps_its_mix_when_few_items_can_be_checked():
    """The checked updates and deletes hit the victims a check can see; the others hit any other key
    (initial or not), so a kept collection whose answers hold few initial items still streams a third
    each of inserts, updates and deletes. No key is changed after its delete or after a checked
    change; an unchecked update leaves its key live for later changes, so that a stream far longer than
    the keys keeps the collection's size (inserts as many as deletes). Only a checked change carries the
    old vector's row (a check needs it; an unchecked delete of a key streamed in before has none)."""
    import numpy as np

    from pm_vector.bench.writes_stream import Stream

    victims, others = list(range(1, 41)), list(range(41, 4_000)) + list(range(6_001, 7_000))
    st = Stream(5_000, 20_000, victims, np.random.default_rng(3), next_key=8_000, others=others)
    spec = st.take(6_000, 300)
    kinds = [c.kind for c in spec]
    assert min(kinds.count(k) for k in ("insert", "update", "delete")) > 1_700  # a third each
    assert not {c.key for c in spec if c.kind == "insert"} & {c.key for c in spec if c.kind != "insert"}
    checked = [c for c in spec if c.checked]
    assert 0 < len(checked) <= 300
    assert all(c.key in victims for c in checked if c.kind != "insert")
    assert all(c.checked for c in spec if c.kind != "insert" and c.key in victims)  # (others left: 1,000 or so)
    assert st.others
    assert {c.key for c in spec if c.kind != "insert" and 6_000 < c.key < 7_000}  # keys streamed in before, too
    # (the other keys left while they last: this stream's own keys only once they ran out) then the keys
    # of this stream's unchecked inserts, each after its insert (never a checked one's)
    more = st.take(3_000, 0)
    kinds = [c.kind for c in more]
    assert min(kinds.count(k) for k in ("insert", "update", "delete")) > 800 and not st.others
    at = {c.key: j for j, c in enumerate(spec + more) if c.kind == "insert"}
    again = [(j, c) for j, c in enumerate(spec + more) if c.kind != "insert" and c.key in at]
    assert again and all(at[c.key] < j and not (spec + more)[at[c.key]].checked for j, c in again)
    # a long stream: the keys ran out long ago, and the collection keeps its size
    longer = st.take(60_000, 0)
    kinds = [c.kind for c in longer]
    assert min(kinds.count(k) for k in ("insert", "update", "delete")) > 19_000
    assert abs(kinds.count("insert") - kinds.count("delete")) < 2_000
    every = spec + more + longer
    ended = set()  # no key changed after its delete or after a checked change, nor before it was live
    for c in every:
        assert c.key not in ended
        if c.kind == "delete" or c.checked:
            ended.add(c.key)
    updated = [c.key for c in longer if c.kind == "update"]
    assert len(set(updated)) < len(updated)  # (an updated key changed again)
    assert all(c.old_row == c.key - 1 for c in checked if c.kind != "insert")
    assert all(c.old_row is None for c in spec if not c.checked)
    assert all(c.row is None for c in spec if c.kind == "delete" and not c.checked)


def test_a_phase_only_pgvector_runs_takes_no_key_from_the_streams_after_it():
    """The saturating phase (:meth:`Stream.take_apart`), however long: a third each, every update and
    delete on a key its own inserts made live; the shared pools untouched, so that the streams after
    it keep their mix and the collection its size. (Drawn from the shared keys, a phase of 600 s
    deleted nearly every key from pgvector's table and the streams after it became mostly inserts.)"""
    import numpy as np

    from pm_vector.bench.writes_stream import Stream

    live = set(range(1, 3_001))
    st = Stream(3_000, 9_000, list(range(1, 41)), np.random.default_rng(5), next_key=3_001,
                others=list(range(41, 3_001)))
    before = (list(st.victims), list(st.others), list(st.streamed))

    def walk(changes, keys: set[int], never: set[int]) -> None:
        """Each insert a fresh key (none of ``never``), each update or delete a key of ``keys`` then."""
        for c in changes:
            if c.kind == "insert":
                assert c.key not in keys and c.key not in never and c.row is not None
                keys.add(c.key)
            else:
                assert c.key in keys, c
                if c.kind == "delete":
                    keys.discard(c.key)

    ops = st.take_apart(30_000)  # ten times the table's keys
    assert not any(c.checked for c in ops) and min(c.key for c in ops) >= 3_001
    own: set[int] = set()
    walk(ops, own, live)
    kinds = [c.kind for c in ops]
    assert all(abs(kinds.count(k) - 10_000) < 600 for k in ("insert", "update", "delete"))
    assert len(own) < 1_000  # (what pgvector's table keeps of the phase: a random walk's few)
    assert (st.victims, st.others, st.streamed) == before
    later = st.take(20_000, 50)
    walk(later, live, own)
    later_kinds = [c.kind for c in later]
    assert all(abs(later_kinds.count(k) - 20_000 / 3) < 500 for k in ("insert", "update", "delete"))
    assert abs(len(live) - 3_000) < 600


def test_the_writer_process_commits_in_order_and_reports_each_transaction(db):
    """The writer in a process of its own (pm_vector.bench.writes_writer): every transaction committed
    in order and reported with its changes and commit time (after the start it was given); a failing
    one rolled back and reported, the next ones still committed; none started after ``seconds``."""
    import time

    from psycopg import sql

    from pm_vector.bench import writes_writer

    t = sql.Identifier("public", "bench_writer_probe")
    with db.connect(autocommit=True) as c:
        c.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(t))
        c.execute(sql.SQL("CREATE TABLE {} (id int PRIMARY KEY, v text)").format(t))
        todo = {"insert": sql.SQL("INSERT INTO {} (id, v) VALUES (%s, %s)").format(t).as_string(c),
                "delete": sql.SQL("DELETE FROM {} WHERE id = %s").format(t).as_string(c)}
    txs = [[("insert", [1, "a"]), ("insert", [2, "b"])], [("insert", [3, "c"]), ("insert", [1, "again"])],
           [("delete", [2])], [("insert", [4, "d"])]]
    w = writes_writer.start(db.database_url(), todo, txs, rate=40.0, seconds=60.0)
    t0 = time.perf_counter()
    w.go(t0)
    got = list(w.results())
    w.close()
    assert [m[:3] for m in got[:4]] == [("ok", 0, 2), ("error", 2, 4), ("ok", 4, 5), ("ok", 5, 6)]
    assert "UniqueViolation" in got[1][3] and got[-1][0] == "end"
    assert t0 < got[0][3] < got[2][3] < got[3][3] <= got[4][1]
    assert got[3][3] - t0 >= 5 / 40.0  # paced: the fourth transaction is due after 5 changes
    with db.connect() as c:
        assert c.execute(sql.SQL("SELECT id, v FROM {} ORDER BY id").format(t)).fetchall() == [(1, "a"), (4, "d")]
    w = writes_writer.start(db.database_url(), todo, [[("delete", [9])]] * 5, rate=1.0, seconds=0.5)
    w.go(time.perf_counter())
    got = list(w.results())
    w.close()
    assert [m[0] for m in got] == ["ok", "end"]  # due at 0 s, then at 1 s: past the stream's 0.5 s
    with db.connect(autocommit=True) as c:
        c.execute(sql.SQL("DROP TABLE {}").format(t))
