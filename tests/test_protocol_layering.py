"""The wire protocol sits below the client and the server.

``pm_vector.db`` and ``pm_vector.service`` read requests through :mod:`pm_vector.protocol`, never
through :mod:`pm_vector.client` (the server does not depend on the client package), and
``pm_vector.protocol`` imports neither side. The import graph is
:func:`tests.test_import_cycles.import_graph`: every import statement, lazy ones inside functions
included.
"""

from __future__ import annotations

from test_import_cycles import PACKAGE, import_graph


def _imports_of(graph, under: str, forbidden: str) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in graph.items()
                  if m == under or m.startswith(under + ".")
                  for t in ts if t == forbidden or t.startswith(forbidden + "."))


def test_db_and_service_do_not_import_the_client():
    g = import_graph()
    bad = (_imports_of(g, f"{PACKAGE}.db", f"{PACKAGE}.client")
           + _imports_of(g, f"{PACKAGE}.service", f"{PACKAGE}.client"))
    assert bad == [], "the server imports the client package (use pm_vector.protocol):\n" + "\n".join(bad)


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
    assert requests._check_k_prime(bounds.MAX_K_PRIME) == bounds.MAX_K_PRIME
    for bad in (0, bounds.MAX_K_PRIME + 1, True, 5.0):
        with pytest.raises(InvalidInputError, match="k'"):
            requests._check_k_prime(bad)
        with pytest.raises(InvalidInputError, match="k must be"):
            requests._check_k(bad)
