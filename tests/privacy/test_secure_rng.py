"""secure_generator: CSPRNG-seeded by default, deterministic only when a seed is injected."""

from __future__ import annotations

import numpy as np
import pytest

import pm_vector.privacy.rng as rng_mod
from pm_vector.errors import InvalidInputError
from pm_vector.privacy import secure_generator


def test_seeded_generators_are_reproducible():
    a = secure_generator(seed=123).normal(size=5)
    b = secure_generator(seed=123).normal(size=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, secure_generator(seed=124).normal(size=5))


def test_unseeded_generator_draws_its_seed_from_secrets(monkeypatch):
    calls = []

    def fake_randbits(k):
        calls.append(k)
        return 987654321

    monkeypatch.setattr(rng_mod.secrets, "randbits", fake_randbits)
    g = secure_generator()
    assert calls == [128]
    np.testing.assert_array_equal(g.normal(size=3), np.random.Generator(np.random.PCG64(987654321)).normal(size=3))


def test_unseeded_generators_differ():
    assert isinstance(secure_generator(), np.random.Generator)
    assert not np.array_equal(secure_generator().normal(size=4), secure_generator().normal(size=4))


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True])
def test_bad_seed(seed):
    with pytest.raises(InvalidInputError):
        secure_generator(seed)
