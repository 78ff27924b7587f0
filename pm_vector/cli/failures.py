"""What the command line prints when a command fails in a way no command handles itself: one line
``error: ...`` saying what happened and what to do, exit status 1 (130 when interrupted), never a
traceback (``PM_VECTOR_DEBUG=1`` shows it).

A command's own refusals (:class:`~pm_vector.errors.PMVectorError`) already print their message;
this covers what comes from below it: the database stopping or refusing mid-command, a full disk
(PostgreSQL's ``DiskFull`` or ``ENOSPC``), memory, and anything unexpected."""

from __future__ import annotations

import errno
import os
import sys

from .. import errors

DEBUG_ENV = "PM_VECTOR_DEBUG"


def _chain(exc: BaseException):
    seen = 0
    while exc is not None and seen < 8:
        yield exc
        exc = exc.__cause__ or exc.__context__
        seen += 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def describe(exc: BaseException) -> str:
    """The message (after ``error: ``) for a command that failed with ``exc``."""
    # an error of psycopg's exists only once psycopg is imported: `pm-vector --help` does not import it
    psycopg = sys.modules.get("psycopg")
    PoolTimeout = getattr(sys.modules.get("psycopg_pool"), "PoolTimeout", ())  # () matches nothing
    for e in _chain(exc):
        if isinstance(e, errors.PMVectorError):
            return str(e)
        if (psycopg is not None and isinstance(e, psycopg.errors.DiskFull)) or \
                (isinstance(e, OSError) and e.errno == errno.ENOSPC):
            return (f"the disk is full ({_first_line(e)}). Nothing of this command's writes was kept (each is one "
                    "transaction). Free space on the database's disk (`pm-vector db status` shows its data "
                    "directory) and run the command again.")
    for e in _chain(exc):
        if psycopg is not None and isinstance(e, (psycopg.OperationalError, PoolTimeout)):
            return (f"the database stopped answering during the command ({_first_line(e)}). Nothing half-written is "
                    "visible. Start it (`pm-vector db start`, or check PM_VECTOR_DATABASE_URL) and run the command "
                    "again.")
        if psycopg is not None and isinstance(e, psycopg.Error):
            state = getattr(e, "sqlstate", None)
            return (f"the database refused the command (SQLSTATE {state}: {_first_line(e)}). Nothing of it was "
                    "kept; check the database's settings and log, then run the command again.")
        if isinstance(e, MemoryError):
            return ("out of memory. Nothing of this command's writes was kept; run it with a smaller --batch-size or "
                    "on a machine with more memory.")
    return (f"unexpected failure ({type(exc).__name__}: {_first_line(exc)}). Run it again with {DEBUG_ENV}=1 to "
            "see where, and report it.")


def run(app) -> None:
    """``app()`` (a typer application) with the failures above printed as ``error: ...``."""
    try:
        app()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        print("error: interrupted. Nothing of an unfinished write was kept; run the command again.", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a message, not a traceback
        if os.environ.get(DEBUG_ENV, "").strip() in ("1", "true", "yes", "on"):
            raise
        print(f"error: {describe(exc)}", file=sys.stderr)
        sys.exit(1)
