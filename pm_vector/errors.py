"""Exceptions raised by pm_vector. Every message names what was wrong and how to fix it."""


class PMVectorError(Exception):
    """Base class of all pm_vector errors."""


class InvalidInputError(PMVectorError, ValueError):
    """Input data is malformed: wrong shape, NaN/inf, non-unit rows, unknown labels..."""


class RequestError(InvalidInputError):
    """A request is malformed (shape, counts, numbers, format)."""


class PrivacyParameterError(PMVectorError, ValueError):
    """A privacy parameter (epsilon, delta, sensitivity) is outside its valid range."""


class DomainError(PMVectorError, ValueError):
    """A formula is used outside the domain where its proof holds; refusing to calibrate."""


class BudgetExceededError(PMVectorError):
    """A release would exceed the privacy budget the user set."""


class AlignmentError(PMVectorError, ValueError):
    """Anchors are degenerate or do not match; no transform can be estimated."""


class FrameMismatchError(AlignmentError):
    """The anchor frame rebuilt from a run's public data (anchor set, parameters, seed) does not
    reproduce the run's published anchor embedding, or the run was not built with an AnchorFrame
    (:func:`pm_vector.protocol.frame.rebuild_frame`)."""


class ServiceError(PMVectorError):
    """A pm_vector service's answer cannot be used: it refused the request (4xx), failed (5xx),
    answered with any other non-2xx status (a 3xx redirect is not followed: a client sends its
    request to the server it was given and nowhere else), or its answer is malformed
    (:class:`MalformedAnswerError`). ``status``: the HTTP status (None when the answer never
    arrived whole), ``error``: a short code, ``message``: what happened and what to do."""

    def __init__(self, status: int | None, error: str, message: str):
        super().__init__(f"{status} {error}: {message}" if status is not None else f"{error}: {message}")
        self.status, self.error, self.message = status, error, message


class MalformedAnswerError(ServiceError):
    """A service answered 2xx with something a client cannot use: a body that is not a document
    of the protocol, over the client's byte or element bounds, in a ``Content-Encoding`` the
    client did not ask for, or missing or mistyping a field the client reads. Nothing of the
    answer was used."""

    def __init__(self, message: str, status: int | None = None, error: str = "malformed_answer"):
        super().__init__(status, error, message)


class RunChangedError(ServiceError):
    """The collection's active run changed in the middle of a query (the anchor document or the
    answer names another run than the one the query started on), or changed more often than a
    client re-downloads an anchor document. Nothing of the answer was used; ask again."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(status, "run_changed", message)
