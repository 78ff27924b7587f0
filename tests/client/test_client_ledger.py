"""The client's ledger: a default budget (never unlimited), its overrides, keys by server origin
(and an earlier client's per-collection entries carried over), the in-memory ledger, and
PrivateKNN charging before it draws any noise."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pm_vector.client.budget import (
    DEFAULT_DELTA_BUDGET,
    DEFAULT_EPSILON_BUDGET,
    LOCAL_KEY,
    MemoryBudget,
    PrivacyBudget,
    origin_key,
    server_origin,
)
from pm_vector.client.query import PrivateKNN
from pm_vector.errors import (
    BudgetExceededError,
    InvalidInputError,
    PrivacyParameterError,
)
from pm_vector.manifold.class_frames import ClassFrames


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("PM_VECTOR_HOME", str(tmp_path))
    monkeypatch.delenv("PM_VECTOR_EPSILON_BUDGET", raising=False)
    monkeypatch.delenv("PM_VECTOR_DELTA_BUDGET", raising=False)


def test_a_collection_without_a_budget_gets_the_default_not_unlimited(tmp_path):
    b = PrivacyBudget(tmp_path / "l.json")
    st = b.status("uuid:x")
    assert (st["epsilon_budget"], st["delta_budget"], st["default_budget"]) == \
        (DEFAULT_EPSILON_BUDGET, DEFAULT_DELTA_BUDGET, True)
    for _ in range(10):
        b.spend("uuid:x", 1.0, 1e-5)
    with pytest.raises(BudgetExceededError):
        b.spend("uuid:x", 0.5, 1e-6)
    # set_budget(None) is the default too, and a raised budget lets the next one through
    assert b.set_budget("uuid:x", None)["epsilon_budget"] == DEFAULT_EPSILON_BUDGET
    b.set_budget("uuid:x", 20.0, 1e-3)
    assert b.spend("uuid:x", 0.5, 1e-6)[0] == pytest.approx(10.5)
    # a version-1 ledger written before the default (budget null) is read with the default
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"version": 1, "collections": {"digits": {
        "version": 1, "epsilon_budget": None, "delta_budget": None, "delta_slack": None,
        "spends": [{"epsilon": 9.5, "delta": 1e-5, "label": None}]}}}))
    with pytest.raises(BudgetExceededError):
        PrivacyBudget(path).spend("digits", 1.0, 1e-5)


def test_the_default_is_overridable_and_checked(tmp_path, monkeypatch):
    assert PrivacyBudget(tmp_path / "a.json", default_epsilon=3.0).status("k")["epsilon_budget"] == 3.0
    monkeypatch.setenv("PM_VECTOR_EPSILON_BUDGET", "25")
    monkeypatch.setenv("PM_VECTOR_DELTA_BUDGET", "1e-3")
    st = PrivacyBudget(tmp_path / "a.json").status("k")
    assert (st["epsilon_budget"], st["delta_budget"]) == (25.0, 1e-3)
    monkeypatch.setenv("PM_VECTOR_EPSILON_BUDGET", "lots")
    with pytest.raises(InvalidInputError, match="PM_VECTOR_EPSILON_BUDGET"):
        PrivacyBudget(tmp_path / "a.json")
    monkeypatch.delenv("PM_VECTOR_EPSILON_BUDGET")
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(PrivacyParameterError):
            PrivacyBudget(tmp_path / "a.json", default_epsilon=bad)
    assert not (tmp_path / "a.json").exists()  # refusing wrote nothing


def test_the_origin_is_normalised_as_the_user_configured_it():
    same = ["http://127.0.0.1:8000", "http://localhost:8000/", "HTTP://LocalHost:8000/api/v1?x=1#f",
            "http://[::1]:8000", "http://127.0.0.2:8000", "http://user:pw@127.0.0.1:8000", "http://localhost.:8000",
            "http://[::ffff:127.0.0.1]:8000", "http://app.localhost:8000"]
    assert {server_origin(u) for u in same} == {"http://localhost:8000"}
    assert server_origin("https://Example.ORG") == server_origin("https://example.org:443/x") == \
        "https://example.org:443"
    assert server_origin("http://example.org") == "http://example.org:80"
    assert server_origin("http://[2001:DB8:0::1]:9000") == "http://[2001:db8::1]:9000"
    assert server_origin("http://bücher.example") == "http://xn--bcher-kva.example:80"
    # what the user chose apart stays apart: port, scheme, host
    assert len({server_origin(u) for u in ("http://localhost:8000", "http://localhost:8001", "https://localhost:8000",
                                           "http://10.0.0.1:8000", "http://10.0.0.2:8000")}) == 5
    assert origin_key("http://127.0.0.1:8000") == "origin:http://localhost:8000"
    for bad in ("", "127.0.0.1:8000", "ftp://host", "http://", "http://host:99999", None):
        with pytest.raises(InvalidInputError):
            server_origin(bad)


def test_an_earlier_clients_entries_fold_into_their_servers_origin(tmp_path):
    """Entries kept per published collection id, labelled ``name@base_url``: those of one server
    move into its origin entry (spends added, its own budget kept); others stay; once only."""
    earlier = [("uuid:aaa", "digits@http://127.0.0.1:8000", 2.0), ("uuid:bbb", "x@http://localhost:8000/", 3.0),
               ("uuid:ccc", "digits@http://10.0.0.1:8000", 4.0), ("digits", None, 5.0)]
    entry = lambda e: {"version": 1, "epsilon_budget": None, "delta_budget": None,  # noqa: E731
                       "delta_slack": None, "spends": [{"epsilon": e, "delta": 1e-5, "label": None}]}
    (tmp_path / "l.json").write_text(json.dumps({   # the JSON ledger an earlier client wrote
        "version": 1, "collections": {key: entry(eps) for key, _, eps in earlier},
        "names": {key: label for key, label, _ in earlier if label}}))
    b = PrivacyBudget(tmp_path / "l.json")
    key = origin_key("http://localhost:8000")
    b.set_budget(key, 30.0)
    assert b.fold(key, server_origin("http://localhost:8000"), label="http://localhost:8000") == 2
    st = b.status(key)
    assert st["epsilon_spent"] == pytest.approx(5.0) and st["releases"] == 2 and st["epsilon_budget"] == 30.0
    assert st["name"] == "http://localhost:8000"
    assert sorted(b.keys()) == sorted([key, "uuid:ccc", "digits"])  # another server's, and an unattributable one
    assert b.fold(key, server_origin("http://localhost:8000"), label="http://localhost:8000") == 0


def test_memory_budget_writes_nothing(tmp_path):
    m = MemoryBudget(default_epsilon=2.0)
    m.spend("k", 1.5, 1e-5)
    with pytest.raises(BudgetExceededError):
        m.account("k").spend(1.0, 1e-5)
    assert m.status("k")["releases"] == 1
    assert not list(tmp_path.rglob("*.json"))


def test_private_knn_charges_before_any_noise(digits_split, tmp_path):
    Xa, ya = digits_split.anchor
    Xd, yd = digits_split.dummy
    Xq, yq = digits_split.query
    frames = ClassFrames(4, 0.9).fit(Xa, ya)
    acc = MemoryBudget(default_epsilon=5.0).account("uuid:c")
    client = PrivateKNN(frames, Xd, yd, 4.0, accountant=acc)

    drawn = []  # a refused request must not reach the sampler
    real = client.mechanism.release_grid

    def spy(rows, rng=None):
        drawn.append(1)
        return real(rows, rng)

    client.mechanism.release_grid = spy
    client.request(Xq[0], int(yq[0]))
    with pytest.raises(BudgetExceededError):
        client.request(Xq[1], int(yq[1]))
    assert len(drawn) == 1 and acc.status()["releases"] == 1
    # bad input is refused before the charge
    with pytest.raises(InvalidInputError):
        PrivateKNN(frames, Xd, yd, 1.0, accountant=acc).request(np.full(Xq.shape[1], np.nan), int(yq[0]))
    assert acc.status()["releases"] == 1
    with pytest.raises(InvalidInputError, match="spend"):
        PrivateKNN(frames, Xd, yd, 1.0, accountant=object())
    # no accountant: the default ledger under the one key "local", whatever the collection or frames
    PrivateKNN(frames, Xd, yd, 4.0, collection="digits").request(Xq[0], int(yq[0]))
    PrivateKNN(ClassFrames(4, 0.8).fit(Xa, ya), Xd, yd, 4.0, collection="other").request(Xq[1], int(yq[1]))
    assert PrivacyBudget().status(LOCAL_KEY)["epsilon_spent"] == pytest.approx(8.0)
    assert PrivacyBudget().keys() == [LOCAL_KEY]
    with pytest.raises(BudgetExceededError):
        PrivateKNN(frames, Xd, yd, 4.0).request(Xq[2], int(yq[2]))
    assert PrivacyBudget().path.is_relative_to(tmp_path)


def _legacy_ledger(path, key, spends):
    path.write_text(json.dumps({"version": 1, "collections": {key: {
        "version": 1, "epsilon_budget": None, "delta_budget": None, "delta_slack": None,
        "spends": [{"epsilon": e, "delta": 1e-6, "label": "old"} for e in spends]}}, "names": {key: "a server"}}))


def test_the_ledger_appends_one_row_per_spend_to_an_sqlite_store(tmp_path):
    """Nothing is rewritten on a spend: one row appended to an SQLite database in WAL mode."""
    import sqlite3

    b = PrivacyBudget(tmp_path / "l.json", default_epsilon=1e6)
    for i in range(50):
        b.spend("k", 0.5, 1e-9, label=f"q{i}")
    assert b.store == tmp_path / "l.sqlite3" and not (tmp_path / "l.json").exists()
    db = sqlite3.connect(b.store)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT count(*), sum(epsilon) FROM spends WHERE key = 'k'").fetchone() == (50, 25.0)
    db.close()
    st = b.status("k")
    assert st["releases"] == 50 and st["epsilon_spent"] == pytest.approx(25.0) and st["path"] == str(b.store)


def test_a_json_ledger_is_carried_over_once_on_first_use(tmp_path):
    path = tmp_path / "budget.json"
    _legacy_ledger(path, "origin:http://localhost:80", [4.0, 3.0])
    b = PrivacyBudget(path)
    st = b.status("origin:http://localhost:80")
    assert st["releases"] == 2 and st["epsilon_spent"] == pytest.approx(7.0) and st["name"] == "a server"
    assert not path.exists() and (tmp_path / "budget.json.migrated").exists()
    with pytest.raises(BudgetExceededError):  # 7 + 4 > the default 10
        PrivacyBudget(path).spend("origin:http://localhost:80", 4.0, 1e-6)
    assert PrivacyBudget(path).status("origin:http://localhost:80")["releases"] == 2  # carried over once
    exported = PrivacyBudget(path).export()
    assert [s["epsilon"] for s in exported["collections"]["origin:http://localhost:80"]["spends"]] == [4.0, 3.0]
    # a JSON ledger at a path without the .json suffix is carried over into that very path
    other = tmp_path / "ledger"
    _legacy_ledger(other, "k", [1.5])
    assert PrivacyBudget(other).status("k")["epsilon_spent"] == pytest.approx(1.5)
    assert other.read_bytes()[:15] == b"SQLite format 3"


def test_a_withdrawn_spend_no_longer_counts(tmp_path):
    for b in (PrivacyBudget(tmp_path / "w.json"), MemoryBudget()):
        b.spend("k", 1.0, 1e-6)
        with b.recording() as ids:
            b.spend("k", 2.0, 1e-6)
            b.account("k").spend(3.0, 1e-6)
        assert len(ids) == 2 and b.status("k")["epsilon_spent"] == pytest.approx(6.0)
        assert b.withdraw(ids) == 2 and b.withdraw(ids) == 0
        st = b.status("k")
        assert st["releases"] == 1 and st["epsilon_spent"] == pytest.approx(1.0)
        assert len(b.export()["collections"]["k"]["spends"]) == 1


def _spender(path: str, attempts: int) -> int:
    b = PrivacyBudget(path, default_epsilon=10.0)
    n = 0
    for _ in range(attempts):
        try:
            b.spend("origin:http://localhost:8000", 1.0, 1e-6)
            n += 1
        except BudgetExceededError:
            pass
    return n


def test_several_processes_never_spend_past_the_budget(tmp_path):
    """Four processes racing to spend eps 1 twenty times each from one eps-10 entry: exactly ten
    releases recorded in all, each by one process."""
    import multiprocessing

    path = tmp_path / "shared.json"
    _legacy_ledger(path, "origin:http://localhost:8000", [])  # carried over by whichever process is first
    with multiprocessing.get_context("fork").Pool(4) as pool:
        counts = pool.starmap(_spender, [(str(path), 20)] * 4)
    st = PrivacyBudget(path, default_epsilon=10.0).status("origin:http://localhost:8000")
    assert sum(counts) == 10 and st["releases"] == 10 and st["epsilon_spent"] == pytest.approx(10.0)


def test_standalone_cell_and_location_releases_charge_the_one_local_key(digits_split):
    """Issue #35, finding 12a: PrivateLocationKNN and PrivateCellKNN used on their own charged the
    default ledger under a key derived from the published cells' digest (or the collection's name),
    so three published cell sets gave 2 accepted eps-4 requests each (24 eps against a default
    budget of 10) and a renamed collection a fourth entry. Now every one charges ``"local"``."""
    from pm_vector.client.cell_client import PrivateCellKNN
    from pm_vector.client.location import PrivateLocationKNN
    from pm_vector.manifold.public_cells import PublicCells, fit_location_cells

    Xa, ya = digits_split.anchor
    Xq, yq = digits_split.query
    # three cell sets a server could publish (fit with other seeds: other digests)
    locs = [fit_location_cells(Xa, levels=(2, 4, 8), random_state=s) for s in range(3)]
    assert len({c.digest() for c in locs}) == 3
    accepted = 0
    for i, cells in enumerate(locs):
        for name in (f"c{i}", f"renamed{i}"):
            client = PrivateLocationKNN(cells, 4.0, n_items=1000, level=8, candidates=10, code_bytes=16,
                                        widths=(16,), collection=name)
            try:
                client.request(Xq[accepted])
                accepted += 1
            except BudgetExceededError:
                pass
    assert accepted == 2  # 8 eps of the default 10: the third is refused whatever the cells or the name
    assert PrivacyBudget().keys() == [LOCAL_KEY]
    assert PrivacyBudget().status(LOCAL_KEY)["epsilon_spent"] == pytest.approx(8.0)
    cells = PublicCells(levels=(2, 4), random_state=1).fit(Xa, ya)
    for name in (None, "digits", "other"):
        with pytest.raises(BudgetExceededError):
            PrivateCellKNN(cells, 4.0, n_cells=2, collection=name).request(Xq[5], int(yq[5]))
    assert PrivacyBudget().keys() == [LOCAL_KEY]
