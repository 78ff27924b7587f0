"""The paper protocol's post-processing (:class:`~pm_vector.client.PrivateMail`, step 3): the
query rows embedded from a release alone, against the public anchor frame. A function of the
release, the query rows' labels and public parameters only (post-processing of a DP release), so
the client (:meth:`pm_vector.client.PrivateMail.post_process`) and the server
(:func:`pm_vector.db.resolve.paper_resolution.post_process_release`, iteration-distribute-recursion)
run the same code."""

from __future__ import annotations

import math

import numpy as np
import torch

from .laplacian import DTYPE, GraphLaplacian, gaussian_weights


def post_process_release(frame, release: np.ndarray, query_labels, *, noise_sigma: float, q_rms: float,
                         n_post_iter: int, post_alpha: float) -> np.ndarray:
    """The query rows (``C x k``) embedded from ``release`` (the noisy first iteration of the
    ``C`` query rows then the anchor rows) by ``frame`` (a fitted
    :class:`~pm_vector.manifold.AnchorFrame`); ``noise_sigma``/``q_rms`` set the rebuilt graph's
    bandwidth, ``n_post_iter``/``post_alpha`` the iterations."""
    Z = torch.as_tensor(release, dtype=DTYPE)
    C = len(query_labels)
    d = torch.cdist(Z, Z)
    med = float(torch.median(d[torch.triu(torch.ones_like(d, dtype=torch.bool), 1)]))
    # the client knows how much noise it added: the noisier, the flatter the rebuilt graph
    rho = noise_sigma * math.sqrt(Z.shape[1]) / max(q_rms, 1e-12)
    h = max(med, 1e-12) * (1.0 + rho)
    # each query row is extended against the public frame alone: no edges between query
    # rows, so rows cannot push each other around (with C = 100 classes they did)
    W = torch.cat([torch.zeros(C, C, dtype=DTYPE), gaussian_weights(Z[:C], Z[C:], h)], dim=1)
    Zq = frame.extend(None, np.asarray(query_labels), graph=GraphLaplacian(W), n_iter=n_post_iter,
                        alpha=post_alpha, alpha_scale="stable")
    # The normalisation step of the iterate (NOTES 3), for the free rows: one scalar for all
    # query rows, bringing their RMS norm to that of the frame's class centroids. The label
    # pull of the between-class graph shrinks like 1/C, so without it the rows of a
    # 100-class request sat near the origin (precision@8 0.045 on 100 synthetic classes).
    E, ya = frame.anchor_embedding_, frame.anchor_labels_
    cent = np.stack([E[ya == c].mean(0) for c in frame.classes_])
    target = float(np.sqrt((cent ** 2).sum(1).mean()))
    rms = float(np.sqrt((Zq ** 2).sum(1).mean()))
    return Zq * (target / rms) if rms > 0 else Zq
