"""The modules a private query crosses on the client side, and the ones it enters twice (issue #37,
"the client, one path").

:func:`trace` runs a function under :func:`sys.settrace` on the calling thread only (a service
started in a thread of the same process, as the tests do, is not traced: its threads are not the
caller's) and records every call into a ``pm_vector`` module. From that:

* ``modules``: the distinct ``pm_vector`` modules the call entered, in order of first entry;
* ``client``: those of them under ``pm_vector.client``;
* ``reentered``: the ``pm_vector.client`` modules entered again from another ``pm_vector`` module
  while they were already on the stack below it -- a call back (``http -> location -> http``), the
  path going back and forth (``chains``: the client modules on the stack each time). A module that
  calls itself (through a library too: httpx calling the transport's network backend, contextlib
  the ledger's context manager), or is called again after it returned, is not counted.

Run against a service::

    python tools/client_path.py URL KEY COLLECTION [EPSILON]

prints the figures of one default query (``Client.query(name, x, epsilon=...)``, a fresh client,
so the public document is fetched inside the query). ``tests/service/test_client_path.py`` runs the
same on the test service and holds the figures.
"""

from __future__ import annotations

import sys
from pathlib import Path


def _module(filename: str) -> str | None:
    """The dotted name of a pm_vector module from a code object's file name (None: not ours)."""
    import pm_vector

    root = str(Path(pm_vector.__file__).resolve().parent)
    try:
        rel = Path(filename).resolve().relative_to(root)
    except ValueError:
        return None
    parts = list(rel.with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(["pm_vector", *parts])


def trace(fn, *args, **kwargs) -> dict:
    """``{"result", "modules", "client", "reentered"}`` of ``fn(*args, **kwargs)`` (module doc)."""
    names: dict[str, str | None] = {}
    order: list[str] = []
    reentered: list[str] = []
    chains: list[str] = []  # the client modules on the stack at each re-entry
    stack: list[str | None] = []  # the module of every traced frame, innermost last

    def name_of(code) -> str | None:
        f = code.co_filename
        if f not in names:
            names[f] = _module(f)
        return names[f]

    def local(frame, event, arg):
        if event == "return":
            if stack:
                stack.pop()
        return local

    def tracer(frame, event, arg):
        if event != "call":
            return None
        mod = name_of(frame.f_code)
        caller = next((m for m in reversed(stack) if m is not None), None)  # the nearest pm_vector frame below
        if mod is not None:
            if mod not in order:
                order.append(mod)
            if (mod.startswith("pm_vector.client") and caller != mod and mod in stack
                    and mod not in reentered):
                reentered.append(mod)
                path = [m for i, m in enumerate(stack) if m is not None and (i == 0 or stack[i - 1] != m)]
                chains.append(" -> ".join(m.rpartition(".")[2] for m in [*path, mod]
                                          if m.startswith("pm_vector.client")) + f" ({frame.f_code.co_name})")
        stack.append(mod)
        return local

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.settrace(old)
    return {"result": result, "modules": order, "client": [m for m in order if m.startswith("pm_vector.client")],
            "reentered": reentered, "chains": chains}


def default_query(url: str, key: str, name: str, x, *, epsilon: float = 4.0) -> dict:
    """:func:`trace` of one default ``Client.query`` by a fresh client (the public document fetched
    inside the query), after one untraced query by another client (the modules imported: an import
    runs a module's body, which is not the query's path)."""
    from pm_vector.client import Client, MemoryBudget

    for traced in (False, True):
        with Client(url, key, budget=MemoryBudget()) as c:
            c.budget.set_budget(c.budget_key(), epsilon=10 * epsilon)
            if traced:
                return trace(c.query, name, x, epsilon=epsilon, k=8)
            c.query(name, x, epsilon=epsilon, k=8)


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python tools/client_path.py URL KEY COLLECTION [EPSILON]", file=sys.stderr)
        return 2
    import numpy as np

    from pm_vector.client import Client, MemoryBudget

    url, key, name = argv[:3]
    eps = float(argv[3]) if len(argv) > 3 else 4.0
    with Client(url, key, budget=MemoryBudget()) as c:  # a query: the collection's width, from its anchor
        d = c.anchor_document(name)
    x = np.asarray(d["features"], dtype=np.float64)[0]
    t = default_query(url, key, name, x, epsilon=eps)
    print(f"release {t['result']['release']}: {len(t['modules'])} pm_vector modules, {len(t['client'])} of "
          f"pm_vector.client; entered again while on the stack: {t['reentered'] or 'none'}")
    for c in t["chains"]:
        print("   again:", c)
    for m in t["modules"]:
        print("  ", m)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
