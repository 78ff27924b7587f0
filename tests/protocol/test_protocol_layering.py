"""The wire protocol sits below the client and the server.

``pm_vector.db`` and ``pm_vector.service`` read requests through :mod:`pm_vector.protocol`, never
through :mod:`pm_vector.client` (the server does not depend on the client package), and
``pm_vector.protocol`` imports neither side. The import graph is
:func:`tests.test_import_cycles.import_graph`: every import statement, lazy ones inside functions
and those under ``if TYPE_CHECKING:`` included.

The server's check follows every module ``db`` and ``service`` reach, not only their own
imports: a shared module outside both (``pm_vector.alignment``, say) that imports the client puts
the server above the client as surely as a direct import does. Reaching a module also runs its
packages' ``__init__`` files, so they are followed too.
"""

from __future__ import annotations

from collections import deque

import pytest

from test_import_cycles import PACKAGE, import_graph


def _imports_of(graph, under: str, forbidden: str) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in graph.items()
                  if m == under or m.startswith(under + ".")
                  for t in ts if t == forbidden or t.startswith(forbidden + "."))


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _reached(graph, froms: tuple[str, ...], forbidden: str) -> list[str]:
    """Every module of ``forbidden`` that the modules under ``froms`` reach, each with one
    shortest chain of imports to it (breadth first; a module's packages count as reached with it,
    since Python runs their ``__init__`` first; the search does not continue inside ``forbidden``)."""

    def successors(m: str) -> set[str]:
        parts = m.split(".")
        parents = {".".join(parts[:i]) for i in range(1, len(parts))}
        return set(graph.get(m, ())) | {p for p in parents if p in graph}

    starts = sorted(m for m in graph if any(_within(m, f) for f in froms))
    prev: dict[str, str | None] = dict.fromkeys(starts)
    queue = deque(starts)
    while queue:
        v = queue.popleft()
        if _within(v, forbidden):
            continue
        for w in sorted(successors(v)):
            if w not in prev:
                prev[w] = v
                queue.append(w)
    out = []
    for m in sorted(m for m in prev if _within(m, forbidden) and prev[m] is not None):
        chain = [m]
        while prev[chain[-1]] is not None:
            chain.append(prev[chain[-1]])
        out.append(" -> ".join(reversed(chain)))
    return out


def test_db_and_service_do_not_import_the_client():
    g = import_graph()
    bad = (_imports_of(g, f"{PACKAGE}.db", f"{PACKAGE}.client")
           + _imports_of(g, f"{PACKAGE}.service", f"{PACKAGE}.client"))
    assert bad == [], "the server imports the client package (use pm_vector.protocol):\n" + "\n".join(bad)


def test_nothing_db_and_service_reach_imports_the_client():
    g = import_graph()
    bad = _reached(g, (f"{PACKAGE}.db", f"{PACKAGE}.service"), f"{PACKAGE}.client")
    assert bad == [], ("the server reaches the client package through a module it imports "
                       "(import from pm_vector.protocol):\n" + "\n".join(bad))


def test_the_programs_that_drive_a_client_sit_above_both_sides():
    # the demo and the load test drive the real client against the real service: they live in
    # bench/, which neither side (nor the protocol below them) imports
    g = import_graph()
    assert {f"{PACKAGE}.bench.demo", f"{PACKAGE}.bench.loadtest"} <= set(g)
    assert _imports_of(g, f"{PACKAGE}.bench.demo", f"{PACKAGE}.client") != []
    bad = [e for side in ("client", "db", "service", "protocol")
           for e in _imports_of(g, f"{PACKAGE}.{side}", f"{PACKAGE}.bench")]
    assert bad == [], "\n".join(bad)


def test_the_protocol_imports_neither_side():
    g = import_graph()
    bad = [e for side in ("client", "db", "service", "cli")
           for e in _imports_of(g, f"{PACKAGE}.protocol", f"{PACKAGE}.{side}")]
    assert bad == [], "\n".join(bad)


def test_the_check_sees_a_lazy_import(tmp_path):
    pkg = tmp_path / PACKAGE
    for d in ("db", "client", "protocol"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "client" / "query.py").write_text("X = 1\n")
    (pkg / "protocol" / "wire.py").write_text("X = 1\n")
    (pkg / "db" / "ok.py").write_text("from ..protocol import wire\n")
    (pkg / "db" / "lazy.py").write_text("def f():\n    from ..client.query import X\n    return X\n")
    g = import_graph(tmp_path)
    assert _imports_of(g, f"{PACKAGE}.db", f"{PACKAGE}.client") == [f"{PACKAGE}.db.lazy -> {PACKAGE}.client.query"]


def test_the_check_follows_what_the_server_reaches(tmp_path):
    # db imports a shared module lazily, which imports the client only for types: the server
    # reaches the client all the same (the chain stops at the first client module)
    pkg = tmp_path / PACKAGE
    for d in ("db", "service", "client", "protocol"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "client" / "__init__.py").write_text("from .request import R\n")
    (pkg / "client" / "request.py").write_text("from ..protocol.paper import R\n")
    (pkg / "protocol" / "paper.py").write_text("R = 1\n")
    (pkg / "shared.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                   "    from .client.request import R\n")
    (pkg / "fine.py").write_text("from .protocol.paper import R\n")
    (pkg / "db" / "lazy.py").write_text("def f():\n    from ..shared import R\n    return R\n")
    (pkg / "service" / "ok.py").write_text("from .. import fine\n")
    g = import_graph(tmp_path)
    assert _imports_of(g, f"{PACKAGE}.db", f"{PACKAGE}.client") == []  # its own imports are clean
    chain = f"{PACKAGE}.db.lazy -> {PACKAGE}.shared -> {PACKAGE}.client.request"
    assert _reached(g, (f"{PACKAGE}.db", f"{PACKAGE}.service"), f"{PACKAGE}.client") == [chain]
    (pkg / "shared.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                                   "    from .protocol.paper import R\n")
    assert _reached(import_graph(tmp_path), (f"{PACKAGE}.db", f"{PACKAGE}.service"), f"{PACKAGE}.client") == []


def test_one_limit_for_k_prime_and_query_rows():
    import pytest

    from pm_vector.db.resolve import requests, run_graph
    from pm_vector.db.runs import sharding
    from pm_vector.errors import InvalidInputError
    from pm_vector.protocol import bounds
    from pm_vector.service.settings import ServiceSettings

    # the server's own names for the limit are the protocol's constant, not copies of it
    assert run_graph.MAX_K_PRIME is bounds.MAX_K_PRIME and sharding.FILL is bounds.MAX_K_PRIME
    assert requests.MAX_QUERY_ROWS is bounds.MAX_QUERY_ROWS
    assert ServiceSettings().max_shortlist == bounds.MAX_K_PRIME
    # a service cannot be set to allow more candidates per row than a run's graph keeps
    with pytest.raises(InvalidInputError, match="max_shortlist"):
        ServiceSettings(max_shortlist=bounds.MAX_K_PRIME + 1)
    assert bounds.shortlist(bounds.MAX_K_PRIME) == bounds.MAX_K_PRIME  # the db checks k' with it
    for bad in (0, bounds.MAX_K_PRIME + 1, True, 5.0):
        with pytest.raises(InvalidInputError, match="k'"):
            bounds.shortlist(bad)
        with pytest.raises(InvalidInputError, match="k must be"):
            requests.check_k(bad)


def test_a_requests_digest_and_collection_bounds_have_one_home():
    """The wire types and the request dataclasses' own checks read the same bounds
    (pm_vector.protocol.bounds.MAX_DIGEST_CHARS / MAX_COLLECTION_CHARS), with their messages."""
    import pytest

    from pm_vector.errors import InvalidInputError
    from pm_vector.protocol import bounds
    from pm_vector.protocol.wire_types import Collection, Digest
    from pydantic import TypeAdapter

    assert TypeAdapter(Digest).json_schema()["maxLength"] == bounds.MAX_DIGEST_CHARS
    assert TypeAdapter(Collection).json_schema()["anyOf"][0]["maxLength"] == bounds.MAX_COLLECTION_CHARS
    assert bounds.digest("a" * bounds.MAX_DIGEST_CHARS, "bad") == "a" * bounds.MAX_DIGEST_CHARS
    with pytest.raises(InvalidInputError, match="^bad$"):
        bounds.digest("a" * (bounds.MAX_DIGEST_CHARS + 1), "bad")
    with pytest.raises(InvalidInputError, match="collection must be a collection name"):
        bounds.collection("c" * (bounds.MAX_COLLECTION_CHARS + 1))
    with pytest.raises(InvalidInputError, match=r"a location request is pure eps: delta must be 0; got 0\.1"):
        bounds.zero_delta(0.1, "a location request")
    assert bounds.pure_epsilon("inf") == float("inf")
    with pytest.raises(InvalidInputError, match=r"epsilon must be a number > 0 \(or inf\); got 0"):
        bounds.pure_epsilon(0)


@pytest.mark.parametrize("module, cls", [("location", "LocationRequest"), ("cell_request", "CellRequest"),
                                         ("class_rows", "ClassRowsRequest"), ("paper", "PrivateMailRequest")])
def test_a_request_document_with_an_unknown_field_is_refused_naming_it(module, cls):
    """One check of a document's keys (wire_types.check_keys) for every request type: an unknown
    field is an InvalidInputError naming it (the location request's formatted its list with
    ``:.200`` and raised TypeError), a missing one names the field."""
    import importlib

    from pm_vector.errors import InvalidInputError
    from pm_vector.protocol import formats

    t = getattr(importlib.import_module(f"pm_vector.protocol.{module}"), cls)
    fmt = {"location": formats.LOCATION_FORMAT, "cell_request": formats.CELL_FORMAT,
           "class_rows": formats.CLASS_ROWS_FORMAT, "paper": formats.PRIVATEMAIL_FORMAT}[module]
    doc = {"format": fmt, **{k: 1 for k in t._NEED}, "bogus": 1}
    with pytest.raises(InvalidInputError, match=r"unknown .*field\(s\) \['bogus'\]"):
        t.from_dict(doc)
    del doc["bogus"], doc[t._NEED[0]]
    with pytest.raises(InvalidInputError, match=f"missing fields: {t._NEED[0]}"):
        t.from_dict(doc)
