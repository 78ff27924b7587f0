"""A bound on the time a request's header lines may take to arrive.

uvicorn (0.54) closes a keep-alive connection that stays idle after a response, but any byte
cancels that timer and nothing bounds a request whose header lines trickle in: 1,000 connections
that each sent a header line now and then stayed open after 70 s. :func:`protocol_class` gives
uvicorn's httptools protocol (its C parser, what ``uvicorn[standard]`` runs) with one more timer:
from the moment a connection opens, or the first byte of a further request on it arrives, its
header block must be complete within ``timeout_s``; otherwise the service answers ``408 Request
Timeout`` (``Connection: close``) and closes the connection. (The body has its own bound,
:mod:`pm_vector.service.middleware.body_timeout`.)

Staying on uvicorn keeps one server for the service, the tests and the demo; the subclass uses
uvicorn's protocol hooks (``connection_made``, ``connection_lost``) and the parser's callbacks
(``on_message_begin``: the first byte of a request; ``on_headers_complete``), nothing private
beyond ``self.transport`` and ``self.loop`` which the base class itself sets.

Measured (``pm-vector bench load --classes 10 --workers 2 --concurrency 16``, 2 cores): the C
parser in place of h11's pure-Python one takes about a fifth off the service's CPU per request.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_TIMEOUT_ANSWER = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                   b"content-length: %d\r\n\r\n%s")


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; a request's header block must arrive within ``header_timeout_s``."""

    header_timeout_s: float = 10.0
    #: connections closed for headers that did not arrive in time (all instances of the class)
    timed_out = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_headers = True  # a new connection's first request is on the clock at once
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def on_message_begin(self) -> None:
        self._in_headers = True  # the first byte of a request: its headers are now on the clock
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_headers = False  # the header block is complete (the body has its own timeout)
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._in_headers:
            return
        type(self).timed_out += 1
        body = (b'{"error":"request_timeout","message":"the request headers did not arrive within %g s; send them '
                b'at once (the operator sets PM_VECTOR_SERVICE_HEADER_TIMEOUT_S)."}' % self.header_timeout_s)
        try:
            self.transport.write(_TIMEOUT_ANSWER % (len(body), body))
        finally:
            self.transport.close()


def protocol_class(timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """uvicorn's ``http`` protocol class whose header block must arrive within ``timeout_s``."""
    if not timeout_s > 0:
        raise ValueError("timeout_s must be > 0")
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": float(timeout_s)})
