"""A benchmark's private PM_VECTOR_HOME (pm_vector.bench._home.private_home): the servers it
started are stopped while the private home is still in force, and the user's environment comes
back as it was, whether the benchmark returns or raises."""

import os
from contextlib import nullcontext
from pathlib import Path

import pytest

from pm_vector.bench._home import HOME_VARIABLES, private_home


@pytest.mark.parametrize("raises", [False, True])
def test_private_home_restores_the_environment_and_removes_the_directory(monkeypatch, raises):
    monkeypatch.setenv("PM_VECTOR_HOME", "/users/home")
    monkeypatch.setenv("PM_VECTOR_DATABASE_URL", "postgresql://user@db/pm")
    monkeypatch.delenv("PM_VECTOR_EMBEDDED_FAST", raising=False)
    seen_at_stop = {}

    def stop():
        seen_at_stop.update({k: os.environ.get(k) for k in HOME_VARIABLES})

    inside = {}
    with pytest.raises(RuntimeError) if raises else nullcontext():
        with private_home("pm_test_home_", stop=stop) as path:
            inside.update({k: os.environ.get(k) for k in HOME_VARIABLES}, path=path)
            assert Path(path).is_dir() and Path(path).name.startswith("pm_test_home_")
            if raises:
                raise RuntimeError("the benchmark failed")
    # inside: the private home, no external URL (so the embedded server starts there), fast mode
    assert inside["PM_VECTOR_HOME"] == inside["path"] and inside["PM_VECTOR_DATABASE_URL"] is None
    assert inside["PM_VECTOR_EMBEDDED_FAST"] == "1"
    # stop ran before the environment was put back: it still found the private home's servers
    assert seen_at_stop == {k: inside[k] for k in HOME_VARIABLES}
    # afterwards: the user's values again, the unset one unset, the directory gone
    assert os.environ["PM_VECTOR_HOME"] == "/users/home"
    assert os.environ["PM_VECTOR_DATABASE_URL"] == "postgresql://user@db/pm"
    assert "PM_VECTOR_EMBEDDED_FAST" not in os.environ
    assert not Path(inside["path"]).exists()


def test_a_failing_stop_still_restores_the_environment(monkeypatch):
    monkeypatch.setenv("PM_VECTOR_HOME", "/users/home")

    def stop():
        raise OSError("the server would not stop")

    with pytest.raises(OSError, match="would not stop"):
        with private_home("pm_test_home_", stop=stop) as path:
            pass
    assert os.environ["PM_VECTOR_HOME"] == "/users/home" and not Path(path).exists()

