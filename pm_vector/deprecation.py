"""Public names renamed in this release, still importable under their old names until
:data:`REMOVED_IN`, with a :class:`FutureWarning` that names the new name.

A package face that kept an old name defines ``__getattr__(name)`` as
``renamed(__name__, name)``; a function that renamed a keyword argument takes the old
one through :func:`renamed_keywords`.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from typing import Any

REMOVED_IN = "0.3.0"

#: module -> {old public name there: the new name, dotted from its home}; each module listed defines
#: ``__getattr__(name)`` as ``renamed(__name__, name)``
RENAMED: dict[str, dict[str, str]] = {
    "pm_vector.protocol": {"QueryRequest": "pm_vector.protocol.ClassRowsRequest"},
    "pm_vector.client": {"QueryRequest": "pm_vector.protocol.ClassRowsRequest",
                         "QuerySecret": "pm_vector.client.ClientSecret"},
    "pm_vector.client.query": {"QueryRequest": "pm_vector.protocol.ClassRowsRequest",
                               "QuerySecret": "pm_vector.client.ClientSecret",
                               "FORMAT": "pm_vector.protocol.formats.CLASS_ROWS_FORMAT"},
    "pm_vector.client.request": {"FORMAT": "pm_vector.protocol.formats.PRIVATEMAIL_FORMAT"},
    "pm_vector.client.http": {"rebuild_frame": "pm_vector.protocol.frame.frame_from_document"},
}


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(f"{old} is renamed {new}; the old name is removed in pm_vector {REMOVED_IN}",
                  FutureWarning, stacklevel=stacklevel + 1)


def renamed(module: str, name: str) -> Any:
    """The body of a module's ``__getattr__``: the object an old name of ``module`` now has, with a
    FutureWarning, or the usual AttributeError."""
    new = RENAMED.get(module, {}).get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", new, stacklevel=2)
    home, _, attr = new.rpartition(".")
    return getattr(importlib.import_module(home), attr)


def renamed_keyword(function: str, old: str, new: str, old_value: Any, new_value: Any) -> Any:
    """The value of keyword ``new`` when a caller passed it as ``old`` (FutureWarning); both at
    once is a TypeError. For a function on every query's path, called only when ``old`` was given."""
    if new_value is not None:
        raise TypeError(f"{function}() got both {old!r} and {new!r}; pass {new!r} only")
    _warn(f"{function}(..., {old}=...)", f"{function}(..., {new}=...)", stacklevel=2)
    return old_value


def renamed_keywords(**old_to_new: str):
    """Decorator: the function still takes each old keyword (``k_prime=...``) as its new one
    (``shortlist=...``), with a FutureWarning; both at once is a TypeError."""

    def wrap(f):
        @functools.wraps(f)
        def inner(*args, **kwargs):
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{f.__qualname__}() got both {old!r} and {new!r}; pass {new!r} only")
                    _warn(f"{f.__qualname__}(..., {old}=...)", f"{f.__qualname__}(..., {new}=...)", stacklevel=2)
                    kwargs[new] = kwargs.pop(old)
            return f(*args, **kwargs)

        return inner

    return wrap
