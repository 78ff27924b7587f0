"""Kept for one release: the module moved to :mod:`pm_vector.db.postgres.replicas`; import from there."""

from .postgres.replicas import ReadRouter  # noqa: F401
