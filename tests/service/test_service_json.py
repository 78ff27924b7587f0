"""The service writes its answers with orjson (pm_vector.service.documents.json_bytes): the same
JSON values as the _plain + json path it replaced, and float32 arrays (raw features) that read
back bit for bit."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np


def test_json_bytes_equals_the_plain_path():
    from pm_vector.service.documents import plain_json, json_bytes

    doc = {"rows": [{"item_ids": [1, 2**62], "scores": np.array([0.5, np.nan, np.inf]),
                     "labels": np.arange(3, dtype=np.int64), "flag": np.bool_(True), "x": np.float32(0.25),
                     "codes": np.ones((2, 3), np.uint8), "ids": np.arange(2, dtype=np.uint32),
                     "t": np.array([[1.5, -2.0]], np.float32)[:, ::-1]}],
           "when": dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc), 7: "int key", "none": None,
           "nested": ({"a": np.int32(4)},)}
    assert json.loads(json_bytes(doc)) == json.loads(json.dumps(plain_json(doc)))


def test_float32_features_read_back_exactly():
    from pm_vector.service.documents import json_bytes

    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    x = np.concatenate([x, rng.standard_normal(100_000).astype(np.float32),
                        np.array([np.finfo(np.float32).max, np.finfo(np.float32).tiny, 1e-45, -0.0], np.float32)])
    back = np.asarray(json.loads(json_bytes({"f": x}))["f"], dtype=np.float32)
    np.testing.assert_array_equal(back.view(np.uint32), x.view(np.uint32))
    # and shorter than float64 text of the same values
    assert len(json_bytes({"f": x})) < 0.8 * len(json.dumps({"f": x.tolist()}))
