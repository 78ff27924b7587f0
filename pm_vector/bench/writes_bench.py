"""``pm-vector bench writes``: a mixed stream of writes while private queries run, for pm_vector and,
with ``compare_pgvector``, for a plain pgvector HNSW table given the same stream in the same run.

Set-up (on the configured database: the embedded PostgreSQL, or ``PM_VECTOR_DATABASE_URL``):
``items`` rows of ``dim`` unit-norm clustered gaussian data (:func:`pm_vector.bench.latency.clustered`,
keys 1..items), a public anchor set of ``anchors`` other rows of the same law, and pm_vector's
collection (:class:`~pm_vector.bench.writes_targets.PmVectorTarget`: the default job, queried by the
location release, which uses no label) written through ``path``:

* ``"attached"`` (the default: a user's own table, changed by SQL, as with plain pgvector): the
  table (with the data's 10 cluster groups as its label column: an attached table's job needs
  one) attached, the changes committed to it, the service's
  :class:`~pm_vector.service.sync_worker.SyncWorker` applying them every ``sync_interval_s`` in a
  process of its own (warmed by one change before any stream);
* ``"api"``: a collection without labels, :func:`pm_vector.db.ingest` +
  :func:`pm_vector.db.embed_new_items` (main's engine
  answers a new item only once it is placed), :func:`pm_vector.db.update_items`,
  :func:`pm_vector.db.delete_items`, called by the writer itself.

With ``reuse`` (``--reuse``, the attached path) the collection and pgvector's table are kept for the
next run of the same flags (:mod:`pm_vector.bench.writes_reuse`): the 100,000-item set-up is paid
once. With ``compare_pgvector`` the same rows in ``(id bigint PRIMARY KEY, v vector(dim))`` with an HNSW
index (``vector_l2_ops``, default options).

**The stream** (per rate of ``rates``, one after the other): ``ceil(rate * seconds)`` changes, a
third each inserts (new keys, new vectors), vector updates and deletes, drawn once and given to
each system in the same order (:mod:`pm_vector.bench.writes_stream`). The checked updates and
deletes hit items whose own cell's answer held them at set-up (so a check can see them change), and
no change hits their key again; the others hit any other key of the table, and once those ran out a
key the stream's unchecked inserts and updates made live before them (an update leaves its key
live). (Drawing every victim from the answered ones ran out on a kept collection
whose answers new items had filled: 188 of 47,171 initial items, and the stream became inserts;
drawing the others from the initial items alone ran out too, after a few streams.) The mix stays a
third each, and the collection its size. pm_vector's
writer commits ``batch`` changes a transaction (one call per kind on the API path), plain pgvector
one change a commit; change ``j`` is due at ``j / rate`` s after the start and the writer stops
starting batches after ``seconds``. Meanwhile ``queries_concurrency`` threads of this process
each send a query, pause ``query_pause_s``, and again: for pm_vector a private query of the
location release (a client's report of a random item's vector at the default plan, eps
``epsilon``, 50 kB) resolved in this process and logged, as the service resolves it; for pgvector
``ORDER BY v <-> q LIMIT 8``. The systems run one after the other, never together: before
pgvector's phases pm_vector's queue is applied and no merge of its is building
(:meth:`~pm_vector.bench.writes_targets.PmVectorTarget.quiet`; ``setup.pm_vector.quiet_before_s``),
and before every phase both systems' tables are vacuumed (:func:`_vacuum`: a phase pays its own
autovacuum, not the one before's).

**What is measured, per change** (``delay``): from the moment its transaction's commit returned
to the writer until the end of the first check that saw it. A checker thread repeats rounds over
the pending changes (a pause of ``check_pause_s`` between rounds):

* pm_vector: the location request of the changed item's own cell at the finest published level,
  with the candidates and code width of the public plan at that level (eps ``epsilon``, 50 kB),
  resolved in this process (not logged); one resolve per cell per round, oldest change first. An
  insert or update is seen when its new item is in the answer (on the attached path the item id is
  read from ``pm_vector.items``: the key's item that is not the old one), a delete when its old
  item is not. On the attached path a change is checked only once the sync has applied it (the
  queue is applied in commit order: of n changes committed, the first n - ``queued`` of
  :func:`pm_vector.db.sync_status`), so the checks do not rebuild the answers of cells whose
  changes are still queued after every sync;
* pgvector: ``ORDER BY v <-> q LIMIT 8`` with the item's own vector (the new one; the deleted one's
  for a delete) through the HNSW index, one query per pending change: seen when the key is among
  the 8 (or, for a delete, is not).

So a delay is an upper bound of the true commit-to-answer delay by at most one round of checks plus
its pause (``check_round_s`` reports the rounds). ``checkers`` threads share the cells (pgvector:
the keys); at most ``max_checked`` changes of a stream are checked, an even sample of it (every
one when fewer): each check of pm_vector builds an answer (about 0.1 s on a loaded 2-core machine
at 20,000 items), and after a sync batch of hundreds of changes checking them all would measure
the checks. **A new item outside its cell's answer** (an insert, an update's new version) is not
late: it enters its cell's answer only if it ranks within the answer's size by its estimated hub
counts (:mod:`pm_vector.db.runs.delta`), and one that does not is never seen before the merge
recounts them. So a check that finds the item placed in the active run (its items table, read
before the answer is built) and the answer without it counts the change ``not_in_answer`` (by kind
in ``not_in_answer_by_kind``), done then, outside the delays: **the delays are over the changes
the answer holds** (deletes, and new items that rank within it). Changes neither seen nor found
so ``drain_s`` after the writer stopped, or once everything is applied (``settled``: the queue
empty; always on the API path and for pgvector) and nothing was seen for ``settle_s``, are
``unobserved`` (by kind in ``unobserved_by_kind``).

**Per system and rate**: ``rate`` (asked), ``changes_per_s`` (sustained: the checked changes done --
seen, or ``not_in_answer`` -- after the first one, over the time from the first one done to the
last, times the stream's changes per checked one: what the system applied a second; as asked when
it keeps up, less when the delays grow along the stream or changes are never seen; capped at
``commits_per_s``, as no system applies more than was committed, the sample's own estimate in
``changes_per_s_sample``),
``commits_per_s`` (the changes committed over ``seconds``: what the writer got through),
``rows_after`` (the collection's items, or the table's rows, when the stream and its drain ended),
``delay_p50_s`` / ``delay_p99_s`` / ``delay_max_s`` (and p99 by kind), ``query_p50_ms`` /
``query_p99_ms`` (the queries during the stream and its drain), ``n_changes`` (committed),
``observed``, ``not_in_answer``, ``unobserved``, ``errors`` (writes, checks and queries that raised),
``merges``, ``merging_s``, ``writer_while_merging`` and ``writer_between`` (the writer's commits a second
while a merge of the system's was building -- a run of its collection, from ``started_at`` to
``finished_at`` -- and outside those spans: :func:`~pm_vector.bench.writes_summary.writer_rates`;
plain pgvector has no merges), ``writer_behind``, ``pause_bound`` and ``cycle`` (the pause's model:
:func:`~pm_vector.bench.writes_summary.merge_model`), ``writer_waits`` (on each side of those spans, the p50 / p99 of the
writer process's statements and COMMITs and the server's WAL MB a second:
:func:`~pm_vector.bench.writes_summary.writer_waits`; None on the API path), ``wal`` (the server's
checkpoints and WAL per change during the stream: :func:`~pm_vector.bench.writes_summary.wal_figures`;
its settings in ``setup.server``), ``timeline`` (the stream by 10 s buckets); pm_vector also
``delta_size`` (the delta's rows when the stream ends) and ``merge_s`` (the bulk merge of that delta,
timed after the stream: :meth:`~pm_vector.bench.writes_targets.PmVectorTarget.engine_figures`) and, on the attached path,
``sync_status`` (:func:`pm_vector.db.sync_status` sampled every second: queue length max, ``lag_s``
p50 / p99); pgvector also ``max_commits_per_s``: a saturating phase of ``saturate_s`` s after the
streams, single-row commits of the same mix as fast as one writer can, the queries running (its updates
and deletes hit keys its own inserts made: :meth:`~pm_vector.bench.writes_stream.Stream.take_apart`).

**``match_pgvector``** (``--match-pgvector``): that saturating phase runs first, and the one stream of
both systems runs at the rate it measured (``config.rates``): whether pm_vector sustains plain
pgvector's single-row commit rate, measured in the same run.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from ..errors import InvalidInputError
from .writes_stream import Stream, fresh
from .writes_summary import pct, server_counters, server_settings, summarise, wal_bytes
from .writes_pgvector import PgvectorTarget
from .writes_targets import Change, PmVectorTarget
import pm_vector.db as db
from . import writes_reuse, writes_writer
from .latency import N_FINE, clustered
from .machine import BENCH_APP, CHECK_APP, QUERY_APP, CpuParts

PATHS = ("attached", "api")
#: the interpreter's thread switch interval during a stream (Python's default is 5 ms): a check
#: thread stamps what it saw when its statement returns, and would wait up to that long for the
#: interpreter held by a query thread first (the writer has a process of its own:
#: :mod:`pm_vector.bench.writes_writer`)
SWITCH_INTERVAL_S = 0.0005


@dataclass
class WritesConfig:
    items: int = 20_000
    dim: int = 128
    rates: tuple = (10.0,)
    seconds: float = 60.0
    compare_pgvector: bool = False
    queries_concurrency: int = 2
    batch: int = 1
    path: str = "attached"
    epsilon: float = 16.0
    anchors: int = 1000
    sync_interval_s: float = 1.0  # the service's default sync_interval_s
    query_pause_s: float = 0.05
    check_pause_s: float = 0.05
    checkers: int = 2  # checker threads, each its own share of the cells (of the keys for pgvector)
    max_checked: int = 200  # the changes checked per stream, evenly spread over it (all when fewer)
    drain_s: float = 300.0
    saturate_s: float = 10.0
    settle_s: float = 30.0  # after the writer stopped and everything is applied, stop checking once nothing is seen
    seed: int = 0
    reuse: bool = False  # keep the prepared collection (and pgvector's table) for the next run of the same flags
    merge: bool = True  # time the merge of each stream's delta after it (False: merge_s None)
    match_pgvector: bool = False  # pgvector's saturating phase first; the one stream at its commits a second


def check_config(cfg: WritesConfig) -> None:
    """Refuse a configuration the benchmark cannot run, before anything is built."""
    if cfg.path not in PATHS:
        raise InvalidInputError(f"path must be one of {PATHS}; got {cfg.path!r}.")
    if cfg.reuse and cfg.path != "attached":
        raise InvalidInputError("--reuse keeps an attached table's collection: use it with --path attached.")
    if cfg.items < 200 or cfg.dim < 2 or cfg.anchors < 20:
        raise InvalidInputError("the benchmark needs at least 200 items, 2 dimensions and 20 anchors.")
    if not cfg.rates or any(not (r > 0) or math.isinf(r) for r in cfg.rates) or not cfg.seconds > 0:
        raise InvalidInputError("each rate and the seconds must be positive numbers.")
    if cfg.batch < 1 or cfg.queries_concurrency < 0 or cfg.drain_s <= 0 or cfg.saturate_s < 0 or cfg.checkers < 1 \
            or cfg.max_checked < 1:
        raise InvalidInputError("batch, checkers and max_checked must be >= 1, queries_concurrency >= 0, drain_s > 0 "
                                "and saturate_s >= 0.")
    if cfg.match_pgvector and not (cfg.compare_pgvector and cfg.saturate_s > 0):
        raise InvalidInputError("--match-pgvector streams at pgvector's saturated rate: give --compare-pgvector "
                                "and a --saturate above 0.")
    # the checked updates and deletes need initial items of their own (the others also take the keys the
    # stream inserted before them)
    need = sum(min(cfg.max_checked, math.ceil(r * cfg.seconds)) for r in cfg.rates)
    if need * 2 // 3 + 1 > cfg.items - 1:
        raise InvalidInputError(f"{need} checked changes need about {need * 2 // 3} distinct items to update or "
                                f"delete; the collection has {cfg.items}: lower --rates' count or the checks.")


def drive(target, ops: list[Change], rate: float | None, seconds: float, cfg: WritesConfig, Xq: np.ndarray,
          say: Callable[[str], None], label: str, check: bool = True) -> dict[str, Any]:
    """One stream of ``ops`` against ``target`` (module doc): a writer (paced at ``rate``, or as fast
    as it can with None), the checker (with ``check``), the query threads and a status sampler.
    Returns the raw figures."""
    lock = threading.Lock()
    pending: dict[int, Change] = {}
    committed: list[Change] = []
    seen: list[Change] = []
    outside: list[Change] = []  # placed, and not in their cell's answer (not_in_answer)
    errors: list[str] = []
    query_s: list[float] = []
    samples: list[dict] = []
    rounds: list[float] = []
    txs: list[tuple] = []  # the writer process's transactions: (commit_t, statements_s, commit_s, paced_s)
    wal: list[tuple[float, int]] = []  # the server's WAL bytes, each second: (perf_counter, pg_stat_wal.wal_bytes)
    counters: list[dict] = []  # the server's checkpoints and full-page images, at the sampler's start and end
    writer_done, stop = threading.Event(), threading.Event()
    ended: list[float] = []  # when the writer stopped
    step = 1 if target.single_row else cfg.batch
    todo = target.statements()
    proc = None
    if todo is not None:  # the writer in a process of its own (pm_vector.bench.writes_writer)
        target.stamp(ops)
        proc = writes_writer.start(db.database_url(), todo, [[(c.kind, target.params(c)) for c in ops[j:j + step]]
                                                             for j in range(0, len(ops), step)], rate, seconds)
    parts = CpuParts(db.connect(autocommit=True, application_name=BENCH_APP))
    parts.start()
    for pid, part, children in target.processes() + ([(proc.pid, "writer", None)] if proc is not None else []):
        parts.process(pid, part, children)
    t0, wall0 = time.perf_counter(), time.time()

    def done(batch: list[Change]) -> None:
        with lock:
            for c in batch:
                c.seq = len(committed)
                committed.append(c)
            if check:
                pending.update((id(c), c) for c in batch if c.checked)

    def from_process():
        try:
            proc.go(t0)
            for msg in proc.results():
                if msg[0] == "ok":
                    txs.append(msg[3:7])
                    for c in ops[msg[1]:msg[2]]:
                        c.commit_t = msg[3]
                    done(ops[msg[1]:msg[2]])
                elif msg[0] == "error":
                    errors.append(f"write: {msg[3]}")
                else:
                    ended.append(msg[1])
        finally:
            if not ended:
                ended.append(time.perf_counter())
            proc.close()
            writer_done.set()

    def writer():
        conn = target.writer()
        try:
            for j in range(0, len(ops), cfg.batch):
                if rate is not None:  # (the time left read once: it may run out between two reads)
                    time.sleep(max(0.0, t0 + j / rate - time.perf_counter()))
                if time.perf_counter() - t0 > seconds:
                    break
                b = ops[j:j + cfg.batch]
                try:
                    target.apply(conn, b)
                except Exception as exc:  # noqa: BLE001 - counted
                    errors.append(f"write: {exc}")
                    conn.rollback()
                done([c for c in b if c.commit_t is not None])
        finally:
            conn.close()
            ended.append(time.perf_counter())
            writer_done.set()

    def checker(i: int):
        conn = db.connect(application_name=CHECK_APP)
        deadline = None
        mine = lambda c: (c.cell if c.cell is not None else c.key) % cfg.checkers == i  # noqa: E731
        try:
            while True:
                with lock:
                    now, n = [c for c in pending.values() if mine(c)], len(committed)
                if stop.is_set():
                    return
                if writer_done.is_set():
                    if not now:
                        return
                    deadline = deadline or time.perf_counter() + cfg.drain_s
                    if time.perf_counter() > deadline:
                        return
                    if time.perf_counter() - max(ended + [c.seen_t for c in seen[-1:]]) > cfg.settle_s and \
                            target.settled():
                        return  # everything applied, nothing seen for settle_s: the rest will not be
                if not now:
                    time.sleep(0.02)
                    continue
                t = time.perf_counter()
                try:
                    got = target.observe(conn, now, n)
                except Exception as exc:  # noqa: BLE001 - counted
                    errors.append(f"check: {exc}")
                    conn.rollback()
                    got = []
                rounds.append(time.perf_counter() - t)
                with lock:
                    for c in got:
                        pending.pop(id(c), None)
                seen.extend(c for c in got if c.outside_t is None)
                outside.extend(c for c in got if c.outside_t is not None)
                time.sleep(cfg.check_pause_s)
        finally:
            conn.close()

    def querier(i: int):
        conn = db.connect(application_name=QUERY_APP)
        try:
            client = target.query_client(cfg.seed + 101 + i)
            rng = np.random.default_rng(cfg.seed + 31 + i)
            while not stop.is_set():
                x = Xq[int(rng.integers(Xq.shape[0]))]
                t = time.perf_counter()
                try:
                    target.query(conn, client, x)
                    query_s.append(time.perf_counter() - t)
                except Exception as exc:  # noqa: BLE001 - counted
                    errors.append(f"query: {exc}")
                    conn.rollback()
                stop.wait(cfg.query_pause_s)
        finally:
            conn.close()

    def sampler():
        conn = db.connect(autocommit=True, application_name=BENCH_APP)
        try:
            counters.append(server_counters(conn))
            while not stop.is_set():
                try:
                    wal.append((time.perf_counter(), wal_bytes(conn)))
                    samples.append(target.status())
                    parts.sample()
                except Exception as exc:  # noqa: BLE001 - counted
                    errors.append(f"status: {exc}")
                stop.wait(1.0)
            wal.append((time.perf_counter(), wal_bytes(conn)))
            counters.append(server_counters(conn))
        finally:
            conn.close()

    work = [threading.Thread(target=parts.runs("writer", writer) if proc is None else from_process, daemon=True)]
    work += [threading.Thread(target=parts.runs("checks", checker), args=(i,), daemon=True)
             for i in range(cfg.checkers if check else 0)]
    side = [threading.Thread(target=parts.runs("queries", querier), args=(i,), daemon=True)
            for i in range(cfg.queries_concurrency)]
    side.append(threading.Thread(target=sampler, daemon=True))
    load = os.getloadavg()
    c0 = time.perf_counter()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    for th in work + side:
        th.start()
    try:
        while any(th.is_alive() for th in work):
            next(th for th in work if th.is_alive()).join(10.0)
            with lock:
                p = len(pending)
            say(f"{label}: {time.perf_counter() - t0:.0f} s, {len(committed)} committed, {len(seen)} seen, "
                f"{p} pending")
    finally:
        try:
            cpu = {**parts.stop(), "seconds": round(time.perf_counter() - c0, 2)}
        finally:
            stop.set()
        sys.setswitchinterval(switch)
    for th in side:
        th.join()
    parts.conn.close()
    try:
        samples.append(target.status())  # the state the stream ended in
        # the system's merges during the stream, on the clock of the commits
        spans = [(a - wall0 + t0, b - wall0 + t0) for a, b in target.busy_spans(wall0, wall0 + seconds)]
        rows = target.rows()  # the collection's size the stream left
    except Exception as exc:  # noqa: BLE001 - counted
        errors.append(f"status: {exc}")
        spans, rows = [], None
    return {"t0": t0, "spans": spans, "rows_after": rows, "txs": txs, "wal": wal, "counters": counters,
            "committed": committed, "seen": seen, "outside": outside, "errors": errors, "query_s": query_s,
            "samples": samples, "rounds": rounds, "load_average": [round(v, 2) for v in load], "cpu": cpu}


def saturate(target, stream: Stream, cfg: WritesConfig, Xq: np.ndarray, say) -> dict[str, Any]:
    """Plain pgvector's most single-row commits a second: one writer as fast as it can for
    ``saturate_s`` s, the same mix on keys of its own (:meth:`Stream.take_apart`: the streams after
    it keep every key pm_vector's table has), the queries running (nothing checked)."""
    ops = stream.take_apart(int(cfg.saturate_s * 5_000))
    raw = drive(target, ops, None, cfg.saturate_s, cfg, Xq, say, "pgvector saturating", check=False)
    return {"max_commits_per_s": round(len(raw["committed"]) / cfg.saturate_s, 1),
            "saturate_query_p50_ms": pct(raw["query_s"], 50, 1e3, 1), "saturate_errors": len(raw["errors"])}


def _vacuum(targets, say) -> None:
    """Every system's tables vacuumed before a phase: each phase pays its own autovacuum, not the
    debt of the phase before (pgvector's HNSW index vacuumed after 70,000 changes took a core for
    minutes, in pm_vector's next phase)."""
    t = time.perf_counter()
    for tg in targets:
        tg.vacuum()
    say(f"tables vacuumed before the phase ({time.perf_counter() - t:.0f} s)")


def _victims(pm, cfg: WritesConfig, rng, say) -> tuple[list[int], list[int]]:
    """Initial keys (never the last: the warm-up's) whose own cell's answer holds them, as many as the
    streams' checked changes may update or delete, and every other key of the table, in random order
    (the unchecked updates and deletes: a reused collection has few initial items left unchanged;
    module doc)."""
    need = (cfg.max_checked if cfg.match_pgvector else
            len(cfg.rates) * min(cfg.max_checked, sum(math.ceil(r * cfg.seconds) for r in cfg.rates))) * 2 // 3 + 16
    keys = rng.permutation(np.asarray(pm.state["untouched"], np.int64))
    out: list[int] = []
    t = time.perf_counter()
    for s in range(0, keys.size, 500):
        out += pm.answerable(keys[s:s + 500])
        if len(out) >= need:
            break
        if s % 5000 == 4500:  # (one answer built per cell: about 0.15 s each at 100,000 items under load)
            say(f"items to change: {len(out):,} of {need:,} ({time.perf_counter() - t:.0f} s)")
    pm.setup["victims_s"] = round(time.perf_counter() - t, 1)
    out = out[:need]
    say(f"{len(out)} items to change where a check sees them, each held by its own cell's answer")
    taken = set(out)
    return out, [int(k) for k in rng.permutation(np.asarray(pm.state["live"], np.int64)).tolist() if int(k) not in taken]


def run(cfg: WritesConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The benchmark (module doc); returns the JSON-able result: ``pm_vector`` and (with
    ``compare_pgvector``) ``pgvector_hnsw`` of the first rate, and ``by_rate`` (every rate's)."""
    say = progress or (lambda _m: None)
    check_config(cfg)
    rates = [float(r) for r in cfg.rates]
    say("data")
    # (the data depends on --items, --dim and --seed alone: a kept collection's rows are these)
    X, y = clustered(cfg.items + writes_reuse.NEW_ROWS, cfg.dim, N_FINE, seed=cfg.seed)
    anchor, anchor_y = clustered(cfg.anchors, cfg.dim, N_FINE, seed=cfg.seed + 1)
    Xq = X[:cfg.items]
    tag = writes_reuse.tag(cfg) if cfg.reuse else uuid.uuid4().hex[:8]
    rng = np.random.default_rng(cfg.seed + 5)
    targets: list = []
    out: dict[str, Any] = {"config": {**asdict(cfg), "rates": rates}, "setup": {}, "by_rate": []}
    t_start = time.perf_counter()
    try:
        say(f"pm_vector ({cfg.path}): {cfg.items:,} x {cfg.dim}")
        pm = PmVectorTarget(tag, X, y // 10, cfg.items, anchor, anchor_y // 10, path=cfg.path, epsilon=cfg.epsilon, seed=cfg.seed,
                            sync_interval_s=cfg.sync_interval_s, say=say, reuse=cfg.reuse)
        pm.merge_after = cfg.merge
        targets.append(pm)
        victims, others = _victims(pm, cfg, rng, say)
        stream = Stream(cfg.items, X.shape[0], victims, rng, next_key=pm.state["next_key"], others=others)
        if cfg.compare_pgvector:
            targets.append(PgvectorTarget(tag, X, cfg.items, say, source=pm.table if cfg.reuse else None))
        sat = None
        if cfg.match_pgvector:  # the rate to sustain: pgvector's single-row commits a second, measured first,
            # before pm_vector's sync worker (and the merges it starts) exists
            _vacuum(targets, say)
            sat = saturate(targets[1], stream, cfg, Xq, say)
            rates = [float(sat["max_commits_per_s"])]
            out["config"]["rates"] = rates
            say(f"both systems at pgvector's saturated rate, {rates[0]:g} a second")
        pm.start()
        for t in targets:
            out["setup"][t.system] = t.setup
        with db.connect(autocommit=True, application_name=BENCH_APP) as conn:
            out["setup"]["server"] = server_settings(conn)  # (one server: both systems' tables are on it)
        for r in rates:
            spec = stream.take(math.ceil(r * cfg.seconds), cfg.max_checked)
            row: dict[str, Any] = {"rate": r}
            for t in targets:
                if t is pm:
                    pm.start()
                else:  # (pm_vector's merge and queue done first, its worker stopped: one system at a time)
                    pm.setup.setdefault("quiet_before_s", []).append(pm.quiet(say))
                _vacuum(targets, say)
                say(f"{t.system}: {len(spec)} changes at {r:g} a second")
                raw = drive(t, fresh(spec), r, cfg.seconds, cfg, Xq, say, f"{t.system} at {r:g}/s")
                row[t.system] = summarise(t, raw, r, cfg.seconds)
            out["by_rate"].append(row)
        if cfg.compare_pgvector and cfg.saturate_s > 0:
            if sat is None:
                pm.quiet(say)
                _vacuum(targets, say)
            sat = sat or saturate(targets[1], stream, cfg, Xq, say)
            for row in out["by_rate"]:
                row["pgvector_hnsw"].update(sat)
    finally:
        for t in reversed(targets):
            try:
                t.close()
            except Exception:  # noqa: BLE001 - best effort: the result (or the error) matters more
                pass
    for system in ("pm_vector", "pgvector_hnsw"):
        if system in out["by_rate"][0]:
            out[system] = out["by_rate"][0][system]
    out["seconds_total"] = round(time.perf_counter() - t_start, 1)
    return out
