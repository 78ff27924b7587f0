"""Moved to :mod:`pm_vector.protocol.bounds` (the wire types' bounds); this name re-exports it."""

from ..protocol.bounds import *  # noqa: F401,F403
