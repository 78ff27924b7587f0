"""The packages read top-down: each imports only what sits below it, lazy imports included.

Nothing is imported: the edges are :mod:`test_import_cycles`'s (every import statement of every
``pm_vector/**/*.py``, at module level, inside functions, under ``if``/``try``/``TYPE_CHECKING``),
grouped by the area a module belongs to. An edge from a module to one of its own area is free; an
edge to another area must go DOWN the order declared here. A new module of an existing room needs
no change here; a new room (a subpackage of ``pm_vector.db``, a top-level package) must be placed
in the order, and the test says so.

The rooms of ``pm_vector.db``, bottom to top (``docs/layout.md`` says the same):

- ``errors``, ``_binary``, ``run_tables``: the database's errors, binary encodings and run tables' names;
- ``postgres/``: which server, connecting, migrating, the privilege matrix;
- ``core/``: what every room reads of a collection (its row, anchor sets, raw features and items)
  and the clean-up of work whose process died;
- ``runs/``: the derived tables of an embedding run (the job, the delta, the merge, the erasure
  inside a run);
- ``store/``: the write API over items (ingest, delete, update, attach and sync), keeping the
  derived tables in step through ``runs/``; collections, anchors, the request log;
- ``kahm/``: KAHM roles of a collection, beside the store;
- ``resolve/``: a private request against the active run;
- ``pm_vector.db`` itself: the face.

Across the packages: the library (``manifold``, ``privacy``, ...) imports nothing of the protocol
or above; ``protocol/`` nothing of ``db/``, ``client/``, ``service/``; ``client/`` and ``db/``
nothing of each other nor of the service; ``service/`` nothing of the client; ``bench/`` nothing of
the command line; the command line is the top.
"""

from __future__ import annotations

import ast

import pytest

from test_import_cycles import ROOT, _modules, _targets  # the one reading of an import (tests/ is on the path)

#: ``pm_vector.db``'s rooms, bottom to top: a room imports its own modules and those of the rooms
#: below it; in a layer marked ``peers`` (True) its members may import each other
DB_LAYERS: list[tuple[set[str], bool]] = [
    ({"errors", "_binary", "run_tables"}, True),
    ({"postgres"}, False),
    ({"core"}, False),
    ({"runs"}, False),
    ({"store"}, False),
    ({"kahm"}, False),
    ({"resolve"}, False),
    ({"(face)"}, False),
]

#: pm_vector's top-level packages and modules, bottom to top, the same way: ``db`` and ``client``
#: are siblings that do not import each other; the package's face (``pm_vector/__init__``: the
#: version) imports nothing
PACKAGE_LAYERS: list[tuple[set[str], bool]] = [
    ({"(face)", "errors", "_validation", "deprecation", "defaults"}, True),
    ({"manifold", "privacy", "neighbors", "shortlist", "kahm", "datasets", "features"}, True),
    ({"protocol", "alignment"}, True),
    ({"db", "client"}, False),
    ({"service"}, False),
    ({"bench"}, False),
    ({"cli"}, False),
]

#: edges the order allows but the design does not: the service never imports the client
APART = {("service", "client")}


def _package_area(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(face)"


def _db_area(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["pm_vector", "db"]:
        return None
    return parts[2] if len(parts) > 2 else "(face)"


def _rank(layers, area: str) -> int:
    for i, (members, _peers) in enumerate(layers):
        if area in members:
            return i
    raise AssertionError(f"{area!r} is in no layer of tests/test_layers.py: place it in the order")


def _edges() -> list[tuple[str, str]]:
    modules = _modules()
    return sorted((m, t) for m, f in modules.items()
                  for t in _targets(m, ast.parse(f.read_text(encoding="utf-8")), modules))


def _upward(edges, area, layers) -> list[str]:
    """The edges that do not go down ``layers`` (edges inside one area, or outside them all, are free)."""
    bad = []
    for m, t in edges:
        a, b = area(m), area(t)
        if a is None or b is None or a == b:
            continue
        ra, rb = _rank(layers, a), _rank(layers, b)
        if rb > ra or (rb == ra and not layers[ra][1]) or (a, b) in APART:
            bad.append(f"{m} -> {t} ({a} may not import {b})")
    return bad


def test_every_area_is_placed_in_the_order():
    for m in _modules():
        _rank(PACKAGE_LAYERS, _package_area(m))
        if _db_area(m) is not None:
            _rank(DB_LAYERS, _db_area(m))


def test_the_database_rooms_import_only_downwards():
    # store/ and runs/ used to import each other (runs/ at the top of its modules, store/ inside functions)
    assert _upward(_edges(), _db_area, DB_LAYERS) == []


def test_the_packages_import_only_downwards():
    assert _upward(_edges(), _package_area, PACKAGE_LAYERS) == []


@pytest.mark.parametrize("edge,broken", [
    (("pm_vector.db.runs.jobs", "pm_vector.db.store.api"), True),
    (("pm_vector.db.store.sync", "pm_vector.db.runs.delta"), False),
    (("pm_vector.db.core.features", "pm_vector.db.runs.delta"), True),
    (("pm_vector.db.postgres.engine", "pm_vector.db.errors"), False),
    (("pm_vector.db.store.api", "pm_vector.db"), True),
    (("pm_vector.protocol.wire", "pm_vector.db.errors"), True),
    (("pm_vector.client.http", "pm_vector.service.errors"), True),
    (("pm_vector.db.store.api", "pm_vector.client.http"), True),
    (("pm_vector.service.app", "pm_vector.client"), True),
    (("pm_vector.service.app", "pm_vector.db.store"), False),
    (("pm_vector.shortlist", "pm_vector.privacy.cell_release"), False),
    (("pm_vector.bench.demo", "pm_vector.cli.demo"), True),
])
def test_the_rules_catch_an_upward_edge(edge, broken):
    assert bool(_upward([edge], _db_area, DB_LAYERS) + _upward([edge], _package_area, PACKAGE_LAYERS)) is broken
