"""``pm-vector bench merge``: a plain single-row writer beside real merges of a collection, at the
three priorities (:mod:`pm_vector.bench.merge_bench`)."""

from __future__ import annotations

import os
import sys

import psutil
from typer.testing import CliRunner


def test_bench_merge_times_a_writer_beside_three_real_merges(db, digits_collection, conn, tmp_path):
    """Each phase merged the collection into a new run (the last one active) while the writer
    committed; only the background phase's sessions took SCHED_IDLE; the control's busy processes
    ran at SCHED_IDLE and are gone; the disk controls ran with the writer counted, and their
    processes and files are gone; every phase timed the writer's COMMITs; the scratch table is gone."""
    from pm_vector.bench.merge_bench import run
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    cname = digits_collection
    first = db.run_embedding_job(cname, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)["run_id"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    res = run(cname, dim=8, alone_s=2.0, scratch_dir=str(scratch), load_mb=4)
    runs = [res[p]["run_id"] for p in ("normal", "process_idle", "background")]
    assert first < runs[0] < runs[1] < runs[2]
    assert conn.execute("SELECT active_run_id FROM pm_vector.collections WHERE name = %s",
                        [cname]).fetchone()[0] == runs[2]
    assert res["alone"]["median"] > 0 and all(res[p]["writer"]["seconds"] >= 1 for p in ("normal", "background"))
    assert all(res[p]["wal_mb"] > 0 and res[p]["wal_fpi"] >= 0 for p in ("normal", "process_idle", "background"))
    assert res["normal"]["nice"] == 0 and res["normal"]["idle"] is False
    # the control: the writer counted beside a busy process per core (no merge), none left running
    assert res["idle_load"]["processes"] == os.cpu_count() and res["idle_load"]["writer"]["seconds"] >= 1
    # the second: a busy process per background CPU, confined there (more than one CPU)
    if (os.cpu_count() or 1) > 1:
        b = res["background_load"]
        assert b["cpus"] and b["processes"] == len(b["cpus"]) < os.cpu_count() and b["writer"]["seconds"] >= 1
    assert not [p for p in psutil.process_iter(["cmdline"]) if "sched_setaffinity" in " ".join(p.info["cmdline"] or [])]
    assert res["normal"]["sessions_idle"] == 0 and res["process_idle"]["sessions_idle"] == 0
    # the disk's controls: each with the writer counted beside it; nothing of theirs left
    for mode in ("flush", "writeback"):
        d = res[f"{mode}_load"]
        assert d["mode"] == mode and d["mb"] == 4 and d["running"] is True and d["writer"]["seconds"] >= 1
    assert list(scratch.iterdir()) == []
    assert not [p for p in psutil.process_iter(["cmdline"]) if "os.fsync" in " ".join(p.info["cmdline"] or [])]
    # every phase's COMMITs timed: ordered quantiles, within what the phase's seconds allow
    for w in [res["alone"], res["idle_load"]["writer"], res["flush_load"]["writer"],
              *(res[p]["writer"] for p in ("normal", "process_idle", "background"))]:
        c = w["commit_ms"]
        assert 0 < c["p50"] <= c["p99"] <= c["max"] and 0 < c["mean"] <= c["max"] < 1e3 * (w["seconds"] + 1)
    if sys.platform.startswith("linux"):
        assert res["idle_load"]["idle"] is True
        assert not [p for p in psutil.process_iter(["cmdline"]) if "sched_setscheduler" in " ".join(p.info["cmdline"] or [])]
        assert res["process_idle"]["idle"] is True and res["background"]["sessions_idle"] >= 1
    assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'bench_merge_writer_%'").fetchone()[0] == 0


def test_bench_merge_refuses_a_collection_without_a_run(db, cname):
    """No active run: ``error: ...`` naming the fix, no traceback, a non-zero exit."""
    from pm_vector.cli import app

    db.create_collection(cname, 4, [0, 1])
    r = CliRunner().invoke(app, ["bench", "merge", cname, "--alone-seconds", "2"])
    assert r.exit_code != 0
    assert "error:" in r.output and "pm-vector embed" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["bench", "merge", cname + "_missing", "--alone-seconds", "2"])
    assert r.exit_code != 0 and "error:" in r.output and "Traceback" not in r.output


def test_the_writers_commit_times_are_read_per_window():
    """``commit_ms`` holds the COMMITs that returned inside the window, and only those."""
    from psycopg import sql

    from pm_vector.bench.merge_bench import _Writer

    w = _Writer("", sql.Identifier("unused"), 1)
    w.seconds = [(10.0 + s, 100) for s in range(1, 6)]
    for i in range(1, 101):  # 100 COMMITs of 1..100 ms inside [10, 15]
        w.commit_at.append(10.0 + i * 0.04)
        w.commit_s.append(i / 1e3)
    for t in (9.0, 16.0):  # two slow ones outside it
        w.commit_at.append(t)
        w.commit_s.append(5.0)
    c = w.between(10.0, 15.0)["commit_ms"]
    assert c["max"] == 100.0 and c["mean"] == 50.5 and c["p50"] == 50.5 and 99.0 < c["p99"] < 100.0
    assert w.between(20.0, 30.0) == {"seconds": 0}
    w.seconds.append((17.0, 1))
    assert w.between(15.5, 17.0)["commit_ms"] == {"mean": 5000.0, "p50": 5000.0, "p99": 5000.0, "max": 5000.0}


def test_bench_merge_refuses_a_scratch_dir_that_is_not_one(tmp_path):
    """``--scratch-dir`` must be a directory: ``error: ...`` naming the fix, before any merge."""
    from pm_vector.cli import app

    r = CliRunner().invoke(app, ["bench", "merge", "any", "--scratch-dir", str(tmp_path / "none")])
    assert r.exit_code == 2 and "error:" in r.output and "--scratch-dir" in r.output and "Traceback" not in r.output
