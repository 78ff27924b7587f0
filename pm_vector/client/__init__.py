"""The client side of pm_vector: private nearest-neighbour queries, built, charged and re-ranked
on the client's machine.

* :class:`Client` (:mod:`.http`): a pm_vector service's client. It fetches a collection's public
  anchor document once per active run (verified: :mod:`pm_vector.protocol.frame`, published
  codes and cells checked against their digests; :mod:`.public_documents`), builds the request
  locally, charges the privacy budget before any noise is drawn (:class:`PrivacyBudget`, one
  ledger entry per server origin, :mod:`.budget`), sends it (:mod:`.transport`: msgpack or
  JSON) and re-ranks its real row's candidates locally (:mod:`.rerank`).
* :class:`PrivateKNN` (:mod:`.query`): the default release, one noised row per class (exact
  discrete Gaussian; the guarantee is :mod:`pm_vector.privacy.class_rows`).
* :class:`PrivateCellKNN` (:mod:`.cell_client`): the cell release, one public cell per class by
  randomized response (pure epsilon; :mod:`pm_vector.privacy.cell_release`).
* The paper's protocol, as an option (``protocol="privatemail_paper"``): :class:`PrivateMail`
  (:mod:`.privatemail`; its guarantee between real queries: :func:`paper_protocol_guarantee`)
  and :class:`~pm_vector.client.release.ReleaseOnlyPrivateMail` (the server post-processes).

What a client keeps is never sent: :class:`ClientSecret` says which row is real. The request
types themselves (:class:`ClassRowsRequest`, :class:`CellRequest`, :class:`PrivateMailRequest`,
the public data :class:`PublicAnchor`) are the wire protocol's (:mod:`pm_vector.protocol`, shared
with the server) and are re-exported here. ``QueryRequest`` and ``QuerySecret``, their names
before 0.2.0, still import from here until :data:`pm_vector.deprecation.REMOVED_IN`, with a
FutureWarning.
"""

from ..protocol import CellRequest, ClassRowsRequest, PrivateMailRequest, PublicAnchor
from .budget import MemoryBudget, PrivacyBudget
from .cell_client import PrivateCellKNN
from .http import Client, ServiceError
from .privatemail import PrivateMail, frame_params, paper_protocol_guarantee
from .query import PrivateKNN
from .request import ClientSecret
from .rerank import rank, rerank
from ..deprecation import renamed

__all__ = ["CellRequest", "ClassRowsRequest", "Client", "ClientSecret", "MemoryBudget", "PrivacyBudget",
           "PrivateCellKNN", "PrivateKNN", "PrivateMail", "PrivateMailRequest", "PublicAnchor", "ServiceError",
           "frame_params", "paper_protocol_guarantee", "rank", "rerank"]


def __getattr__(name):  # old names (pm_vector.deprecation.RENAMED), until its REMOVED_IN

    return renamed(__name__, name)
