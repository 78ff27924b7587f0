"""The figures of one stream of ``pm-vector bench writes`` (:mod:`pm_vector.bench.writes_bench`, whose
module doc names each key): :func:`summarise` turns what :func:`~pm_vector.bench.writes_bench.drive`
recorded into one system's figures, and :func:`writer_rates` splits the writer's commits a second
into the time a merge of the system's was building and the time between merges.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pct(v, q: float, scale: float = 1.0, nd: int = 3):
    """The ``q``-th percentile of ``v`` times ``scale``, rounded to ``nd`` places (None when empty)."""
    return round(scale * float(np.percentile(np.asarray(v, np.float64), q)), nd) if len(v) else None


def writer_rates(commit_t: list[float], start: float, end: float, spans: list[tuple[float, float]]) -> dict[str, Any]:
    """The writer's commits a second inside and outside ``spans`` (a system's merges: each run of the
    collection from its ``started_at`` to its ``finished_at``, on the clock of ``commit_t``), over the
    stream's window ``[start, end]``: ``merging_s`` (the window's seconds inside a span),
    ``writer_while_merging`` and ``writer_between`` (commits there over those seconds; None where
    fewer than 1 s), and ``merges`` (the spans that meet the window). Spans that overlap count once."""
    cut = sorted((max(a, start), min(b, end)) for a, b in spans if b > start and a < end)
    merged: list[list[float]] = []
    for a, b in cut:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    inside_s = sum(b - a for a, b in merged)
    t = np.asarray([x for x in commit_t if start <= x <= end], np.float64)
    inside = int(sum(np.count_nonzero((t >= a) & (t < b)) for a, b in merged))
    outside_s = (end - start) - inside_s
    return {"merges": len(cut), "merging_s": round(inside_s, 1),
            "writer_while_merging": round(inside / inside_s, 1) if inside_s >= 1.0 else None,
            "writer_between": round((t.size - inside) / outside_s, 1) if outside_s >= 1.0 else None}


def summarise(target, raw: dict[str, Any], rate: float, seconds: float) -> dict[str, Any]:
    """One system's figures of one stream (module doc)."""
    seen, committed, t0 = raw["seen"], raw["committed"], raw["t0"]
    outside = raw.get("outside", [])
    delays = [c.seen_t - c.commit_t for c in seen]
    checked = sum(1 for c in committed if c.checked)
    kinds = ("insert", "update", "delete")
    by_kind = {k: pct([c.seen_t - c.commit_t for c in seen if c.kind == k], 99, nd=2) for k in kinds}
    ids = {id(c) for c in seen + outside}
    missed = {k: sum(1 for c in committed if c.checked and c.kind == k and id(c) not in ids) for k in kinds}
    # a change is done when seen, or found placed outside its cell's answer (module doc)
    done = [c.seen_t for c in seen] + [c.outside_t for c in outside]
    first, last = min(done, default=0.0), max(done, default=0.0)
    # of the checked sample, scaled to the whole stream (1 in n_changes / checked was checked)
    sample_rate = (len(done) - 1) / (last - first) * len(committed) / checked if last > first else 0.0
    commits = len(committed) / seconds
    return {
        "rate": float(rate),
        # no system applies more than its writer committed: the sample's estimate, capped there
        "changes_per_s": round(min(sample_rate, commits), 2), "changes_per_s_sample": round(sample_rate, 2),
        "commits_per_s": round(commits, 2),
        "delay_p50_s": pct(delays, 50), "delay_p99_s": pct(delays, 99), "delay_max_s": pct(delays, 100),
        "delay_p99_s_by_kind": by_kind,
        "query_p50_ms": pct(raw["query_s"], 50, 1e3, 1), "query_p99_ms": pct(raw["query_s"], 99, 1e3, 1),
        "queries": len(raw["query_s"]),
        "n_changes": len(committed), "checked": checked, "observed": len(seen), "not_in_answer": len(outside),
        "not_in_answer_by_kind": {k: sum(1 for c in outside if c.kind == k) for k in kinds},
        "unobserved": checked - len(seen) - len(outside), "unobserved_by_kind": missed,
        "errors": len(raw["errors"]), "error_samples": raw["errors"][:3],
        "check_round_s": {"p50": pct(raw["rounds"], 50), "max": pct(raw["rounds"], 100)},
        "load_average": raw["load_average"],
        # the machine's cores busy while the stream ran and its changes were checked, and their time per change
        "cpu_busy_cores": round(raw["cpu"]["busy_s"] / max(raw["cpu"]["seconds"], 1e-9), 2),
        "cpu_ms_per_change": round(raw["cpu"]["busy_s"] * 1e3 / len(committed), 3) if committed else None,
        # the writer's commits a second while a merge of the system's built, and between merges
        "rows_after": raw.get("rows_after"),
        **writer_rates([c.commit_t for c in committed], t0, t0 + seconds, raw.get("spans", [])),
        **target.engine_figures(raw["samples"]),
    }
