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


def start_child(code: str, *args: str):
    """A Python child process running ``code`` (dedented) with the test session's environment."""
    import os
    import subprocess
    import sys
    import textwrap

    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], env=dict(os.environ), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_ready(proc, timeout: float = 90.0) -> str:
    """The child's first stdout line starting with READY (it prints one where it should be killed)."""
    import select
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([proc.stdout], [], [], 0.5)
        if r:
            line = proc.stdout.readline()
            if line.startswith("READY"):
                return line
            if not line and proc.poll() is not None:
                break
    proc.kill()
    raise AssertionError(f"child never got ready: {proc.stderr.read()}")


def check_location_parts(conn, run_id: int) -> int:
    """The location rows' parts of a run (pm_vector.db.runs.locations): the rows of level -1 list
    every item of the run exactly once, and every entry of a row of level > 0 sits in the part those
    rows give its item (a wrong part would hide it from an erasure). Returns the part level."""
    rid = int(run_id)
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    L = int((doc.get("locations") or {}).get("part_level") or 0)
    items = sorted(r[0] for r in conn.execute(f"SELECT item_id FROM pm_vector.run_{rid}_items").fetchall())
    book = conn.execute(f"SELECT cell, part, item_ids FROM pm_vector.run_{rid}_locations WHERE level = -1").fetchall()
    if not L:
        assert not book
        return 0
    assert all(c == p and 0 <= p < L for c, p, _ in book)
    listed = [int(i) for _, _, a in book for i in a]
    assert sorted(listed) == items  # each item once
    part = {int(i): p for _, p, a in book for i in a}
    for lv, p, a in conn.execute(f"SELECT level, part, item_ids FROM pm_vector.run_{rid}_locations "
                                 "WHERE level > 0").fetchall():
        assert all(part[int(i)] == p for i in a), (lv, p)
    top = conn.execute(f"SELECT count(*) FROM pm_vector.run_{rid}_locations WHERE level = 0").fetchone()[0]
    assert top == 1
    return L
