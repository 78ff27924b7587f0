"""Resolving private requests: a request against a collection's active run, answered in PostgreSQL.

The path of one request, in the order it runs: parse and check it (``requests``), check it
against the run's public anchor and frames (``frame``), rank each row's candidates (class rows:
``run_graph`` and ``resolution``; cells: ``cell_resolution``; the paper's PrivateMail:
``paper_resolution``), join the items and log the answer (``answer``).

Modules:

* :mod:`~pm_vector.db.resolve.resolution` -- ``resolve``, ``explain_resolution`` (entry point; class rows);
* :mod:`~pm_vector.db.resolve.cell_resolution` -- cell requests (release ``"cells"``);
* :mod:`~pm_vector.db.resolve.paper_resolution` -- the paper's requests and ``post_process_release``;
* :mod:`~pm_vector.db.resolve.requests` -- parsing, checks and limits, the snapshot, the answer's rows;
* :mod:`~pm_vector.db.resolve.frame` -- the public side of the active run: ``public_anchor``,
  ``client_frame``, ``class_frames``;
* :mod:`~pm_vector.db.resolve.run_graph` -- the run's graph in memory and the per-request k-NN;
* :mod:`~pm_vector.db.resolve.answer` -- what both class-level resolves share: item joins, the
  connection's adapters, the request log written on the primary.

Importing this package loads the wire protocol's request types (:mod:`pm_vector.protocol`; and
through them numpy and the manifold code); :mod:`pm_vector.db` itself does not import it.
"""

from .frame import class_frames, client_frame, public_anchor
from .paper_resolution import post_process_release
from .resolution import explain_resolution, resolve

__all__ = ["class_frames", "client_frame", "explain_resolution", "post_process_release", "public_anchor", "resolve"]
