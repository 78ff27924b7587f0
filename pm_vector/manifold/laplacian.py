"""Gaussian-kernel graph Laplacians of features and of labels, in torch.

Kernel convention (NOTES 1): ``w(a, b) = exp(-||a - b||^2 / (2 sigma^2))`` -- the form of the
PrivateMail appendix, from which the sensitivity constant is derived (eq. 2's ``/sigma`` is not
used anywhere). ``L = D - W`` with a zero diagonal in ``W``; ``Diag(L) = D`` is the degree.

Graphs are kept as operators (``apply(Z) = L @ Z``) so that the server never forms a dense
``n x n`` matrix: features use a dense kernel for the client's small sets or a sparse k-NN
graph for large ones; labels use an exact class-sum formula that costs ``O(n k + C^2 k)``.
Numpy arrays at the API, torch (CPU, or CUDA when asked for and present) inside.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import warnings

import numpy as np
import torch

from .._validation import as_labels, as_matrix
from ..errors import InvalidInputError

DTYPE = torch.float64

# torch flags its sparse layouts as beta on every construction; the operations used here
# (COO coalesce, CSR @ dense) are stable, so the notices are noise for users.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


@contextmanager
def single_threaded():
    """Run small tensor work on one thread.

    For the client's few-hundred-row matrices, OpenMP start-up and spin-waiting cost more than
    the arithmetic (measured: 3.4 s -> 0.07 s per PrivateMail request on a busy 2-core
    machine). torch's thread count is process-wide, so it is restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None``/"auto" -> CUDA when present, else CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def to_tensor(a, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(a), dtype=DTYPE, device=device)


def _check_sigma(sigma: float, name: str = "sigma") -> float:
    sigma = float(sigma)
    if not np.isfinite(sigma) or sigma <= 0:
        raise InvalidInputError(f"{name} must be a positive finite bandwidth; got {sigma}.")
    return sigma


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pairwise squared Euclidean distances, clamped at 0 against rounding."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    return d2.clamp_min_(0.0)


def gaussian_weights(a: torch.Tensor, b: torch.Tensor, sigma: float) -> torch.Tensor:
    return torch.exp(-squared_distances(a, b) / (2.0 * sigma * sigma))


class GraphLaplacian:
    """``L = D - W`` as an operator. ``W`` is dense (n x m) or sparse CSR; rows index the
    nodes being updated, columns the nodes of the full state (``m >= n``; when ``m > n`` the
    extra columns are fixed nodes, e.g. clamped anchors)."""

    def __init__(self, weights: torch.Tensor, self_columns: bool = True):
        self.W = weights
        if weights.layout == torch.strided:
            self.degree = weights.sum(1)
        else:
            ones = torch.ones(weights.shape[1], 1, dtype=weights.dtype, device=weights.device)
            self.degree = (weights @ ones).squeeze(1)
        self.self_columns = self_columns

    @property
    def n_rows(self) -> int:
        return self.W.shape[0]

    def apply(self, Z_rows: torch.Tensor, Z_all: torch.Tensor | None = None) -> torch.Tensor:
        """``(L Z)`` for the rows: ``d_i z_i - sum_j w_ij z_j`` with ``z_j`` from ``Z_all``."""
        Z_all = Z_rows if Z_all is None else Z_all
        return self.degree[:, None] * Z_rows - self.W @ Z_all

    def dense(self) -> torch.Tensor:
        W = self.W.to_dense() if self.W.layout != torch.strided else self.W
        n = W.shape[0]
        L = -W.clone()
        L[:, :n] += torch.diag(self.degree)
        return L


def feature_laplacian(X, sigma: float, *, graph: str = "dense", n_neighbors: int = 30,
                      device=None, block_rows: int = 4096) -> GraphLaplacian:
    """Gaussian-kernel Laplacian of the rows of ``X``.

    ``graph="dense"``: all pairs (client-side sets, a few thousand rows at most).
    ``graph="knn"``: each row keeps its ``n_neighbors`` largest weights, symmetrised by
    ``max(W, W^T)``; memory ``O(n k)``, time ``O(n^2 d / block)`` in blocked matmuls.
    """
    device = resolve_device(device)
    sigma = _check_sigma(sigma)
    Xt = to_tensor(as_matrix(X), device)
    n = Xt.shape[0]
    if graph == "dense":
        W = gaussian_weights(Xt, Xt, sigma)
        W.fill_diagonal_(0.0)
        return GraphLaplacian(W)
    if graph != "knn":
        raise InvalidInputError(f"graph must be 'dense' or 'knn'; got {graph!r}.")
    k = int(min(max(1, n_neighbors), n - 1))
    rows, cols, vals = [], [], []
    for start in range(0, n, block_rows):
        blk = Xt[start:start + block_rows]
        d2 = squared_distances(blk, Xt)
        idx = torch.arange(start, start + blk.shape[0], device=device)
        d2[torch.arange(blk.shape[0], device=device), idx] = float("inf")
        nd, nj = torch.topk(d2, k, dim=1, largest=False)
        rows.append(idx[:, None].expand(-1, k).reshape(-1))
        cols.append(nj.reshape(-1))
        vals.append(torch.exp(-nd.reshape(-1) / (2.0 * sigma * sigma)))
    r, c, v = torch.cat(rows), torch.cat(cols), torch.cat(vals)
    # symmetrise: max(W, W^T). The kernel is symmetric, so an edge listed both ways was
    # summed to 2w by coalesce; dividing by the multiplicity restores w.
    idx = torch.cat([torch.stack([r, c]), torch.stack([c, r])], dim=1)
    summed = torch.sparse_coo_tensor(idx, torch.cat([v, v]), (n, n), device=device).coalesce()
    mult = torch.sparse_coo_tensor(idx, torch.ones(2 * v.numel(), dtype=DTYPE, device=device),
                                   (n, n), device=device).coalesce()
    W = torch.sparse_coo_tensor(summed.indices(), summed.values() / mult.values(), (n, n),
                                device=device).coalesce().to_sparse_csr()
    return GraphLaplacian(W)


def cross_laplacian(X_rows, X_fixed, sigma: float, *, n_neighbors: int | None = None,
                    device=None, block_rows: int = 8192) -> GraphLaplacian:
    """Laplacian of new rows against themselves and fixed nodes (out-of-sample extension).

    Columns are ``[rows..., fixed...]``. With ``n_neighbors`` set, each row keeps only its
    nearest fixed nodes and ignores the other new rows: cost linear in the number of rows.
    """
    device = resolve_device(device)
    sigma = _check_sigma(sigma)
    R = to_tensor(as_matrix(X_rows, "X_rows"), device)
    F = to_tensor(as_matrix(X_fixed, "X_fixed"), device)
    if R.shape[1] != F.shape[1]:
        raise InvalidInputError(f"rows have {R.shape[1]} features but the fixed nodes have {F.shape[1]}.")
    n, m = R.shape[0], F.shape[0]
    if n_neighbors is None:
        W = torch.cat([gaussian_weights(R, R, sigma), gaussian_weights(R, F, sigma)], dim=1)
        W[:, :n].fill_diagonal_(0.0)
        return GraphLaplacian(W)
    k = int(min(max(1, n_neighbors), m))
    col, val = [], []
    for start in range(0, n, block_rows):
        d2 = squared_distances(R[start:start + block_rows], F)
        nd, nj = torch.topk(d2, k, dim=1, largest=False)
        col.append(nj.reshape(-1) + n)
        val.append(torch.exp(-nd.reshape(-1) / (2.0 * sigma * sigma)))
    cols = torch.cat(col)
    vals = torch.cat(val)
    crow = torch.arange(0, n * k + 1, k, device=device)
    W = torch.sparse_csr_tensor(crow, cols, vals, (n, n + m), device=device)
    return GraphLaplacian(W)


@dataclass
class LabelLaplacian:
    """Laplacian of a Gaussian kernel on labels, applied exactly through class sums.

    ``encoding="integer"`` (the paper): labels are numbers, ``||y_i - y_j||^2 = (y_i - y_j)^2``.
    ``encoding="onehot"``: ``||y_i - y_j||^2 = 2`` between classes, 0 within.
    ``kind="same"`` (the paper): ``w = exp(-||y_i - y_j||^2 / (2 sigma^2))`` -- largest within a
    class, so the ``-alpha L_Y`` term of the SMLQ objective *spreads* same-class points.
    ``kind="between"``: ``w = 1 - exp(...)`` -- zero within a class, the between-class graph of
    Vural & Guillemot's supervised manifold learning, so ``-alpha L_Y`` separates classes.
    Rows are the updated nodes, the first ``n`` columns of the state; ``fixed_labels`` adds
    fixed columns after them. ``link_rows=False`` drops the row-row edges (each row then sees
    only the fixed nodes, as in a batched out-of-sample extension).
    """

    row_labels: torch.Tensor
    col_labels: torch.Tensor
    col_mask: torch.Tensor
    K: torch.Tensor  # (C, C) kernel between class indices
    n_classes: int

    @classmethod
    def build(cls, y_rows, sigma: float, *, fixed_labels=None, link_rows: bool = True,
              encoding: str = "onehot", kind: str = "between", classes=None, device=None) -> "LabelLaplacian":
        device = resolve_device(device)
        sigma = _check_sigma(sigma, "label_sigma")
        yr = np.asarray(y_rows)
        yf = np.asarray([], dtype=np.int64) if fixed_labels is None else np.asarray(fixed_labels)
        yc = np.concatenate([yr, yf])
        classes = np.unique(yc) if classes is None else np.asarray(classes)
        pos = {int(c): i for i, c in enumerate(classes)}
        try:
            ir = np.array([pos[int(v)] for v in yr], dtype=np.int64)
            ic = np.array([pos[int(v)] for v in yc], dtype=np.int64)
        except KeyError as e:
            raise InvalidInputError(f"label {e.args[0]} is not among the known classes {classes.tolist()}.") from None
        vals = classes.astype(np.float64)
        if encoding == "integer":
            d2 = (vals[:, None] - vals[None, :]) ** 2
        elif encoding == "onehot":
            d2 = 2.0 * (vals[:, None] != vals[None, :])
        else:
            raise InvalidInputError(f"label encoding must be 'integer' or 'onehot'; got {encoding!r}.")
        K = np.exp(-d2 / (2.0 * sigma * sigma))
        if kind == "between":
            K = 1.0 - K
        elif kind != "same":
            raise InvalidInputError(f"label graph kind must be 'same' or 'between'; got {kind!r}.")
        mask = np.ones(len(yc))
        if not link_rows:
            mask[:len(yr)] = 0.0
        return cls(torch.as_tensor(ir, device=device), torch.as_tensor(ic, device=device),
                   torch.as_tensor(mask, dtype=DTYPE, device=device),
                   torch.as_tensor(K, dtype=DTYPE, device=device), len(classes))

    @property
    def n_rows(self) -> int:
        return self.row_labels.shape[0]

    def _self_weight(self) -> torch.Tensor:
        # the row's own column carries K[c, c]; a node is not its own neighbour
        return self.K.diagonal()[self.row_labels] * self.col_mask[:self.n_rows]

    @property
    def degree(self) -> torch.Tensor:
        counts = torch.zeros(self.n_classes, dtype=DTYPE, device=self.K.device)
        counts.index_add_(0, self.col_labels, self.col_mask)
        return (self.K @ counts)[self.row_labels] - self._self_weight()

    def apply(self, Z_rows: torch.Tensor, Z_all: torch.Tensor | None = None) -> torch.Tensor:
        Z_all = Z_rows if Z_all is None else Z_all
        sums = torch.zeros(self.n_classes, Z_all.shape[1], dtype=Z_all.dtype, device=Z_all.device)
        sums.index_add_(0, self.col_labels, Z_all * self.col_mask[:, None])
        WZ = (self.K @ sums)[self.row_labels] - self._self_weight()[:, None] * Z_rows
        return self.degree[:, None] * Z_rows - WZ

    def dense(self) -> torch.Tensor:
        W = self.K[self.row_labels][:, self.col_labels] * self.col_mask[None, :]
        n = self.n_rows
        W[:, :n].fill_diagonal_(0.0)
        L = -W
        L[:, :n] += torch.diag(W.sum(1))
        return L


def label_laplacian(y, sigma: float, *, encoding: str = "onehot", kind: str = "between",
                    classes=None, device=None) -> LabelLaplacian:
    """Label Laplacian of the rows' own labels (see :class:`LabelLaplacian`)."""
    y = as_labels(y, len(np.asarray(y)))
    return LabelLaplacian.build(y, sigma, encoding=encoding, kind=kind, classes=classes, device=device)
