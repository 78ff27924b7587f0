"""Labelled image-feature datasets and their stratified splits for retrieval benchmarks.

Every dataset is returned with **unit-norm float32 rows**: the sensitivity bounds of the
private mechanisms in :mod:`pm_vector.privacy` assume ``||x|| = 1``, so normalisation is
part of loading, not an option.

Sources
-------
``"digits"``
    scikit-learn's :func:`~sklearn.datasets.load_digits` (1,797 8x8 images, 64 features,
    10 classes). It ships with scikit-learn, so it works offline.
``"fashion-mnist"``
    The four IDX files of Debian's ``dataset-fashion-mnist`` package
    (``/usr/share/datasets/fashion-mnist/``; the environment variable
    ``PM_VECTOR_FASHION_MNIST_DIR`` or the ``data_dir`` argument overrides the directory).
    Train and test are combined: 70,000 images of 784 pixels, 10 classes.
``"fashion-mnist-70k"``
    The same 70,000 images under their own name, for benchmarks that split the whole collection
    (``pm-vector bench privacy --dataset fashion-mnist-70k``: 68,000 server items) where
    ``"fashion-mnist"``'s default split serves 10,000.
your own arrays
    :func:`load_arrays` reads a features ``.npy`` file and a labels ``.npy`` file.

A :class:`Split` cuts a dataset into four disjoint, stratified index sets: the server's
items, the public anchor set, the public dummy pool and the queries
(:func:`split_dataset`).

The module is a little over 500 lines because loading, validating (unit rows, labels) and
splitting are one path every benchmark takes in order, and the IDX reader is small enough that a
module of its own would only hold one function.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._validation import as_labels, as_matrix, normalize_rows, require_unit_rows
from .errors import InvalidInputError, PMVectorError

__all__ = [
    "Dataset",
    "DatasetNotFoundError",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_DIR_ENV",
    "DEFAULT_FASHION_MNIST_DIR",
    "Split",
    "available_datasets",
    "fashion_mnist_dir",
    "load_arrays",
    "load_dataset",
    "read_idx",
    "split_dataset",
]

FASHION_MNIST_DIR_ENV = "PM_VECTOR_FASHION_MNIST_DIR"
DEFAULT_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

_NORMALISE_CHUNK = 8192


class DatasetNotFoundError(PMVectorError, FileNotFoundError):
    """The files of a dataset are not on this machine; the message says how to get them."""


# --------------------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Dataset:
    """A labelled feature matrix.

    Attributes
    ----------
    name:
        Short name (``"digits"``, ``"fashion-mnist"``, or the file stem for user arrays).
    features:
        ``(n, d)`` float32 array; every row has unit Euclidean norm.
    labels:
        ``(n,)`` int64 class labels.
    classes:
        Sorted distinct label values, int64 ``(C,)``.
    class_names:
        One human-readable name per entry of ``classes`` (``str(label)`` when unknown).
    """

    name: str
    features: np.ndarray
    labels: np.ndarray
    classes: np.ndarray = field(default=None)  # type: ignore[assignment]
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        x = as_matrix(self.features, f"{self.name} features", dtype=np.float32)
        require_unit_rows(x, f"{self.name} features", tol=1e-5)
        y = as_labels(self.labels, x.shape[0], f"{self.name} labels")
        classes = np.unique(y) if self.classes is None else np.asarray(self.classes, dtype=np.int64)
        if classes.ndim != 1 or not np.array_equal(classes, np.unique(classes)):
            raise InvalidInputError(f"{self.name}: classes must be a sorted 1-d array of distinct labels.")
        missing = np.setdiff1d(y, classes)
        if missing.size:
            raise InvalidInputError(f"{self.name}: label {int(missing[0])} is not among the classes {classes.tolist()}.")
        names = tuple(self.class_names) if self.class_names else tuple(str(int(c)) for c in classes)
        if len(names) != classes.shape[0]:
            raise InvalidInputError(f"{self.name}: {len(names)} class names for {classes.shape[0]} classes.")
        object.__setattr__(self, "features", x)
        object.__setattr__(self, "labels", y)
        object.__setattr__(self, "classes", classes)
        object.__setattr__(self, "class_names", names)

    @property
    def n_items(self) -> int:
        return int(self.features.shape[0])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def n_classes(self) -> int:
        return int(self.classes.shape[0])

    def class_counts(self) -> dict[int, int]:
        """Number of items of each class (every class present, zeros included)."""
        return _class_counts(self.labels, self.classes)

    def __repr__(self) -> str:  # the arrays are too long for the default repr
        return (f"Dataset(name={self.name!r}, n_items={self.n_items}, dim={self.dim}, "
                f"n_classes={self.n_classes})")


def available_datasets() -> tuple[str, ...]:
    """Names accepted by :func:`load_dataset`."""
    return ("digits", "fashion-mnist", "fashion-mnist-70k")


def load_dataset(name: str, *, max_items: int | None = None, seed: int = 0,
                 data_dir: str | os.PathLike | None = None) -> Dataset:
    """Load a built-in dataset with unit-norm rows.

    Parameters
    ----------
    name:
        ``"digits"``, ``"fashion-mnist"`` or ``"fashion-mnist-70k"`` (the same images, named for
        the benchmark split of the whole collection; case-insensitive, ``_`` for ``-`` also works).
    max_items:
        Keep a stratified random subsample of at most this many items (class proportions
        preserved, every class kept when ``max_items`` >= number of classes). ``None`` keeps all.
    seed:
        Seed of the subsampling (the subsample is public bookkeeping, not a privacy
        mechanism, so numpy's default generator is used).
    data_dir:
        Fashion-MNIST only: directory of the four IDX files. Default: the environment
        variable ``PM_VECTOR_FASHION_MNIST_DIR``, else ``/usr/share/datasets/fashion-mnist``.

    Raises
    ------
    DatasetNotFoundError
        Fashion-MNIST files are missing (the message names the directory and the fix).
    InvalidInputError
        Unknown name or bad ``max_items``.
    """
    key = str(name).strip().lower().replace("_", "-")
    if max_items is not None:
        if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)) or max_items < 1:
            raise InvalidInputError(f"max_items must be a positive integer or None; got {max_items!r}.")
    if key == "digits":
        ds = _load_digits()
    elif key in ("fashion-mnist", "fashionmnist"):
        ds = _load_fashion_mnist(data_dir, max_items=max_items, seed=seed)
        return ds  # subsampled before normalisation to save memory
    elif key in ("fashion-mnist-70k", "fashionmnist-70k"):
        ds = _load_fashion_mnist(data_dir, max_items=max_items, seed=seed)
        return Dataset("fashion-mnist-70k", ds.features, ds.labels, ds.classes, ds.class_names)
    else:
        raise InvalidInputError(f"unknown dataset {name!r}; available: {', '.join(available_datasets())} "
                                f"(or load your own arrays with pm_vector.datasets.load_arrays).")
    if max_items is not None and max_items < ds.n_items:
        ds = subsample(ds, int(max_items), seed)
    return ds


def subsample(ds: Dataset, max_items: int, seed: int = 0) -> Dataset:
    """A stratified random subsample of at most ``max_items`` items (``ds`` itself when it is no
    larger); class proportions kept, as :func:`load_dataset`'s ``max_items``."""
    if isinstance(max_items, bool) or not isinstance(max_items, (int, np.integer)) or max_items < 1:
        raise InvalidInputError(f"max_items must be a positive integer; got {max_items!r}.")
    if max_items >= ds.n_items:
        return ds
    keep = _stratified_subsample(ds.labels, int(max_items), np.random.default_rng(seed))
    return Dataset(ds.name, ds.features[keep], ds.labels[keep], ds.classes, ds.class_names)


def load_arrays(features_path: str | os.PathLike, labels_path: str | os.PathLike | None, *,
                name: str | None = None) -> Dataset:
    """Load a user's own ``.npy`` feature and label files (``labels_path=None``: a collection
    without labels, every item in class 0; public partitions take the place of classes).

    ``features_path`` must hold a 2-d array of finite numbers (one row per item) and
    ``labels_path`` a 1-d array of integer class labels (integer-valued floats are
    accepted) with one label per row. **Rows are rescaled to unit Euclidean norm**
    (cosine geometry; the privacy calibrations assume unit-norm rows); an all-zero row
    cannot be normalised and is refused. Files are read with ``allow_pickle=False``.
    """
    fpath = Path(features_path)
    raw_x = _load_npy(fpath, "features")
    if labels_path is None:
        x = as_matrix(raw_x, f"features ({fpath.name})") if raw_x.dtype.kind in "biuf" and raw_x.ndim == 2 else None
        if x is None:
            raise InvalidInputError(f"features file {fpath} must hold a 2-d array of numbers (items x features); "
                                    f"got shape {raw_x.shape}, dtype {raw_x.dtype}.")
        return Dataset(name or fpath.stem, _unit_rows_float32(x), np.zeros(x.shape[0], dtype=np.int64))
    lpath = Path(labels_path)
    raw_y = _load_npy(lpath, "labels")
    if raw_x.dtype.kind not in "biuf":
        raise InvalidInputError(f"features file {fpath} must hold numbers; got dtype {raw_x.dtype}.")
    if raw_x.ndim != 2:
        raise InvalidInputError(f"features file {fpath} must hold a 2-d array (items x features); "
                                f"got shape {raw_x.shape}.")
    x = as_matrix(raw_x, f"features ({fpath.name})")
    if raw_y.ndim != 1:
        raise InvalidInputError(f"labels file {lpath} must hold a 1-d array; got shape {raw_y.shape}.")
    if raw_y.shape[0] != x.shape[0]:
        raise InvalidInputError(f"labels file {lpath} has {raw_y.shape[0]} labels but features file {fpath} "
                                f"has {x.shape[0]} rows; they must match one-to-one.")
    y = as_labels(raw_y, x.shape[0], f"labels ({lpath.name})")
    return Dataset(name or fpath.stem, _unit_rows_float32(x), y)


# --------------------------------------------------------------------------------------
# IDX files
# --------------------------------------------------------------------------------------

_IDX_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST / Fashion-MNIST format), gzip-compressed or not.

    Format: two zero bytes, a type byte (0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), a byte with the number of dimensions, one big-endian
    uint32 per dimension, then the data in big-endian C order. The payload length must
    match the header exactly. Returns an array in native byte order.
    """
    p = Path(path)
    with open(p, "rb") as fh:
        head = fh.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    try:
        with opener(p, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as exc:
        raise InvalidInputError(f"cannot read IDX file {p}: {exc}") from exc
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise InvalidInputError(f"{p} is not an IDX file (it must start with two zero bytes).")
    code, ndim = data[2], data[3]
    if code not in _IDX_TYPES:
        raise InvalidInputError(f"{p}: unknown IDX data type 0x{code:02X}.")
    if ndim == 0:
        raise InvalidInputError(f"{p}: IDX header declares 0 dimensions.")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise InvalidInputError(f"{p}: truncated IDX header.")
    dims = tuple(int(v) for v in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_TYPES[code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    got = len(data) - header_len
    if got != expected:
        raise InvalidInputError(f"{p}: IDX header declares shape {dims} ({expected} data bytes) but the file "
                                f"holds {got} data bytes; the file is truncated or corrupt.")
    arr = np.frombuffer(data, dtype=dtype, offset=header_len).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


# --------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------

_PARTS = ("server", "anchor", "dummy", "query")


@dataclass(frozen=True, eq=False)
class Split:
    """Four disjoint index sets into ``dataset``.

    ``server_idx`` are the server's items (the database searched), ``anchor_idx`` the
    public anchor set, ``dummy_idx`` the public dummy pool, ``query_idx`` the queries.
    Every class is present in the anchor set and the dummy pool.
    """

    dataset: Dataset
    server_idx: np.ndarray
    anchor_idx: np.ndarray
    dummy_idx: np.ndarray
    query_idx: np.ndarray
    seed: int | None

    def indices(self, part: str) -> np.ndarray:
        if part not in _PARTS:
            raise InvalidInputError(f"unknown part {part!r}; one of {', '.join(_PARTS)}.")
        return getattr(self, f"{part}_idx")

    def features(self, part: str) -> np.ndarray:
        return self.dataset.features[self.indices(part)]

    def labels(self, part: str) -> np.ndarray:
        return self.dataset.labels[self.indices(part)]

    @property
    def server(self) -> tuple[np.ndarray, np.ndarray]:
        return self.features("server"), self.labels("server")

    @property
    def anchor(self) -> tuple[np.ndarray, np.ndarray]:
        return self.features("anchor"), self.labels("anchor")

    @property
    def dummy(self) -> tuple[np.ndarray, np.ndarray]:
        return self.features("dummy"), self.labels("dummy")

    @property
    def query(self) -> tuple[np.ndarray, np.ndarray]:
        return self.features("query"), self.labels("query")

    def describe(self) -> dict:
        """Sizes, seed and per-class counts of each part, as plain Python types."""
        return {
            "dataset": self.dataset.name,
            "n_items": self.dataset.n_items,
            "dim": self.dataset.dim,
            "n_classes": self.dataset.n_classes,
            "seed": self.seed,
            "sizes": {p: int(self.indices(p).shape[0]) for p in _PARTS},
            "class_counts": {p: _class_counts(self.labels(p), self.dataset.classes) for p in _PARTS},
        }


def split_dataset(ds: Dataset, n_server: int, n_anchor: int, n_dummy: int, n_query: int,
                  seed: int | None = 0) -> Split:
    """Cut ``ds`` into four disjoint stratified index sets.

    Each part's class counts follow the dataset's class proportions (largest-remainder
    rounding). The anchor set and the dummy pool additionally contain at least one item of
    every class; the server items and the queries need not. ``seed`` drives numpy's default
    generator (public bookkeeping, not a privacy mechanism).

    Raises :class:`InvalidInputError` when the sizes are negative, exceed the dataset, or
    when some class has too few items to appear in both the anchor set and the dummy pool
    (the message names the class and the sizes).
    """
    sizes = {}
    for part, v in zip(_PARTS, (n_server, n_anchor, n_dummy, n_query)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise InvalidInputError(f"n_{part} must be a non-negative integer; got {v!r}.")
        sizes[part] = int(v)
    if sizes["server"] < 1 or sizes["query"] < 1:
        raise InvalidInputError("n_server and n_query must be at least 1.")
    total = sum(sizes.values())
    if total > ds.n_items:
        raise InvalidInputError(
            f"the split asks for {total} items (server {sizes['server']} + anchor {sizes['anchor']} + "
            f"dummy {sizes['dummy']} + query {sizes['query']}) but dataset {ds.name!r} has only {ds.n_items}.")
    counts = np.array([np.sum(ds.labels == c) for c in ds.classes], dtype=np.int64)
    n_cls = counts.shape[0]
    for part in ("anchor", "dummy"):
        if sizes[part] < n_cls:
            raise InvalidInputError(
                f"n_{part}={sizes[part]} is smaller than the {n_cls} classes of {ds.name!r}: every class must be "
                f"present in the {part} set; use n_{part} >= {n_cls}.")
    small = np.flatnonzero(counts < 2)
    if small.size:
        c = int(small[0])
        raise InvalidInputError(
            f"class {int(ds.classes[c])} ({ds.class_names[c]!r}) has {int(counts[c])} item(s) in {ds.name!r}; the anchor "
            f"set and the dummy pool each need at least one item of every class (2 in total). Drop that class or "
            f"add items.")

    rng = np.random.default_rng(seed)
    pools = [rng.permutation(np.flatnonzero(ds.labels == c)) for c in ds.classes]
    weights = counts / counts.sum()
    remaining = counts.copy()
    alloc: dict[str, np.ndarray] = {}
    # anchor and dummy first (they carry the one-per-class minimum), then query, then server
    for part in ("anchor", "dummy", "query", "server"):
        minimum = np.ones(n_cls, np.int64) if part in ("anchor", "dummy") else np.zeros(n_cls, np.int64)
        if part == "anchor":  # keep one item of every class for the dummy pool
            capacity = remaining - 1
        else:
            capacity = remaining.copy()
        alloc[part] = _allocate(sizes[part], weights, capacity, minimum, ds, part)
        remaining = remaining - alloc[part]

    out = {p: [] for p in _PARTS}
    for ci, pool in enumerate(pools):
        start = 0
        for part in ("anchor", "dummy", "query", "server"):
            m = int(alloc[part][ci])
            out[part].append(pool[start:start + m])
            start += m
    idx = {p: rng.permutation(np.concatenate(out[p]).astype(np.int64)) for p in _PARTS}
    return Split(ds, idx["server"], idx["anchor"], idx["dummy"], idx["query"], seed)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def _class_counts(labels: np.ndarray, classes: np.ndarray) -> dict[int, int]:
    return {int(c): int(np.sum(labels == c)) for c in classes}


def _allocate(total: int, weights: np.ndarray, capacity: np.ndarray, minimum: np.ndarray,
              ds: Dataset, part: str) -> np.ndarray:
    """Integer counts per class summing to ``total``, proportional to ``weights``,
    ``minimum <= counts <= capacity`` (largest-remainder rounding with water-filling)."""
    bad = np.flatnonzero(capacity < minimum)
    if bad.size:
        c = int(bad[0])
        raise InvalidInputError(f"class {int(ds.classes[c])} has too few items left for the {part} set "
                                f"(needs {int(minimum[c])}, {max(int(capacity[c]), 0)} left).")
    if capacity.sum() < total:
        raise InvalidInputError(f"not enough items left for the {part} set ({total} requested, "
                                f"{int(capacity.sum())} available).")
    target = total * weights
    counts = np.clip(np.floor(target).astype(np.int64), minimum, capacity)
    while counts.sum() < total:
        gap = np.where(counts < capacity, target - counts, -np.inf)
        counts[int(np.argmax(gap))] += 1
    while counts.sum() > total:
        gap = np.where(counts > minimum, target - counts, np.inf)
        counts[int(np.argmin(gap))] -= 1
    return counts


def _stratified_subsample(labels: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a stratified random subsample of size ``m``."""
    classes, counts = np.unique(labels, return_counts=True)
    minimum = np.ones_like(counts) if m >= classes.shape[0] else np.zeros_like(counts)
    target = m * counts / counts.sum()
    alloc = np.clip(np.floor(target).astype(np.int64), minimum, counts)
    while alloc.sum() < m:
        gap = np.where(alloc < counts, target - alloc, -np.inf)
        alloc[int(np.argmax(gap))] += 1
    while alloc.sum() > m:
        gap = np.where(alloc > minimum, target - alloc, np.inf)
        alloc[int(np.argmin(gap))] -= 1
    keep = [rng.choice(np.flatnonzero(labels == c), size=int(a), replace=False)
            for c, a in zip(classes, alloc)]
    return np.sort(np.concatenate(keep))


def _unit_rows_float32(x: np.ndarray) -> np.ndarray:
    """Unit-normalise rows (chunked through :func:`normalize_rows`) into a float32 array."""
    out = np.empty(x.shape, dtype=np.float32)
    for start in range(0, x.shape[0], _NORMALISE_CHUNK):
        stop = min(start + _NORMALISE_CHUNK, x.shape[0])
        try:
            out[start:stop] = normalize_rows(x[start:stop])
        except InvalidInputError as exc:  # report the row index in the whole array
            raise InvalidInputError(f"{exc} (chunk starting at row {start})") from exc
    return out


def _load_npy(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise InvalidInputError(f"{what} file {path} does not exist.")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise InvalidInputError(f"{what} file {path} is not a plain numeric .npy array "
                                f"(object arrays are refused): {exc}") from exc
    except OSError as exc:
        raise InvalidInputError(f"cannot read {what} file {path} as .npy: {exc}") from exc


def _load_digits() -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return Dataset("digits", _unit_rows_float32(bunch.data), bunch.target.astype(np.int64),
                   np.arange(10, dtype=np.int64), tuple(str(i) for i in range(10)))


def fashion_mnist_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """Directory searched for Fashion-MNIST: ``data_dir``, else ``$PM_VECTOR_FASHION_MNIST_DIR``,
    else ``/usr/share/datasets/fashion-mnist``."""
    if data_dir is not None:
        return Path(data_dir)
    env = os.environ.get(FASHION_MNIST_DIR_ENV)
    return Path(env) if env else DEFAULT_FASHION_MNIST_DIR


def _load_fashion_mnist(data_dir, *, max_items: int | None, seed: int) -> Dataset:
    d = fashion_mnist_dir(data_dir)
    missing = [f for f in FASHION_MNIST_FILES.values() if not (d / f).is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"Fashion-MNIST files not found in {d} (missing: {', '.join(missing)}). Install them with "
            f"`apt-get install dataset-fashion-mnist`, or point {FASHION_MNIST_DIR_ENV} at a directory holding "
            f"the four IDX .gz files, or use your own data with --features/--labels "
            f"(pm_vector.datasets.load_arrays).")
    parts = {k: read_idx(d / f) for k, f in FASHION_MNIST_FILES.items()}
    for split in ("train", "test"):
        imgs, labs = parts[f"{split}_images"], parts[f"{split}_labels"]
        if imgs.ndim != 3 or labs.ndim != 1 or imgs.shape[0] != labs.shape[0]:
            raise InvalidInputError(f"Fashion-MNIST {split} files in {d} do not match: images {imgs.shape}, "
                                    f"labels {labs.shape}.")
    images = np.concatenate([parts["train_images"], parts["test_images"]])
    labels = np.concatenate([parts["train_labels"], parts["test_labels"]]).astype(np.int64)
    if max_items is not None and max_items < labels.shape[0]:
        keep = _stratified_subsample(labels, int(max_items), np.random.default_rng(seed))
        images, labels = images[keep], labels[keep]
    x = images.reshape(images.shape[0], -1)
    return Dataset("fashion-mnist", _unit_rows_float32(x), labels,
                   np.arange(10, dtype=np.int64), FASHION_MNIST_CLASSES)
