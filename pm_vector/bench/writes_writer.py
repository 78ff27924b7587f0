"""The writer of ``pm-vector bench writes`` in a process of its own: the stream's SQL statements
committed on a connection of that process, at the stream's pace, each commit's time sent back.

The writer was a thread of the bench process, beside the query and check threads. Each change
waits on the database twice (the statement, the commit), and each time the thread must take the
interpreter back from the others, so the rate a system took measured the bench process's
interpreter, and pm_vector's query threads (a client's request built and an answer parsed in
Python) held it longer than plain pgvector's (``docs/benchmarks.md``, "Writes": the figures, thread
against process). In a process of its own the writer waits only on the database, as a user's
writer does.

:func:`start` spawns the process with the database URL, the statement of each kind (``insert``,
``update``, ``delete``; text) and every transaction's statements' parameters, and returns once it is
connected; :meth:`Writer.go` gives it the stream's start (``time.perf_counter``: Linux's monotonic
clock, the same in every process) and :meth:`Writer.results` yields what it sends: ``("ok", first,
end, commit_t, statements_s, commit_s, paced_s)`` per committed transaction (changes ``first..end-1``
of the stream; the seconds its statements took, its COMMIT's (the wait for its WAL to be flushed),
and the writer's pause before it, ahead of the stream's pace), ``("error",
first, end, message)`` per failed one (rolled back), then ``("end", t)``.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any, Iterator

import psycopg

#: its session's ``application_name`` (``pg_stat_activity``; :class:`pm_vector.bench.machine.CpuParts`)
APPLICATION_NAME = "pm_vector bench writer"


def _run(url: str, statements: dict[str, str], txs: list, rate: float | None, seconds: float, pipe) -> None:
    with psycopg.connect(url, application_name=APPLICATION_NAME) as conn:
        pipe.send(("ready",))
        t0 = pipe.recv()
        j = 0
        for tx in txs:
            ts = time.perf_counter()
            if rate is not None:
                time.sleep(max(0.0, t0 + j / rate - ts))
            if time.perf_counter() - t0 > seconds:
                break
            try:
                ta = time.perf_counter()
                for kind, params in tx:
                    conn.execute(statements[kind], params, prepare=True)
                tb = time.perf_counter()
                conn.commit()
                tc = time.perf_counter()
                pipe.send(("ok", j, j + len(tx), tc, tb - ta, tc - tb, ta - ts))
            except Exception as exc:  # noqa: BLE001 - counted by the bench
                conn.rollback()
                pipe.send(("error", j, j + len(tx), f"{type(exc).__name__}: {str(exc)[:200]}"))
            j += len(tx)
    pipe.send(("end", time.perf_counter()))


class Writer:
    """A started writer process (:func:`start`)."""

    def __init__(self, proc, pipe):
        self.proc, self.pipe = proc, pipe

    @property
    def pid(self) -> int:
        return self.proc.pid

    def go(self, t0: float) -> None:
        self.pipe.send(t0)

    def results(self) -> Iterator[tuple]:
        """What the process sends, until its ``("end", t)`` (included)."""
        while True:
            msg = self.pipe.recv()
            yield msg
            if msg[0] == "end":
                return

    def close(self) -> None:
        self.pipe.close()
        self.proc.join(10.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def start(url: str, statements: dict[str, str], txs: list[list[tuple[str, list[Any]]]], rate: float | None,
          seconds: float, timeout: float = 120.0) -> Writer:
    """Spawn the writer (module doc) and wait until it is connected. ``txs``: the transactions in
    order, each a list of ``(kind, parameters)``; transaction ``i`` starts ``(changes before it) /
    rate`` s after :meth:`Writer.go`'s start (as fast as it can with ``rate`` None), none after
    ``seconds``."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=_run, args=(url, statements, txs, rate, seconds, theirs), daemon=True)
    proc.start()
    theirs.close()
    if not mine.poll(timeout):
        proc.kill()
        raise TimeoutError(f"the writer process did not connect within {timeout:g} s")
    try:
        msg = mine.recv()
    except EOFError:
        msg = f"nothing: it ended with exit code {proc.join(5.0) or proc.exitcode}"
    if msg != ("ready",):
        proc.kill()
        raise RuntimeError(f"the writer process said {msg!r:.200}")
    return Writer(proc, mine)
