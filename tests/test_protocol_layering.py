"""The wire protocol sits below the client and the server.

``pm_vector.db`` and ``pm_vector.service`` read requests through :mod:`pm_vector.protocol`, never
through :mod:`pm_vector.client` (the server does not depend on the client package), and
``pm_vector.protocol`` imports neither side. The import graph is
:func:`tests.test_import_cycles.import_graph`: every import statement, lazy ones inside functions
included.
"""

from __future__ import annotations

from test_import_cycles import PACKAGE, import_graph

#: programs in service/ that drive a client against a running service (the demo and the load
#: test): they are the client's users, not part of the server
CLIENT_DRIVERS = {f"{PACKAGE}.service.demo", f"{PACKAGE}.service.loadtest"}


def _imports_of(graph, under: str, forbidden: str, allowed: set[str] = frozenset()) -> list[str]:
    return sorted(f"{m} -> {t}" for m, ts in graph.items()
                  if (m == under or m.startswith(under + ".")) and m not in allowed
                  for t in ts if t == forbidden or t.startswith(forbidden + "."))


def test_db_and_service_do_not_import_the_client():
    g = import_graph()
    bad = (_imports_of(g, f"{PACKAGE}.db", f"{PACKAGE}.client")
           + _imports_of(g, f"{PACKAGE}.service", f"{PACKAGE}.client", CLIENT_DRIVERS))
    assert bad == [], "the server imports the client package (use pm_vector.protocol):\n" + "\n".join(bad)


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
