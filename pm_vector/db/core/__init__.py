"""The core: what every room of :mod:`pm_vector.db` reads of a collection, below all of them.

The rooms, bottom to top (``tests/test_layers.py`` holds the order, lazy imports included):
``errors`` / ``_binary``, :mod:`~pm_vector.db.postgres`, **core**, :mod:`~pm_vector.db.runs`
(the derived tables of an embedding run), :mod:`~pm_vector.db.store` (the write API over items,
keeping the derived tables in step through ``runs``), :mod:`~pm_vector.db.kahm`,
:mod:`~pm_vector.db.resolve`, and the face :mod:`pm_vector.db`. ``runs`` and ``store`` both read a
collection's row, its anchor sets and its items, and both meet work whose process died; those
readers live here so that ``runs`` imports nothing of ``store`` and ``store`` imports ``runs`` at
the top of its modules (before, each imported the other: ``runs`` at module level, ``store``
inside functions).

Modules:

* :mod:`~pm_vector.db.core.collection` -- ``collection_row``, ``AnchorSet`` / ``load_anchor_set``,
  ``load_items`` (a collection's items by binary COPY), ``iso_datetime``, ``worker_identity``;
* :mod:`~pm_vector.db.core.features` -- where raw features are read from (``feature_sql``,
  ``feature_filter``: the items table, or an attached table's vector column);
* :mod:`~pm_vector.db.core.abandoned` -- work whose process died: the advisory-lock kinds,
  ``fail_run``, ``cleanup_stale_runs``, ``cleanup`` (runs and ingests).

It imports only :mod:`pm_vector.db.postgres`, :mod:`pm_vector.db.errors`, ``_binary`` and the
package's base modules; it has no public names of its own (the face :mod:`pm_vector.db` exports
``cleanup`` and ``cleanup_stale_runs``).
"""
