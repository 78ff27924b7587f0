"""What a client keeps (:class:`ClientSecret`), whichever request it sends. The requests live in
:mod:`pm_vector.protocol` and are re-exported here (their old home)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from ..protocol.cell_request import CellRequest
from ..protocol.formats import CELL_FORMAT, PRIVATEMAIL_FORMAT
from ..protocol.paper import PrivateMailRequest
from ..deprecation import REMOVED_IN, renamed

__all__ = ["CELL_FORMAT", "PRIVATEMAIL_FORMAT", "CellRequest", "ClientSecret", "PrivateMailRequest"]


def __getattr__(name):  # old names (pm_vector.deprecation.RENAMED), until its REMOVED_IN

    return renamed(__name__, name)


@dataclass(frozen=True, kw_only=True)
class ClientSecret:
    """Kept by the client, never sent: which query row is the real one (``real_row``), the real
    query's ``label``, whether that label was ``predicted`` (the label-free client's classifier
    chose it), and, for the paper's protocol, every row's label (``row_labels``).

    One class for every release (class rows, cells, the paper's); ``QuerySecret`` was its name
    for the class-rows and cell clients (:mod:`pm_vector.deprecation`). Keyword arguments only:
    the two old classes took their fields in different orders.
    """

    real_row: int
    label: int
    predicted: bool = False
    row_labels: tuple = ()

    @property
    def row(self) -> int:
        """``real_row`` under ``QuerySecret``'s name for it (FutureWarning)."""
        warnings.warn(f"ClientSecret.row is renamed real_row; the old name is removed in pm_vector {REMOVED_IN}",
                      FutureWarning, stacklevel=2)
        return self.real_row

    def pick(self, per_row_results: list):
        """The real row's answer from the server's per-row results."""
        return per_row_results[self.real_row]
