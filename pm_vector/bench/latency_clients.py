"""`pm-vector bench latency`'s client side: every timed release's client, built from what the run
publishes, and its requests, each one timed (:mod:`pm_vector.bench.latency` times their resolves).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..client import PrivateMail
from ..client.cell_client import PrivateCellKNN
from ..client.location import PrivateLocationKNN
from ..client.query import PrivateKNN
from ..manifold.class_frames import ClassFrames
from ..manifold.codes import compact_answer_shape
from ..manifold.public_cells import PublicCells
from ..privacy import secure_generator
from ..privacy.cell_release import max_cells_for
from ..protocol.published_codes import unpack


def answer_shape(cfg, n_rows: int, info) -> dict[str, tuple[int, int | None]]:
    """Per release, the timed answer's ``(k', code prefix bytes)``: the default compact answer's by
    the public rule (:func:`~pm_vector.manifold.codes.compact_answer_shape` of the run's published
    stages), or ``(shortlist, None)`` for ``answer="full"`` or a run without codes."""
    codes = ((info.get("class_rows") or {}).get("codes") or {})
    if cfg.answer == "full" or codes.get("status") != "ready":
        return {r: (int(cfg.shortlist), None) for r in ("cells", "gaussian")}
    stages = tuple(int(b) for b in codes.get("widths") or codes["stage_bytes"])
    return {r: tuple(int(v) for v in compact_answer_shape(int(n_rows), r, float(cfg.epsilon), stages))
            for r in ("cells", "gaussian")}


def _timed(fn: Callable[[int], Any], n: int, warmup: int) -> tuple[list, list[float]]:
    """``fn(i)`` for ``i < n``, each timed; returns (the results, the times in ms after the warm-up)."""
    out, ms = [], []
    for i in range(n):
        t = time.perf_counter()
        out.append(fn(i))
        ms.append((time.perf_counter() - t) * 1e3)
    return out, ms[warmup:]


@dataclass
class Requests:
    """One collection's client side: every timed release's client, its requests (JSON) and client times."""

    shape: dict  # release -> (k', code prefix bytes or None)
    client_ms: list  # (a) PrivateMail
    reqs: list
    secrets: list
    pmv: Any = None  # (b') the Gaussian release
    pmv_client_ms: list | None = None
    pmv_reqs: list | None = None
    cells_client: Any = None  # (b'') the cell release
    cell_client_ms: list | None = None
    cell_reqs: list | None = None
    loc_client: Any = None  # the location release
    loc_client_ms: list | None = None
    loc_reqs: list | None = None


def client_requests(cfg, name: str, C: int, n_items: int, pa, info, frame,
                     Xq: np.ndarray, yq_c: np.ndarray, n_query: int) -> Requests:
    """Every timed release's client and its ``n_query`` requests, each request timed: (a) PrivateMail,
    then the location, cell and Gaussian releases the run publishes and ``cfg.release`` asks for."""
    client = PrivateMail(frame, epsilon=cfg.epsilon, delta=cfg.delta, _rng=cfg.seed + 7)
    out, client_ms = _timed(lambda i: client.request(Xq[i], int(yq_c[i]), pa, collection=name), n_query, cfg.warmup)
    r = Requests(shape=answer_shape(cfg, C, info), client_ms=client_ms,
                  reqs=[req.to_json() for req, _ in out], secrets=[sec for _, sec in out])

    ctx = _Ctx(cfg, name, C, n_items, pa, info, Xq, yq_c, n_query)
    for release in TIMED[cfg.release]:
        _CLIENTS[release](r, ctx)
    return r


#: ``bench latency --release``: which releases of the table it times, in this order
TIMED = {"location": ("location",), "cells": ("cells",), "gaussian": ("gaussian",), "both": ("cells", "gaussian"),
         "all": ("location", "cells", "gaussian")}


@dataclass
class _Ctx:
    """What every release's timed client is built from."""

    cfg: Any
    name: str
    C: int
    n_items: int
    pa: Any
    info: Any
    Xq: np.ndarray
    yq_c: np.ndarray
    n_query: int


def _location(r: Requests, x: _Ctx) -> None:
    """The location release's client and requests, when the run publishes its cells."""
    if not x.info.get("public_locations"):
        return

    cfg, Xq = x.cfg, x.Xq
    pc = unpack(x.info["product_codes"], x.info["class_rows"]["codes"]["digest"])
    loc_client = PrivateLocationKNN(PublicCells.from_dict(x.info["public_locations"]), cfg.epsilon,
                                    n_items=x.n_items, widths=pc.widths_, collection=x.name)
    loc_client._inject_generator(secure_generator(cfg.seed + 19))
    r.loc_client = loc_client
    r.loc_reqs, r.loc_client_ms = _timed(lambda i: loc_client.request(Xq[i]).to_json(), x.n_query, cfg.warmup)


def _cells(r: Requests, x: _Ctx) -> None:
    """The cell release's client and requests, when the run publishes its cells."""
    if not x.info.get("public_cells"):
        return

    cfg, Xq, yq_c, shape = x.cfg, x.Xq, x.yq_c, r.shape
    cells_client = PrivateCellKNN(PublicCells.from_dict(x.info["public_cells"]), cfg.epsilon,
                                  shortlist=shape["cells"][0], collection=x.name,
                                  max_cells=max_cells_for(x.n_items, x.C, shape["cells"][0]))
    cells_client._inject_generator(secure_generator(cfg.seed + 17))
    r.cells_client = cells_client
    out, r.cell_client_ms = _timed(lambda i: cells_client.request(Xq[i], int(yq_c[i])), x.n_query, cfg.warmup)
    r.cell_reqs = [req.to_json() for req, _ in out]


def _gaussian(r: Requests, x: _Ctx) -> None:
    """The Gaussian class-rows release's client and requests, when the run publishes class frames."""
    frames_doc = x.info.get("class_frames")
    if not frames_doc:
        return

    cfg, Xq, yq_c, pa = x.cfg, x.Xq, x.yq_c, x.pa
    pmv = PrivateKNN(ClassFrames.from_dict(frames_doc), pa.dummy_features, pa.dummy_labels, cfg.epsilon,
                     cfg.delta, shortlist=r.shape["gaussian"][0], collection=x.name)
    pmv._inject_generator(secure_generator(cfg.seed + 13))
    r.pmv = pmv
    out, r.pmv_client_ms = _timed(lambda i: pmv.request(Xq[i], int(yq_c[i])), x.n_query, cfg.warmup)
    r.pmv_reqs = [req.to_json() for req, _ in out]


#: the timed client of each release of the table
_CLIENTS = {"location": _location, "cells": _cells, "gaussian": _gaussian}
