"""A run's embedding tables (``run_<id>_items`` / ``_anchors``): what the full job
(:mod:`pm_vector.db.runs.jobs`) and new items (:mod:`pm_vector.db.runs.new_items`) both write --
the check of an embedding matrix, its pgvector type, and its binary COPY in batches.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from psycopg import sql

from .. import _binary
from ..errors import EmbeddingJobError

#: the widest embedding a run stores (``vector`` up to 2,000 columns, ``halfvec`` above)
MAX_EMBEDDING_DIM = 4000


def embedding_matrix(a, rows: int | None, what: str, dim: int | None = None) -> np.ndarray:
    """``a`` as a float32 ``(rows, dim)`` embedding, or :class:`EmbeddingJobError` saying what is wrong
    (not numeric, not 2-d, other sizes, more than :data:`MAX_EMBEDDING_DIM` columns, non-finite, beyond
    half precision where ``halfvec`` stores it)."""
    try:
        m = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise EmbeddingJobError(f"{what} is not a numeric array ({exc}).") from None
    if m.ndim != 2:
        raise EmbeddingJobError(f"{what} must be 2-d, got shape {m.shape}.")
    if rows is not None and m.shape[0] != rows:
        raise EmbeddingJobError(f"{what} has {m.shape[0]} rows, expected {rows}.")
    if not 1 <= m.shape[1] <= MAX_EMBEDDING_DIM:
        raise EmbeddingJobError(f"{what} has {m.shape[1]} columns; an embedding needs 1..{MAX_EMBEDDING_DIM}.")
    if dim is not None and m.shape[1] != dim:
        raise EmbeddingJobError(f"{what} has {m.shape[1]} columns, but the run embeds in {dim} dimensions.")
    m32 = m.astype(np.float32)
    if not np.all(np.isfinite(m32)):
        raise EmbeddingJobError(f"{what} contains NaN or infinite values (or values beyond float32).")
    if m.shape[1] > 2000 and np.abs(m32).max() > 65504.0:
        raise EmbeddingJobError(f"{what} has values beyond half precision (used above 2,000 dimensions).")
    return m32


def vector_type(dim: int) -> str:
    """The pgvector type of a run's embeddings of ``dim`` columns."""
    return "vector" if dim <= 2000 else "halfvec"


def write_embeddings(conn, table: sql.Composable, key: str, key_kind: str, keys: np.ndarray, emb: np.ndarray,
                     batch: int, progress: Callable[[int, int], None] | None, commit: bool = True,
                     frozen: bool = False) -> None:
    """COPY ``keys`` and their embeddings ``emb`` into ``table`` in batches of ``batch`` rows (binary),
    each committed when ``commit``, reporting ``progress(done, total)``; ``frozen``: rows written
    frozen, none committed (:func:`pm_vector.db._binary.copy_options`)."""
    k = emb.shape[1]
    n = emb.shape[0]
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        stream = _binary.encode([(key, key_kind, 0), ("embedding", vector_type(k), k)],
                                {key: keys[start:stop], "embedding": emb[start:stop]})
        _binary.copy_in(conn, sql.SQL("COPY {} ({}, embedding) FROM STDIN {}").format(
            table, sql.Identifier(key), _binary.copy_options(frozen)), stream)
        if commit and not frozen:
            conn.commit()
        if progress is not None:
            progress(stop, n)
