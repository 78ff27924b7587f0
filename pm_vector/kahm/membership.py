"""Membership-inference score (Section 4.3, eq 69).

``mis = integral (f_r(t) - f_r'(t))^2 dt`` where ``f_r`` is the density of the classifier's
statistic ``min_c Gamma_{W_{Y_c}}(y)`` over training points and ``f_r'`` over held-out points
(``o = 0``). The L2 distance between the two densities is estimated directly from the two
samples by least-squares density-difference estimation (LSDD; Sugiyama et al., 2013):

    g(t) = sum_l theta_l exp(-(t - c_l)^2 / (2 sigma^2))   ~   f_r - f_r'
    theta = (H + lam I)^-1 h,  H_ll' = sqrt(pi) sigma exp(-(c_l - c_l')^2 / (4 sigma^2)),
    h_l = mean_i k(r_i, c_l) - mean_j k(r'_j, c_l),
    mis  = 2 h^T theta - theta^T H theta     (the bias-corrected estimator of the paper)

with ``sigma`` and ``lam`` chosen by K-fold cross-validation of the LSDD criterion
``theta^T H theta - 2 h_test^T theta``. Negative estimates (sampling noise around 0) are
clipped to 0.

Scale: an L2 distance between densities has units of ``1 / distance``, so ``mis`` changes if the
distances are rescaled. :func:`membership_audit` therefore also reports the attack AUC
(probability that a training point has a smaller distance than a held-out point), which is
scale-free.
"""

from __future__ import annotations

import math

import numpy as np
from threadpoolctl import threadpool_limits

from ..errors import InvalidInputError

__all__ = ["lsdd", "membership_inference_score", "membership_auc", "membership_audit", "clopper_pearson",
           "tpr_at_fpr", "scale_free"]


def _gauss(a, c, sigma):
    return np.exp(-((a[:, None] - c[None, :]) ** 2) / (2.0 * sigma * sigma))


def _H(c, sigma):
    return math.sqrt(math.pi) * sigma * np.exp(-((c[:, None] - c[None, :]) ** 2) / (4.0 * sigma * sigma))


def _as_sample(x, name):
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size < 2:
        raise InvalidInputError(f"{name} needs at least 2 values; got {a.size}.")
    if not np.all(np.isfinite(a)):
        raise InvalidInputError(f"{name} contains NaN or infinite values.")
    return a


def lsdd(x, x2, *, sigmas=None, lams=None, n_folds: int = 5, n_centers: int = 300, seed: int = 0) -> float:
    """LSDD estimate of ``integral (p(t) - p'(t))^2 dt`` from 1-d samples ``x ~ p`` and ``x2 ~ p'``.

    ``sigmas``/``lams``: candidate kernel widths / ridge terms (default: 12 widths from 1 % to 2x
    the pooled standard deviation, ridge 1e-6..1), picked by ``n_folds``-fold cross-validation;
    ``n_centers`` Gaussian centres drawn from the pooled sample."""
    with threadpool_limits(limits=1):    # small dense problems: threads only add contention
        return _lsdd(x, x2, sigmas=sigmas, lams=lams, n_folds=n_folds, n_centers=n_centers, seed=seed)


def _lsdd(x, x2, *, sigmas, lams, n_folds, n_centers, seed) -> float:
    x = _as_sample(x, "first sample")
    x2 = _as_sample(x2, "second sample")
    rng = np.random.default_rng(seed)          # centres / folds: bookkeeping, not a privacy mechanism
    pooled = np.concatenate([x, x2])
    spread = float(np.std(pooled))
    if spread == 0.0:
        return 0.0
    c = rng.choice(pooled, size=min(n_centers, pooled.size), replace=False)
    if sigmas is None:
        sigmas = spread * np.logspace(-2, 0.3, 12)
    if lams is None:
        lams = np.logspace(-6, 0, 7)
    lams = np.asarray(lams, dtype=np.float64)
    f1 = rng.permutation(x.size) % n_folds
    f2 = rng.permutation(x2.size) % n_folds
    best = (np.inf, None, None)
    for sigma in sigmas:
        w, V = np.linalg.eigh(_H(c, sigma))
        w = np.clip(w, 0.0, None)
        k1, k2 = _gauss(x, c, sigma), _gauss(x2, c, sigma)
        # per-fold sums of the kernel features, then the fold means in H's eigenbasis
        s1 = np.stack([k1[f1 == k].sum(0) for k in range(n_folds)])
        s2 = np.stack([k2[f2 == k].sum(0) for k in range(n_folds)])
        n1 = np.bincount(f1, minlength=n_folds).astype(float)
        n2 = np.bincount(f2, minlength=n_folds).astype(float)
        score = np.zeros(lams.size)
        for k in range(n_folds):
            if n1[k] == 0 or n2[k] == 0 or n1[k] == x.size or n2[k] == x2.size:
                continue
            a_tr = ((s1.sum(0) - s1[k]) / (x.size - n1[k]) - (s2.sum(0) - s2[k]) / (x2.size - n2[k])) @ V
            a_te = (s1[k] / n1[k] - s2[k] / n2[k]) @ V
            t = a_tr[None, :] / (w[None, :] + lams[:, None])           # theta in the eigenbasis, per lam
            score += (w[None, :] * t * t).sum(1) - 2.0 * (t * a_te[None, :]).sum(1)
        i = int(np.argmin(score))
        if score[i] < best[0]:
            best = (float(score[i]), float(sigma), float(lams[i]))
    _, sigma, lam = best
    H = _H(c, sigma)
    h = _gauss(x, c, sigma).mean(0) - _gauss(x2, c, sigma).mean(0)
    theta = np.linalg.solve(H + lam * np.eye(c.size), h)
    return max(0.0, float(2.0 * h @ theta - theta @ H @ theta))


def membership_inference_score(train_distances, holdout_distances, **kw) -> float:
    """eq 69 with ``o = 0``: LSDD between the distance densities at training and held-out points."""
    return lsdd(train_distances, holdout_distances, **kw)


def membership_auc(train_distances, holdout_distances) -> float:
    """AUC of the attack 'member if the distance is small' (0.5 = no information)."""
    from sklearn.metrics import roc_auc_score
    a = _as_sample(train_distances, "training distances")
    b = _as_sample(holdout_distances, "held-out distances")
    scores = -np.concatenate([a, b])
    labels = np.concatenate([np.ones(a.size), np.zeros(b.size)])
    return float(roc_auc_score(labels, scores))


def scale_free(train_distances, holdout_distances) -> tuple[np.ndarray, np.ndarray]:
    """Both samples divided by the median held-out distance: the MIS of eq 69 has units of
    1 / distance, so comparing (or taking ratios of) scores of two models needs a common unit."""
    a = _as_sample(train_distances, "training distances")
    b = _as_sample(holdout_distances, "held-out distances")
    m = float(np.median(b))
    if not (m > 0 and math.isfinite(m)):
        raise InvalidInputError("held-out distances have a zero or non-finite median; cannot normalise them.")
    return a / m, b / m


def tpr_at_fpr(train_distances, holdout_distances, fpr: float) -> tuple[int, int, int, int]:
    """Threshold attack 'member if distance < t' with ``t`` the largest threshold that flags at most
    ``floor(fpr * n_holdout)`` held-out rows. Returns ``(true positives, n_train, false positives,
    n_holdout)`` so that several repeats can be pooled. Infinite distances never count as members."""
    a = np.asarray(train_distances, dtype=np.float64).ravel()
    b = np.sort(np.asarray(holdout_distances, dtype=np.float64).ravel())
    k = int(math.floor(float(fpr) * b.size))
    t = b[k] if k < b.size else np.inf
    return int(np.sum(a < t)), int(a.size), int(np.sum(b < t)), int(b.size)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided binomial confidence interval for ``k`` successes in ``n`` trials."""
    from scipy.stats import beta

    if n <= 0:
        return 0.0, 1.0
    a = (1.0 - level) / 2.0
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return lo, hi


def membership_audit(model_raw, model_fab, X_train, X_holdout, **kw) -> dict:
    """Membership-inference scores (eq 69) of two fitted KAHM classifiers on the same
    training rows and held-out rows -- typically the noisy-data classifier (Definition 12) and
    the fabricated-data classifier (Definition 15).

    Returns ``{"mis_raw", "mis_fab", "mis_reduction" (fraction), "auc_raw", "auc_fab",
    "n_train", "n_holdout"}``. ``model_raw`` may also be a non-private
    :class:`~pm_vector.kahm.KAHMClassifier`. The scores are computed on distances in units of each
    model's median held-out distance (:func:`scale_free`), so the reduction compares like with like.
    """
    out = {"n_train": int(np.shape(X_train)[0]), "n_holdout": int(np.shape(X_holdout)[0])}
    for tag, model in (("raw", model_raw), ("fab", model_fab)):
        r_tr, r_ho = scale_free(model.min_distance(X_train), model.min_distance(X_holdout))
        out[f"mis_{tag}"] = membership_inference_score(r_tr, r_ho, **kw)
        out[f"auc_{tag}"] = membership_auc(r_tr, r_ho)
    out["mis_reduction"] = (1.0 - out["mis_fab"] / out["mis_raw"]) if out["mis_raw"] > 0 else 0.0
    return out
