"""Compact public codes of items, for a client to re-rank candidates without raw features.

:class:`ProductCodes` (the compact answer's codes): product quantisation fit on the public anchor
only, published with it (codebooks and rotation, digested); every item's code is what the
collection reveals of it in a compact answer, and the client re-ranks its candidates by
asymmetric distance. :func:`compact_answer_shape` is the public rule for an answer's
``(k', code prefix)`` under a byte budget.

Runs built before the product codes (64-d ``halfvec`` PCA codes) serve no compact answer: the
client says so and names the fix (raw features where allowed, or a new embedding job).
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import numpy as np

from .._validation import as_matrix
from ..errors import InvalidInputError

PQ_FORMAT = "pm_vector.product-codes/2"
#: the first format: residual stages only (runs built before the wide tables); still read
PQ_FORMAT_V1 = "pm_vector.product-codes/1"
#: the code sizes a collection may choose (bytes per item, every stage together)
MIN_CODE_BYTES, MAX_CODE_BYTES = 8, 256


class ProductCodes:
    """Product-quantisation codes fit on the public anchor only (faiss ``ProductQuantizer``).

    The anchor is centred and rotated by its principal directions (an orthogonal ``d x d``
    rotation, fit on the public anchor), the rotated components are dealt round-robin to
    ``M`` sub-spaces (so every sub-space gets a share of the variance), and each sub-space has
    256 centroids (8 bits). ``n_stages`` > 1 adds stages that quantise the residual of the
    previous ones, so a *prefix* of an item's code (the first ``stage_bytes_[j]`` bytes) is a
    coarser code of its own: an answer may carry a prefix.

    Everything learned is a function of the public anchor: the codebooks and the rotation are
    published with it (:meth:`to_dict`, :meth:`digest`). An item's code is what the collection
    reveals of it in a compact answer, in place of its raw features. The client re-ranks by the
    *asymmetric* distance (:meth:`distances`): its exact query against the decoded codes.

    Measured (Fashion-MNIST default split of ``pm-vector bench privacy``, 1,000 anchor rows; the
    Gaussian's noise-free candidates, k' = 128, re-ranked to 8): nn_recall@8 0.708 with 32 bytes,
    0.796 with 2 x 32 bytes. OPQ (faiss ``OPQMatrix`` in place of the PCA round-robin) over-fits the
    small anchor: 0.547 and 0.707. Keeping only the top 128 principal directions: the same with one
    stage, 0.756 with two. Four stages of 16 bytes: 0.794 at 64 bytes, 0.701 at 32.

    **Wide tables** (``widths``): a later residual stage is fit on the residuals of the same small
    anchor, and over-fits it; one product quantiser of ``w`` sub-spaces (``w`` bytes, sub-spaces of
    ``d / w`` dimensions) generalises better at the same width. Each width of ``widths`` is such a
    single-stage table of its own, coded after the residual stages: an item's stored code is the
    residual stages followed by every wide table, and a width ``w`` of the codes is the byte span
    :meth:`span` of it (a prefix for a residual width). The wide tables share the anchor's mean and
    principal directions (each deals them round-robin to its own sub-spaces), so they publish only
    their centroids.

    Parameters: ``code_bytes`` (bytes per item of the residual stages, in ``[8, 256]``, a multiple
    of ``n_stages``), ``n_stages``, ``widths`` (the wide tables' widths: each in ``(code_bytes,
    256]``, at most the feature dimension, distinct). Learned: ``mean_`` ``(d,)``, ``rotation_``
    ``(d', d)`` (rows: principal directions, permuted round-robin; ``d'`` padded to a multiple of
    the sub-spaces), ``centroids_`` (one ``(M, 256, d'/M)`` array per stage), ``stage_bytes_`` (the
    residual prefixes), ``wide_`` (one ``(w, 256, d_w/w)`` centroid array per wide table),
    ``widths_`` (every width the codes serve: the residual prefixes, then the wide tables),
    ``total_bytes_`` (bytes of an item's stored code).
    """

    def __init__(self, code_bytes: int = 32, n_stages: int = 1, widths: tuple[int, ...] = ()):
        self.code_bytes = code_bytes
        self.n_stages = n_stages
        self.widths = widths

    def _check_params(self) -> tuple[int, int]:
        b, s = self.code_bytes, self.n_stages
        for name, v in (("code_bytes", b), ("n_stages", s)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidInputError(f"{name} must be an integer; got {v!r}.")
        if not MIN_CODE_BYTES <= b <= MAX_CODE_BYTES:
            raise InvalidInputError(f"code_bytes must be in [{MIN_CODE_BYTES}, {MAX_CODE_BYTES}]; got {b}.")
        if s < 1 or b % s:
            raise InvalidInputError(f"n_stages must be >= 1 and divide code_bytes ({b}); got {s}.")
        return int(b), int(s)

    def _check_widths(self, d: int) -> tuple[int, ...]:
        b, _ = self._check_params()
        ws = self.widths
        if not isinstance(ws, (list, tuple)) or any(isinstance(w, bool) or not isinstance(w, (int, np.integer))
                                                    for w in ws):
            raise InvalidInputError(f"widths must be a list of integers; got {ws!r:.80}.")
        out = tuple(sorted(int(w) for w in ws))
        if len(set(out)) != len(out) or any(not b < w <= min(MAX_CODE_BYTES, d) for w in out):
            raise InvalidInputError(f"widths must be distinct integers in ({b}, {min(MAX_CODE_BYTES, d)}] (above the "
                                    f"residual stages' {b} bytes, at most the {d} feature dimensions); got {list(out)}.")
        return out

    def fit(self, X) -> "ProductCodes":
        b, s = self._check_params()
        X = as_matrix(X, "anchor features")
        n, d = X.shape
        m = b // s
        if n < 256:
            raise InvalidInputError(f"product codes need at least 256 public anchor rows (256 centroids per "
                                    f"sub-quantiser); the anchor has {n}.")
        widths = self._check_widths(d)
        self.mean_ = X.mean(0)
        vt = np.linalg.svd(X - self.mean_, full_matrices=True)[2]  # (d, d) orthogonal
        sgn = np.sign(vt[np.arange(d), np.argmax(np.abs(vt), axis=1)])
        vt = vt * np.where(sgn == 0, 1.0, sgn)[:, None]
        self.rotation_ = _deal(vt, m)
        R = self._rotate(X).astype(np.float32)
        self.centroids_ = []
        for _ in range(s):
            cen = _train(R, m)
            self.centroids_.append(cen)
            R = R - self._decode_stage(cen, _StageCoder(cen).codes(R)).astype(np.float32)
        self.stage_bytes_ = tuple(m * (j + 1) for j in range(s))
        self._wide_rotations = [_deal(vt, w) for w in widths]
        self.wide_ = [_train(self._rotate(X, rot).astype(np.float32), w) for w, rot in zip(widths, self._wide_rotations)]
        self._layout()
        return self

    def _layout(self) -> None:
        """``widths_``, ``total_bytes_`` and the byte span of every width (residual prefixes first)."""
        self._spans = {w: (0, w) for w in self.stage_bytes_}
        off = self.stage_bytes_[-1]
        for cen in self.wide_:
            self._spans[cen.shape[0]] = (off, cen.shape[0])
            off += cen.shape[0]
        self.widths_ = tuple(self._spans)
        self.total_bytes_ = off

    def span(self, width: int) -> tuple[int, int]:
        """``(offset, width)``: where the ``width``-byte code of an item sits in its stored code."""
        if width not in self._spans:
            raise InvalidInputError(f"code width {width!r:.20} is not one of the published widths {list(self.widths_)}.")
        return self._spans[width]

    def select(self, codes, width: int) -> np.ndarray:
        """The ``width``-byte codes out of stored codes ``(n, total_bytes_)``."""
        off, w = self.span(width)
        return np.asarray(codes, dtype=np.uint8)[:, off:off + w]

    def _rotate(self, X, rotation: np.ndarray | None = None) -> np.ndarray:
        rot = self.rotation_ if rotation is None else rotation
        return (np.asarray(X, dtype=np.float64) - self.mean_) @ rot.T

    @staticmethod
    def _decode_stage(cen: np.ndarray, codes: np.ndarray) -> np.ndarray:
        m = cen.shape[0]
        return np.concatenate([cen[j][codes[:, j]] for j in range(m)], axis=1)

    def encode(self, X, batch: int = 65536) -> np.ndarray:
        """``(n, total_bytes_)`` uint8 stored codes of the rows of ``X`` (every residual stage, in
        order, then every wide table)."""
        X = as_matrix(X, "features")
        if X.shape[1] != self.mean_.shape[0]:
            raise InvalidInputError(f"features have {X.shape[1]} columns; the codes have {self.mean_.shape[0]}.")
        out = np.empty((X.shape[0], self.total_bytes_), dtype=np.uint8)
        quantizers = [_StageCoder(cen) for cen in self.centroids_]  # once, not per batch
        wide = [_StageCoder(cen) for cen in self.wide_]
        for a in range(0, X.shape[0], batch):
            R = self._rotate(X[a:a + batch])
            col = 0
            for cen, coder in zip(self.centroids_, quantizers):
                c = coder.codes(R)
                out[a:a + batch, col:col + cen.shape[0]] = c
                R = R - self._decode_stage(cen, c)
                col += cen.shape[0]
            for cen, coder, rot in zip(self.wide_, wide, self._wide_rotations):
                out[a:a + batch, col:col + cen.shape[0]] = coder.codes(self._rotate(X[a:a + batch], rot))
                col += cen.shape[0]
        return out

    def decode(self, codes) -> np.ndarray:
        """The reconstruction ``(n, d')`` of ``width``-byte codes (``width = codes.shape[1]``, one of
        ``widths_``: a residual prefix or a wide table's codes, as :meth:`select` gives them), in the
        rotated space of that width (:meth:`distances` compares a query in the same space)."""
        codes = np.asarray(codes, dtype=np.uint8)
        if codes.ndim != 2 or codes.shape[1] not in self.widths_:
            raise InvalidInputError(f"codes must be (n, b) with b one of {list(self.widths_)}; "
                                    f"got shape {codes.shape}.")
        if codes.shape[1] not in self.stage_bytes_:
            return self._decode_stage(self.wide_[self.widths_.index(codes.shape[1]) - len(self.stage_bytes_)], codes)
        out = np.zeros((codes.shape[0], self.rotation_.shape[0]))
        col = 0
        for cen in self.centroids_:
            if col >= codes.shape[1]:
                break
            out += self._decode_stage(cen, codes[:, col:col + cen.shape[0]])
            col += cen.shape[0]
        return out

    def rotate(self, X, width: int) -> np.ndarray:
        """Rows of ``X`` in the rotated space the ``width``-byte codes decode to."""
        if width in self.stage_bytes_:
            return self._rotate(X)
        self.span(width)
        return self._rotate(X, self._wide_rotations[self.widths_.index(width) - len(self.stage_bytes_)])

    def distances(self, q, codes) -> np.ndarray:
        """Asymmetric distances: ``||rotate(q) - decode(code)||`` for every code (the exact query
        against the coded items; the rotation is orthogonal, so this is the feature-space distance
        to the reconstruction, up to the part of ``q`` outside the anchor's span)."""
        rec = self.decode(codes)
        r = self.rotate(np.asarray(q, dtype=np.float64).reshape(1, -1), int(np.shape(codes)[1]))
        return np.linalg.norm(rec - r, axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {"format": PQ_FORMAT, "code_bytes": int(self.code_bytes), "n_stages": int(self.n_stages),
                "widths": [int(c.shape[0]) for c in self.wide_],
                "mean": self.mean_.astype(np.float32), "rotation": self.rotation_.astype(np.float32),
                "centroids": [c.astype(np.float32) for c in self.centroids_],
                "wide_centroids": [c.astype(np.float32) for c in self.wide_]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProductCodes":
        if not isinstance(d, Mapping) or d.get("format") not in (PQ_FORMAT, PQ_FORMAT_V1):
            raise InvalidInputError(f"not a product-codes document (format {PQ_FORMAT!r} expected).")
        v1 = d.get("format") == PQ_FORMAT_V1
        p = cls(d.get("code_bytes"), d.get("n_stages"), () if v1 else d.get("widths"))
        b, s = p._check_params()
        if not v1 and not isinstance(d.get("wide_centroids"), (list, tuple)):
            raise InvalidInputError("the product-codes document's wide_centroids must be a list (one array per width).")
        missing = [k for k in ("mean", "rotation", "centroids") if k not in d]
        if missing:
            raise InvalidInputError(f"the product-codes document lacks {', '.join(missing)}.")
        if not isinstance(d["centroids"], (list, tuple)):
            raise InvalidInputError("the product-codes document's centroids must be a list (one array per stage).")
        try:
            p.mean_ = np.asarray(d["mean"], dtype=np.float32).astype(np.float64).reshape(-1)
            p.rotation_ = np.asarray(d["rotation"], dtype=np.float32).astype(np.float64)
            p.centroids_ = [np.asarray(c, dtype=np.float32).astype(np.float64) for c in d["centroids"]]
            p.wide_ = [np.asarray(c, dtype=np.float32).astype(np.float64) for c in ([] if v1 else d["wide_centroids"])]
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"the product-codes document holds non-numeric arrays ({exc}).") from None
        m = b // s
        dim = p.mean_.shape[0]
        dp = -(-dim // m) * m
        widths = p._check_widths(dim)
        if (p.rotation_.shape != (dp, dim) or len(p.centroids_) != s
                or any(c.shape != (m, 256, dp // m) for c in p.centroids_) or len(p.wide_) != len(widths)
                or any(c.shape != (w, 256, -(-dim // w)) for c, w in zip(p.wide_, widths))):
            raise InvalidInputError("the product-codes document is inconsistent (shapes).")
        if not all(np.isfinite(a).all() for a in [p.mean_, p.rotation_, *p.centroids_, *p.wide_]):
            raise InvalidInputError("the product-codes document holds NaN or infinite values.")
        p.stage_bytes_ = tuple(m * (j + 1) for j in range(s))
        if widths:
            vt = _undeal(p.rotation_, m, dim)
            p._wide_rotations = [_deal(vt, w) for w in widths]
        else:
            p._wide_rotations = []
        p._layout()
        return p

    def digest(self) -> str:
        """sha256 of the published parameters (float32, little-endian, in :meth:`to_dict` order)."""
        if not self.wide_:  # a residual-only code hashes as the first format did: old runs keep their digest
            h = hashlib.sha256(f"{PQ_FORMAT_V1}|{int(self.code_bytes)}|{int(self.n_stages)}|".encode())
        else:
            ws = ",".join(str(c.shape[0]) for c in self.wide_)
            h = hashlib.sha256(f"{PQ_FORMAT}|{int(self.code_bytes)}|{int(self.n_stages)}|{ws}|".encode())
        for a in [self.mean_, self.rotation_, *self.centroids_, *self.wide_]:
            h.update(np.ascontiguousarray(a, dtype="<f4").tobytes())
        return h.hexdigest()


class _StageCoder:
    """One stage's coder: each sub-vector's nearest centroid, as faiss's ``ProductQuantizer.compute_codes``
    gives it (float32 squared distances; of equal ones, the lowest centroid index).

    faiss compares a sub-vector with all 256 centroids. A stage of one-dimension sub-spaces (a wide
    table as wide as the features: 128 bytes of 128 dimensions) is coded here by a binary search of
    each sub-space's sorted centroids instead: the nearest centroid is one of the two around the value,
    and a float32 distance grows (never shrinks) away from them, so when the smallest of the four
    float32 distances around the value is reached once, it is faiss's code. A row with any tie among
    them goes to faiss (``tests/test_codes.py`` checks the codes equal faiss's, ties and duplicate
    centroids included)."""

    def __init__(self, cen: np.ndarray):
        import faiss

        m, _, ds = cen.shape
        self.pq = faiss.ProductQuantizer(m * ds, m, 8)
        faiss.copy_array_to_vector(np.ascontiguousarray(cen, dtype=np.float32).ravel(), self.pq.centroids)
        self.one_dim = ds == 1
        if self.one_dim:
            v = cen[:, :, 0].astype(np.float32)
            self._order = np.argsort(v, axis=1, kind="stable").astype(np.uint8)
            srt = np.take_along_axis(v, self._order.astype(np.intp), 1)
            self._keys = (_ordinal(srt) + _column_offsets(m)[:, None]).ravel()  # every column's keys, ascending
            inf = np.full((m, 2), np.inf, dtype=np.float32)
            self._padded = np.concatenate([-inf, srt, inf], axis=1).ravel()  # (m * 260): two sentinels a side

    def codes(self, R) -> np.ndarray:
        """``(n, M)`` uint8 codes of the rows of ``R`` ``(n, d')``."""
        x = np.ascontiguousarray(R, dtype=np.float32)
        if not self.one_dim or x.shape[0] == 0:
            return self.pq.compute_codes(x)
        m = x.shape[1]
        cols = np.arange(m)
        # p[i, j]: the sorted centroids p - 1 and p of column j are around x[i, j] (searched a column at a time)
        p = np.searchsorted(self._keys, (_ordinal(x) + _column_offsets(m)).T).T - cols * 256
        at = p + cols * 260  # the padded position of the sorted centroid p - 2
        d0, d1, d2, d3 = ((x - self._padded[at + k]) ** 2 for k in range(4))  # float32, as faiss
        right = d2 < d1  # the nearest: p - 1 or p (d0 >= d1 and d3 >= d2: farther on the same side)
        low = np.where(right, d2, d1)
        tied = ((d1 == d2) | (d0 == low) | (d3 == low)).any(1)
        out = self._order[cols, np.clip(p - 1 + right, 0, 255)]
        if tied.any():
            out[tied] = self.pq.compute_codes(np.ascontiguousarray(x[tied]))
        return out


def _ordinal(v: np.ndarray) -> np.ndarray:
    """int64 keys in the order of the float32 values ``v`` (no NaN; -0 just below +0, which is harmless
    here: both are as far from any value)."""
    b = v.view(np.int32).astype(np.int64)
    return np.where(b < 0, b ^ 0x7FFFFFFF, b)


def _column_offsets(m: int) -> np.ndarray:
    """Keys of column ``j`` shifted by ``j * 2**33``: every column's keys above the one before's."""
    return np.arange(m, dtype=np.int64) << 33


def _order(dp: int, m: int) -> list[int]:
    """Row ``i`` of a dealt rotation holds principal component ``_order(dp, m)[i]``: sub-space r
    takes components r, r + m, ... (a component index of ``d`` or more is a zero padding row)."""
    return [j for r in range(m) for j in range(r, dp, m)]


def _deal(vt: np.ndarray, m: int) -> np.ndarray:
    """``(d', d)``: the principal directions ``vt`` dealt round-robin to ``m`` sub-spaces
    (:func:`_order`), ``d'`` padded with zero rows to a multiple of ``m``."""
    d = vt.shape[1]
    dp = -(-d // m) * m
    rot = np.zeros((dp, d))
    order = np.array(_order(dp, m))
    real = order < d
    rot[real] = vt[order[real]]
    return rot


def _undeal(rot: np.ndarray, m: int, d: int) -> np.ndarray:
    """The principal directions ``(d, d)`` back from their dealing :func:`_deal`."""
    vt = np.zeros((d, d))
    order = np.array(_order(rot.shape[0], m))
    real = order < d
    vt[order[real]] = rot[real]
    return vt


def _train(R: np.ndarray, m: int) -> np.ndarray:
    """``(m, 256, d'/m)`` centroids of a faiss ``ProductQuantizer`` of ``m`` 8-bit sub-quantisers
    trained on the rows of ``R`` ``(n, d')`` (float32)."""
    import faiss

    dp = R.shape[1]
    pq = faiss.ProductQuantizer(dp, m, 8)
    pq.cp.min_points_per_centroid = 1  # the public anchor is small; say nothing about it
    pq.cp.seed = 1234
    pq.train(np.ascontiguousarray(R, dtype=np.float32))
    return faiss.vector_to_array(pq.centroids).reshape(m, 256, dp // m).astype(np.float64)


#: what a compact answer's rows may cost on the wire, in bytes: every row's ids, codes and framing.
#: With the request (under 2 kB for C = 10) and the answer's top-level fields a compact answer
#: stays under 50,000 bytes on the wire (msgpack, :mod:`pm_vector.protocol.codec`).
ANSWER_BUDGET_BYTES = 47_500
#: bytes of one item id in an answer (uint32: collections of up to 2^32 items)
ID_BYTES = 4
#: msgpack framing of one answer row (its map, two keys, two array headers), in bytes
ROW_FRAMING_BYTES = 48
#: never fewer candidates per row than the client's default k
MIN_K_PRIME = 8
#: the Gaussian release takes the whole code while it still leaves this many candidates per row
FULL_CODE_MIN_K_PRIME = 48
#: never more candidates per row than this
MAX_K_PRIME = 1000
#: the code prefixes the class-rows answers use when the codes publish them (measured: see below)
CLASS_ROWS_PREFIXES = (32, 64)
#: how each class-rows release picks its code prefix: ``"first"`` (the shortest stage, the most
#: candidates) or ``"longest"`` (the longest that leaves ``FULL_CODE_MIN_K_PRIME`` candidates). The
#: table of releases declares it (``Release.code_prefix``, :mod:`pm_vector.protocol.releases`, which
#: sits above this module); this is its copy by name for callers that pass a name, and
#: ``tests/protocol/test_releases.py`` checks the two agree
CODE_PREFIX_RULES = {"cells": "first", "gaussian": "longest"}


def _k_prime_within(n_rows: int, b: int, budget_bytes: int) -> int:
    return (budget_bytes // n_rows - ROW_FRAMING_BYTES) // (b + ID_BYTES)


def compact_answer_shape(n_rows: int, release, epsilon: float, stage_bytes: tuple[int, ...],
                         budget_bytes: int = ANSWER_BUDGET_BYTES) -> tuple[int, int]:
    """The public rule for a compact answer's ``(k_prime, code_prefix_bytes)``: a function of public
    values only (the number of rows, the release, the published code stages, the budget), so the
    answer's shape says nothing about the query.

    ``release``: a release of the table (:class:`pm_vector.protocol.releases.Release`: its
    ``code_prefix``) or its name (:data:`CODE_PREFIX_RULES`).

    * ``k_prime`` is the most candidates per row whose ids (``ID_BYTES`` each), code prefixes and
      row framing (``ROW_FRAMING_BYTES``) fit in ``budget_bytes`` over ``n_rows`` rows, within
      ``[MIN_K_PRIME, MAX_K_PRIME]`` (so with many rows -- more than about 120 at the default
      budget and 32-byte prefixes -- the floor of ``MIN_K_PRIME`` candidates may exceed the budget);
    * the **cell** release locates the query coarsely, so recall is bound by the candidates: it
      takes the first stage (the shortest prefix) and the most candidates;
    * the **Gaussian** release (at very large epsilon, and its noise-free endpoint) locates the
      query; recall is bound by the code: it takes the longest prefix that still leaves
      ``FULL_CODE_MIN_K_PRIME`` candidates per row (else the first stage).

    Measured on the Fashion-MNIST default split of ``pm-vector bench privacy`` (C = 10, codes of
    2 x 32 bytes fit on the 1,000-row public anchor; nn_recall@8 after the client's re-rank): the
    cell release at eps 4 gives 0.533 with the 32-byte prefix at k' = 128 against 0.46 with the
    64-byte code at k' = 64 (at eps 16: 0.666 against 0.654); the Gaussian's noise-free endpoint
    gives 0.79 with 64 bytes at k' = 64 against 0.71 with 32 bytes at k' = 128. A 24-byte first
    stage at k' = 170, stages of 16 bytes, and OPQ (faiss ``OPQMatrix``, which over-fits the
    small anchor) measured no better. The rule does not depend on ``epsilon`` beyond the release
    (kept in the signature: a release's shape may come to depend on it).

    With the defaults (``ANSWER_BUDGET_BYTES``, stages ``(32, 64)``) and 10 rows: cells ->
    ``(130, 32)``, Gaussian -> ``(69, 64)``."""
    if isinstance(n_rows, bool) or not isinstance(n_rows, (int, np.integer)) or n_rows < 1:
        raise InvalidInputError(f"n_rows must be a positive integer; got {n_rows!r}.")
    rule = getattr(release, "code_prefix", None) or (CODE_PREFIX_RULES.get(release) if isinstance(release, str)
                                                     else None)
    if rule not in ("first", "longest"):
        raise InvalidInputError(f"release must be one of {', '.join(CODE_PREFIX_RULES)} (or a release of the table "
                                f"with a code_prefix); got {getattr(release, 'name', release)!r:.60}.")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)) or budget_bytes < 1:
        raise InvalidInputError(f"budget_bytes must be a positive integer; got {budget_bytes!r}.")
    stages = tuple(int(b) for b in stage_bytes or ())
    if not stages:
        raise InvalidInputError("the collection publishes no code stages.")
    if any(b < 1 for b in stages) or list(stages) != sorted(set(stages)):
        raise InvalidInputError(f"stage_bytes must be increasing positive prefix widths; got {list(stages)}.")
    # the class-rows answers were measured with prefixes of 32 and 64 bytes: they keep those when published
    stages = tuple(b for b in stages if b in CLASS_ROWS_PREFIXES) or stages
    n, budget = int(n_rows), int(budget_bytes)
    b = stages[0]
    if rule == "longest":
        b = next((w for w in reversed(stages) if _k_prime_within(n, w, budget) >= FULL_CODE_MIN_K_PRIME), b)
    return max(MIN_K_PRIME, min(_k_prime_within(n, b, budget), MAX_K_PRIME)), b
