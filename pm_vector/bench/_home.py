"""A private ``PM_VECTOR_HOME`` for a benchmark that starts its own embedded servers.

:func:`private_home` points ``PM_VECTOR_HOME`` at a new temporary directory, drops
``PM_VECTOR_DATABASE_URL`` (so :mod:`pm_vector.db` starts the embedded server there, not the
user's) and sets ``PM_VECTOR_EMBEDDED_FAST=1`` for as long as the benchmark runs. On the way out it
runs ``stop`` (which stops the servers it started while they are still found in that home), then
puts the three variables back as they were and removes the directory, whether the benchmark
returned or raised.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import Callable, Iterator

#: the variables a private home sets; each is restored (or removed again) on exit
HOME_VARIABLES = ("PM_VECTOR_HOME", "PM_VECTOR_DATABASE_URL", "PM_VECTOR_EMBEDDED_FAST")


@contextmanager
def private_home(prefix: str, stop: Callable[[], object] | None = None) -> Iterator[str]:
    """Run the ``with`` body in a new temporary ``PM_VECTOR_HOME`` (module doc); yields its path."""
    saved = {k: os.environ.get(k) for k in HOME_VARIABLES}
    tmp = tempfile.TemporaryDirectory(prefix=prefix)
    os.environ["PM_VECTOR_HOME"] = tmp.name
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    os.environ["PM_VECTOR_EMBEDDED_FAST"] = "1"
    try:
        yield tmp.name
    finally:
        try:
            if stop is not None:
                stop()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            tmp.cleanup()

