import numpy as np
import pytest
from scipy.stats import special_ortho_group

from pm_vector.alignment import UmeyamaAlignment, umeyama
from pm_vector.errors import AlignmentError


@pytest.mark.parametrize("k", [2, 3, 8])
def test_umeyama_recovers_a_known_similarity(k):
    rng = np.random.default_rng(k)
    for trial in range(20):
        src = rng.standard_normal((50, k))
        R = special_ortho_group.rvs(k, random_state=trial)
        c, t = rng.uniform(0.1, 10), rng.standard_normal(k) * 5
        dst = c * src @ R.T + t
        al = umeyama(src, dst)
        np.testing.assert_allclose(al.rotation_, R, atol=1e-8)
        assert al.scale_ == pytest.approx(c, abs=1e-8)
        np.testing.assert_allclose(al.translation_, t, atol=1e-8)
        assert al.residual_rms_ < 1e-8
        np.testing.assert_allclose(al.transform(src), dst, atol=1e-8)


def test_reflection_is_not_returned_as_a_rotation():
    rng = np.random.default_rng(0)
    src = rng.standard_normal((30, 3))
    dst = src * np.array([1, 1, -1])  # a mirror image: the best *rotation* is not exact
    al = umeyama(src, dst)
    assert np.linalg.det(al.rotation_) == pytest.approx(1.0)
    assert al.residual_rms_ > 0.1


def test_rigid_mode_keeps_scale_one():
    rng = np.random.default_rng(1)
    src = rng.standard_normal((20, 2))
    al = UmeyamaAlignment(with_scale=False).fit(src, 3 * src)
    assert al.scale_ == 1.0


def test_degenerate_and_mismatched_anchors_are_refused():
    rng = np.random.default_rng(2)
    line = np.outer(rng.standard_normal(10), [1.0, 2.0, 3.0])
    with pytest.raises(AlignmentError, match="degenerate"):
        umeyama(line, line)
    with pytest.raises(AlignmentError, match="cannot determine"):
        umeyama(np.eye(3), np.eye(3))
    with pytest.raises(AlignmentError, match="same anchors"):
        umeyama(rng.standard_normal((10, 3)), rng.standard_normal((11, 3)))
    with pytest.raises(AlignmentError, match="not fitted"):
        UmeyamaAlignment().transform(np.zeros((1, 2)))
