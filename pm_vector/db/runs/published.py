"""The public documents a run publishes, kept from one run to the next when their inputs are the same.

A run publishes, besides its anchor frame, four documents fit on its public anchor set only: the
class frames (``embedding_runs.class_frames``, digested as ``class_rows["frames_digest"]``), the cell
release's cells (``public_cells``, ``class_rows["cells"]["digest"]``), the location release's cells
(``public_locations``, ``class_rows["locations"]["digest"]``) and the product codes
(``public_projection``, ``class_rows["codes"]["digest"]``). A client builds its requests on them, and
the server refuses a request whose digest is not the active run's (``CellsDigestMismatchError``),
and a client refuses an answer whose codes' digest is not the one it holds.

Their fits are public functions of the anchor set and a few parameters, but not bit for bit: faiss's
k-means sums in threads, so two fits of the same anchor can give centroids a few ulps apart, and
another digest. A merge (:mod:`pm_vector.db.runs.merge`) is a new run of the same anchor set and
parameters every few thousand changes; had it fit them again, every client holding the last run's
documents would have its requests refused after each merge (measured: 7,913 refused queries in a
10-minute stream at 100,000 items).

So a job takes each document from the collection's active run when that run was built on the same
anchor set, with the same parameters for that document (:data:`INPUTS`), and its stored document
hashes to the digest the run publishes: :func:`of_active_run`. The new run then publishes the same
bytes and the same digests; a client's documents and requests stay valid across the switch. A job
on another anchor set, or with other parameters, fits them anew. Nothing here reads an item: the
documents are public data, and reusing one changes no answer's privacy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import AlignmentError, InvalidInputError
from ...manifold.class_frames import ClassFrames
from ...manifold.public_cells import PublicCells
from ...protocol.class_rows import frames_digest
from ...protocol.published_codes import unpack

#: the class-rows parameters each document is a function of, besides the anchor set
INPUTS = {"frames": ("n_components", "clip_quantile"), "cells": (), "locations": (),
          "codes": ("code_bytes", "code_stages", "code_widths")}


@dataclass(frozen=True)
class Published:
    """Documents to publish again (None: fit anew)."""

    frames: ClassFrames | None = None
    cells: PublicCells | None = None
    locations: PublicCells | None = None
    codes: Any = None  # ProductCodes
    codes_run: int | None = None  # the run whose codes document ``codes`` is (:mod:`pm_vector.db.runs.carry`)

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.frames, self.cells, self.locations, self.codes))


def _same(a: Any, b: Any) -> bool:
    """Parameters equal as JSON stores them (a tuple is a list there)."""
    norm = (lambda v: [norm(x) for x in v] if isinstance(v, (list, tuple)) else v)
    return norm(a) == norm(b)


def _ready(doc: Mapping[str, Any] | None, part: str) -> Mapping[str, Any] | None:
    got = (doc or {}).get(part)
    return got if isinstance(got, Mapping) and got.get("status") == "ready" and got.get("digest") else None


def of_active_run(conn, coll: Mapping[str, Any], anchor_set_id: int, params: Mapping[str, Any]) -> Published:
    """The documents of collection ``coll``'s active run that a job on anchor set ``anchor_set_id`` with
    class-rows parameters ``params`` publishes again (module doc): each one whose run was built on
    that anchor set, whose parameters (:data:`INPUTS`) are ``params``', and whose stored document
    hashes to its published digest. Read in the caller's transaction."""
    rid = coll.get("active_run_id")
    if rid is None:
        return Published()
    row = conn.execute("SELECT anchor_set_id, class_rows, class_frames, public_cells, public_locations, "
                       "public_projection FROM pm_vector.embedding_runs WHERE id = %s", [int(rid)]).fetchone()
    if row is None or row[0] != anchor_set_id or not isinstance(row[1], Mapping) or row[1].get("status") != "ready":
        return Published()
    doc, frames_doc, cells_doc, loc_doc, codes_doc = row[1], row[2], row[3], row[4], row[5]

    def same(part: str) -> bool:
        return all(k in doc and _same(doc[k], params.get(k)) for k in INPUTS[part])

    got: dict[str, Any] = {}
    try:
        if frames_doc and same("frames"):
            frames = ClassFrames.from_dict(frames_doc)
            if frames_digest(frames) == doc.get("frames_digest"):
                got["frames"] = frames
        for part, stored in (("cells", cells_doc), ("locations", loc_doc)):
            meta = _ready(doc, part)
            if meta and stored and same(part):
                cells = PublicCells.from_dict(stored)
                if cells.digest() == meta["digest"]:
                    got[part] = cells
        meta = _ready(doc, "codes")
        if meta and codes_doc and same("codes"):
            got["codes"], got["codes_run"] = unpack(codes_doc, meta["digest"]), int(rid)
    except (InvalidInputError, AlignmentError, KeyError, TypeError, ValueError):  # a document that does not parse: fit anew
        return Published(**got)
    return Published(**got)
