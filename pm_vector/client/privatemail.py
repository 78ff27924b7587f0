"""The client side of PrivateMail (Algorithm 1 of the paper, with NOTES corrections).

1. **Client set.** Query rows: the real query and one dummy per other class, each dummy drawn
   uniformly from the public *dummy pool* (public items that are never anchor rows, so no
   query row duplicates another row of the request), shuffled by a CSPRNG permutation. Then
   the anchor rows, in anchor-id order. The multiset of query-row labels is always "every
   class once", whatever the real class.
2. **Private first iteration.** ``f(X) = Q + 1/2 Diag(L_X)^-1 (alpha L_Y - L_X) Q`` with the
   appendix kernel and the paper's label kernel, ``Q = [0 for query rows; anchor frame E]``
   (public, data-independent), released with the analytic Gaussian mechanism calibrated to
   the corrected appendix-B bound (:func:`pm_vector.privacy.smlq_sensitivity`) with
   ``n = N - 1``: the release is (eps, delta)-DP with respect to replacing any one row of the
   client set by the null record of the appendix (features and label). Between two *real*
   queries it is weaker: :func:`paper_protocol_guarantee` (about (2.15, 1e-5) at nominal
   eps 1 when the class stays, (4.75, 1e-5) when it changes). The noise is a float Gaussian:
   **not floating-point safe** (:mod:`pm_vector.privacy.gaussian`).
3. **Post-processing** (no access to raw features): ``L_X`` is rebuilt from the release with a
   bandwidth that widens with the noise the client knows it added, and the query rows are
   iterated with eq. 4 against the anchor frame (anchors held fixed). The query rows' labels
   enter here in the clear, as in the paper; they reveal only "one row per class", which is
   the same for every query, so the real class stays hidden as long as the real row cannot
   be told apart -- position is random and features are DP.
"""

from __future__ import annotations

import secrets

import numpy as np

from .._validation import as_matrix, normalize_rows
from ..errors import InvalidInputError
from ..manifold import AnchorFrame, label_laplacian, smlq_step
from ..manifold.laplacian import feature_laplacian, single_threaded, to_tensor
from ..manifold.post_process import post_process_release
from ..privacy import AnalyticGaussianMechanism, GaussianMechanism, secure_generator, smlq_sensitivity
from ..privacy.gaussian import gaussian_epsilon
from ..protocol import bounds
from ..protocol.releases import by_format
from ..protocol.anchor import PublicAnchor  # re-exported: its old home
from .request import ClientSecret, PrivateMailRequest
from .budget import LOCAL_KEY, PrivacyBudget

#: null-record steps between the client sets of two real queries: the real row goes x -> null
#: -> x' (same class), or two rows are replaced (the class changes)
NULL_RECORD_STEPS = {True: 2, False: 4}


def paper_protocol_guarantee(epsilon: float, delta: float = 1e-5, *, same_class: bool,
                             mechanism: str = "analytic") -> tuple[float, float]:
    """The (epsilon, delta) of one paper-protocol request (:class:`PrivateMail` at nominal
    ``epsilon, delta``) with respect to replacing the query by **another real query**, at the
    same delta.

    Derivation. The release is ``f(D) + N(0, sigma^2 I)``, ``sigma`` calibrated so that it is
    (epsilon, delta)-DP at L2 sensitivity ``Delta`` (the corrected appendix-B bound), which holds
    for the null-record relation: ``||f(D) - f(D')|| <= Delta`` when one row of the client set
    ``D`` is replaced by the null record. Two real queries ``(x, c)`` and ``(x', c')``: couple
    the dummy draws (one dummy per class; each world uses all but its own class) and the
    shuffle. If ``c = c'`` the client sets differ in the real row only, ``D -> null -> D'``, two
    steps. If ``c != c'`` the row at the real position holds ``x`` or a dummy of class ``c`` and
    the row at the other position a dummy of class ``c'`` or ``x'`` (labels and positions the
    same in both worlds): two rows, four steps. By the triangle inequality
    ``||f(D) - f(D')|| <= k Delta`` (``k`` = 2 or 4), so for every coupled draw the two releases
    are Gaussians ``k Delta`` apart, whose exact privacy profile (Balle & Wang 2018, Thm 8;
    :func:`~pm_vector.privacy.gaussian_privacy_profile`) gives the smallest epsilon at this delta
    (:func:`~pm_vector.privacy.gaussian.gaussian_epsilon`); the mixture over the coupled draws
    keeps it (joint convexity of the hockey-stick divergence), and the post-processing sees the
    release and the row labels, which the coupling keeps equal. ``sigma / Delta`` does not depend
    on ``Delta``, so neither does the result. (Group privacy would give ``(k eps, k e^{(k-1) eps}
    delta)``, far looser in delta.) Values at delta 1e-5: nominal eps 1 -> 2.15 (same class) and
    4.75 (different classes); eps 0.1 -> 0.21 and 0.45.
    """
    steps = NULL_RECORD_STEPS[bool(same_class)]
    if mechanism == "analytic":
        sigma = AnalyticGaussianMechanism(epsilon, delta, 1.0).sigma
    elif mechanism == "classical":
        sigma = GaussianMechanism(epsilon, delta, 1.0).sigma
    else:
        raise InvalidInputError(f"mechanism must be 'analytic' or 'classical'; got {mechanism!r}.")
    return gaussian_epsilon(sigma, delta, float(steps)), float(delta)


def paper_charge(epsilon: float, delta: float = 1e-5, mechanism: str = "analytic") -> tuple[float, float]:
    """What one paper-protocol request at nominal ``(epsilon, delta)`` is charged: its guarantee
    between two real queries whose class may change (:func:`paper_protocol_guarantee`,
    ``same_class=False``: e.g. (4.75, 1e-5) at nominal eps 1), the relation docs/guide/queries.md claims for
    the client's data. A mechanism that is not the paper's is refused."""
    return paper_protocol_guarantee(float(epsilon), float(delta), same_class=False,
                                    mechanism=bounds.mechanism(mechanism, float(epsilon)))


def request_charge(d: dict) -> tuple[float, float]:
    """``(epsilon, delta)`` to charge for sending the request ``d`` (a request's dict): what the
    table's release of its format says it charges (:meth:`pm_vector.protocol.releases.Guarantee.charge`:
    its own (eps, delta) for the pm_vector protocol's requests, :func:`paper_charge` for the paper's);
    its own (eps, delta) for a format the table does not know."""
    try:
        eps, dlt = float(d["epsilon"]), float(d["delta"])
    except (KeyError, TypeError, ValueError):
        raise InvalidInputError("the request names no valid epsilon/delta to charge; build it with "
                                "build_request().") from None
    rel = by_format(d.get("format"))
    return (eps, dlt) if rel is None else tuple(rel.guarantee.charge(d))


class PrivateMail:
    """Builds PrivateMail requests against an :class:`~pm_vector.manifold.AnchorFrame`.

    Guarantee: (epsilon, delta)-DP with respect to replacing one row of the client set by the
    null record; with respect to replacing the query by another real query,
    :func:`paper_protocol_guarantee` (e.g. (4.75, 1e-5) at nominal eps 1 when the class
    changes). The noise is a float64 Gaussian, not floating-point safe.

    Parameters (validated in :meth:`request`): ``epsilon``/``delta`` of the release;
    ``dp_sigma``/``dp_alpha``: kernel bandwidth and alpha of the private iteration -- sigma must
    lie in the domain of the appendix-B bound (for ~1000 rows, sigma >= ~0.6: the refusal names
    the bound); ``mechanism``: "analytic" (any eps) or "classical" (eps < 1 only);
    ``n_post_iter``: post-processing iterations. Noise, dummies and shuffle come from a
    generator seeded from :mod:`secrets`; there is no seed parameter. ``accountant``: charged
    (``spend(epsilon, delta, label)``) before the noise is drawn, :func:`paper_charge` of the
    nominal (eps, delta) (what the request costs between two real queries); None charges the default ledger
    (:class:`~pm_vector.client.budget.PrivacyBudget`, default budget) under the one key
    ``"local"`` (:data:`~pm_vector.client.budget.LOCAL_KEY`; nothing published selects it), except
    for a seeded request (not a private release); :class:`~pm_vector.client.http.Client` passes its
    server's entry, so its queries are charged once, there. Tests and benchmarks
    inject one through the internal ``_rng`` keyword (a Generator, or an int for
    ``secure_generator(int)``), and the request then says ``params["seeded"] = true``.
    """

    def __init__(self, frame: AnchorFrame, *, epsilon: float, delta: float = 1e-5, dp_sigma: float = 1.0,
                 dp_alpha: float = 0.5, mechanism: str = "analytic", n_post_iter: int = 200,
                 post_alpha: float = 0.9,
                 accountant=None, _rng=None):
        self.frame = frame
        self.epsilon = epsilon
        self.delta = delta
        self.dp_sigma = dp_sigma
        self.dp_alpha = dp_alpha
        self.mechanism = mechanism
        self.n_post_iter = n_post_iter
        self.post_alpha = post_alpha
        self.accountant = accountant
        self._seeded = _rng is not None
        self._rng = _rng if isinstance(_rng, np.random.Generator) else secure_generator(_rng)

    # dummies and the shuffle from `secrets` (the noise has its own generator), unless a test
    # injected a generator, which then drives all three
    def _below(self, n: int) -> int:
        return int(self._rng.integers(n)) if self._seeded else secrets.randbelow(n)

    def _permutation(self, n: int) -> np.ndarray:
        if self._seeded:
            return self._rng.permutation(n)
        order = list(range(n))
        secrets.SystemRandom().shuffle(order)
        return np.asarray(order)

    def _mechanism(self, sensitivity: float):
        if self.mechanism == "analytic":
            return AnalyticGaussianMechanism(self.epsilon, self.delta, sensitivity)
        if self.mechanism == "classical":
            return GaussianMechanism(self.epsilon, self.delta, sensitivity)
        raise InvalidInputError(f"mechanism must be 'analytic' or 'classical'; got {self.mechanism!r}.")

    def request(self, query, label: int, anchor: PublicAnchor, collection: str | None = None):
        """Return ``(PrivateMailRequest, ClientSecret)`` for one query row."""
        with single_threaded():
            return self._request(query, label, anchor, collection)

    def _request(self, query, label, anchor, collection):
        frame = self.frame
        if not hasattr(frame, "anchor_embedding_"):
            raise InvalidInputError("the anchor frame is not fitted; fit it on the public anchor first.")
        q = as_matrix(np.atleast_2d(np.asarray(query, dtype=np.float64)), "query")
        if q.shape[0] != 1:
            raise InvalidInputError(f"one query row at a time; got {q.shape[0]}.")
        if q.shape[1] != anchor.features.shape[1]:
            raise InvalidInputError(f"query has {q.shape[1]} features; the anchor set has {anchor.features.shape[1]}.")
        q = normalize_rows(q)  # the bound assumes unit rows: queries are normalised, documented
        classes = frame.classes_
        label = int(label)
        if label not in set(classes.tolist()):
            raise InvalidInputError(f"query label {label} is not one of the collection's classes {classes.tolist()}.")
        E = frame.anchor_embedding_
        if E.shape[0] != anchor.features.shape[0]:
            raise InvalidInputError("the anchor frame was fitted on a different anchor set.")
        rng = self._rng
        # 1. client set: the real row and one dummy per other class, CSPRNG-shuffled
        rows, row_labels = [q[0]], [label]
        for c in classes:
            if c == label:
                continue
            pool = np.flatnonzero(anchor.dummy_labels == c)
            if pool.size == 0:
                raise InvalidInputError(f"class {int(c)} has no item in the public dummy pool to draw a dummy from; "
                                        "the server must publish at least one dummy per class.")
            rows.append(anchor.dummy_features[pool[self._below(pool.size)]])
            row_labels.append(int(c))
        order = self._permutation(len(rows))
        Xq = np.asarray(rows)[order]
        yq = np.asarray(row_labels)[order]
        real_row = int(np.flatnonzero(order == 0)[0])
        C, k = Xq.shape[0], E.shape[1]
        X = np.vstack([Xq, anchor.features])
        y = np.concatenate([yq, anchor.labels])
        N = X.shape[0]
        # 2. the private first iteration and its release
        Q = np.vstack([np.zeros((C, k)), E])
        sens = smlq_sensitivity(n=N - 1, sigma=self.dp_sigma, alpha=self.dp_alpha, label_diameter_sq=2.0,
                                q_frobenius=float(np.linalg.norm(Q)))
        mech = self._mechanism(sens)
        bounds.privacy(self.epsilon, self.delta)  # the wire's bounds, before anything is charged
        bounds.mechanism(self.mechanism, self.epsilon)
        acc = self.accountant
        if acc is None and not self._seeded:  # a seeded request (tests, benchmarks) is not a private release

            acc = PrivacyBudget().account(LOCAL_KEY)
        if acc is not None:
            # charged what it costs between two real queries (the class may change), not its nominal eps
            acc.spend(*paper_charge(self.epsilon, self.delta, self.mechanism), label=collection)
        LX = feature_laplacian(X, self.dp_sigma, graph="dense", device="cpu")
        LY = label_laplacian(y, self.dp_sigma, encoding="onehot", kind="same", device="cpu")
        f = smlq_step(to_tensor(Q, "cpu"), LX, LY, float(self.dp_alpha)).numpy()
        release = mech.release(f, rng if self._seeded else secure_generator())
        # 3. post-processing: graph from the release only; anchors held at the public frame
        Zq = self.post_process(release, yq, noise_sigma=mech.sigma, q_rms=float(np.sqrt((Q ** 2).sum(1).mean())))
        embedding = np.vstack([Zq, E])
        params = {"dp_sigma": self.dp_sigma, "dp_alpha": self.dp_alpha, "n_post_iter": self.n_post_iter,
                  "post_alpha": self.post_alpha,
                  "frame": frame_params(frame), "seeded": self._seeded}
        req = PrivateMailRequest(anchor_ids=list(anchor.ids), embedding=embedding, n_query_rows=C,
                                 epsilon=float(self.epsilon), delta=float(self.delta), sensitivity=float(sens),
                                 noise_sigma=float(mech.sigma), mechanism=self.mechanism, params=params,
                                 collection=collection)
        return req, ClientSecret(real_row=real_row, label=label, row_labels=tuple(int(v) for v in yq))

    def post_process(self, release: np.ndarray, query_labels, *, noise_sigma: float, q_rms: float) -> np.ndarray:
        """Embed the query rows from the release alone (post-processing: no raw features;
        :func:`pm_vector.manifold.post_process.post_process_release`)."""
        return post_process_release(self.frame, release, query_labels, noise_sigma=noise_sigma, q_rms=q_rms,
                                    n_post_iter=self.n_post_iter, post_alpha=self.post_alpha)


def frame_params(frame: AnchorFrame) -> dict:
    return {k: getattr(frame, k) for k in ("n_components", "sigma", "label_sigma", "alpha", "n_iter",
                                           "n_extend_iter", "n_neighbors", "label_graph", "label_encoding", "seed")}
