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
