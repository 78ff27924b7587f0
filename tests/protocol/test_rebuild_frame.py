"""One rebuild of the public anchor frame (pm_vector.protocol.frame): the client's check of an
anchor document and the server's check of a run are the same function, tolerance and error."""

import copy

import numpy as np
import pytest

from pm_vector.errors import AlignmentError, FrameMismatchError
from pm_vector.protocol.frame import FRAME_TOLERANCE, frame_from_document, rebuild_frame


@pytest.fixture(scope="module")
def doc(digits_split):
    from pm_vector.manifold import AnchorFrame

    Xa, ya = digits_split.anchor
    Xd, yd = digits_split.dummy
    Xa = Xa[:120] / np.linalg.norm(Xa[:120], axis=1, keepdims=True)
    ya = ya[:120]
    Xd = Xd / np.linalg.norm(Xd, axis=1, keepdims=True)
    fr = AnchorFrame(6, seed=3).fit(Xa, ya)
    # the anchor embedding as a run stores it (float32) and a service publishes it
    emb = fr.anchor_embedding_.astype(np.float32).astype(np.float64)
    return {"anchor_ids": [f"1:{i}" for i in range(len(ya))], "features": Xa.tolist(), "labels": ya.tolist(),
            "dummy_features": Xd.tolist(), "dummy_labels": yd.tolist(),
            "frame": {"params": {"n_components": 6, "seed": 3}, "seed": 3, "anchor_embedding": emb.tolist()}}


def test_the_client_and_the_server_share_the_function_the_tolerance_and_the_error():
    from pm_vector.client import http, public_documents
    from pm_vector.db.resolve import frame as db_frame

    assert db_frame.rebuild_frame is rebuild_frame and public_documents.frame_from_document is frame_from_document
    assert db_frame.FRAME_TOLERANCE == http.FRAME_TOLERANCE == FRAME_TOLERANCE
    assert db_frame.FrameMismatchError is FrameMismatchError and issubclass(FrameMismatchError, AlignmentError)


def test_a_published_float32_embedding_is_accepted_and_a_shifted_one_refused(doc):
    frame, anchor = frame_from_document(doc)
    assert frame.reproduction_error_ <= FRAME_TOLERANCE and anchor.ids == doc["anchor_ids"]
    within = copy.deepcopy(doc)
    within["frame"]["anchor_embedding"][0][0] += FRAME_TOLERANCE / 4
    frame_from_document(within)
    shifted = copy.deepcopy(doc)
    shifted["frame"]["anchor_embedding"][0][0] += 1e-3  # another embedding, 10x the tolerance
    with pytest.raises(FrameMismatchError, match="does not reproduce the published anchor embedding"):
        frame_from_document(shifted)
    reshaped = copy.deepcopy(doc)
    reshaped["frame"]["anchor_embedding"] = [row[:-1] for row in doc["frame"]["anchor_embedding"]]
    with pytest.raises(FrameMismatchError, match="shape"):
        frame_from_document(reshaped)


def test_parameters_that_are_not_anchor_frames_are_the_same_error_on_the_client(doc):
    bad = copy.deepcopy(doc)
    bad["frame"]["params"]["not_a_parameter"] = 1  # used to escape the client's check as a TypeError
    with pytest.raises(FrameMismatchError, match="not built with an AnchorFrame"):
        frame_from_document(bad)
