"""The large-request gate: at most ``slots`` requests with a large body handled at once, the
heap trimmed after each (why: :mod:`pm_vector.service.memory`)."""

from __future__ import annotations

import asyncio
import time

from .. import memory


class LargeRequestGate:
    """ASGI middleware: at most ``slots`` requests with a body over ``threshold_bytes`` (or
    without a Content-Length) are *handled* at once; after each, :func:`pm_vector.service.memory.trim` runs in a worker
    thread.

    A large request takes its slot only once its whole body has arrived (the gate reads it
    first, under the body timeout and the body limit, and hands it to the app as one message):
    a client that declares 2 MB and sends one byte holds its own connection until the body
    timeout answers 408, never a slot. While bodies arrive, a key (or, without keys, an address)
    may have at most ``slots`` large bodies in flight; its further large requests wait, unread,
    so that one key cannot make the service hold many bodies at once."""

    def __init__(self, app, threshold_bytes: int, slots: int):
        if threshold_bytes < 1 or slots < 1:
            raise ValueError("threshold_bytes and slots must be >= 1")
        self.app, self.threshold, self.slots = app, int(threshold_bytes), int(slots)
        self._sem: asyncio.Semaphore | None = None
        self._reading: dict[object, list] = {}  # per key: [semaphore of its large bodies being received, users]
        self.waiting = 0
        self.max_running = 0
        self._running = 0
        self._last_trim = 0.0

    def _large(self, scope) -> bool:
        if scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return False
        for name, value in scope.get("headers") or []:
            if name == b"content-length":
                try:
                    return int(value) > self.threshold
                except ValueError:
                    return False  # the body limit answers 400
        return True  # chunked: size unknown until read

    @staticmethod
    def _owner(scope) -> object:
        rec = (scope.get("state") or {}).get("api_key")
        if rec is not None and rec.get("id") is not None:
            return ("key", rec["id"])
        return ("address", (scope.get("client") or ("unknown",))[0])

    async def _read_body(self, scope, receive) -> tuple[bytes, bool]:
        """The whole body, under this owner's share of large bodies in flight; and whether the
        client went away."""
        owner = self._owner(scope)
        entry = self._reading.setdefault(owner, [asyncio.Semaphore(self.slots), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                chunks = []
                while True:
                    m = await receive()
                    if m["type"] == "http.disconnect":
                        return b"", True
                    chunks.append(m.get("body", b""))
                    if not m.get("more_body", False):
                        return b"".join(chunks), False
        finally:
            entry[1] -= 1
            if not entry[1]:
                self._reading.pop(owner, None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self._large(scope):
            return await self.app(scope, receive, send)
        body, gone = await self._read_body(scope, receive)
        if gone:
            return None
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.slots)
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        self._running += 1
        self.max_running = max(self.max_running, self._running)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body only http.disconnect can come

        try:
            await self.app(scope, replay, send)
        finally:
            self._running -= 1
            self._sem.release()
            now = time.monotonic()
            if now - self._last_trim > 0.5 or self._running == 0:
                self._last_trim = now
                asyncio.get_running_loop().run_in_executor(None, memory.trim)
