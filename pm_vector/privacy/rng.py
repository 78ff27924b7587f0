"""The single source of randomness for released noise."""

from __future__ import annotations

import numbers
import secrets

import numpy as np

from ..errors import InvalidInputError


def secure_generator(seed: int | None = None) -> np.random.Generator:
    """Return a ``numpy.random.Generator`` (PCG64) for drawing release noise.

    ``seed=None`` (production): the generator is seeded with 128 bits from
    :func:`secrets.randbits`, i.e. from the operating system's CSPRNG, so the
    seed cannot be guessed or replayed. The noise stream itself is PCG64, a
    statistical (not cryptographic) generator; what it guarantees is an
    unpredictable seed, not resistance to state recovery from many outputs.

    ``seed=<int >= 0>`` (tests only): a deterministic generator. Never pass a
    seed for a real release: a known seed makes the noise removable.
    """
    if seed is None:
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise InvalidInputError(f"seed must be None (cryptographically seeded) or a non-negative int; got {seed!r}.")
    return np.random.Generator(np.random.PCG64(int(seed)))


def require_generator(rng) -> np.random.Generator:
    """Return ``rng`` if it is a ``numpy.random.Generator``; ``None`` gives a fresh :func:`secure_generator`."""
    if rng is None:
        return secure_generator()
    if not isinstance(rng, np.random.Generator):
        raise InvalidInputError(
            f"rng must be a numpy.random.Generator from pm_vector.privacy.secure_generator(); "
            f"got {type(rng).__name__}. "
            "Legacy np.random.RandomState and the global np.random functions are refused.")
    return rng
