"""The settings objects: the database layer's and the client's configuration, each read from the
environment in one place, frozen, and validated with errors that name the variable and the fix."""

import dataclasses
from pathlib import Path

import pytest

from pm_vector.client.budget import PrivacyBudget, default_path
from pm_vector.client.settings import ClientSettings
from pm_vector.db.errors import DatabaseConfigError
from pm_vector.db.postgres import config
from pm_vector.db.postgres.config import DatabaseSettings
from pm_vector.errors import InvalidInputError, PrivacyParameterError


def test_database_settings_from_the_environment(tmp_path):
    s = DatabaseSettings.from_env({"PM_VECTOR_HOME": str(tmp_path / "h"), "PM_VECTOR_EMBEDDED_FAST": "yes",
                                   "PM_VECTOR_START_TIMEOUT_S": "30", "PM_VECTOR_SQL_DIR": "/x/sql",
                                   "PM_VECTOR_DATABASE_URL": "  "})
    assert s.home == (tmp_path / "h").resolve() and s.pgdata_dir == s.home / "pgdata"
    assert s.embedded_fast is True and s.start_timeout_s == 30.0 and s.sql_dir == Path("/x/sql")
    assert s.database_url is None and s.mode == "embedded" and s.migrations_dir is None
    assert DatabaseSettings.from_env({"PM_VECTOR_RUN_GRAPH_CACHE_MB": " 0 "}).run_graph_cache_mb == 0.0
    d = DatabaseSettings.from_env({})
    assert d.home == Path("~/.local/share/pm_vector").expanduser().resolve()
    assert d.embedded_fast is False and d.start_timeout_s == 600.0 and d.run_graph_cache_mb == 1024.0
    assert DatabaseSettings.from_env({"PM_VECTOR_DATABASE_URL": "postgresql://h/d"}).mode == "external"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.home = tmp_path  # type: ignore[misc]


def test_the_module_functions_read_the_environment_now(tmp_path, monkeypatch):
    monkeypatch.setenv("PM_VECTOR_HOME", str(tmp_path / "a"))
    monkeypatch.delenv("PM_VECTOR_DATABASE_URL", raising=False)
    assert config.home() == (tmp_path / "a").resolve() and config.mode() == "embedded"
    monkeypatch.setenv("PM_VECTOR_HOME", str(tmp_path / "b"))
    monkeypatch.setenv("PM_VECTOR_DATABASE_URL", "postgresql://u@h/d")
    assert config.pgdata_dir() == (tmp_path / "b").resolve() / "pgdata"
    assert config.external_url() == "postgresql://u@h/d" and config.mode() == "external"


@pytest.mark.parametrize("env, var", [
    ({"PM_VECTOR_EMBEDDED_FAST": "maybe"}, "PM_VECTOR_EMBEDDED_FAST"),
    ({"PM_VECTOR_START_TIMEOUT_S": "soon"}, "PM_VECTOR_START_TIMEOUT_S"),
    ({"PM_VECTOR_START_TIMEOUT_S": "0"}, "PM_VECTOR_START_TIMEOUT_S"),
    ({"PM_VECTOR_START_TIMEOUT_S": "nan"}, "PM_VECTOR_START_TIMEOUT_S"),
    ({"PM_VECTOR_START_TIMEOUT_S": "90000"}, "PM_VECTOR_START_TIMEOUT_S"),
    ({"PM_VECTOR_RUN_GRAPH_CACHE_MB": "lots"}, "PM_VECTOR_RUN_GRAPH_CACHE_MB"),
    ({"PM_VECTOR_RUN_GRAPH_CACHE_MB": "-1"}, "PM_VECTOR_RUN_GRAPH_CACHE_MB"),
    ({"PM_VECTOR_RUN_GRAPH_CACHE_MB": "inf"}, "PM_VECTOR_RUN_GRAPH_CACHE_MB"),
])
def test_bad_database_settings_name_the_variable(env, var):
    with pytest.raises(DatabaseConfigError, match=var):
        DatabaseSettings.from_env(env)


def test_client_settings_from_the_environment(tmp_path, monkeypatch):
    s = ClientSettings.from_env({"PM_VECTOR_HOME": str(tmp_path), "PM_VECTOR_EPSILON_BUDGET": "20",
                                 "PM_VECTOR_DELTA_BUDGET": ""})
    assert s.ledger_path == tmp_path / "client" / "budget.json"
    assert s.epsilon_budget == 20.0 and s.delta_budget == 1e-4
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.epsilon_budget = 1.0  # type: ignore[misc]
    monkeypatch.setenv("PM_VECTOR_EPSILON_BUDGET", "3")
    monkeypatch.setenv("PM_VECTOR_DELTA_BUDGET", "1e-6")
    b = PrivacyBudget(tmp_path / "ledger.json")
    assert (b.default_epsilon, b.default_delta) == (3.0, 1e-6)
    assert PrivacyBudget(tmp_path / "l2.json", default_epsilon=1.0, default_delta=1e-5).default_epsilon == 1.0


def test_the_default_ledger_follows_pm_vector_home(tmp_path, monkeypatch):
    import pm_vector.client.budget as budget_mod

    monkeypatch.undo()  # the suite's autouse fixture replaces default_path; look at the real one
    monkeypatch.setattr(budget_mod, "default_path", default_path)
    monkeypatch.setenv("PM_VECTOR_HOME", str(tmp_path))
    assert budget_mod.default_path() == tmp_path / "client" / "budget.json"


@pytest.mark.parametrize("env, var", [
    ({"PM_VECTOR_EPSILON_BUDGET": "lots"}, "PM_VECTOR_EPSILON_BUDGET"),
    ({"PM_VECTOR_EPSILON_BUDGET": "-1"}, "PM_VECTOR_EPSILON_BUDGET"),
    ({"PM_VECTOR_EPSILON_BUDGET": "inf"}, "PM_VECTOR_EPSILON_BUDGET"),
    ({"PM_VECTOR_DELTA_BUDGET": "1"}, "PM_VECTOR_DELTA_BUDGET"),
    ({"PM_VECTOR_DELTA_BUDGET": "x"}, "PM_VECTOR_DELTA_BUDGET"),
])
def test_bad_client_settings_name_the_variable(env, var):
    with pytest.raises(InvalidInputError, match=var):
        ClientSettings.from_env(env)


def test_the_client_settings_read_the_budgets_bounds_from_their_one_home(monkeypatch):
    """The settings' budgets have the bounds the accountant (and the ledger) check,
    pm_vector.privacy.accountant.BUDGET_UPPER, with the settings' own messages."""
    from pm_vector.privacy import accountant

    with pytest.raises(InvalidInputError, match=r"PM_VECTOR_DELTA_BUDGET=1\.0 must be a number in \(0, 1\); set it "
                                                r"to the default total budget \(e\.g\. 1e-4\) or unset it\."):
        ClientSettings.from_env({"PM_VECTOR_DELTA_BUDGET": "1"})
    with pytest.raises(InvalidInputError, match=r"PM_VECTOR_EPSILON_BUDGET=inf must be a number finite and > 0; "
                                                r"set it to the default total budget \(e\.g\. 10\)"):
        ClientSettings.from_env({"PM_VECTOR_EPSILON_BUDGET": "inf"})
    monkeypatch.setitem(accountant.BUDGET_UPPER, "delta_budget", 0.5)
    with pytest.raises(InvalidInputError, match=r"PM_VECTOR_DELTA_BUDGET=0\.6 must be a number in \(0, 0\.5\)"):
        ClientSettings.from_env({"PM_VECTOR_DELTA_BUDGET": "0.6"})
    with pytest.raises(PrivacyParameterError):  # the accountant reads the same bound
        accountant.PrivacyAccountant(delta_budget=0.6)


def test_the_schema_owner_by_mode():
    """Embedded: pm_vector_owner (no superuser); your own PostgreSQL: PM_VECTOR_OWNER_ROLE, else the
    role that migrates (None); a name that is not a plain role name is refused naming the variable."""
    assert DatabaseSettings.from_env({}).schema_owner == config.OWNER_ROLE == "pm_vector_owner"
    ext = {"PM_VECTOR_DATABASE_URL": "postgresql://u@h/db"}
    assert DatabaseSettings.from_env(ext).schema_owner is None
    assert DatabaseSettings.from_env({**ext, "PM_VECTOR_OWNER_ROLE": "app_owner"}).schema_owner == "app_owner"
    with pytest.raises(DatabaseConfigError, match="PM_VECTOR_OWNER_ROLE"):
        DatabaseSettings.from_env({**ext, "PM_VECTOR_OWNER_ROLE": 'x"; DROP ROLE y'})
