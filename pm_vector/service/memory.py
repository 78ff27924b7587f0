"""Bounds on the service's memory under large requests.

A 13 MB ``/kahm/distances`` body becomes about a million Python floats in lists, a float64 array
and the model's temporaries: a few hundred MB per request while it runs. Two things made the
resident set grow and stay grown (615 MB to 1.2 GB over 13 rounds of 6 parallel calls):

* every request in flight holds its own copy, so the peak grows with the number of large requests
  at once -- :class:`LargeRequestGate` lets at most ``slots`` requests whose body exceeds
  ``threshold_bytes`` (or has no Content-Length) be handled at once, each taking its slot once
  its body has arrived (a slow sender holds no slot), and at most ``slots`` large bodies of one
  key arrive at once (its others wait, unread);
* glibc keeps freed memory: its mmap threshold rises after each large free (up to 32 MB), so
  later arrays of that size come from the heap arenas, one per thread up to 8 per core, where
  freed pages stay resident. :func:`configure_malloc` caps the arenas at :data:`ARENA_MAX`, and
  :func:`trim` (glibc's ``malloc_trim(0)``, which also releases free pages inside a heap) returns
  what is free after each large request. (Fixing the mmap threshold at 1 MiB bounds the heap as
  well, but every large temporary then costs fresh zeroed pages: the memory benchmark ran about
  twice as long, mostly in the kernel.)

On a C library other than glibc the two functions do nothing (the gate still bounds the peak).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import threading
import time

log = logging.getLogger("pm_vector.service")

#: glibc's mallopt parameter M_ARENA_MAX, and the cap the service sets
_M_ARENA_MAX = -8
ARENA_MAX = 4

_libc = None
_libc_lock = threading.Lock()
_trim_lock = threading.Lock()


def _glibc():
    global _libc
    with _libc_lock:
        if _libc is None:
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                lib.mallopt.argtypes, lib.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
                lib.malloc_trim.argtypes, lib.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
                _libc = lib
            except (OSError, AttributeError):  # not glibc
                _libc = False
        return _libc or None


def configure_malloc() -> bool:
    """Cap glibc's arenas at :data:`ARENA_MAX` (this process, from now on). Returns whether it
    applied (glibc)."""
    lib = _glibc()
    if lib is None:
        return False
    ok = lib.mallopt(_M_ARENA_MAX, ARENA_MAX) == 1
    if not ok:
        log.warning("mallopt refused a setting; large requests may leave the heap grown")
    return ok


def trim() -> bool:
    """Give the free memory of glibc's heaps back to the system (``malloc_trim(0)``); one call
    at a time. Returns whether it ran."""
    lib = _glibc()
    if lib is None or not _trim_lock.acquire(blocking=False):
        return False
    try:
        lib.malloc_trim(0)
        return True
    finally:
        _trim_lock.release()


class LargeRequestGate:
    """ASGI middleware: at most ``slots`` requests with a body over ``threshold_bytes`` (or
    without a Content-Length) are *handled* at once; after each, :func:`trim` runs in a worker
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
                asyncio.get_running_loop().run_in_executor(None, trim)
