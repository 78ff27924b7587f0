"""One mapping of a request document's ``format`` to its request type: what the server parses and
the client builds. A new release adds one line here (and one resolver on the server,
:data:`pm_vector.db.resolve.resolution.RESOLVERS`), not a branch in every module."""

from __future__ import annotations

from .cell_request import CellRequest
from .class_rows import ClassRowsRequest
from .formats import CELL_FORMAT, CLASS_ROWS_FORMAT, LOCATION_FORMAT, PRIVATEMAIL_FORMAT, RELEASE_FORMAT
from .location import LocationRequest
from .paper import PrivateMailRequest, ReleaseRequest

#: format string -> request type (each has ``from_dict``, ``to_dict`` and ``epsilon``/``delta``)
REQUEST_TYPES = {
    LOCATION_FORMAT: LocationRequest,
    CELL_FORMAT: CellRequest,
    CLASS_ROWS_FORMAT: ClassRowsRequest,
    PRIVATEMAIL_FORMAT: PrivateMailRequest,
    RELEASE_FORMAT: ReleaseRequest,
}
#: the request types, for isinstance checks
REQUEST_CLASSES = tuple(REQUEST_TYPES.values())
#: release name -> request type of the pm_vector protocol's releases
RELEASE_TYPES = {"location": LocationRequest, "cells": CellRequest, "gaussian": ClassRowsRequest}

__all__ = ["REQUEST_CLASSES", "REQUEST_TYPES", "RELEASE_TYPES"]
