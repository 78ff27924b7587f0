"""Issue #37, build item 1: the run tables a run has follow from the releases it serves. The
releases name kinds of run tables (``Release.derived_tables``); the one registry of kinds
(:data:`pm_vector.db.runs.erase.KINDS`) says how an erased item leaves each, where a sharded run
keeps it and whether the query role reads it. No second list of kinds: the erasure, the grants and
a sharded run's foreign tables read the registry, and every kind a release names is known to it
(and the other way round)."""

from __future__ import annotations

import pytest

from pm_vector.db.runs import erase
from pm_vector.protocol import releases

READY = {"status": "ready"}


def test_every_kind_a_release_names_is_registered_and_the_other_way_round():
    named = {k for rel in releases.RELEASES.values() for k in rel.derived_tables}
    assert named == set(erase.KINDS)
    # the erasure and the grants know every named kind: an item table has its erasure, an answer
    # table is granted (every kind a built-in release names is read by its answer)
    assert erase.answer_tables() == frozenset(named)
    assert {k for k, t in erase.KINDS.items() if t.erase is None} == {"anchors"}
    for rt in erase.KINDS.values():
        assert rt.where in ("coordinator", "shards", "both")
        assert (rt.shard_columns is not None) == (rt.where != "coordinator"), rt.kind


@pytest.mark.parametrize("doc, kinds", [
    (None, ["anchors", "items"]),
    ({"status": "unavailable"}, ["anchors", "items"]),
    (READY, ["anchors", "items", "codes", "prior", "neighbors", "hubs"]),
    ({**READY, "cells": READY}, ["anchors", "items", "codes", "prior", "neighbors", "hubs", "cells"]),
    ({**READY, "locations": READY, "cells": {"status": "unavailable"}},
     ["anchors", "items", "codes", "prior", "neighbors", "hubs", "locations"]),
])
def test_a_run_has_the_tables_of_the_releases_it_serves(doc, kinds):
    assert erase.run_kinds(doc) == kinds
    assert [t.kind for t in erase.run_tables(doc)] == [k for k in kinds if k != "anchors"]
    served = {r.name for r in releases.RELEASES.values() if r.served_by(doc)}
    assert set(kinds) == {k for r in served for k in releases.by_name(r).derived_tables}


def test_a_release_naming_an_unknown_kind_is_refused_and_a_registered_one_is_erased():
    rel = releases.register(releases.Release(
        name="test-kinds", wire_format="tests.kinds/1", request_type=type("KindsRequest", (), {}),
        answer_type=None, check_answer=None, guarantee=releases.Guarantee("eps", 0.0), client_plan=None,
        resolver=lambda *a, **k: {}, derived_tables=("hubs", "test_marks")))
    try:
        with pytest.raises(ValueError, match="test_marks"):
            erase.run_kinds(READY)
        erase.register_kind(erase.RunTable("test_marks", "coordinator", lambda conn, place, plan: None, answer=True))
        try:
            assert erase.run_kinds(READY)[-1] == "test_marks"
            assert "test_marks" in {t.kind for t in erase.run_tables(READY)} and "test_marks" in erase.answer_tables()
            assert "test_marks" not in erase.run_kinds({"status": "unavailable"})  # not served: not there
            with pytest.raises(ValueError, match="already registered"):
                erase.register_kind(erase.RunTable("test_marks", "coordinator", None))
        finally:
            erase.unregister_kind("test_marks")
    finally:
        releases.unregister(rel.name)
    assert "test_marks" not in erase.answer_tables()
