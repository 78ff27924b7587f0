"""Server-side resolution of a PrivateMail request: align, then k-NN every query row."""

from __future__ import annotations

import numpy as np
import torch

from .alignment import UmeyamaAlignment
from .client.request import PrivateMailRequest
from .errors import AlignmentError, InvalidInputError

# A client that used the published frame sends anchor rows that the similarity maps onto the
# server's almost exactly; a large residual means a different frame or corrupted rows.
MAX_RELATIVE_RESIDUAL = 0.5


def align_request(request: PrivateMailRequest, anchor_ids, anchor_embedding: np.ndarray) -> np.ndarray:
    """Map the request's query rows into the server's frame (Kabsch-Umeyama on anchor rows)."""
    ids = list(anchor_ids)
    if list(request.anchor_ids) != ids:
        raise InvalidInputError(f"the request's {len(request.anchor_ids)} anchor ids do not match the collection's "
                                f"anchor set ({len(ids)} ids, in order); fetch the current anchor set and rebuild.")
    E = np.asarray(anchor_embedding, dtype=np.float64)
    if request.embedding.shape[1] != E.shape[1]:
        raise InvalidInputError(f"request embedding has dimension {request.embedding.shape[1]}; the active run's "
                                f"is {E.shape[1]}.")
    al = UmeyamaAlignment().fit(request.anchor_rows, E)
    if al.relative_residual_ > MAX_RELATIVE_RESIDUAL:
        raise AlignmentError(f"the request's anchor rows do not match the collection's anchor frame (relative "
                             f"residual {al.relative_residual_:.3f}); rebuild it with the frame parameters of the "
                             "active run.")
    return al.transform(request.query_rows)


def knn(items: np.ndarray, queries: np.ndarray, k: int, batch: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Exact Euclidean k-NN: ``(indices, distances)``, each ``(q, k)``."""
    it = torch.as_tensor(np.asarray(items, dtype=np.float32))
    k = min(int(k), it.shape[0])
    idx, dist = [], []
    for s in range(0, len(queries), batch):
        d = torch.cdist(torch.as_tensor(np.asarray(queries[s:s + batch], dtype=np.float32)), it)
        v, i = torch.topk(d, k, dim=1, largest=False)
        idx.append(i.numpy())
        dist.append(v.numpy())
    return np.concatenate(idx), np.concatenate(dist)
