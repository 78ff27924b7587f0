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
