"""The format strings: every request document names its kind in ``"format"``."""

from ..errors import InvalidInputError

#: a PrivateMail request (the paper's protocol, post-processed by the client)
PRIVATEMAIL_FORMAT = "pm_vector.privatemail/1"
#: a PrivateMail request that stops after the private first iteration (the server post-processes)
RELEASE_FORMAT = "pm_vector.privatemail-release/1"
#: a class-rows request: one noised row per class
CLASS_ROWS_FORMAT = "pm_vector.class-rows/1"
#: a cell request: one reported public cell per class
CELL_FORMAT = "pm_vector.cells/1"

__all__ = ["CELL_FORMAT", "CLASS_ROWS_FORMAT", "PRIVATEMAIL_FORMAT", "RELEASE_FORMAT"]
#: a location request: one reported public cell of the whole collection
LOCATION_FORMAT = "pm_vector.location/1"

__all__ += ["LOCATION_FORMAT"]


def expect(value, wanted, message: str, error: type[Exception] | None = None) -> None:
    """Raise ``error(message)`` (:class:`~pm_vector.errors.InvalidInputError` by default) unless
    ``value == wanted``: how a request type checks its own document's ``format`` and ``release``
    (one check for every type; which release a request is is :mod:`pm_vector.protocol.releases`'
    business)."""
    if value != wanted:
        raise (error or InvalidInputError)(message)


__all__ += ["expect"]
