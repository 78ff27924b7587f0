"""Exceptions of the database layer.

Every message says what was wrong and how to fix it. All subclass
:class:`pm_vector.errors.PMVectorError`; input problems also subclass
:class:`pm_vector.errors.InvalidInputError` (hence ``ValueError``).

The SQL functions in ``sql/`` raise errors with custom SQLSTATE codes
(``PM001`` ...); :func:`translate_sql_error` maps them onto these classes.
"""

from __future__ import annotations

from ..errors import InvalidInputError, PMVectorError


class DatabaseError(PMVectorError):
    """Base class of errors raised by :mod:`pm_vector.db`."""


class DatabaseConfigError(DatabaseError):
    """The database cannot be reached or is not set up for pm_vector."""


class PgvectorMissingError(DatabaseConfigError):
    """The pgvector extension is not installed in the server or cannot be created."""


class PgvectorVersionError(DatabaseConfigError):
    """The installed pgvector is older than the minimum pm_vector needs (0.7)."""


class SchemaNotReadyError(DatabaseConfigError):
    """The pm_vector schema is missing or not at the newest migration."""


class EmbeddedServerError(DatabaseError):
    """The embedded PostgreSQL server could not be started or stopped."""


class CollectionNotFoundError(DatabaseError, LookupError):
    """No collection of that name."""


class CollectionExistsError(DatabaseError):
    """A collection of that name already exists."""


class NoActiveRunError(DatabaseError):
    """The collection has no successful embedding run serving queries yet."""


class NoAnchorSetError(DatabaseError):
    """The collection has no anchor set of the requested role."""


class RunNotFoundError(DatabaseError, LookupError):
    """No embedding run with that id."""


class RawFeaturesNotAllowedError(DatabaseError, PermissionError):
    """The collection's settings forbid returning raw features to clients."""


class EmbeddingJobError(DatabaseError):
    """An embedding job failed; the previously active run keeps serving."""

    def __init__(self, message: str, run_id: int | None = None):
        super().__init__(message)
        self.run_id = run_id


class ClassRowsUnavailableError(DatabaseError):
    """The collection's active run has no class rows (built before they existed, or its anchor
    set cannot give class frames): class-rows requests need a new embedding job."""


class CellsUnavailableError(ClassRowsUnavailableError):
    """The active run publishes no ready cells (built before the cell release, or an anchor set that
    gives none): cell requests need a full embedding job."""


class ShardNotRegisteredError(DatabaseConfigError):
    """A shard name the coordinator does not know (``pm-vector db shard-add`` registers shards)."""


class ShardUnavailableError(DatabaseError):
    """A shard did not answer (down, unreachable); the message names it and its address. Nothing
    was written: retry once it is back."""


class DimensionMismatchError(InvalidInputError):
    """A vector's dimension differs from the collection's (or run's) dimension."""


class DuplicateExternalIdError(InvalidInputError):
    """An external id occurs twice in the input or already exists in the collection."""


class UnknownLabelError(InvalidInputError):
    """A label is not in the collection's label set."""


class AnchorIdMismatchError(InvalidInputError):
    """The request's anchor ids are not the active run's anchor set's ids, in order."""


class FramesDigestMismatchError(InvalidInputError):
    """A class-rows request was built on other class frames than the active run's."""


class CellsDigestMismatchError(InvalidInputError):
    """A cell request was built on other public cells than the active run's."""


#: the anchor frame rebuilt from a run's public data does not reproduce its stored anchor embedding:
#: one error for the client and the server (:func:`pm_vector.protocol.frame.rebuild_frame`)
from ..errors import FrameMismatchError  # noqa: E402,F401  (re-exported: its home is pm_vector.errors)


class CollectionBrokenError(DatabaseError):
    """The collection's attached table changed under it (a tracked column dropped, renamed or
    retyped, the table rewritten or dropped: ``settings -> 'broken'``): its items may no longer be
    the table's rows, so queries and syncs are refused until ``pm-vector attach NAME --resync``."""

    def __init__(self, collection: str, reason: str, at: str | None = None):
        self.collection, self.reason, self.at = collection, reason, at
        super().__init__(f"collection {collection!r} is broken: {reason}" + (f" (since {at})" if at else "")
                         + f"; `pm-vector attach {collection} --resync` rebuilds it from the table.")


class NoKAHMModelError(DatabaseError, LookupError):
    """The collection has no stored KAHM model (or not the one asked for)."""


class KAHMRefitNeededError(NoKAHMModelError):
    """The collection's current KAHM model is a raw model that may hold an erased (deleted) item among
    its training rows: its outputs are refused until it is refit (``pm-vector kahm fit``)."""


class RawKAHMDistancesNotAllowedError(RawFeaturesNotAllowedError):
    """Distances of a raw (non-private) KAHM model were asked for and the collection has not opted
    in (``settings["kahm"]["raw_distances"]``): they separate members from non-members."""


_SQLSTATE_CLASSES: dict[str, type[PMVectorError]] = {
    "PM001": CollectionNotFoundError,
    "PM002": NoActiveRunError,
    "PM003": DimensionMismatchError,
    "PM004": InvalidInputError,
    "PM005": RunNotFoundError,
    "PM006": ClassRowsUnavailableError,
    "PM007": ShardNotRegisteredError,
    "PM008": ShardUnavailableError,
    "PM009": CellsUnavailableError,
    "PM010": DimensionMismatchError,
    "PM011": UnknownLabelError,
    "PM012": InvalidInputError,
}


def translate_sql_error(exc: BaseException) -> BaseException:
    """Return the pm_vector exception for a psycopg error raised by our SQL, or ``exc`` itself.

    Handles the custom SQLSTATEs of ``sql/*.sql`` and unique violations on external ids.
    """
    sqlstate = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) or str(exc)
    hint = getattr(diag, "message_hint", None)
    if sqlstate in _SQLSTATE_CLASSES:
        msg = primary + (f" Hint: {hint}" if hint else "")
        return _SQLSTATE_CLASSES[sqlstate](msg)
    if sqlstate == "23505" and "uq_items_collection_external_id" in str(exc):
        detail = getattr(diag, "message_detail", None) or ""
        return DuplicateExternalIdError(
            f"an external id already exists in this collection ({detail.strip()}); nothing was written. "
            "Use unique external ids, or drop the existing item first.")
    return exc
