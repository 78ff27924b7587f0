import numpy as np
import pytest


@pytest.fixture(scope="session")
def digits():
    from pm_vector.datasets import load_dataset
    return load_dataset("digits")


@pytest.fixture(scope="session")
def digits_split(digits):
    from pm_vector.datasets import split_dataset
    return split_dataset(digits, 800, 300, 150, 100, seed=0)


@pytest.fixture(scope="session")
def frame(digits_split):
    from pm_vector.manifold import AnchorFrame
    Xa, ya = digits_split.anchor
    return AnchorFrame(8, seed=0).fit(Xa, ya)


@pytest.fixture(scope="session")
def public_anchor(digits_split):
    from pm_vector.client import PublicAnchor
    Xa, ya = digits_split.anchor
    Xd, yd = digits_split.dummy
    return PublicAnchor(list(range(len(ya))), Xa, ya, Xd, yd)



@pytest.fixture(autouse=True)
def _private_budget_ledger(tmp_path, monkeypatch):
    """No test writes the user's real client ledger (~/.local/share/pm_vector/client/budget.json)."""
    monkeypatch.setattr("pm_vector.client.budget.default_path", lambda: tmp_path / "client_budget.json")
