"""secure_generator: every production draw comes from the OS CSPRNG (os.urandom); a seed gives a
deterministic numpy Generator for tests only."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from scipy import stats

import pm_vector.privacy.rng as rng_mod
from pm_vector.errors import InvalidInputError
from pm_vector.privacy import secure_generator
from pm_vector.privacy.class_rows import ClassRowsGaussianMechanism
from pm_vector.privacy.rng import SecureRandom, is_secure, require_generator


def test_seeded_generators_are_reproducible():
    a = secure_generator(seed=123).normal(size=5)
    b = secure_generator(seed=123).normal(size=5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, secure_generator(seed=124).normal(size=5))
    assert isinstance(secure_generator(1), np.random.Generator) and not is_secure(secure_generator(1))


def _fake_urandom(tag: int):
    """A deterministic byte source standing in for os.urandom (counter blocks, one stream per tag)."""
    state = {"i": 0, "calls": 0}

    def urandom(n):
        state["calls"] += 1
        out = bytearray()
        while len(out) < n:
            state["i"] += 1
            out += np.random.Generator(np.random.PCG64([tag, state["i"]])).bytes(64)
        return bytes(out[:n])
    return urandom, state


@pytest.mark.parametrize("release", ["class_rows", "kahm_grid", "kahm_row", "laplace"])
def test_every_default_release_draws_all_its_bits_from_os_urandom(monkeypatch, release):
    """With os.urandom replaced by a fixed byte stream, a default (rng=None) release becomes a
    deterministic function of that stream: no bit comes from anywhere else (a PCG64 seeded from
    ``secrets`` would not follow the patched stream)."""
    from pm_vector.kahm.grid import GridOptimalNoise, RowGaussianNoise
    from pm_vector.privacy import LaplaceMechanism

    X = np.zeros((6, 4))
    make = {"class_rows": lambda: ClassRowsGaussianMechanism(4.0, 1e-5, np.ones(6), 4).release(X),
            "kahm_grid": lambda: GridOptimalNoise(1.0, 1e-5, 1.0).release(X),
            "kahm_row": lambda: RowGaussianNoise(1.0, 1e-5, 1.0, grid=2.0 ** -4).release(X),
            "laplace": lambda: LaplaceMechanism(1.0, 1.0).release(X)}[release]
    outs = []
    for tag in (1, 1, 2):
        fake, state = _fake_urandom(tag)
        monkeypatch.setattr(rng_mod.os, "urandom", fake)
        outs.append(make())
        assert state["calls"] >= 1
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


def test_unseeded_generator_is_the_os_csprng(monkeypatch):
    g = secure_generator()
    assert isinstance(g, SecureRandom) and is_secure(g) and is_secure(require_generator(None))
    fake, state = _fake_urandom(3)
    monkeypatch.setattr(rng_mod.os, "urandom", fake)
    w = SecureRandom().words(5)
    assert state["calls"] == 1 and w.dtype == np.uint64
    np.testing.assert_array_equal(w, np.frombuffer(_fake_urandom(3)[0](8 * SecureRandom.BUFFER_WORDS),
                                                   dtype=np.uint64)[:5])


def test_secure_integers_are_uniform_and_in_range():
    g = SecureRandom()
    for lo, hi in ((0, 2), (0, 7), (-3, 10), (5, 6)):
        x = g.integers(lo, hi, size=70_000)
        assert x.dtype == np.int64 and x.min() >= lo and x.max() < hi
        if hi - lo > 1:
            counts = np.bincount(x - lo, minlength=hi - lo)
            assert stats.chisquare(counts).pvalue > 1e-6
    # per-element bounds (the exact samplers' call) and the top of the int64 range
    b = np.array([1, 2, 3, 1000, 2 ** 62], dtype=np.int64)
    x = np.stack([g.integers(0, b) for _ in range(3000)])
    assert np.all((x >= 0) & (x < b)) and np.all(x[:, 0] == 0)
    assert abs(x[:, 1].mean() - 0.5) < 0.05 and abs(x[:, 4].mean() / 2 ** 62 - 0.5) < 0.05
    top = g.integers(0, 1 << 63, size=4000, dtype=np.int64)
    assert top.min() >= 0 and (top >= 1 << 62).mean() > 0.45
    assert 0 <= int(g.integers(3)) < 3 and g.integers(0, 3, endpoint=True, size=4000).max() == 3
    with pytest.raises(InvalidInputError):
        g.integers(5, 5)
    with pytest.raises(InvalidInputError):
        g.integers(0, 2.5)


def test_secure_floats_and_permutation():
    g = SecureRandom()
    u = g.random(50_000)
    assert u.min() >= 0 and u.max() < 1 and np.all(u * 2 ** 53 == np.floor(u * 2 ** 53))
    assert stats.kstest(u, "uniform").pvalue > 1e-6
    assert stats.kstest(g.standard_normal(50_000), "norm").pvalue > 1e-6
    assert stats.kstest(g.laplace(0.0, 2.0, size=50_000), "laplace", args=(0.0, 2.0)).pvalue > 1e-6
    assert g.normal(1.0, 0.0, size=3).tolist() == [1.0, 1.0, 1.0]
    firsts = np.array([g.permutation(4)[0] for _ in range(4000)])
    assert sorted(g.permutation(9).tolist()) == list(range(9))
    assert stats.chisquare(np.bincount(firsts, minlength=4)).pvalue > 1e-6


def test_secure_random_is_not_shared_across_fork_pickle_or_copy():
    import copy

    g = SecureRandom()
    g.words(1)  # fills the read-ahead buffer
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child hands back its next words
        try:
            os.write(w, g.words(4).tobytes())
        finally:
            os._exit(0)
    os.close(w)
    child = np.frombuffer(os.read(r, 32), dtype=np.uint64)
    os.waitpid(pid, 0)
    os.close(r)
    assert child.size == 4 and not np.array_equal(child, g.words(4))
    with pytest.raises(TypeError):
        pickle.dumps(g)
    with pytest.raises(TypeError):
        copy.copy(g)


@pytest.mark.parametrize("seed", [-1, 1.5, "7", True])
def test_bad_seed(seed):
    with pytest.raises(InvalidInputError):
        secure_generator(seed)


def test_refuses_legacy_generators():
    with pytest.raises(InvalidInputError):
        require_generator(np.random.RandomState(0))
