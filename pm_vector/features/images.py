"""Reading images and the standard ImageNet preprocessing.

Every input (a PIL image, an ``H x W x C`` uint8 array or a file) is first turned into a
``3 x H x W`` uint8 RGB tensor, then preprocessed with ``torchvision.transforms.v2`` on
that tensor: resize of the shorter side to ``round(image_size * 256 / 224)`` (bilinear,
antialiased), center crop to ``image_size``, scale to [0, 1], normalise with the ImageNet
mean and standard deviation. Working on tensors makes a PIL image and the equal array give
identical features.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import InvalidInputError

__all__ = [
    "IMAGE_EXTENSIONS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageReadError",
    "build_transform",
    "find_images",
    "read_image",
    "to_uint8_chw",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RESIZE_RATIO = 256 / 224
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff",
                              ".ppm", ".pgm", ".pbm", ".pnm"})


class ImageReadError(InvalidInputError):
    """An image file is missing, unreadable or corrupt; ``path`` names it."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot read image file {self.path!r}: {reason}")


def build_transform(image_size: int):
    """``uint8 3xHxW tensor -> float32 3 x image_size x image_size`` ImageNet preprocessing."""
    from torchvision.transforms import v2

    return v2.Compose([
        v2.Resize(int(round(image_size * RESIZE_RATIO)), interpolation=v2.InterpolationMode.BILINEAR,
                  antialias=True),
        v2.CenterCrop(image_size),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD)),
    ])


def _pil_to_rgb_array(img) -> np.ndarray:
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode != "RGB":
        img = img.convert("RGB")  # alpha is dropped, as torchvision's ImageFolder loader does
    return np.array(img, dtype=np.uint8)  # a writable copy (torch.from_numpy warns on read-only arrays)


def to_uint8_chw(image, name: str = "image") -> torch.Tensor:
    """A PIL image or an ``H x W``/``H x W x {1,3,4}`` uint8 array as a ``3 x H x W`` uint8 tensor."""
    from PIL import Image

    if isinstance(image, Image.Image):
        arr = _pil_to_rgb_array(image)
    elif isinstance(image, np.ndarray):
        arr = image
        if arr.dtype != np.uint8:
            raise InvalidInputError(
                f"{name} must be a uint8 array (0..255); got dtype {arr.dtype}. Convert floats in [0, 1] "
                f"with (x * 255).round().astype(np.uint8).")
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
            raise InvalidInputError(f"{name} must be H x W x C with C in (1, 3, 4) (RGB order); got shape "
                                    f"{arr.shape}.")
        if arr.shape[2] == 4:
            arr = arr[:, :, :3]
        elif arr.shape[2] == 1:
            arr = np.repeat(arr, 3, axis=2)
    elif isinstance(image, (str, os.PathLike)):
        raise InvalidInputError(f"{name} is a path ({os.fspath(image)!r}); use transform_paths for files.")
    else:
        raise InvalidInputError(f"{name} must be a PIL image or an H x W x C uint8 numpy array; got "
                                f"{type(image).__name__}.")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise InvalidInputError(f"{name} is empty (size {arr.shape[1]} x {arr.shape[0]}).")
    return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).contiguous()


def read_image(path: str | os.PathLike) -> torch.Tensor:
    """Decode an image file completely (EXIF orientation applied) into a ``3 x H x W`` uint8
    RGB tensor; any failure raises :class:`ImageReadError` naming the file."""
    from PIL import Image, ImageOps

    p = Path(os.fspath(path))
    if not p.exists():
        raise ImageReadError(p, "no such file")
    if not p.is_file():
        raise ImageReadError(p, "not a regular file")
    try:
        with Image.open(p) as img:
            img.load()  # full decode: truncated or corrupt data fails here, not later
            img = ImageOps.exif_transpose(img)
            arr = _pil_to_rgb_array(img)
    except Exception as exc:  # UnidentifiedImageError, OSError (truncated), DecompressionBombError...
        raise ImageReadError(p, f"{type(exc).__name__}: {exc}") from exc
    if arr.ndim != 3 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ImageReadError(p, f"decoded to an empty image (shape {arr.shape})")
    return torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).contiguous()


def find_images(folder: Path, *, recursive: bool = True) -> list[Path]:
    """Image files (by extension, case-insensitive) under ``folder``, hidden files and folders
    skipped, in sorted order."""
    found: list[Path] = []
    if recursive:
        for root, dirs, files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found.extend(Path(root) / f for f in files
                         if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_EXTENSIONS)
    else:
        found = [p for p in folder.iterdir()
                 if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS]
    return sorted(found, key=lambda p: p.relative_to(folder).parts)


def check_path_list(paths, name: str = "paths") -> list[Path]:
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise InvalidInputError(f"{name} must be a list of file paths; got a single path. Wrap it: [path].")
    if not isinstance(paths, Sequence):
        paths = list(paths)
    out = []
    for i, p in enumerate(paths):
        if not isinstance(p, (str, os.PathLike)):
            raise InvalidInputError(f"{name}[{i}] must be a str or os.PathLike; got {type(p).__name__}.")
        out.append(Path(os.fspath(p)).expanduser())
    return out
