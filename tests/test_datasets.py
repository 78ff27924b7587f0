"""Datasets: IDX parsing, built-in loaders, user arrays, stratified disjoint splits."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from pm_vector.datasets import (
    DEFAULT_FASHION_MNIST_DIR,
    FASHION_MNIST_FILES,
    Dataset,
    available_datasets,
    DatasetNotFoundError,
    load_arrays,
    load_dataset,
    read_idx,
    split_dataset,
)
from pm_vector.errors import InvalidInputError

REAL_FMNIST = all((DEFAULT_FASHION_MNIST_DIR / f).is_file() for f in FASHION_MNIST_FILES.values())


def write_idx(path, arr: np.ndarray, code: int, *, compress: bool, extra: bytes = b"", cut: int = 0):
    be = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[code]
    head = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    payload = head + arr.astype(be).tobytes() + extra
    if cut:
        payload = payload[:-cut]
    if compress:
        with gzip.open(path, "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)


# ---------------------------------------------------------------------------- IDX

@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_uint8_images(tmp_path, compress):
    arr = np.arange(3 * 4 * 5, dtype=np.uint8).reshape(3, 4, 5)
    p = tmp_path / "imgs.idx"
    write_idx(p, arr, 0x08, compress=compress)
    out = read_idx(p)
    assert out.shape == (3, 4, 5) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, arr)


def test_read_idx_big_endian_int32_and_float(tmp_path):
    a = np.array([[1, -2, 70000], [2**30, 0, -5]], dtype=np.int32)
    write_idx(tmp_path / "a.gz", a, 0x0C, compress=True)
    out = read_idx(tmp_path / "a.gz")
    assert out.dtype == np.int32 and out.dtype.isnative
    np.testing.assert_array_equal(out, a)
    f = np.array([0.5, -1.25, 3e10])
    write_idx(tmp_path / "f", f, 0x0E, compress=False)
    np.testing.assert_array_equal(read_idx(tmp_path / "f"), f)


def test_read_idx_rejects_corrupt_files(tmp_path):
    arr = np.arange(10, dtype=np.uint8)
    write_idx(tmp_path / "short", arr, 0x08, compress=False, cut=1)
    with pytest.raises(InvalidInputError, match="truncated or corrupt"):
        read_idx(tmp_path / "short")
    write_idx(tmp_path / "long", arr, 0x08, compress=True, extra=b"\x00")
    with pytest.raises(InvalidInputError, match="truncated or corrupt"):
        read_idx(tmp_path / "long")
    (tmp_path / "magic").write_bytes(b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"\x05")
    with pytest.raises(InvalidInputError, match="not an IDX file"):
        read_idx(tmp_path / "magic")
    (tmp_path / "type").write_bytes(b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x05")
    with pytest.raises(InvalidInputError, match="unknown IDX data type"):
        read_idx(tmp_path / "type")


# ---------------------------------------------------------------------------- built-in datasets

def test_digits_unit_rows_and_metadata():
    ds = load_dataset("digits")
    assert ds.n_items == 1797 and ds.dim == 64 and ds.n_classes == 10
    assert ds.features.dtype == np.float32 and ds.labels.dtype == np.int64
    np.testing.assert_allclose(np.linalg.norm(ds.features.astype(np.float64), axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(ds.classes, np.arange(10))
    assert sum(ds.class_counts().values()) == 1797


def test_digits_stratified_subsample_is_seeded():
    a = load_dataset("digits", max_items=200, seed=3)
    b = load_dataset("digits", max_items=200, seed=3)
    c = load_dataset("digits", max_items=200, seed=4)
    assert a.n_items == 200
    np.testing.assert_array_equal(a.features, b.features)
    assert not np.array_equal(a.features, c.features)
    assert set(a.class_counts().values()) <= {19, 20, 21}  # ~ 200 * 0.1 per class
    with pytest.raises(InvalidInputError, match="max_items"):
        load_dataset("digits", max_items=0)


def test_unknown_dataset_name():
    with pytest.raises(InvalidInputError, match="unknown dataset.*digits"):
        load_dataset("cifar-100")


def _fake_fmnist_dir(tmp_path, n_train=30, n_test=10):
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        imgs = rng.integers(1, 256, size=(n, 28, 28)).astype(np.uint8)
        labs = (np.arange(n) % 10).astype(np.uint8)
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", imgs, 0x08, compress=True)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", labs, 0x08, compress=True)
    return tmp_path


def test_fashion_mnist_from_env_dir(tmp_path, monkeypatch):
    d = _fake_fmnist_dir(tmp_path)
    monkeypatch.setenv("PM_VECTOR_FASHION_MNIST_DIR", str(d))
    ds = load_dataset("fashion-mnist")
    assert ds.n_items == 40 and ds.dim == 784 and ds.n_classes == 10
    assert ds.class_names[0] == "T-shirt/top" and ds.class_names[9] == "Ankle boot"
    np.testing.assert_allclose(np.linalg.norm(ds.features, axis=1), 1.0, atol=1e-6)
    # train rows come first, in file order
    first = read_idx(d / "train-images-idx3-ubyte.gz")[0].reshape(-1).astype(np.float64)
    np.testing.assert_allclose(ds.features[0], first / np.linalg.norm(first), rtol=1e-6)
    sub = load_dataset("fashion_mnist", max_items=20, seed=1)
    assert sub.n_items == 20 and set(sub.class_counts().values()) == {2}


def test_fashion_mnist_70k_is_every_image_of_train_and_test(tmp_path, monkeypatch):
    """The benchmark's larger collection: the same images (train then test) under its own name."""
    monkeypatch.setenv("PM_VECTOR_FASHION_MNIST_DIR", str(_fake_fmnist_dir(tmp_path)))
    small, big = load_dataset("fashion-mnist"), load_dataset("Fashion_MNIST-70k")
    assert big.name == "fashion-mnist-70k" and "fashion-mnist-70k" in available_datasets()
    assert big.n_items == 40 and big.class_names == small.class_names
    np.testing.assert_array_equal(big.features, small.features)
    np.testing.assert_array_equal(big.labels, small.labels)


def test_fashion_mnist_missing_files_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PM_VECTOR_FASHION_MNIST_DIR", str(tmp_path))
    with pytest.raises(DatasetNotFoundError) as ei:
        load_dataset("fashion-mnist")
    msg = str(ei.value)
    assert "apt-get install dataset-fashion-mnist" in msg and "--features/--labels" in msg
    assert str(tmp_path) in msg and "train-images-idx3-ubyte.gz" in msg
    assert isinstance(ei.value, FileNotFoundError)


@pytest.mark.skipif(not REAL_FMNIST, reason="Debian package dataset-fashion-mnist is not installed "
                                            "(apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist_files(monkeypatch):
    monkeypatch.delenv("PM_VECTOR_FASHION_MNIST_DIR", raising=False)
    labels = read_idx(DEFAULT_FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz")
    assert labels.shape == (10000,) and labels.dtype == np.uint8
    np.testing.assert_array_equal(np.bincount(labels), np.full(10, 1000))
    ds = load_dataset("fashion-mnist", max_items=2000, seed=0)
    assert ds.n_items == 2000 and ds.dim == 784
    assert set(ds.class_counts().values()) == {200}
    np.testing.assert_allclose(np.linalg.norm(ds.features, axis=1), 1.0, atol=1e-6)


# ---------------------------------------------------------------------------- user arrays

def test_load_arrays_normalises_rows(tmp_path):
    x = np.array([[3.0, 4.0], [0.0, -2.0], [1.0, 1.0]])
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.array([0, 1, 1]))
    ds = load_arrays(tmp_path / "x.npy", tmp_path / "y.npy")
    assert ds.name == "x" and ds.features.dtype == np.float32
    np.testing.assert_allclose(ds.features, [[0.6, 0.8], [0.0, -1.0], [2**-0.5, 2**-0.5]], rtol=1e-6)
    np.testing.assert_array_equal(ds.labels, [0, 1, 1])
    np.save(tmp_path / "yf.npy", np.array([0.0, 1.0, 1.0]))  # integer-valued floats are fine
    assert load_arrays(tmp_path / "x.npy", tmp_path / "yf.npy").labels.dtype == np.int64


@pytest.mark.parametrize("x, y, match", [
    (np.array([[1.0, np.nan], [1.0, 0.0]]), np.array([0, 1]), "NaN"),
    (np.array([1.0, 2.0]), np.array([0, 1]), "2-d"),
    (np.ones((3, 2)), np.array([0, 1]), "must match"),
    (np.ones((2, 2)), np.array([0.5, 1.0]), "integer"),
    (np.ones((2, 2)), np.array([[0], [1]]), "1-d"),
    (np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([0, 1]), "zero row"),
])
def test_load_arrays_rejects_bad_input(tmp_path, x, y, match):
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    with pytest.raises(InvalidInputError, match=match):
        load_arrays(tmp_path / "x.npy", tmp_path / "y.npy")


def test_load_arrays_missing_file(tmp_path):
    with pytest.raises(InvalidInputError, match="does not exist"):
        load_arrays(tmp_path / "nope.npy", tmp_path / "y.npy")


# ---------------------------------------------------------------------------- splits

def test_split_disjoint_sized_stratified():
    ds = load_dataset("digits")
    sp = split_dataset(ds, 1000, 300, 197, 300, seed=0)
    parts = {p: sp.indices(p) for p in ("server", "anchor", "dummy", "query")}
    sizes = {p: len(v) for p, v in parts.items()}
    assert sizes == {"server": 1000, "anchor": 300, "dummy": 197, "query": 300}
    allidx = np.concatenate(list(parts.values()))
    assert len(np.unique(allidx)) == len(allidx) == 1797  # disjoint, here a partition
    freq = np.bincount(ds.labels) / ds.n_items
    for p, idx in parts.items():
        counts = np.bincount(ds.labels[idx], minlength=10)
        assert np.all(np.abs(counts - freq * len(idx)) < 1.0 + 1e-9), (p, counts)
    for p in ("anchor", "dummy"):
        assert np.all(np.bincount(ds.labels[parts[p]], minlength=10) >= 1)
    d = sp.describe()
    assert d["seed"] == 0 and d["sizes"] == sizes
    assert sum(d["class_counts"]["anchor"].values()) == 300 and set(d["class_counts"]["query"]) == set(range(10))
    x, y = sp.server
    np.testing.assert_array_equal(y, ds.labels[parts["server"]])
    assert x.shape == (1000, 64)


def test_split_is_seeded():
    ds = load_dataset("digits")
    a = split_dataset(ds, 100, 20, 20, 50, seed=5)
    b = split_dataset(ds, 100, 20, 20, 50, seed=5)
    c = split_dataset(ds, 100, 20, 20, 50, seed=6)
    np.testing.assert_array_equal(a.query_idx, b.query_idx)
    assert not np.array_equal(a.query_idx, c.query_idx)


def _toy(counts):
    labels = np.repeat(np.arange(len(counts)), counts)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((labels.shape[0], 3))
    return Dataset("toy", x / np.linalg.norm(x, axis=1, keepdims=True), labels)


def test_split_small_class_goes_to_anchor_and_dummy():
    ds = _toy([50, 2, 50])
    sp = split_dataset(ds, 40, 3, 3, 20, seed=0)
    for p in ("anchor", "dummy"):
        assert sorted(sp.labels(p).tolist()) == [0, 1, 2]
    assert 1 not in set(sp.labels("query").tolist()) | set(sp.labels("server").tolist())


def test_split_errors_name_class_and_sizes():
    with pytest.raises(InvalidInputError, match=r"class 1 .*has 1 item.*anchor.*dummy"):
        split_dataset(_toy([20, 1, 20]), 10, 3, 3, 5, seed=0)
    with pytest.raises(InvalidInputError, match=r"n_anchor=2 is smaller than the 3 classes"):
        split_dataset(_toy([20, 20, 20]), 10, 2, 3, 5, seed=0)
    with pytest.raises(InvalidInputError, match=r"asks for 61 items .* has only 60"):
        split_dataset(_toy([20, 20, 20]), 40, 3, 3, 15, seed=0)
    with pytest.raises(InvalidInputError, match="non-negative integer"):
        split_dataset(_toy([20, 20, 20]), -1, 3, 3, 5, seed=0)


def test_dataset_rejects_non_unit_rows():
    with pytest.raises(InvalidInputError, match="unit-norm"):
        Dataset("bad", np.ones((2, 2)), np.array([0, 1]))


def test_load_arrays_without_labels_and_subsample(tmp_path):
    from pm_vector.datasets import load_arrays, subsample

    X = np.random.default_rng(0).standard_normal((50, 4))
    np.save(tmp_path / "X.npy", X)
    ds = load_arrays(tmp_path / "X.npy", None)
    assert ds.n_items == 50 and ds.n_classes == 1 and np.all(ds.labels == 0)
    assert subsample(ds, 20).n_items == 20 and subsample(ds, 500) is ds
    with pytest.raises(InvalidInputError):
        subsample(ds, 0)
