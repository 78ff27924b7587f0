"""The wire protocol, below both the client and the server: what travels and how.

* :mod:`.releases`: the one table of releases (name, format, request type, guarantee, the
  client's builder, the server's resolver, the service's check, the run tables it reads) and the
  one default rule; :mod:`.requests` holds read-only views of it under older names;
* :mod:`.formats`: the format strings every request document names itself by;
* :mod:`.bounds`: the bounds and field checks every request passes (one named constant per
  limit: :data:`~.bounds.MAX_K_PRIME`, :data:`~.bounds.MAX_QUERY_ROWS`, ...), used by the
  client that builds a request, the service that parses one and :mod:`pm_vector.db` that
  answers one;
* the request types: :class:`ClassRowsRequest` (class rows, :mod:`.class_rows`, with
  :func:`frames_digest`), :class:`CellRequest` (:mod:`.cell_request`), :class:`LocationRequest`
  (:mod:`.location`, with the answer's checks), :class:`PrivateMailRequest` and
  :class:`ReleaseRequest` (the paper's protocol, :mod:`.paper`);
* :class:`PublicAnchor` (:mod:`.anchor`): the public anchor document's data as a client holds it;
* :mod:`.frame`: the public anchor frame rebuilt and verified (one function, one tolerance, one
  error for the client and the server); :mod:`.published_codes`: the items' published product
  codes as a document;
* :mod:`.codec`: how documents travel (msgpack or JSON).

``QueryRequest``, the class-rows request's name before 0.2.0, still imports from here until
:data:`pm_vector.deprecation.REMOVED_IN`, with a FutureWarning.

Nothing here imports :mod:`pm_vector.client`, :mod:`pm_vector.db` or :mod:`pm_vector.service`.
"""

from .anchor import PublicAnchor
from .bounds import MAX_K_PRIME, MAX_QUERY_ROWS
from .cell_request import CellRequest
from .class_rows import DEFAULT_SHORTLIST, ClassRowsRequest, frames_digest
from .codec import JSON, MEDIA_TYPES, MSGPACK, decode, encode
from .formats import CELL_FORMAT, CLASS_ROWS_FORMAT, LOCATION_FORMAT, PRIVATEMAIL_FORMAT, RELEASE_FORMAT
from .location import LocationRequest
from .paper import PrivateMailRequest, ReleaseRequest
from ..deprecation import renamed

__all__ = ["CELL_FORMAT", "CLASS_ROWS_FORMAT", "LOCATION_FORMAT", "LocationRequest", "DEFAULT_SHORTLIST", "JSON", "MAX_K_PRIME", "MAX_QUERY_ROWS",
           "MEDIA_TYPES", "MSGPACK", "PRIVATEMAIL_FORMAT", "RELEASE_FORMAT", "CellRequest", "PrivateMailRequest",
           "PublicAnchor", "ClassRowsRequest", "ReleaseRequest", "decode", "encode", "frames_digest"]


def __getattr__(name):  # old names (pm_vector.deprecation.RENAMED), until its REMOVED_IN

    return renamed(__name__, name)
