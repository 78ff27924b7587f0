"""Views of the one table of releases (:mod:`pm_vector.protocol.releases`) under their older names:
what the server parses and the client builds. A new release is one
:func:`~pm_vector.protocol.releases.register` call there, not a line here."""

from __future__ import annotations

from collections.abc import Mapping

from . import releases


class _View(Mapping):
    """A read-only mapping computed from the table on every read (a release a test registers
    shows up at once)."""

    def __init__(self, build):
        self._build = build

    def __getitem__(self, key):
        return self._build()[key]

    def __iter__(self):
        return iter(self._build())

    def __len__(self):
        return len(self._build())

    def get(self, key, default=None):
        try:
            return self._build().get(key, default)
        except TypeError:  # an unhashable key
            return default


#: format string -> request type (each has ``from_dict``, ``to_dict`` and ``epsilon``/``delta``)
REQUEST_TYPES: Mapping[str, type] = _View(releases.request_types)
#: release name -> request type
RELEASE_TYPES: Mapping[str, type] = _View(lambda: {n: r.request_type for n, r in releases.RELEASES.items()})


class _AnyRequestType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, tuple(r.request_type for r in releases.RELEASES.values()))


class REQUEST_CLASSES(metaclass=_AnyRequestType):
    """``isinstance(x, REQUEST_CLASSES)``: is ``x`` a request of a release in the table (read on
    every check: a release a test registers counts at once)."""


__all__ = ["REQUEST_CLASSES", "REQUEST_TYPES", "RELEASE_TYPES"]
