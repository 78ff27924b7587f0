"""The per-run data of class-rows requests (format ``pm_vector.class-rows/1``), built by the
embedding job.

For a run, :func:`build` computes in memory (from the run's public anchor set and the items it
embeds):

* the run's :class:`~pm_vector.manifold.class_frames.ClassFrames` (fit on the public anchor
  set; stored as JSON in ``embedding_runs.class_frames`` and published to clients);
* the **prior**: every item of a class ``c`` with its clipped coordinates in ``c``'s frame;
* the **graph**: the ``graph_degree`` nearest other items of every item by raw features (any
  class): the first columns of the ONE graph the job computes for the class rows and the cell
  release (``max(graph_degree, CELL_GRAPH_DEGREE)`` neighbours), with
  :func:`pm_vector.neighbors.neighbor_graph`: exact up to
  ``graph_exact_max_items`` items (default 50,000), approximate above (blocked exact search over
  faiss k-means cells, float32, its probe chosen on a sample; ``"hnsw"``: a faiss HNSW index);
  ``graph`` = ``"exact"`` / ``"ivf"`` / ``"hnsw"`` forces one (collection setting
  ``settings["class_rows"]`` or the job's override); the document records ``graph_method``;
* the **hubs**: ``hub_c(i)`` = number of items ``j`` of class ``c`` with ``i`` in ``N(j)``;
* the **codes**: :class:`~pm_vector.manifold.codes.ProductCodes` of ``code_bytes`` bytes per
  item in ``code_stages`` residual stages and one single-stage table per width of ``code_widths``
  (at most the feature dimension; collection setting ``settings["class_rows"]``, default 32 B in 2
  stages of 16 and tables of 64, 96, 128, 160, 192 and 256 B: the widths the location release chooses
  from; the class-rows answers take the 32- and 64-byte widths; formerly 256 B in 16 residual
  stages of 16, whose later stages over-fit the small anchor), fit on the public anchor set only
  (public data; published with the public anchor, :mod:`pm_vector.protocol.published_codes`, and
  digested in the run's document, ``class_rows["codes"]``) and every item's code: what a compact
  answer carries of each candidate, and what a client re-ranks its real row by. An anchor set
  the codes cannot be fit on (fewer rows than a sub-quantiser's 256 centroids) leaves the run
  without codes (``class_rows["codes"] = {"status": "unavailable", "error"}``): it answers
  with raw features only, where the collection allows them.

:func:`write` stores them in ``run_<id>_prior`` / ``_neighbors`` / ``_hubs`` (binary COPY, each
batch committed like the embeddings: nothing points at the run before the job's switch), the
codes in ``run_<id>_codes(item_id bigint, code bytea)`` (on the node that joins the candidates
with their items: the coordinator of a sharded run) and the published codes document in
``embedding_runs.public_projection``, and :func:`build_indexes` indexes them (all of them are
dropped with the run by ``pm_vector.pm_drop_run_tables``, so a failed or killed job leaves none). ``embedding_runs.class_rows`` records the parameters, the
class order and sizes, the frames' digest and ``status`` (``ready``; ``unavailable`` with
``error`` when the anchor set cannot give frames, e.g. a class with fewer than 2 anchor rows:
the run then serves PrivateMail requests only).

Since migration 0009 each prior row also carries its item's neighbour list (``nbrs bigint[]``) and
those neighbours' hub counts in the item's class (``nhub float8[]``), so that the shortlist reads
them with the prior row instead of joining the graph and the hubs (``sql/0009_fast_shortlist.sql``);
runs created before keep their layout and the 0005 statement.

The SQL that answers a request from these tables is ``pm_vector.pm_shortlist``
(``sql/0005_class_rows.sql``, ``sql/0009_fast_shortlist.sql``); it computes exactly
:meth:`pm_vector.shortlist.PosteriorShortlist.scores` on the same data.

New items (:func:`extend`, called by :func:`pm_vector.db.runs.new_items.embed_new_items`): each new
item gets its prior row, its own neighbour list (against all items of the run, new ones
included; searched as the job built its graph, :func:`pm_vector.neighbors.knn_rows`: exactly in
float64 up to ``graph_exact_max_items`` items, by an exact float32 search above), its code, and adds its contribution to the hub counts of its class (the ``nhub``
of every prior row listing an item whose count changed gains the change; the new rows are written
with their ``nhub`` read from the hub counts once those include the new items); the neighbour lists of
existing items are **not** recomputed (a new item never enters an older item's ``N(j)``), so
after new items the run's scores are those of a graph slightly different from a fresh fit. The
cell release's per-cell hub counts are extended alike (:func:`pm_vector.db.runs.cell_data.extend`). A
full embedding job rebuilds everything exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
from psycopg import sql
from psycopg.types.json import Json

from ... import shortlist as _shortlist
from ...errors import InvalidInputError
from ...neighbors import GRAPH_METHODS, graph_method, neighbor_graph, EXACT_MAX_ITEMS, knn_rows
from .. import _binary
from ..errors import EmbeddingJobError
from ..run_tables import run_index, run_table, shard_names
from .prior_rows import hub_counts, leave_room_for_updates, refresh_nhub, reverse_index
from .run_copy import copy_hubs as _copy_hubs, copy_pairs as _copy_pairs, copy_prior as _copy_prior  # noqa: F401
from . import cell_data as _cells, locations as _loc, sharding
from .carry import fill_codes
from .published import Published
from ...manifold.class_frames import ClassFrames
from ...manifold.codes import MAX_CODE_BYTES, MIN_CODE_BYTES, ProductCodes
from ...protocol.class_rows import frames_digest
from ...protocol.published_codes import pack, summary, unpack
from ...shortlist import CELL_GRAPH_DEGREE, PosteriorShortlist

FORMAT = "pm_vector.class-rows/1"
DEFAULTS = {"n_components": 4, "clip_quantile": 0.9, "graph_degree": _shortlist.GRAPH_DEGREE,
            "max_prior": _shortlist.MAX_PRIOR, "min_weight": _shortlist.MIN_WEIGHT,
            "graph": "auto", "graph_exact_max_items": _shortlist.EXACT_MAX_ITEMS,
            "code_bytes": 32, "code_stages": 2, "code_widths": (64, 96, 128, 160, 192, 256)}


def params(settings: Mapping[str, Any] | None = None, override: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The class-rows parameters: defaults, then the collection's ``settings["class_rows"]``, then
    ``override``. Validated."""
    p = dict(DEFAULTS)
    for src in ((settings or {}).get("class_rows") or {}, override or {}):
        unknown = set(src) - set(DEFAULTS)
        if unknown:
            raise InvalidInputError(f"unknown class-rows parameter(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}.")
        p.update(src)
    for k in ("n_components", "graph_degree", "max_prior"):
        v = p[k]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidInputError(f"class-rows parameter {k} must be a positive integer, got {v!r}.")
        p[k] = int(v)
    if p["n_components"] > 2000 or p["max_prior"] > 100_000 or p["graph_degree"] > 1000:
        raise InvalidInputError("class-rows parameters out of range (n_components <= 2000, graph_degree <= 1000, "
                                "max_prior <= 100000).")
    q = p["clip_quantile"]
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < float(q) <= 1:
        raise InvalidInputError(f"class-rows parameter clip_quantile must be in (0, 1], got {q!r}.")
    p["clip_quantile"] = float(q)
    mw = p["min_weight"]
    if isinstance(mw, bool) or not isinstance(mw, (int, float)) or not 0 <= float(mw) < 1:
        raise InvalidInputError(f"class-rows parameter min_weight must be in [0, 1), got {mw!r}.")
    p["min_weight"] = float(mw)
    if p["graph"] not in GRAPH_METHODS:
        raise InvalidInputError(f"class-rows parameter graph must be one of {', '.join(map(repr, GRAPH_METHODS))}, "
                                f"got {p['graph']!r}.")
    em = p["graph_exact_max_items"]
    if isinstance(em, bool) or not isinstance(em, (int, np.integer)) or em < 0:
        raise InvalidInputError(f"class-rows parameter graph_exact_max_items must be a non-negative integer, got {em!r}.")
    p["graph_exact_max_items"] = int(em)

    b, st = p["code_bytes"], p["code_stages"]
    for k, v in (("code_bytes", b), ("code_stages", st)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InvalidInputError(f"class-rows parameter {k} must be an integer, got {v!r}.")
    if not MIN_CODE_BYTES <= int(b) <= MAX_CODE_BYTES:
        raise InvalidInputError(f"class-rows parameter code_bytes (bytes of every item's code, all stages) must be in "
                                f"{MIN_CODE_BYTES}..{MAX_CODE_BYTES}, got {b}.")
    if int(st) < 1 or int(b) % int(st):
        raise InvalidInputError(f"class-rows parameter code_stages must be a positive divisor of code_bytes ({b}): "
                                f"every stage has the same width; got {st}.")
    p["code_bytes"], p["code_stages"] = int(b), int(st)
    ws = p["code_widths"]
    if (not isinstance(ws, (list, tuple)) or len(ws) > 16
            or any(isinstance(w, bool) or not isinstance(w, (int, np.integer)) for w in ws)
            or len(set(ws)) != len(ws) or any(not int(b) < int(w) <= MAX_CODE_BYTES for w in ws)):
        raise InvalidInputError(f"class-rows parameter code_widths must be a list of at most 16 distinct integers in "
                                f"({b}, {MAX_CODE_BYTES}] (each a single-stage code table of that many bytes); "
                                f"got {ws!r:.80}.")
    p["code_widths"] = tuple(sorted(int(w) for w in ws))
    return p


@dataclass
class ClassRowsData:
    frames: Any  # ClassFrames
    params: dict
    item_ids: np.ndarray  # (N,) run item ids, ascending
    neighbors: np.ndarray  # (N, g) item ids
    prior_ids: np.ndarray  # (P,) items with a label among the frames' classes
    prior_labels: np.ndarray
    prior_coords: np.ndarray  # (P, d) float64, clipped
    hub_labels: np.ndarray
    hub_ids: np.ndarray
    hub_counts: np.ndarray
    product_codes: Any = None  # ProductCodes fit on the public anchor set (None: unavailable)
    codes: np.ndarray | None = None  # (N, code_bytes) uint8, the items' codes in item_ids order
    codes_error: str | None = None  # why the run has no codes
    placement: dict | None = None  # sharded runs: {shard: [class positions]} (pm_vector.db.runs.sharding)
    prior_nbrs: np.ndarray | None = None  # (P, g) item ids: each prior item's neighbour list
    prior_nhub: np.ndarray | None = None  # (P, g) float64: hub count of each of them in the item's class
    cells: Any = None  # pm_vector.db.runs.cell_data.CellsData: the cell release's public cells and per-cell hub counts
    cells_doc: dict | None = None  # what class_rows -> 'cells' records (ready, or unavailable with the reason)
    locations: Any = None  # pm_vector.db.runs.locations.LocationsData: the location release's cells and lists
    locations_doc: dict | None = None  # what class_rows -> 'locations' records
    graph_method: str = "exact"  # how the graph was computed: "exact", "ivf" or "hnsw"
    # seconds of the job's parts (graph_s, cells_s, ..., write_*_s) and, for a blocked graph, its
    # graph_cells, graph_probe and graph_sample_recall (figures of the raw data: the run's timings
    # record them, server-side; the published document does not)
    timings: dict = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        classes = self.frames.classes_
        sizes = [int(np.sum(self.prior_labels == c)) for c in classes]
        return {"format": FORMAT, "status": "ready", **self.params,
                "graph_degree_effective": int(self.neighbors.shape[1]), "graph_method": self.graph_method,
                "classes": [int(c) for c in classes], "class_sizes": sizes,
                "frames_digest": frames_digest(self.frames), "n_items": int(self.item_ids.shape[0]),
                "codes": self.codes_doc(),
                **({} if self.cells_doc is None else {"cells": self.cells_doc}),
                **({} if self.locations_doc is None else {"locations": self.locations_doc}),
                **({} if self.placement is None else {"shards": self.placement})}


    def codes_doc(self) -> dict[str, Any]:
        """``class_rows["codes"]``: ``{"status": "ready", "code_bytes", "n_stages", "stage_bytes",
        "digest"}`` or ``{"status": "unavailable", "error"}``."""
        if self.product_codes is None:
            return {"status": "unavailable", "error": str(self.codes_error or "no codes")[:500]}
        return {"status": "ready", **summary(self.product_codes)}


#: centroids of each sub-quantiser (8 bits): k-means needs at least as many training rows
_CENTROIDS = 256


def fit_codes(anchor_X, p: Mapping[str, Any]):
    """``(ProductCodes, None)`` fit on the public anchor, or ``(None, reason)`` when it cannot be.

    An anchor set of fewer than 256 rows is repeated whole (every row the same number of times,
    so its mean and principal directions are unchanged) up to 256 rows: the sub-quantisers then
    keep the anchor's own sub-vectors among their centroids. Public data either way. The
    returned codes are the published ones (their float32 parameters, as
    :meth:`~pm_vector.manifold.codes.ProductCodes.to_dict` writes them), so every stored code is
    ``encode`` of the published codes."""
    A = np.asarray(anchor_X, dtype=np.float64)
    if 2 <= A.shape[0] < _CENTROIDS:
        A = np.tile(A, (-(-_CENTROIDS // A.shape[0]), 1))
    try:
        widths = tuple(w for w in p.get("code_widths", ()) if w <= A.shape[1])  # a table has at most d sub-spaces
        pc = ProductCodes(int(p["code_bytes"]), int(p["code_stages"]), widths).fit(A)
        # what is published (float32 parameters) is what codes the items: a client's codes are the stored ones
        return ProductCodes.from_dict(pc.to_dict()), None
    except (InvalidInputError, RuntimeError) as exc:  # faiss: fewer anchor rows than 256 centroids
        return None, f"the product codes cannot be fit on the public anchor set ({str(exc).splitlines()[-1][:300]})"


def unavailable(p: Mapping[str, Any], error: str) -> dict[str, Any]:
    return {"format": FORMAT, "status": "unavailable", "error": str(error)[:2000], **dict(p)}


def build(anchor_X, anchor_y, item_ids, item_X, item_y, p: Mapping[str, Any],
          published: Published | None = None, carried=None) -> ClassRowsData:
    """Frames, prior, graph and hubs of a run (see the module doc). Raises InvalidInputError when
    the anchor set cannot give class frames. ``published``: the public documents to publish again
    instead of fitting them (:mod:`pm_vector.db.runs.published`); ``carried``: the codes of the items
    the run of its codes holds (:func:`pm_vector.db.runs.carry.codes`), not encoded again."""
    pub = published or Published()
    carried = carried if pub.codes is not None else None  # (carried codes are the published codes')
    frames = pub.frames or ClassFrames(int(p["n_components"]), float(p["clip_quantile"])).fit(anchor_X, anchor_y)
    if pub.codes is not None:
        pcodes, codes_error = pub.codes, None
    else:
        pcodes, codes_error = fit_codes(np.asarray(anchor_X, dtype=np.float64), p)  # public data only
    X = np.asarray(item_X)
    y = np.asarray(item_y, dtype=np.int64)
    ids = np.asarray(item_ids, dtype=np.int64)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    # ONE graph for the class rows and the cell release: the max(graph_degree, CELL_GRAPH_DEGREE)
    # nearest other items of every item; each part reads its first columns (exact: the smaller
    # graph itself, ties by position; approximate: the same search, fewer results kept)
    method = graph_method(X.shape[0], p["graph"], int(p["graph_exact_max_items"]))
    ginfo: dict[str, Any] = {}
    graph = neighbor_graph(X, max(int(p["graph_degree"]), CELL_GRAPH_DEGREE), method=method, info=ginfo)
    timings["graph_s"] = time.perf_counter() - t
    timings.update({f"graph_{k}": float(v) for k, v in ginfo.items()})
    t = time.perf_counter()
    # the same fit the in-memory shortlist uses: graph, prior and hub counts are stored as it has them
    ps = PosteriorShortlist(graph_degree=int(p["graph_degree"]), graph=p["graph"],
                            graph_exact_max_items=int(p["graph_exact_max_items"])).fit(frames, X, y, neighbors=graph)
    prior = [ps.prior_[int(c)] for c in frames.classes_]
    # per prior item: its neighbours and their hub counts in its class (the fast layout of migration 0009)
    nb = [ps.neighbors_[pi] for pi, _ in prior]
    nh = [ps.hubs_[int(c)][n] for c, n in zip(frames.classes_, nb)]
    g_eff = ps.neighbors_.shape[1]
    pidx = np.concatenate([pi for pi, _ in prior]) if prior else np.zeros(0, np.int64)
    coords = np.concatenate([pc for _, pc in prior]) if prior else np.zeros((0, frames.n_components))
    hl, hi, hc = [], [], []
    for c in frames.classes_:
        cnt = ps.hubs_[int(c)]
        nz = np.flatnonzero(cnt)
        hl.append(np.full(nz.size, c, np.int64))
        hi.append(ids[nz])
        hc.append(cnt[nz])
    cat = (lambda a, dt: np.concatenate(a) if a else np.zeros(0, dt))

    timings["prior_hubs_s"] = time.perf_counter() - t
    t = time.perf_counter()
    try:  # the cell release: public cells (anchor only) and per-cell hub counts on the same graph
        cells = _cells.build(anchor_X, anchor_y, X, y, ids, frames.classes_, neighbors=graph, cells=pub.cells)
        cells_doc = cells.doc()
    except InvalidInputError as exc:
        cells, cells_doc = None, _cells.unavailable(str(exc))
    timings["cells_s"] = time.perf_counter() - t
    t = time.perf_counter()

    try:  # the location release: cells of the whole anchor, per-cell hub counts on the same graph
        locations = _loc.build(anchor_X, X, ids, neighbors=graph, cells=pub.locations)
        locations_doc = locations.doc()
    except InvalidInputError as exc:
        locations, locations_doc = None, _loc.unavailable(str(exc))
    del graph
    timings["locations_s"] = time.perf_counter() - t
    t = time.perf_counter()
    item_codes = None if pcodes is None else fill_codes(pcodes, X, carried)
    timings["codes_s"] = time.perf_counter() - t  # (the encode of the items not carried)
    if carried is not None:  # (the read of the carried ones, before the build)
        timings.update(codes_carried=float(carried.held.sum()), codes_read_s=carried.read_s)
    return ClassRowsData(timings=timings, frames=frames, params=dict(p), item_ids=ids, neighbors=ids[ps.neighbors_],
                         prior_ids=ids[pidx],
                         prior_labels=y[pidx], prior_coords=coords, hub_labels=cat(hl, np.int64),
                         hub_ids=cat(hi, np.int64), hub_counts=cat(hc, np.float64), product_codes=pcodes,
                         codes=item_codes, codes_error=codes_error,
                         prior_nbrs=ids[np.concatenate(nb)] if nb else np.zeros((0, g_eff), np.int64),
                         prior_nhub=np.concatenate(nh) if nh else np.zeros((0, g_eff)), cells=cells,
                         cells_doc=cells_doc, graph_method=ps.graph_method_, locations=locations,
                         locations_doc=locations_doc)


def _create_codes_table(conn, run_id: int) -> None:
    """The run's ``run_<id>_codes(item_id bigint, code bytea)`` (dropped with the run's tables by
    ``pm_vector.pm_drop_run_tables``; its primary key comes with :func:`build_indexes`)."""
    conn.execute(sql.SQL("CREATE TABLE {} (item_id bigint NOT NULL, code bytea NOT NULL)").format(run_table(run_id, "codes")))


def copy_codes(conn, run_id: int, ids, codes, batch: int, commit: bool, frozen: bool = False) -> None:
    """COPY product codes ``codes`` of items ``ids`` into the run's ``run_<id>_codes`` (``frozen``:
    :func:`pm_vector.db._binary.copy_options`)."""
    m = codes.shape[1]
    for s in range(0, ids.shape[0], batch):
        e = min(ids.shape[0], s + batch)
        stream = _binary.encode([("item_id", "int8", 0), ("code", "bytea", m)],
                                {"item_id": ids[s:e], "code": codes[s:e]})
        _binary.copy_in(conn, sql.SQL("COPY {} (item_id, code) FROM STDIN {}").format(
            run_table(run_id, "codes"), _binary.copy_options(frozen)), stream)
        if commit and not frozen:
            conn.commit()


def prior_has_nbrs(conn, run_id: int) -> bool:
    """Whether the run's prior keeps neighbour lists (runs created after migration 0009)."""
    return bool(conn.execute("SELECT pm_vector.pm_run_has_nbrs(%s)", [int(run_id)]).fetchone()[0])


def write(conn, run_id: int, data: ClassRowsData, batch: int = 20_000,
          progress: Callable[[int, int], None] | None = None) -> None:
    """Create the run's class-rows tables (and codes table) and COPY the data in; the published codes
    document goes to ``embedding_runs.public_projection``. On one node each table is created and
    filled in one transaction, its rows written frozen (:func:`pm_vector.db._binary.copy_options`:
    nothing writes the table again before its next change; the prior by class partition, as a
    partitioned table takes no frozen COPY); on a cluster each batch is committed."""
    rid = int(run_id)
    t = time.perf_counter()
    classes = [int(c) for c in data.frames.classes_]
    shards = shard_names(conn)
    if shards:  # a coordinator: the prior, graph and hubs go to the shards, by class
        data.placement = sharding.placement(len(classes), shards)
        sharding.create_tables(conn, rid, int(data.frames.n_components), classes, data.placement)
        sharding.write(conn, rid, data, data.placement, batch, progress)
    else:
        conn.execute("SELECT pm_vector.pm_create_class_rows_tables(%s, %s, %s::bigint[])",
                     [rid, int(data.frames.n_components), classes])
        leave_room_for_updates(conn, rid)
        fast = prior_has_nbrs(conn, rid)  # each prior row carries its neighbour list and their hubs
        done, n = 0, data.prior_ids.shape[0]
        for k, c in enumerate(classes):  # (partition k: pm_create_class_rows_tables's name for class k)
            sel = np.flatnonzero(data.prior_labels == c)
            _copy_prior(conn, rid, data.prior_ids[sel], data.prior_labels[sel], data.prior_coords[sel], batch, False,
                        None, data.prior_nbrs[sel] if fast else None, data.prior_nhub[sel] if fast else None,
                        table=run_table(rid, f"prior_{k}"), frozen=True)
            done += sel.size
            if progress is not None:
                progress(done, n)
        if done != n:  # (a row of no class: the partitioned table would have refused it)
            raise EmbeddingJobError(f"{n - done} prior rows have a label outside the run's classes {classes}.")
        g = data.neighbors.shape[1]
        _copy_pairs(conn, run_table(rid, "neighbors"), ("item_id", "neighbor_id"),
                    np.repeat(data.item_ids, g), data.neighbors.ravel(), batch * 4, False, frozen=True)
        _copy_hubs(conn, run_table(rid, "hubs"), data.hub_labels, data.hub_ids, data.hub_counts, batch * 4, False,
                   frozen=True)
        conn.commit()
    if data.codes is not None:
        conn.execute("UPDATE pm_vector.embedding_runs SET public_projection = %s WHERE id = %s",
                     [Json(pack(data.product_codes)), rid])
        conn.commit()
        _create_codes_table(conn, rid)
        copy_codes(conn, rid, data.item_ids, data.codes, batch, False, frozen=True)
        conn.commit()
    data.timings["write_s"] = time.perf_counter() - t
    if data.cells is not None:
        t = time.perf_counter()
        _cells.write(conn, rid, data.cells, data.placement)
        data.timings["write_cells_s"] = time.perf_counter() - t
    if data.locations is not None:
        t = time.perf_counter()
        _loc.write(conn, rid, data.locations)
        data.timings["write_locations_s"] = time.perf_counter() - t


def build_indexes(conn, run_id: int, m: int = 16, ef_construction: int = 64) -> None:
    place = conn.execute("SELECT class_rows -> 'shards' FROM pm_vector.embedding_runs WHERE id = %s",
                         [int(run_id)]).fetchone()
    if place is not None and place[0]:
        sharding.build_indexes(conn, int(run_id), place[0], int(m), int(ef_construction))
    else:
        conn.execute("SELECT pm_vector.pm_build_class_rows_indexes(%s, %s, %s)",
                     [int(run_id), int(m), int(ef_construction)])
        conn.execute(reverse_index(run_id))
    if data_has_codes(conn, int(run_id)) and not conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass(pm_vector.pm_run_table(%s, 'codes')) "
            "AND indisprimary)", [int(run_id)]).fetchone()[0]:
        conn.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY (item_id)").format(
            run_table(run_id, "codes"), run_index(run_id, "codes_pkey")))
        conn.execute(sql.SQL("ANALYZE {}").format(run_table(run_id, "codes")))


def data_has_codes(conn, run_id: int) -> bool:
    return conn.execute("SELECT to_regclass(pm_vector.pm_run_table(%s, 'codes')) IS NOT NULL",
                        [int(run_id)]).fetchone()[0]


def extend(conn, run_id: int, frames_doc: Mapping[str, Any], doc: Mapping[str, Any], all_ids, all_X,
           new_ids, new_X, new_y) -> dict[str, Any]:
    """Add new items to a run's prior, graph and hubs, inside the caller's transaction (see the
    module doc for the approximation). ``all_ids``/``all_X``: every item of the run after the
    addition (new ones included), ascending ids. Returns the updated ``class_rows`` document."""
    if doc.get("shards"):
        # a sharded run's prior, graph and hubs live on its shards: a full job rebuilds them there
        raise InvalidInputError("new items cannot be added to a sharded run incrementally; run a full embedding job "
                                "(pm-vector embed COLLECTION) to place them on the shards.")
    frames = ClassFrames.from_dict(frames_doc)
    all_ids = np.asarray(all_ids, dtype=np.int64)
    new_ids = np.asarray(new_ids, dtype=np.int64)
    new_y = np.asarray(new_y, dtype=np.int64)
    rid = int(run_id)
    g = min(int(doc.get("graph_degree_effective", doc["graph_degree"])), all_ids.shape[0] - 1)
    if new_ids.size == 0:
        return dict(doc)
    if (doc.get("codes") or {}).get("status") == "ready":  # the new items' codes, with the run's published codes

        pc_doc = conn.execute("SELECT public_projection FROM pm_vector.embedding_runs WHERE id = %s",
                              [rid]).fetchone()[0]
        pc = unpack(pc_doc, doc["codes"]["digest"])
        copy_codes(conn, rid, new_ids, pc.encode(np.asarray(new_X)), 1 << 30, False)
    # one exact search serves the class rows, the cells and the locations (each reads its first columns)
    degrees = [g] + [int((doc.get(x) or {}).get("graph_degree") or 0) for x in ("cells", "locations")
                     if (doc.get(x) or {}).get("status") == "ready"]
    # (searched as the job built its graph: exactly up to graph_exact_max_items, else in float32)
    exact = all_ids.shape[0] <= int(doc.get("graph_exact_max_items", EXACT_MAX_ITEMS))
    near = knn_rows(np.asarray(all_X), np.searchsorted(all_ids, new_ids), min(all_ids.shape[0], max(degrees) + 1),
                    exact)
    if g > 0:
        idx = near[:, :g + 1]
        nb = all_ids[idx]
        # drop the item itself (it is among its own nearest; remove it, keep g others)
        out = np.empty((new_ids.shape[0], g), np.int64)
        for r in range(new_ids.shape[0]):
            row = nb[r][nb[r] != new_ids[r]]
            out[r] = row[:g]
        _copy_pairs(conn, run_table(rid, "neighbors"), ("item_id", "neighbor_id"), np.repeat(new_ids, g),
                    out.ravel(), 1 << 30, False)
    else:
        out = np.zeros((new_ids.shape[0], 0), np.int64)
    in_prior = np.isin(new_y, frames.classes_)
    if np.any(in_prior):
        coords = frames.clipped(np.asarray(new_X)[in_prior], new_y[in_prior])
        fast = prior_has_nbrs(conn, rid)
        nhub = np.zeros(out[in_prior].shape)
        labels, ids, counts = [], [], []
        for c in np.unique(new_y[in_prior]):
            u, cnt = np.unique(out[new_y == c].ravel(), return_counts=True)
            labels.append(np.full(u.size, c, np.int64))
            ids.append(u)
            counts.append(cnt.astype(np.float64))
        if labels and g > 0:
            labels, ids, counts = np.concatenate(labels), np.concatenate(ids), np.concatenate(counts)
            conn.execute("CREATE TEMP TABLE pm_new_hubs (label bigint, item_id bigint, hub float8) ON COMMIT DROP")
            _copy_hubs(conn, sql.Identifier("pm_new_hubs"), labels, ids, counts, 1 << 30, False)
            conn.execute(sql.SQL("INSERT INTO {} AS h (label, item_id, hub) SELECT label, item_id, hub FROM pm_new_hubs "
                                 "ON CONFLICT (label, item_id) DO UPDATE SET hub = h.hub + EXCLUDED.hub").format(
                                     run_table(rid, "hubs")))
            if fast:  # nhub follows: rows listing a changed item gain the change, the new rows read theirs
                refresh_nhub(conn, rid, g, labels, ids, counts)
                nhub = hub_counts(conn, rid, new_y[in_prior], out[in_prior])
        _copy_prior(conn, rid, new_ids[in_prior], new_y[in_prior], coords, 1 << 30, False,
                    nbrs=out[in_prior] if fast else None, nhub=nhub if fast else None)
    new_doc = dict(doc)
    cells_doc = doc.get("cells") or {}
    if cells_doc.get("status") == "ready":  # the new items' cells and counts, on the cell release's graph

        _cells.extend(conn, rid, cells_doc, all_ids, all_X, new_ids, new_X, new_y, near=near)
    if (doc.get("locations") or {}).get("status") == "ready":  # the new items in the location rows

        _loc.extend(conn, rid, doc["locations"], all_ids, all_X, new_ids, new_X, near=near)
    sizes = list(doc["class_sizes"])
    for k, c in enumerate(doc["classes"]):
        sizes[k] = int(sizes[k]) + int(np.sum(new_y == int(c)))
    new_doc["class_sizes"] = sizes
    new_doc["n_items"] = int(all_ids.shape[0])
    # the graph changed: processes holding the run's graph in memory (pm_vector.db.resolve.run_graph) read it again
    new_doc["graph_version"] = int(doc.get("graph_version", 0)) + 1
    return new_doc
