"""Kept for one release (the README's example imports it): moved to
:mod:`pm_vector.db.resolve.resolution`; import from :mod:`pm_vector.db.resolve`."""

from .resolve.resolution import (  # noqa: F401
    class_frames,
    client_frame,
    explain_paper,
    explain_resolution,
    post_process_release,
    public_anchor,
    resolve,
    resolve_paper,
)
