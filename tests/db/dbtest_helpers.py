"""Helpers shared by the database tests: toy data and a real (random-projection) embedding function."""

from __future__ import annotations

import numpy as np


def projection(d: int, k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(d, k))


def make_embed_fn(k: int = 3):
    """A real, simple embedding function: a fixed random projection chosen by the seed."""

    def embed(anchor_X, anchor_y, item_X, item_y, params, seed, progress):
        P = projection(anchor_X.shape[1], int(params.get("k", k)), seed)
        progress(1, 1)
        return anchor_X.astype(np.float64) @ P, item_X.astype(np.float64) @ P

    return embed


def make_extend_fn():
    def extend(anchor_X, anchor_y, anchor_emb, new_X, new_y, params, seed):
        P = projection(anchor_X.shape[1], anchor_emb.shape[1], seed)
        return new_X.astype(np.float64) @ P

    return extend


def data(n: int, d: int, n_labels: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    y = rng.integers(0, n_labels, n)
    return X, y
