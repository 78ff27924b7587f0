"""Laplace mechanism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pm_vector.errors import InvalidInputError, PrivacyParameterError
from pm_vector.privacy import LaplaceMechanism, secure_generator


def test_scale_and_pure_dp():
    m = LaplaceMechanism(0.5, 3.0)
    assert m.scale == 6.0 and m.delta == 0.0 and m.epsilon == 0.5 and m.sensitivity == 3.0


def test_release_distribution():
    m = LaplaceMechanism(2.0, 1.0)
    noise = m.release(np.zeros(200_000), secure_generator(seed=5))
    assert np.std(noise) == pytest.approx(math.sqrt(2) * m.scale, rel=0.01)      # Var Laplace(b) = 2 b^2
    assert np.mean(np.abs(noise)) == pytest.approx(m.scale, rel=0.01)            # E|X| = b
    value = np.ones((2, 3))
    out = m.release(value, secure_generator(seed=1))
    assert out.shape == (2, 3)
    np.testing.assert_array_equal(out, m.release(value, secure_generator(seed=1)))
    np.testing.assert_array_equal(value, np.ones((2, 3)))


@pytest.mark.parametrize("eps,sens", [(0.0, 1.0), (-1.0, 1.0), (math.nan, 1.0), (math.inf, 1.0), (1.0, 0.0),
                                      (1.0, -2.0), (1.0, math.nan), ("1", 1.0)])
def test_bad_parameters(eps, sens):
    with pytest.raises(PrivacyParameterError):
        LaplaceMechanism(eps, sens)


def test_bad_release_input():
    m = LaplaceMechanism(1.0, 1.0)
    with pytest.raises(InvalidInputError):
        m.release(np.array([np.inf]), secure_generator(0))
    with pytest.raises(InvalidInputError):
        m.release(np.zeros(2), rng=42)
