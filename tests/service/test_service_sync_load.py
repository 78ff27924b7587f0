"""The sync keeps its pace under query load (issue 35, finding 9, build item 8).

The attached tables' sync used to run on the request threads' pool (``run_in_threadpool``) of every
service process: with every request thread busy a queued change waited until one came free, and two
processes synced in turn, each finding the run changed by the other. Now one process of a database
syncs, from a thread and connections of its own, its passes in a process of its own
(:mod:`pm_vector.service.sync_worker`)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import numpy as np
import psycopg


def _vec(v):
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


def _hold_request_threads(svc, release: threading.Event) -> int:
    """Every thread of the service's request pool (anyio's default limiter, which
    ``run_in_threadpool`` borrows from) busy waiting for ``release``; returns how many."""
    from fastapi.concurrency import run_in_threadpool

    loop = svc.server.servers[0].get_loop()

    async def hold() -> int:
        import anyio.to_thread

        lim = anyio.to_thread.current_default_thread_limiter()
        n = int(lim.total_tokens)
        for _ in range(n):
            asyncio.ensure_future(run_in_threadpool(release.wait))
        while lim.borrowed_tokens < n:
            await asyncio.sleep(0.01)
        return n

    return asyncio.run_coroutine_threadsafe(hold(), loop).result(30)


def test_a_change_is_synced_while_every_request_thread_is_busy(pm_home, svc_split):
    from pm_vector import db
    from pm_vector.db import postgres
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn
    from pm_vector.service.runner import ServiceThread
    from pm_vector.service.settings import ServiceSettings

    X, y = svc_split.server
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    t, name = "ldocs_" + uuid.uuid4().hex[:8], "loaded_" + uuid.uuid4().hex[:8]
    conn = psycopg.connect(postgres.database_url(), autocommit=True)
    release = threading.Event()
    try:
        conn.execute(f"CREATE TABLE public.{t} (id bigint PRIMARY KEY, embedding vector, category int)")
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO public.{t} VALUES (%s, %s::vector, %s)",
                            [(i + 1, _vec(X[i]), int(y[i])) for i in range(len(X))])
        db.attach_table(name, table=f"public.{t}", id_column="id", vector_column="embedding",
                        label_column="category", dim=X.shape[1])
        db.register_anchor_set(name, *svc_split.anchor)
        db.register_anchor_set(name, *svc_split.dummy, role="dummy")
        db.run_embedding_job(name, {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
        with ServiceThread(ServiceSettings(pool_max=2, request_log_retention_days=0, sync_interval_s=1)) as svc:
            conn.execute(f"DELETE FROM public.{t} WHERE id = 1")  # a first pass: the worker is up
            t0 = time.monotonic()
            while db.sync_status(name)["queued"] and time.monotonic() - t0 < 60:
                time.sleep(0.1)
            assert db.sync_status(name)["queued"] == 0
            try:
                held = _hold_request_threads(svc, release)
                assert held >= 1
                conn.execute(f"DELETE FROM public.{t} WHERE id = 2")
                conn.execute(f"UPDATE public.{t} SET embedding = %s::vector WHERE id = 3", [_vec(X[7])])
                t0 = time.monotonic()
                while db.sync_status(name)["queued"] and time.monotonic() - t0 < 10:
                    time.sleep(0.1)
                waited = time.monotonic() - t0
                assert db.sync_status(name)["queued"] == 0, \
                    f"with the {held} request threads busy the queued changes waited more than {waited:.1f} s"
            finally:
                release.set()
            have = {r[0] for r in conn.execute(
                "SELECT i.external_id FROM pm_vector.items i JOIN pm_vector.collections c ON c.id = i.collection_id "
                "WHERE c.name = %s", [name]).fetchall()}
            assert "2" not in have and "3" in have and len(have) == len(X) - 2
            # the passes ran in a process of their own; one that ends is made again for the next pass
            import os
            import signal

            syncer = svc.app.state.service_state.syncer
            old = syncer._pass.pid
            assert old is not None and old != os.getpid()
            os.kill(old, signal.SIGKILL)
            conn.execute(f"DELETE FROM public.{t} WHERE id = 4")
            t0 = time.monotonic()
            while db.sync_status(name)["queued"] and time.monotonic() - t0 < 30:
                time.sleep(0.1)
            assert db.sync_status(name)["queued"] == 0
            assert syncer._pass.pid not in (None, old)
    finally:
        release.set()
        db.drop_collection(name, missing_ok=True)
        conn.execute(f"DROP TABLE IF EXISTS public.{t}")
        conn.close()


def test_one_process_of_a_database_syncs_and_another_takes_over(pm_home):
    """Two sync workers on one database: one leads (the advisory lock), the other never passes; when
    the leader stops, the other takes over within its retry period."""
    from pm_vector.db import postgres
    from pm_vector.service.sync_worker import SyncWorker

    url = postgres.libpq_url(postgres.database_url())
    calls: dict[str, int] = {"a": 0, "b": 0}

    def counting(who):
        def one_pass(_url, _health):
            calls[who] += 1
            return {}
        return one_pass

    key = uuid.uuid4().int >> 65  # a lock of their own: no other worker of the session's server meets it
    a = SyncWorker(url, 0.1, retry_s=0.2, pass_fn=counting("a"), lock_key=key).start()
    t0 = time.monotonic()
    while not a.leader and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    b = SyncWorker(url, 0.1, retry_s=0.2, pass_fn=counting("b"), lock_key=key).start()
    try:
        assert a.leader
        time.sleep(1.0)
        assert calls["a"] >= 3 and calls["b"] == 0 and not b.leader
        a.stop()
        t0 = time.monotonic()
        while calls["b"] == 0 and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert b.leader and calls["b"] >= 1
    finally:
        a.stop()
        b.stop()


def test_under_a_stream_a_pass_starts_no_sooner_than_the_gap_after_the_last(pm_home):
    """Changes always queued (a stream): the next pass starts ``min_gap_s`` after the last began, not
    at once (a pass's fixed cost then kept a core busy at any rate), and well before ``interval_s``."""
    from pm_vector.db import postgres
    from pm_vector.service.sync_worker import SyncWorker

    class Streamed(SyncWorker):
        def _queued(self) -> bool:
            return True

    url = postgres.libpq_url(postgres.database_url())
    began: list[float] = []

    def one_pass(_url, _health):
        began.append(time.monotonic())
        return {}

    w = Streamed(url, 5.0, retry_s=0.2, pass_fn=one_pass, lock_key=uuid.uuid4().int >> 65, min_gap_s=0.3).start()
    try:
        t0 = time.monotonic()
        while len(began) < 5 and time.monotonic() - t0 < 20:
            time.sleep(0.05)
    finally:
        w.stop()
    gaps = np.diff(began[:5])
    assert len(gaps) == 4 and gaps.min() >= 0.3 and gaps.max() < 1.5, gaps


def test_request_nice_lowers_every_thread_but_the_sync_workers():
    """``request_nice``: the other threads N nice levels below the kept one, and threads they make
    later inherit it (run in a child process: a lowered priority cannot be raised again)."""
    import subprocess
    import sys

    import pytest

    if not sys.platform.startswith("linux"):
        pytest.skip("a nice value per thread is Linux's")
    code = """
import json, os, threading
from pm_vector.service.sync_worker import lower_request_priority
prio = lambda tid: os.getpriority(os.PRIO_PROCESS, tid)
ev, seen = threading.Event(), {}
kept = threading.Thread(target=ev.wait); kept.start()
other = threading.Thread(target=ev.wait); other.start()
base = prio(threading.get_native_id())
n = lower_request_priority(5, kept.native_id)
again = lower_request_priority(5, kept.native_id)
later = threading.Thread(target=lambda: seen.update(p=prio(threading.get_native_id()))); later.start(); later.join()
print(json.dumps({"base": base, "kept": prio(kept.native_id), "other": prio(other.native_id),
                  "main": prio(threading.get_native_id()), "later": seen["p"], "n": n, "again": again}))
ev.set()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    got = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    want = min(19, got["base"] + 5)
    assert got["kept"] == got["base"]
    assert got["other"] == got["main"] == got["later"] == want
    assert got["n"] >= 2 and got["again"] == 0  # a second call lowers nothing further


def test_request_nice_is_a_nice_value():
    import pytest

    from pm_vector.errors import InvalidInputError
    from pm_vector.service.settings import ServiceSettings

    assert ServiceSettings().request_nice == 10  # docs/benchmarks.md: the sync under query load
    assert ServiceSettings(request_nice=0).request_nice == 0
    assert ServiceSettings(request_nice=19).request_nice == 19
    for bad in (-1, 20):
        with pytest.raises(InvalidInputError, match="request_nice"):
            ServiceSettings(request_nice=bad)
