"""Writes held until the end of a batch: one idea shared by the cell and location rows
(:mod:`pm_vector.db.runs.array_rows`) and the prior's lists (:mod:`pm_vector.db.runs.prior_rows`).

A sync batch erases items and then places new ones, and both change the same derived rows; a
:class:`Deferral` keeps, per connection, what a module changed inside :meth:`Deferral.hold`, and
calls the module's ``flush(conn)`` once at the end (not after an exception: the transaction is
rolled back, and what was held goes with it). A nested ``hold`` on the same connection joins the
outer one.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable


class Deferral:
    """Per-connection state held while :meth:`hold` runs; ``flush(conn)`` writes it at the end."""

    def __init__(self, flush: Callable[[Any], None]):
        self._flush = flush
        self.sessions: dict[int, dict] = {}  # id(conn) -> the module's held state

    @contextmanager
    def hold(self, conn):
        cid = id(conn)
        if cid in self.sessions:
            yield
            return
        self.sessions[cid] = {}
        try:
            yield
            self._flush(conn)
        finally:
            self.sessions.pop(cid, None)

    def held(self, conn) -> dict | None:
        """What is held for ``conn`` (None outside :meth:`hold`)."""
        return self.sessions.get(id(conn))
