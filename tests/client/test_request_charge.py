"""Issue #37: a guarantee is the table's, not re-derived from a release's name or format. What the
client charges for a request it did not build (:meth:`Client.resolve` -> ``request_charge``) is
what the table's release of its format says it charges (:meth:`Guarantee.charge`); it used to
switch on the paper's two formats and charge every other request its own (eps, delta)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pm_vector.client.privatemail import paper_charge, request_charge
from pm_vector.protocol import releases


@dataclass
class _FlatRequest:  # a test-only request type: its release is pure eps whatever the document says
    epsilon: float
    delta: float = 0.0


@pytest.fixture
def flat_release():
    rel = releases.register(releases.Release(
        name="test-flat", wire_format="pm_vector.test-flat/1", request_type=_FlatRequest, answer_type=None,
        check_answer=None, guarantee=releases.Guarantee("the request's epsilon, pure", 0.0), client_plan=None,
        resolver="tests.client.test_request_charge:_FlatRequest"))
    yield rel
    releases.unregister(rel.name)


def test_the_charge_is_the_tables_guarantee(flat_release):
    assert request_charge({"format": "pm_vector.test-flat/1", "epsilon": 2.0, "delta": 1e-5}) == (2.0, 0.0)


def test_the_known_releases_charge_as_before():
    from pm_vector.protocol.formats import CLASS_ROWS_FORMAT, LOCATION_FORMAT, PRIVATEMAIL_FORMAT

    assert request_charge({"format": CLASS_ROWS_FORMAT, "epsilon": 4.0, "delta": 1e-5}) == (4.0, 1e-5)
    assert request_charge({"format": LOCATION_FORMAT, "epsilon": 4.0, "delta": 0.0}) == (4.0, 0.0)
    assert request_charge({"format": PRIVATEMAIL_FORMAT, "epsilon": 1.0, "delta": 1e-5}) == \
        tuple(paper_charge(1.0, 1e-5, "analytic"))
    assert request_charge({"format": "unknown/1", "epsilon": 1.5, "delta": 1e-6}) == (1.5, 1e-6)
    with pytest.raises(Exception, match="no valid epsilon/delta"):
        request_charge({"format": CLASS_ROWS_FORMAT, "epsilon": 4.0})
