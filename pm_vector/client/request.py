"""What a PrivateMail client keeps (:class:`ClientSecret`). The requests it sends live in
:mod:`pm_vector.protocol` and are re-exported here (their old home)."""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.cells import CellRequest
from ..protocol.formats import CELL_FORMAT
from ..protocol.formats import PRIVATEMAIL_FORMAT as FORMAT
from ..protocol.paper import PrivateMailRequest

__all__ = ["CELL_FORMAT", "FORMAT", "CellRequest", "ClientSecret", "PrivateMailRequest"]


@dataclass(frozen=True)
class ClientSecret:
    """Kept by the client, never sent: which query row is the real one."""

    real_row: int
    label: int
    row_labels: tuple

    def pick(self, per_row_results: list):
        """The real row's answer from the server's per-row results."""
        return per_row_results[self.real_row]
