"""Graph Laplacians and the supervised manifold learning query (SMLQ)."""

from .._validation import normalize_rows
from .laplacian import (GraphLaplacian, LabelLaplacian, cross_laplacian, feature_laplacian, label_laplacian,
                        resolve_device)
from .smlq import SMLQ, AnchorFrame, public_init, smlq_objective, smlq_step

__all__ = ["SMLQ", "AnchorFrame", "GraphLaplacian", "LabelLaplacian", "cross_laplacian", "feature_laplacian",
           "label_laplacian", "normalize_rows", "public_init", "resolve_device", "smlq_objective", "smlq_step"]
