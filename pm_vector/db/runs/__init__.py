"""Embedding runs: the server-side job that embeds a collection and the per-run data it writes.

A run embeds the collection's items against its public anchor set (the embedding itself is an
injected function), writes the embeddings and their pgvector indexes, and builds what private
queries are answered from: the class rows (class frames, retained priors, neighbour graph, hub
counts, product codes) and the public cells. Only a finished run is switched to active.

Runs are the derived tables; :mod:`pm_vector.db.store` is the write API over items above them and
calls into here (the delta, new items placed, an erasure inside a run) to keep them in step. This
package imports nothing of ``store``: what it reads of a collection (its row, anchor sets, items)
and the clean-up of dead work are in :mod:`pm_vector.db.core` below both (``tests/test_layers.py``).

Modules:

* :mod:`~pm_vector.db.runs.jobs` -- ``run_embedding_job``, ``run_info``, ``list_runs``;
* :mod:`~pm_vector.db.runs.new_items` -- ``embed_new_items``: new items placed in the active run;
* :mod:`~pm_vector.db.runs.embeddings` -- a run's embedding tables, written by both;
* :mod:`~pm_vector.db.runs.class_rows` -- the per-run data of class-rows requests;
* :mod:`~pm_vector.db.runs.cell_data` -- the per-run data of the cell release;
* :mod:`~pm_vector.db.runs.sharding` -- class-rows runs spread over shards (by class);
* :mod:`~pm_vector.db.runs.kinds` -- THE registry of the kinds of run tables (``KINDS``) the releases name;
* :mod:`~pm_vector.db.runs.erase` -- erasure inside a run, and
  :mod:`~pm_vector.db.runs.erase_plan` -- what an erasure changes in a run's lists;
* :mod:`~pm_vector.db.runs.run_copy` -- binary COPY of a run's tables (a leaf below the two above).
"""

from .jobs import list_runs, run_embedding_job, run_info
from .new_items import embed_new_items

__all__ = ["embed_new_items", "list_runs", "run_embedding_job", "run_info"]
