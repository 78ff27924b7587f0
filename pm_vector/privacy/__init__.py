"""Differential-privacy building blocks: CSPRNG, noise mechanisms, SMLQ sensitivity, accountant.

Each object states in its docstring exactly what it guarantees and under
which assumptions. For a PrivateMail release, calibrate
:class:`AnalyticGaussianMechanism` with :func:`smlq_sensitivity`;
:func:`paper_smlq_sensitivity` and :class:`LaplaceVariantMechanism` exist to
reproduce and compare with the papers, not for releases.
"""

from .accountant import PrivacyAccountant, Spend
from .cell_release import CellRandomizedResponse, cell_level_for_epsilon, release_for_epsilon, rr_probabilities
from .gaussian import AnalyticGaussianMechanism, GaussianMechanism, gaussian_epsilon, gaussian_privacy_profile
from .laplace import LaplaceMechanism
from .laplace_variant import LaplaceVariantMechanism, laplace_variant_constants, laplace_variant_sensitivity
from .rng import secure_generator
from .sensitivity import (appendix_b_constant, paper_smlq_sensitivity, smallest_valid_n, smallest_valid_sigma,
                          smlq_first_iteration, smlq_sensitivity)

__all__ = [
    "secure_generator",
    "CellRandomizedResponse",
    "rr_probabilities",
    "cell_level_for_epsilon",
    "release_for_epsilon",
    "GaussianMechanism",
    "AnalyticGaussianMechanism",
    "gaussian_privacy_profile",
    "gaussian_epsilon",
    "LaplaceMechanism",
    "appendix_b_constant",
    "smlq_sensitivity",
    "paper_smlq_sensitivity",
    "smlq_first_iteration",
    "smallest_valid_sigma",
    "smallest_valid_n",
    "LaplaceVariantMechanism",
    "laplace_variant_constants",
    "laplace_variant_sensitivity",
    "PrivacyAccountant",
    "Spend",
]
