"""Moved to :mod:`pm_vector.protocol.published_codes` (a wire document: the server publishes it,
the client checks it); this name re-exports it."""

from ..protocol.published_codes import MAX_ELEMENTS, pack, row_codes, summary, unpack

__all__ = ["MAX_ELEMENTS", "pack", "row_codes", "summary", "unpack"]
