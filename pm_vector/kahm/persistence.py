"""Saving and reloading fitted KAHM models.

File layout: ``torch.save`` of a dict with only strings and tensors::

    {"format": "pm_vector.kahm", "version": "1", "kind": <model kind>,
     "params": <JSON string of get_params()>, "meta": <JSON string>,
     "tensors": {name: tensor, ...}}

It is read back with ``torch.load(weights_only=True)``, which refuses anything but tensors
and plain containers, so a model file cannot execute code on load.

A leaf below the models (:mod:`pm_vector.kahm.model`, :mod:`pm_vector.kahm.classifier`), which
save and load through it; :func:`pm_vector.kahm.load_model`, which dispatches on the stored
kind to every model class, lives in the package face, above them all.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from ..errors import InvalidInputError

__all__ = ["save_state", "load_state", "FORMAT", "VERSION"]

FORMAT = "pm_vector.kahm"
VERSION = "1"


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, torch.device):
        return str(obj)
    if isinstance(obj, torch.dtype):
        return str(obj).replace("torch.", "")
    return obj


def save_state(path, *, kind: str, params: dict, meta: dict, tensors: dict) -> None:
    params = dict(params)
    if params.get("device") not in (None, "auto") and not isinstance(params.get("device"), str):
        params["device"] = str(params["device"])
    blob = {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "params": json.dumps(_jsonable(params)),
        "meta": json.dumps(_jsonable(meta)),
        "tensors": {k: v.detach().cpu().contiguous() for k, v in tensors.items()},
    }
    tmp = f"{os.fspath(path)}.tmp"
    torch.save(blob, tmp)
    os.replace(tmp, path)


def load_state(path):
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 -- any unpickling refusal becomes a clear error
        raise InvalidInputError(f"{path} is not a pm_vector KAHM model file: {exc}") from exc
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise InvalidInputError(f"{path} is not a pm_vector KAHM model file (format marker missing).")
    if blob.get("version") != VERSION:
        raise InvalidInputError(f"{path} has model-file version {blob.get('version')!r}; this code reads {VERSION}.")
    return blob["kind"], json.loads(blob["params"]), json.loads(blob["meta"]), blob["tensors"]
