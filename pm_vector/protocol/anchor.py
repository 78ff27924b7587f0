"""The public anchor document's data as a client holds it (:class:`PublicAnchor`)."""

from __future__ import annotations

from .._validation import as_labels, as_matrix, require_unit_rows
from ..errors import InvalidInputError


class PublicAnchor:
    """The public data a server publishes: anchor rows (ids, features, labels) and the dummy pool."""

    def __init__(self, ids, features, labels, dummy_features, dummy_labels):
        self.features = as_matrix(features, "anchor features")
        require_unit_rows(self.features, "anchor features")
        self.labels = as_labels(labels, self.features.shape[0], "anchor labels")
        self.ids = list(ids)
        if len(self.ids) != self.features.shape[0] or len(set(self.ids)) != len(self.ids):
            raise InvalidInputError("anchor ids must be unique, one per anchor row.")
        self.dummy_features = as_matrix(dummy_features, "dummy features")
        require_unit_rows(self.dummy_features, "dummy features")
        self.dummy_labels = as_labels(dummy_labels, self.dummy_features.shape[0], "dummy labels")
        if self.dummy_features.shape[1] != self.features.shape[1]:
            raise InvalidInputError("dummy pool and anchor rows have different feature dimensions.")
