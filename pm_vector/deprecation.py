"""Public names renamed in this release, still importable under their old names until
:data:`REMOVED_IN`, with a :class:`FutureWarning` that names the new name.

A package face that kept an old name defines ``__getattr__(name)`` as
``renamed(__name__, name, globals())``; a function that renamed a keyword argument takes the old
one through :func:`renamed_keyword`.
"""

from __future__ import annotations

import warnings
from typing import Any

REMOVED_IN = "0.3.0"

#: old public name -> new name (classes re-exported by the package faces)
RENAMED = {"QueryRequest": "ClassRowsRequest", "QuerySecret": "ClientSecret"}


def _warn(old: str, new: str, stacklevel: int) -> None:
    warnings.warn(f"{old} is renamed {new}; the old name is removed in pm_vector {REMOVED_IN}",
                  FutureWarning, stacklevel=stacklevel + 1)


def renamed(module: str, name: str, namespace: dict[str, Any]) -> Any:
    """The body of a module's ``__getattr__``: the object now called ``RENAMED[name]``, with a
    FutureWarning, or the usual AttributeError."""
    new = RENAMED.get(name)
    if new is None or new not in namespace:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", new, stacklevel=3)
    return namespace[new]


def renamed_keyword(function: str, old: str, new: str, old_value: Any, new_value: Any, default: Any = None) -> Any:
    """The value of keyword ``new`` when a caller may still pass it as ``old`` (FutureWarning);
    both at once is a TypeError."""
    if old_value is None:
        return new_value
    if new_value is not default:
        raise TypeError(f"{function}() got both {old!r} and {new!r}; pass {new!r} only")
    _warn(f"{function}(..., {old}=...)", f"{new}=", stacklevel=3)
    return old_value
