"""Bounds on the service's memory under large requests.

A 13 MB ``/kahm/distances`` body becomes about a million Python floats in lists, a float64 array
and the model's temporaries: a few hundred MB per request while it runs. Two things made the
resident set grow and stay grown (615 MB to 1.2 GB over 13 rounds of 6 parallel calls):

* every request in flight holds its own copy, so the peak grows with the number of large requests
  at once -- the middleware :class:`~pm_vector.service.middleware.large_requests.LargeRequestGate`
  lets at most ``slots`` requests whose body exceeds ``threshold_bytes`` (or has no
  Content-Length) be handled at once, each taking its slot once its body has arrived (a slow
  sender holds no slot), and at most ``slots`` large bodies of one key arrive at once (its others
  wait, unread);
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

import ctypes
import ctypes.util
import logging
import threading

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
