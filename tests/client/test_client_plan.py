"""Issue #37, build item 2: the client asks the table. A release registered by a test with a client
plan of its own (a :class:`~pm_vector.client.releases.base.ReleaseQuery`) is a value of
``Client.query``'s ``release`` option and is built by its plan, with no change under
``pm_vector/client`` (the client's ``RELEASES`` tuple and ``choose_release`` used to refuse it);
and the byte budget has one check and one name, whichever way it comes in."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pm_vector.client import Client, MemoryBudget
from pm_vector.client.releases.base import ReleaseQuery
from pm_vector.errors import InvalidInputError
from pm_vector.privacy.location import plan
from pm_vector.protocol import releases


@dataclass
class _EchoRequest:
    epsilon: float
    delta: float = 0.0

    def to_dict(self):
        return {"format": "pm_vector.test-echo/1", "epsilon": self.epsilon, "delta": self.delta}


class _EchoQuery(ReleaseQuery):
    release = "test-echo"

    def build(self, features, label=None, rng=None):
        self.account.spend(self.q.epsilon, 0.0, label=self.q.name)  # charged before anything is drawn
        return _EchoRequest(self.q.epsilon), None

    def check(self, res, req):
        return res

    def finish(self, res, checked, req, secret, q_raw):
        return {"echo": checked}


@pytest.fixture
def echo_release():
    rel = releases.register(releases.Release(
        name="test-echo", wire_format="pm_vector.test-echo/1", request_type=_EchoRequest, answer_type=None,
        check_answer=None, guarantee=releases.Guarantee("the request's epsilon", 0.0), client_plan=_EchoQuery,
        resolver="tests.client.test_client_plan:_EchoRequest"))
    yield rel
    releases.unregister(rel.name)


def test_a_release_registered_by_a_test_is_asked_through_its_own_plan(echo_release):
    with Client("http://127.0.0.1:9", None, budget=MemoryBudget()) as c:  # nothing is sent
        assert c.choose_release("coll", 1.0, "test-echo") == "test-echo"
        req, _ = c._build_request("coll", [1.0, 0.0], epsilon=1.5, release="test-echo")
        assert isinstance(req, _EchoRequest) and req.epsilon == 1.5
        assert c.budget.status(c.budget_key())["epsilon_spent"] == pytest.approx(1.5)
        with pytest.raises(InvalidInputError, match="release must be one of"):
            c.choose_release("coll", 1.0, "test-nothing")


@pytest.mark.parametrize("bad", [1000, 1 << 35, True, 2.5e4, "50000"])
def test_the_byte_budget_has_one_check(bad):
    with pytest.raises(InvalidInputError) as from_plan:
        plan(1.0, n_items=10, levels=[2], widths=[8], max_bytes=bad)
    with pytest.raises(InvalidInputError) as from_client:
        Client("http://127.0.0.1:9", None, budget=MemoryBudget(), max_answer_bytes=bad)
    assert str(from_client.value) == str(from_plan.value)


@pytest.mark.parametrize("missing", ["build", "check", "finish"])
def test_a_plan_missing_a_step_cannot_be_made(missing):
    """ReleaseQuery is an abc: a plan that leaves out build, check or finish is refused when it is made
    (not when the step is first called, after the ledger was charged)."""
    from pm_vector.client.releases.base import Query

    steps = {m: getattr(_EchoQuery, m) for m in ("build", "check", "finish") if m != missing}
    partial = type("Partial", (ReleaseQuery,), {"release": "test-echo", **steps})
    with pytest.raises(TypeError, match=missing):
        partial(None, Query("coll", 1.0), None)
    _EchoQuery(None, Query("coll", 1.0), None)  # the whole plan is made


def test_every_release_names_its_plan_in_the_table():
    """client_plan is the one place a release's client plan is named: each built-in release the
    client asks names a ReleaseQuery under pm_vector/client/releases/ (no fallback table there)."""
    import pm_vector.client.releases as client_releases
    from pm_vector.client.releases import query_class

    assert not hasattr(client_releases, "QUERIES")
    asked = {}
    for rel in releases.RELEASES.values():
        if rel.client_plan is None:
            continue
        plan = releases.load(rel.client_plan)
        assert isinstance(plan, type) and issubclass(plan, ReleaseQuery), rel.name
        assert plan.__module__.startswith("pm_vector.client.releases."), plan.__module__
        assert query_class(rel) is plan
        asked[rel.name] = plan.__name__
    assert asked == {"location": "LocationQuery", "cells": "CellsQuery", "gaussian": "GaussianQuery",
                     "privatemail": "PaperQuery"}
