"""The wire types of the three request formats (pm_vector.protocol.bounds): what the client builds,
the service parses and pm_vector.db answers is refused the same way, field by field."""

from __future__ import annotations

import numpy as np
import pytest

from pm_vector.protocol import bounds as wire
from pm_vector.protocol.formats import CLASS_ROWS_FORMAT as ROWS_FORMAT
from pm_vector.protocol.formats import PRIVATEMAIL_FORMAT as PAPER_FORMAT
from pm_vector.protocol.formats import RELEASE_FORMAT
from pm_vector.protocol.paper import PrivateMailRequest, ReleaseRequest
from pm_vector.protocol.class_rows import ClassRowsRequest
from pm_vector.db.resolve.requests import parse_request
from pm_vector.errors import InvalidInputError

PARAMS = {"dp_sigma": 1.0, "dp_alpha": 0.5, "n_post_iter": 200, "post_alpha": 0.9, "seeded": False,
          "frame": {"n_components": 4, "sigma": "auto", "label_sigma": 1.0, "alpha": 0.3, "n_iter": 5,
                    "n_extend_iter": 10, "n_neighbors": 10, "label_graph": "between", "label_encoding": "onehot",
                    "seed": 0}}


def rows(**kw):
    d = {"format": ROWS_FORMAT, "rows": [[0.1, 0.2, 0.3], [0.0, -0.1, 0.2]], "classes": [0, 1], "epsilon": 1.0,
         "delta": 1e-5, "noise_scale": 2.0, "sigmas": [0.5, 0.5], "frames_digest": "a" * 32, "seeded": False,
         "noise": "discrete_gaussian", "grid": [0.01, 0.01]}
    return {**d, **kw}


def paper(**kw):
    d = {"format": PAPER_FORMAT, "anchor_ids": ["a", "b"], "embedding": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]],
         "n_query_rows": 1, "epsilon": 1.0, "delta": 1e-5, "sensitivity": 0.5, "noise_sigma": 3.0,
         "mechanism": "analytic", "params": PARAMS}
    return {**d, **kw}


def release(**kw):
    d = {"format": RELEASE_FORMAT, "anchor_ids": ["a", "b"], "release": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]],
         "query_labels": [0], "epsilon": 1.0, "delta": 1e-5, "sensitivity": 0.5, "noise_sigma": 3.0, "q_rms": 1.0,
         "mechanism": "analytic", "n_post_iter": 10, "post_alpha": 0.9, "params": PARAMS}
    return {**d, **kw}


BAD = [
    (rows, {"epsilon": True}, "epsilon"), (rows, {"seeded": "yes"}, "seeded"), (rows, {"seeded": 1}, "seeded"),
    (rows, {"epsilon": 1e-320}, "epsilon"), (rows, {"delta": 1e-320}, "delta"), (rows, {"epsilon": "1"}, "epsilon"),
    (rows, {"noise_scale": 1e308}, "noise_scale"), (rows, {"rows": [[1e308, 0, 0], [0, 0, 0]]}, "beyond"),
    (rows, {"grid": [[0.01], [0.01]]}, "grid"), (rows, {"sigmas": [[0.5, 0.5]]}, "sigmas"),
    (rows, {"sigmas": [True, 0.5]}, "sigmas"), (rows, {"rows": [["0.1", "0", "0"], ["0", "0", "0"]]}, "rows"),
    (paper, {"epsilon": True}, "epsilon"), (paper, {"delta": 1e-320}, "delta"),
    (paper, {"noise_sigma": 1e308}, "noise_sigma"), (paper, {"embedding": [[1e308, 0.0]] * 3}, "beyond"),
    (paper, {"mechanism": "classical", "epsilon": 4.0}, "classical"), (paper, {"n_query_rows": "1"}, "n_query_rows"),
    (paper, {"params": {**PARAMS, "note": "x" * 7000}}, "unknown params"),
    (paper, {"params": {**PARAMS, "dp_sigma": 1e308}}, "dp_sigma"),
    (paper, {"params": {**PARAMS, "n_post_iter": 10 ** 9}}, "n_post_iter"),
    (paper, {"params": {**PARAMS, "frame": {**PARAMS["frame"], "label_graph": "g" * 65}}}, "label_graph"),
    (paper, {"params": {**PARAMS, "seeded": "yes"}}, "seeded"),
    (release, {"epsilon": True}, "epsilon"), (release, {"mechanism": "classical"}, "classical"),
    (release, {"params": {"x": 1}}, "unknown params"), (release, {"release": [[1e308, 0.0]] * 3}, "beyond"),
]


@pytest.mark.parametrize("make, change, needle", BAD, ids=[f"{m.__name__}-{sorted(c)[0]}-{i}"
                                                          for i, (m, c, _) in enumerate(BAD)])
def test_every_format_refuses_bad_wire_types(make, change, needle):
    with pytest.raises(InvalidInputError, match=needle):
        parse_request(make(**change))


def test_valid_requests_parse_and_keep_their_types():
    q, _ = parse_request(rows())
    assert q.epsilon == 1.0 and q.seeded is False and q.grid == [0.01, 0.01]
    p, raw = parse_request(paper())
    assert raw is None and p.params == PARAMS  # the log stores to_dict() of the validated request
    r, _ = parse_request(release())
    assert r.mechanism == "analytic" and r.params == PARAMS
    # the client's own objects go through the same checks (numpy numbers are numbers)
    ClassRowsRequest(rows=np.zeros((2, 3)), classes=[0, 1], epsilon=np.float64(2.0), delta=1e-5, noise_scale=1.0,
                 sigmas=np.ones(2), frames_digest="a" * 32, seeded=np.bool_(False))
    with pytest.raises(InvalidInputError, match="epsilon"):
        ClassRowsRequest(rows=np.zeros((2, 3)), classes=[0, 1], epsilon=wire.MIN_EPSILON / 2, delta=1e-5,
                     noise_scale=1.0, sigmas=np.ones(2), frames_digest="a" * 32)
    with pytest.raises(InvalidInputError, match="classical"):
        PrivateMailRequest(anchor_ids=["a"], embedding=np.zeros((2, 2)), n_query_rows=1, epsilon=1.0, delta=1e-5,
                           sensitivity=1.0, noise_sigma=1.0, mechanism="classical")
    ReleaseRequest.from_dict(release(mechanism="classical", epsilon=0.5))  # classical below eps 1: fine


def test_wire_bounds():
    assert wire.number(3, "x") == 3.0
    for bad in (True, np.bool_(True), "3", None, float("nan"), float("inf"), 2e12, [1]):
        with pytest.raises(InvalidInputError):
            wire.number(bad, "x")
    assert wire.privacy(wire.MIN_EPSILON, wire.MIN_DELTA) == (1e-3, 1e-12)
    with pytest.raises(InvalidInputError):
        wire.privacy(1.0, 1.0)
    assert wire.flag(np.bool_(True), "f") is True
    assert wire.number_list(np.array([1, 2]), "l", 2) == [1.0, 2.0]
    with pytest.raises(InvalidInputError):
        wire.number_list(np.ones((2, 1)), "l", 2)
    assert wire.paper_params(None) == {}


def test_the_client_refuses_out_of_bounds_privacy_before_charging(digits_split):
    """PrivateKNN checks the wire bounds at construction: an epsilon below MIN_EPSILON never
    reaches the budget (the request would be refused after the charge otherwise)."""
    from pm_vector.client.query import PrivateKNN
    from pm_vector.manifold.class_frames import ClassFrames

    class Spy:
        spent = 0

        def spend(self, epsilon, delta, label=None):
            Spy.spent += 1

    Xa, ya = digits_split.anchor
    Xd, yd = digits_split.dummy
    frames = ClassFrames(4, 0.9).fit(Xa, ya)
    for eps, delta in ((wire.MIN_EPSILON / 10, 1e-5), (1.0, 1e-320), (True, 1e-5)):
        with pytest.raises(InvalidInputError):
            PrivateKNN(frames, Xd, yd, epsilon=eps, delta=delta, accountant=Spy()).request(
                digits_split.query[0][0], int(digits_split.query[1][0]))
    assert Spy.spent == 0
    req, _ = PrivateKNN(frames, Xd, yd, epsilon=1.0, accountant=Spy()).request(
        digits_split.query[0][0], int(digits_split.query[1][0]))
    assert Spy.spent == 1 and req.epsilon == 1.0


def test_the_paper_request_schema_is_checked_by_the_request_itself():
    """Unknown fields and anchor ids out of range are refused by PrivateMailRequest (the one home
    of the check: the service, the db layer and the client all parse through it)."""
    with pytest.raises(InvalidInputError, match="unknown request field"):
        PrivateMailRequest.from_dict(paper(hack="x"))
    with pytest.raises(InvalidInputError, match="unknown request field"):
        parse_request(paper(hack="x"))
    for ids in ([2 ** 63, 1], ["a" * 201, "b"], ["a\x00", "b"], [True, "b"], [1.5, "b"]):
        with pytest.raises(InvalidInputError, match="anchor_ids"):
            PrivateMailRequest.from_dict(paper(anchor_ids=ids))
    assert PrivateMailRequest.from_dict(paper(anchor_ids=[np.int64(3), "1:0"])).anchor_ids == [3, "1:0"]
