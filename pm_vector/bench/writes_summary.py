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


def wal_bytes(conn) -> int:
    """The server's WAL written since its statistics were reset (``pg_stat_wal.wal_bytes``)."""
    return int(conn.execute("SELECT wal_bytes FROM pg_stat_wal").fetchone()[0])


#: the server's settings a stream's WAL and commits depend on (``setup.server``)
SERVER_SETTINGS = ("max_wal_size", "checkpoint_timeout", "shared_buffers", "synchronous_commit", "wal_compression",
                   "full_page_writes")


def server_settings(conn) -> dict[str, str]:
    """:data:`SERVER_SETTINGS` as the server reports them (``SHOW``)."""
    return {k: conn.execute("SELECT current_setting(%s)", [k]).fetchone()[0] for k in SERVER_SETTINGS}


def server_counters(conn) -> dict[str, int]:
    """The server's checkpoints since its statistics were reset -- ``requested`` (the WAL since the
    last one reached ``max_wal_size``, or a command asked) and ``timed`` (``checkpoint_timeout``) --
    and the full-page images in its WAL (``pg_stat_wal.wal_fpi``: the first change of a page after a
    checkpoint writes the whole page into the WAL)."""
    if conn.info.server_version >= 170000:
        req, timed = conn.execute("SELECT num_requested, num_timed FROM pg_stat_checkpointer").fetchone()
    else:  # (PostgreSQL 14 to 16: the background writer's view)
        req, timed = conn.execute("SELECT checkpoints_req, checkpoints_timed FROM pg_stat_bgwriter").fetchone()
    fpi = conn.execute("SELECT wal_fpi FROM pg_stat_wal").fetchone()[0]
    return {"requested": int(req), "timed": int(timed), "wal_fpi": int(fpi)}


def wal_figures(counters: list[dict[str, int]], wal: list[tuple[float, int]], n_changes: int) -> dict[str, Any] | None:
    """A stream's WAL, from the sampler's start to its end (the stream and its drain): the server's
    checkpoints (``checkpoints``: requested, timed), its WAL in kB and its full-page images per
    committed change (``wal_kb_per_change``, ``wal_fpi_per_change``; the whole server's: one system
    runs at a time). None without both snapshots (``counters``: :func:`server_counters` at the start
    and the end) or a change."""
    if len(counters) != 2 or n_changes <= 0:
        return None
    first, last = counters
    kb = round((wal[-1][1] - wal[0][1]) / 1e3 / n_changes, 2) if len(wal) >= 2 else None
    return {"checkpoints": {k: last[k] - first[k] for k in ("requested", "timed")},
            "wal_kb_per_change": kb, "wal_fpi_per_change": round((last["wal_fpi"] - first["wal_fpi"]) / n_changes, 3)}


def _cut(spans: list[tuple[float, float]], start: float, end: float) -> tuple[int, list[list[float]]]:
    """The spans that meet ``[start, end]`` (how many), cut to it, overlapping ones joined, in order."""
    cut = sorted((max(a, start), min(b, end)) for a, b in spans if b > start and a < end)
    merged: list[list[float]] = []
    for a, b in cut:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return len(cut), merged


def _inside(t: np.ndarray, merged: list[list[float]]) -> np.ndarray:
    """Which of the times ``t`` lie in one of the ``merged`` spans."""
    m = np.zeros(t.shape, bool)
    for a, b in merged:
        m |= (t >= a) & (t < b)
    return m


def writer_rates(commit_t: list[float], start: float, end: float, spans: list[tuple[float, float]]) -> dict[str, Any]:
    """The writer's commits a second inside and outside ``spans`` (a system's merges: each run of the
    collection from its ``started_at`` to its ``finished_at``, on the clock of ``commit_t``), over the
    stream's window ``[start, end]``: ``merging_s`` (the window's seconds inside a span),
    ``writer_while_merging`` and ``writer_between`` (commits there over those seconds; None where
    fewer than 1 s), and ``merges`` (the spans that meet the window). Spans that overlap count once."""
    n, merged = _cut(spans, start, end)
    inside_s = sum(b - a for a, b in merged)
    t = np.asarray([x for x in commit_t if start <= x <= end], np.float64)
    inside = int(np.count_nonzero(_inside(t, merged)))
    outside_s = (end - start) - inside_s
    return {"merges": n, "merging_s": round(inside_s, 1),
            "writer_while_merging": round(inside / inside_s, 1) if inside_s >= 1.0 else None,
            "writer_between": round((t.size - inside) / outside_s, 1) if outside_s >= 1.0 else None}


#: a writer is behind when its commits so far trail the schedule by more than this many seconds of the rate
BEHIND_S = 1.0


def merge_model(commit_t: list[float], start: float, end: float, spans: list[tuple[float, float]], rate: float,
                while_merging: float | None) -> dict[str, Any]:
    """The figures of the pause's model (docs/benchmarks.md, "The merges' share of the time"), over the
    window ``[start, end]`` by 1-second bins: ``writer_behind`` (``w_f``: the writer's commits a second in
    the bins that meet no merge and begin with it behind the schedule of ``rate`` by more than
    :data:`BEHIND_S`; None under 10 such bins), ``pause_bound`` (``(rate - while_merging) /
    (writer_behind - rate)``: the least pause that keeps up; 0 when the writer kept the rate while
    merging, None when it never was behind, or when no pause would do, ``"none"``) and ``cycle``
    (from the start of the window's first merge to the next one's: ``{"start_s", "seconds", "share"}``,
    the share of the rate committed in it, above 1 when the writer gained; None under two merge starts)."""
    n = int(np.floor(end - start))
    out: dict[str, Any] = {"writer_behind": None, "pause_bound": None, "cycle": None}
    if n < 1 or rate <= 0:
        return out
    edges = start + np.arange(n + 1, dtype=np.float64)
    t = np.sort(np.asarray([x for x in commit_t if start <= x <= end], np.float64))
    got = np.histogram(t, bins=edges)[0]
    before = np.concatenate([[0], np.cumsum(got)[:-1]])
    behind = before < rate * (edges[:-1] - start - BEHIND_S)
    _, merged = _cut(spans, start, end)
    meets = np.zeros(n, bool)
    for a, b in merged:
        meets |= (edges[1:] > a) & (edges[:-1] < b)
    sel = behind & ~meets
    if int(sel.sum()) >= 10:
        w_f = float(got[sel].sum()) / float(sel.sum())
        out["writer_behind"] = round(w_f, 1)
        if while_merging is not None:
            out["pause_bound"] = (0.0 if while_merging >= rate else
                                  round((rate - while_merging) / (w_f - rate), 2) if w_f > rate else "none")
    starts = sorted(a for a, _ in spans if start <= a < end)
    if len(starts) >= 2:
        a, b = starts[0], starts[1]
        done = int(np.count_nonzero((t >= a) & (t < b)))
        out["cycle"] = {"start_s": round(a - start, 1), "seconds": round(b - a, 1),
                        "share": round(done / (rate * (b - a)), 4)}
    return out


def cpu_split(timeline: list[tuple[float, dict[str, float]]], start: float, end: float,
              spans: list[tuple[float, float]]) -> dict[str, Any] | None:
    """Each part's cores busy while a merge built and between merges (the spans and window of
    :func:`writer_rates`), from :class:`~pm_vector.bench.machine.CpuParts`'s ``timeline`` (the parts'
    seconds so far at each sample, about every second): an interval between two samples counts on
    the side its midpoint falls. ``{"while_merging", "between"}``, each ``{part: cores}`` (None where
    the side has less than 1 s of intervals); None without a timeline."""
    if len(timeline) < 2:
        return None
    t = np.asarray([x for x, _ in timeline], np.float64)
    parts = list(timeline[0][1])
    c = np.asarray([[got[k] for k in parts] for _, got in timeline], np.float64)
    mid, dt, dc = (t[1:] + t[:-1]) / 2, np.diff(t), np.diff(c, axis=0)
    keep = (mid >= start) & (mid <= end)
    _, merged = _cut(spans, start, end)
    on = _inside(mid, merged)
    out: dict[str, Any] = {}
    for side, want in (("while_merging", True), ("between", False)):
        k = keep & (on == want)
        secs = float(dt[k].sum())
        out[side] = {p: round(float(dc[k, j].sum()) / secs, 3) for j, p in enumerate(parts)} if secs >= 1.0 else None
    return out


#: the width of a bucket of :func:`timeline` (s)
TIMELINE_S = 10.0


def timeline(commits: list[float], cpu: list[tuple[float, dict[str, float]]], wal: list[tuple[float, int]],
             start: float, end: float, spans: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """The stream by :data:`TIMELINE_S`-second buckets from ``start`` to ``end``: each bucket's start
    (``t``, s from ``start``), the writer's commits a second (``commits_s``: ``commits``, each commit's
    time), the share of it a merge of the system's was building (``merging``: the spans of
    :func:`writer_rates`), each part's cores busy (``cores``: :class:`~pm_vector.bench.machine.CpuParts`'s
    timeline, an interval counted in the bucket its midpoint falls in; None without two samples in
    it) and the server's WAL MB a second (``wal_mb_s``, the same way). What a merge's start, its
    switch and the seconds after it cost the writer, second by second."""
    n = max(1, int(np.ceil((end - start) / TIMELINE_S - 1e-9)))
    edges = start + TIMELINE_S * np.arange(n + 1)
    edges[-1] = end  # (the last bucket ends with the window)
    width = np.diff(edges)
    got = np.histogram(np.asarray(commits, np.float64), bins=edges)[0]
    _, merged = _cut(spans, start, end)
    merging = [sum(max(0.0, min(b, edges[i + 1]) - max(a, edges[i])) for a, b in merged) / width[i] for i in range(n)]

    def by_bucket(ts: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mid, dt, dv = (ts[1:] + ts[:-1]) / 2, np.diff(ts), np.diff(vals, axis=0)
        idx = np.searchsorted(edges, mid, side="right") - 1
        ok = (idx >= 0) & (idx < n)
        secs = np.bincount(idx[ok], weights=dt[ok], minlength=n)
        sums = np.stack([np.bincount(idx[ok], weights=dv[ok, j], minlength=n) for j in range(dv.shape[1])], axis=1)
        return secs, sums

    cores = [None] * n
    if len(cpu) >= 2:
        parts = list(cpu[0][1])
        secs, sums = by_bucket(np.asarray([x for x, _ in cpu], np.float64),
                               np.asarray([[v[k] for k in parts] for _, v in cpu], np.float64))
        cores = [{p: round(float(sums[i, j] / secs[i]), 2) for j, p in enumerate(parts)} if secs[i] >= 1.0 else None
                 for i in range(n)]
    wal_s = [None] * n
    if len(wal) >= 2:
        w = np.asarray(wal, np.float64).reshape(-1, 2)
        secs, sums = by_bucket(w[:, 0], w[:, 1:])
        wal_s = [round(float(sums[i, 0] / secs[i]) / 1e6, 1) if secs[i] >= 1.0 else None for i in range(n)]
    return [{"t": round(float(edges[i] - start), 1), "commits_s": round(float(got[i] / width[i]), 1),
             "merging": round(float(merging[i]), 2), "cores": cores[i], "wal_mb_s": wal_s[i]} for i in range(n)]


def writer_waits(txs: list[tuple[float, float, float, float]], wal: list[tuple[float, int]], start: float,
                 end: float, spans: list[tuple[float, float]]) -> dict[str, Any]:
    """Where the writer's time went while a merge built and between merges (the spans and window of
    :func:`writer_rates`): per side, the p50 / p99 of its transactions' statements and of their
    COMMIT, in ms (``txs``: the writer process's ``(commit_t, statements_s, commit_s, paced_s)``; a
    COMMIT waits for the WAL before it to be flushed); the shares of the side's seconds the writer
    spent in statements, in COMMITs and paused ahead of the stream's pace (``statements_share``,
    ``commit_share``, ``paced_share``; a transaction counts on the side its commit falls; what is
    left is the writer process's own time, its wait for a core included); and the server's WAL a
    second, in MB (``wal``: each second's ``(t, wal_bytes)``; an interval counts on the side its
    midpoint falls). None where the side has no transaction or no interval."""
    _, merged = _cut(spans, start, end)
    inside_s = sum(b - a for a, b in merged)
    tx = np.asarray([x for x in txs if start <= x[0] <= end], np.float64).reshape(-1, 4)
    w = np.asarray(wal, np.float64).reshape(-1, 2)
    mid, dt, db_ = (w[1:, 0] + w[:-1, 0]) / 2, np.diff(w[:, 0]), np.diff(w[:, 1])
    keep = (mid >= start) & (mid <= end)
    mid, dt, db_ = mid[keep], dt[keep], db_[keep]
    out: dict[str, Any] = {}
    for side, on, secs in (("while_merging", True, inside_s), ("between", False, (end - start) - inside_s)):
        t = tx[_inside(tx[:, 0], merged) == on]
        k = _inside(mid, merged) == on
        share = {f"{name}_share": round(float(t[:, i].sum()) / secs, 4) if secs >= 1.0 else None
                 for i, name in ((1, "statements"), (2, "commit"), (3, "paced"))}
        out[side] = {"transactions": int(t.shape[0]), "seconds": round(secs, 1), **share,
                     "statements_ms_p50": pct(t[:, 1], 50, 1e3), "statements_ms_p99": pct(t[:, 1], 99, 1e3),
                     "commit_ms_p50": pct(t[:, 2], 50, 1e3), "commit_ms_p99": pct(t[:, 2], 99, 1e3),
                     "wal_mb_s": round(float(db_[k].sum() / dt[k].sum()) / 1e6, 2) if dt[k].sum() > 0 else None}
    return out


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
    commit_t = [c.commit_t for c in committed]
    rates = writer_rates(commit_t, t0, t0 + seconds, raw.get("spans", []))
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
        # whose it was: the system's writer, sync and merges, the bench's queries and checks, ...
        # (pm_vector.bench.machine.CpuParts)
        **{key: {k: round(v * 1e3 / len(committed), 3) for k, v in raw["cpu"][part].items()}
           if committed and part in raw["cpu"] else None
           for key, part in (("cpu_ms_per_change_by_part", "parts"), ("cpu_ms_per_change_in_server", "server"))},
        "rows_after": raw.get("rows_after"),
        # the writer's commits a second while a merge of the system's built, and between merges
        **rates,
        # the pause's model: the writer's rate while behind between merges, the least pause, one whole cycle
        **merge_model(commit_t, t0, t0 + seconds, raw.get("spans", []), rate, rates["writer_while_merging"]),
        # whose cores were busy while merging and between (None without the parts' timeline)
        "cpu_cores_split": cpu_split(raw["cpu"].get("timeline", []), t0, t0 + seconds, raw.get("spans", [])),
        # the writer process's statements and COMMITs, and the server's WAL, while merging and between
        # (None on the API path: its writer is a thread of the bench, calling the API, not timed so)
        "writer_waits": writer_waits(raw["txs"], raw.get("wal", []), t0, t0 + seconds, raw.get("spans", []))
        if raw.get("txs") else None,
        # the stream by 10-second buckets: commits, merging, each part's cores, WAL
        "timeline": timeline(commit_t, raw["cpu"].get("timeline", []), raw.get("wal", []),
                             t0, t0 + seconds, raw.get("spans", [])),
        # the server's checkpoints during the stream, and its WAL per change (None without the snapshots)
        "wal": wal_figures(raw.get("counters") or [], raw.get("wal", []), len(committed)),
        **target.engine_figures(raw["samples"]),
    }
