"""The single source of randomness for released noise: the operating system's CSPRNG.

Every bit of a production release comes from :func:`os.urandom` (the same source as
:mod:`secrets`: ``getrandom(2)`` on Linux, a ChaCha20-based cryptographic generator). numpy has
no cryptographic bit generator (PCG64 and Philox are statistical generators: their state can be
recovered from enough outputs), so :class:`SecureRandom` draws 64-bit words from ``os.urandom``
and turns them into exactly uniform integers by rejection. It offers the few methods of
``numpy.random.Generator`` that the mechanisms use (``integers``, ``random``, ``standard_normal``,
``normal``, ``laplace``, ``permutation``), so a mechanism takes either.

:func:`secure_generator` ``()`` returns a fresh :class:`SecureRandom`. ``secure_generator(seed)``
returns a deterministic ``numpy.random.Generator`` (PCG64) for tests and reproducible benchmarks
only: a known seed makes the noise removable, and PCG64 is not cryptographic. No client-facing
API takes a seed; a seeded generator reaches a release only through internal test paths.
"""

from __future__ import annotations

import numbers
import os
import threading

import numpy as np

from ..errors import InvalidInputError

__all__ = ["SecureRandom", "secure_generator", "require_generator", "is_secure"]

_U64 = np.uint64
_TWO63 = 1 << 63


def _mask(m: np.ndarray) -> np.ndarray:
    """An all-ones mask ``2^e - 1 >= m`` elementwise (``m`` uint64 < 2^63), with ``2^e <= 4 m`` for
    ``m >= 1``: ``e`` is the binary exponent of ``float(m)``; float rounding is monotone and powers
    of two are exact, so ``m < 2^e`` always holds (rounding up can only add one bit)."""
    _, e = np.frexp(m.astype(np.float64))
    e = e.astype(np.uint64)
    return np.where(e >= _U64(64), ~_U64(0), (_U64(1) << np.minimum(e, _U64(63))) - _U64(1))


class SecureRandom:
    """Uniform random integers and floats from the operating system's CSPRNG (``os.urandom``).

    ``integers(low, high, size)`` is exactly uniform on ``[low, high)`` (masked rejection on
    64-bit words: each round accepts with probability > 1/2 for ranges below 2^53, > 1/4 above); ``random(size)`` is ``k / 2^53``
    with ``k`` uniform on ``[0, 2^53)``. The float methods (``standard_normal``, ``normal``,
    ``laplace``) are the usual transforms of such uniforms: their randomness is cryptographic,
    their values are floats (not floating-point safe in the sense of Mironov 2012; the exact
    integer samplers of :mod:`pm_vector.privacy.discrete` are). Its only state is a read-ahead
    buffer of OS random words, each handed out once (thread-safe; dropped in a forked child), so
    no two draws, threads or processes ever share randomness. Not picklable or copyable.
    """

    __slots__ = ("_buf", "_pos", "_pid", "_lock")

    #: 64-bit words read from the OS at once (32 KiB): one system call serves a typical release
    BUFFER_WORDS = 4096

    def __init__(self):
        self._buf = np.zeros(0, dtype=_U64)
        self._pos = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ raw bits
    def words(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit words (uint64) from ``os.urandom``.

        Words are read ahead in blocks of :attr:`BUFFER_WORDS`, each word handed out once; after a
        ``fork`` the child drops what its parent had read (it never replays the parent's words)."""
        n = int(n)
        if n <= 0:
            return np.zeros(0, dtype=_U64)
        with self._lock:
            if self._pid != os.getpid():
                self._buf, self._pos, self._pid = np.zeros(0, dtype=_U64), 0, os.getpid()
            if self._pos + n > self._buf.size:
                if n > self.BUFFER_WORDS:
                    return np.frombuffer(os.urandom(8 * n), dtype=_U64).copy()
                self._buf = np.frombuffer(os.urandom(8 * self.BUFFER_WORDS), dtype=_U64).copy()
                self._pos = 0
            out = self._buf[self._pos:self._pos + n]  # a view: a refill makes a new array, never rewrites
            self._pos += n
            return out

    def _below(self, span_m1: np.ndarray) -> np.ndarray:
        """Uniform integers in ``[0, span_m1_i]`` elementwise (``span_m1`` uint64 >= 0)."""
        flat = span_m1.reshape(-1)
        mask = _mask(flat)
        out = np.empty(flat.shape, dtype=_U64)
        todo = np.arange(flat.size)
        while todo.size:
            w = self.words(todo.size) & mask[todo]
            ok = w <= flat[todo]
            out[todo[ok]] = w[ok]
            todo = todo[~ok]
        return out.reshape(span_m1.shape)

    # ------------------------------------------------------------------ numpy-like API
    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint: bool = False):
        """Uniform integers on ``[low, high)`` (``[0, low)`` when ``high`` is None; ``endpoint``
        includes ``high``), broadcast like ``numpy.random.Generator.integers``. int64 results;
        each range may hold up to ``2^63`` values."""
        if np.dtype(dtype) != np.int64:
            raise InvalidInputError(f"SecureRandom.integers draws int64 only; got dtype={dtype!r}.")
        if high is None:
            low, high = 0, low
        if (size is None and type(low) is int and low == 0 and isinstance(high, np.ndarray)
                and high.dtype == np.int64 and not endpoint):  # the exact samplers' call: [0, high_i)
            if high.size and int(high.min()) < 1:
                raise InvalidInputError("integers needs high > low everywhere.")
            return self._below((high - 1).astype(_U64)).astype(np.int64)
        lo, hi = np.asarray(low), np.asarray(high)
        for b in (lo, hi):
            if not (np.issubdtype(b.dtype, np.integer) or (b.dtype == object and all(
                    isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in b.reshape(-1).tolist()))):
                raise InvalidInputError(f"SecureRandom.integers needs integer bounds; got dtype {b.dtype}.")
        shape = np.broadcast_shapes(lo.shape, hi.shape) if size is None else \
            ((int(size),) if isinstance(size, numbers.Integral) else tuple(int(s) for s in size))
        if lo.ndim == 0 and hi.ndim == 0:
            a, span = int(lo), int(hi) - int(lo) + (1 if endpoint else 0)
            if not (1 <= span <= _TWO63 and -_TWO63 <= a and a + span - 1 < _TWO63):
                raise InvalidInputError(f"integers needs 1 <= high - low <= 2^63 within int64; got [{a}, {int(hi)}).")
            u = self._below(np.full(shape, span - 1, dtype=_U64))
            out = (u.astype(np.int64) + np.int64(a)) if a else u.astype(np.int64)
        else:
            lo64 = np.broadcast_to(lo.astype(np.int64), shape)
            span = np.broadcast_to(hi.astype(np.int64), shape) - lo64 + (1 if endpoint else 0)
            if span.size and int(span.min()) < 1:
                raise InvalidInputError("integers needs high > low everywhere.")
            out = self._below((span - 1).astype(_U64)).astype(np.int64) + lo64
        return out if (size is not None or out.ndim) else np.int64(out)

    def random(self, size=None):
        """Uniform floats ``k / 2^53``, ``k`` uniform on ``[0, 2^53)`` (so on ``[0, 1)``)."""
        n = 1 if size is None else int(np.prod(size))
        u = (self.words(n) >> _U64(11)).astype(np.float64) * (2.0 ** -53)
        return float(u[0]) if size is None else u.reshape(size)

    def _open_random(self, n: int) -> np.ndarray:
        """``n`` uniforms on ``(0, 1]``: ``(k + 1) / 2^53``."""
        return ((self.words(n) >> _U64(11)).astype(np.float64) + 1.0) * (2.0 ** -53)

    def standard_normal(self, size=None):
        """Standard normal floats (Box-Muller on CSPRNG uniforms)."""
        n = 1 if size is None else int(np.prod(size))
        h = (n + 1) // 2
        r = np.sqrt(-2.0 * np.log(self._open_random(h)))
        t = 2.0 * np.pi * self.random(h)
        z = np.concatenate([r * np.cos(t), r * np.sin(t)])[:n]
        return float(z[0]) if size is None else z.reshape(size)

    def normal(self, loc=0.0, scale=1.0, size=None):
        """``loc + scale * standard_normal(size)``."""
        return loc + scale * self.standard_normal(size if size is not None else np.broadcast(loc, scale).shape or None)

    def laplace(self, loc=0.0, scale=1.0, size=None):
        """Laplace floats by the inverse CDF of CSPRNG uniforms."""
        shp = size if size is not None else (np.broadcast(loc, scale).shape or None)
        n = 1 if shp is None else int(np.prod(shp))
        sign = np.where(self.words(n) & _U64(1), 1.0, -1.0)
        v = sign * -np.log(self._open_random(n))  # Exp(1) with a random sign
        v = v[0] if shp is None else v.reshape(shp)
        return loc + scale * v

    def permutation(self, n) -> np.ndarray:
        """A uniformly random permutation of ``range(n)`` (Fisher-Yates with exact uniform indices)."""
        n = int(n)
        a = np.arange(n)
        if n > 1:
            js = self.integers(0, np.arange(n, 1, -1))  # j_i uniform on [0, n - i)
            for i, j in enumerate(js.tolist()):
                k = n - 1 - i
                a[k], a[j] = a[j], a[k]
        return a

    def __repr__(self) -> str:
        return "SecureRandom(os.urandom)"

    def __reduce__(self):
        raise TypeError("a SecureRandom is not picklable: each process draws its own OS randomness.")

    def __copy__(self):
        raise TypeError("a SecureRandom is not copyable: use a fresh secure_generator().")

    __deepcopy__ = lambda self, memo: self.__copy__()  # noqa: E731


def secure_generator(seed: int | None = None):
    """The generator for release noise.

    ``seed=None`` (production): a :class:`SecureRandom` -- every draw comes from the operating
    system's CSPRNG; nothing can be replayed or predicted.

    ``seed=<int >= 0>`` (tests and reproducible benchmarks only): a deterministic
    ``numpy.random.Generator`` (PCG64). Never for a real release: a known seed makes the noise
    removable, and PCG64 is not a cryptographic stream.
    """
    if seed is None:
        return SecureRandom()
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise InvalidInputError(f"seed must be None (the OS CSPRNG) or a non-negative int (tests); got {seed!r}.")
    return np.random.Generator(np.random.PCG64(int(seed)))


def is_secure(rng) -> bool:
    """Whether ``rng`` draws from the OS CSPRNG (a :class:`SecureRandom`), i.e. not a seeded test generator."""
    return isinstance(rng, SecureRandom)


def require_generator(rng):
    """``rng`` if it is a :class:`SecureRandom` or a ``numpy.random.Generator`` (tests); ``None``
    gives a fresh :class:`SecureRandom`."""
    if rng is None:
        return SecureRandom()
    if not isinstance(rng, (SecureRandom, np.random.Generator)):
        raise InvalidInputError(
            f"rng must be pm_vector.privacy.secure_generator() (the OS CSPRNG) or, in tests, a seeded "
            f"numpy.random.Generator; got {type(rng).__name__}. "
            "Legacy np.random.RandomState and the global np.random functions are refused.")
    return rng
