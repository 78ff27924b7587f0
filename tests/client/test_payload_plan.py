"""What the client's location plan counts per candidate for payloads (issue #35 item 9, follow-up):
``min(max_payload_bytes, payload_bytes_max)`` as the collection document publishes them, the bound
alone from an earlier server or for an invalid mark; and the plan it gives a collection that
stores no payloads: every byte to candidates (1,000 digits at 50 kB: all 1,000)."""

from __future__ import annotations

import pytest

from pm_vector.client.public_documents import PublicDocuments
from pm_vector.privacy.location import plan
from pm_vector.protocol.location import payload_wire_bytes


class _Docs(PublicDocuments):
    def __init__(self, doc, wire="msgpack"):
        self.doc, self.wire = doc, wire

    def collection(self, name):
        return self.doc


@pytest.mark.parametrize("doc, want", [
    ({"max_payload_bytes": 256}, 256),  # an earlier server: the bound
    ({"max_payload_bytes": 256, "payload_bytes_max": 0}, 0),  # no payload stored
    ({"max_payload_bytes": 256, "payload_bytes_max": 40}, 40),
    ({"max_payload_bytes": 256, "payload_bytes_max": 1000}, 256),  # never above the bound
    ({"max_payload_bytes": 256, "payload_bytes_max": True}, 256),
    ({"max_payload_bytes": 256, "payload_bytes_max": -1}, 256),
    ({"max_payload_bytes": 256, "payload_bytes_max": "3"}, 256),
    ({"max_payload_bytes": 256, "payload_bytes_max": 70_000}, 256),
    ({"payload_bytes_max": 0}, None),  # no valid bound: nothing known
    ({"max_payload_bytes": -5, "payload_bytes_max": 0}, None),
])
def test_the_plan_counts_the_smaller_of_bound_and_mark(doc, want):
    for wire in ("msgpack", "json"):
        d = _Docs(doc, wire)
        assert d._payload_plan("c") == want
        assert d._payload_wire_bytes("c") == (0 if want is None else payload_wire_bytes(want, wire))


def test_a_collection_without_payloads_plans_every_item():
    """1,000 digits at 50 kB: every candidate with no payload counted, 79 with the default bound's."""
    kw = dict(n_items=1000, levels=[8, 16, 32, 64, 128], widths=[8, 16, 32], max_bytes=50_000)
    none = plan(4.0, payload_bytes=_Docs({"max_payload_bytes": 256, "payload_bytes_max": 0})._payload_wire_bytes("c"),
                **kw)
    bound = plan(4.0, payload_bytes=_Docs({"max_payload_bytes": 256})._payload_wire_bytes("c"), **kw)
    print(f"\n1,000 items at 50 kB: {none.candidates} candidates without payloads, {bound.candidates} with the "
          "default bound counted")
    assert none.candidates == 1000 and bound.candidates < 200
