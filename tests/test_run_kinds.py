"""Issue #37, build item 1: the run tables a run has follow from the releases it serves. The
releases name kinds of run tables (``Release.derived_tables``); the one registry of kinds
(:data:`pm_vector.db.runs.kinds.KINDS`) says how an erased item leaves each, where a sharded run
keeps it, its shard DDL and foreign-table columns, and whether the query role reads it. No second
list of kinds: the erasure, the grants, a sharded run's foreign tables and the shards' DDL, drop
and ANALYZE lists read the registry, and every kind a release names is known to it (and the other
way round)."""

from __future__ import annotations

import pytest
from psycopg import sql

from pm_vector.db.runs import erase, kinds, sharding
from pm_vector.protocol import releases

READY = {"status": "ready"}


def test_every_kind_a_release_names_is_registered_and_the_other_way_round():
    named = {k for rel in releases.RELEASES.values() for k in rel.derived_tables}
    assert named == set(kinds.KINDS)
    # the erasure and the grants know every named kind: an item table has its erasure, an answer
    # table is granted (every kind a built-in release names is read by its answer)
    assert kinds.answer_tables() == frozenset(named)
    assert {k for k, t in kinds.KINDS.items() if t.erase is None} == {"anchors"}
    for rt in kinds.KINDS.values():
        assert rt.where in ("coordinator", "shards", "both")
        assert (rt.shard_columns is not None) == (rt.where != "coordinator"), rt.kind
        if rt.erase is not None:  # a built-in kind names a function of the erasure
            assert callable(erase.eraser(rt)), rt.kind
    # the sharded class-rows write creates the class rows' tables and the fill list; the cells'
    # shard table comes from pm_cells_table_ddl
    assert kinds.written_on_shards() == ["items", "prior", "neighbors", "hubs"]


@pytest.mark.parametrize("doc, kinds_", [
    (None, ["anchors", "items"]),
    ({"status": "unavailable"}, ["anchors", "items"]),
    (READY, ["anchors", "items", "codes", "prior", "neighbors", "hubs"]),
    ({**READY, "cells": READY}, ["anchors", "items", "codes", "prior", "neighbors", "hubs", "cells"]),
    ({**READY, "locations": READY, "cells": {"status": "unavailable"}},
     ["anchors", "items", "codes", "prior", "neighbors", "hubs", "locations"]),
])
def test_a_run_has_the_tables_of_the_releases_it_serves(doc, kinds_):
    assert kinds.run_kinds(doc) == kinds_
    assert [t.kind for t in erase.run_tables(doc)] == [k for k in kinds_ if k != "anchors"]
    served = {r.name for r in releases.RELEASES.values() if r.served_by(doc)}
    assert set(kinds_) == {k for r in served for k in releases.by_name(r).derived_tables}


def test_a_release_naming_an_unknown_kind_is_refused_and_a_registered_one_is_erased():
    rel = releases.register(releases.Release(
        name="test-kinds", wire_format="tests.kinds/1", request_type=type("KindsRequest", (), {}),
        answer_type=None, check_answer=None, guarantee=releases.Guarantee("eps", 0.0), client_plan=None,
        resolver=lambda *a, **k: {}, derived_tables=("hubs", "test_marks")))
    try:
        with pytest.raises(ValueError, match="test_marks"):
            kinds.run_kinds(READY)
        kinds.register_kind(kinds.RunTable("test_marks", "coordinator", lambda conn, place, plan: None, answer=True))
        try:
            assert kinds.run_kinds(READY)[-1] == "test_marks"
            assert "test_marks" in {t.kind for t in erase.run_tables(READY)} and "test_marks" in kinds.answer_tables()
            assert "test_marks" not in kinds.run_kinds({"status": "unavailable"})  # not served: not there
            with pytest.raises(ValueError, match="already registered"):
                kinds.register_kind(kinds.RunTable("test_marks", "coordinator", None))
        finally:
            kinds.unregister_kind("test_marks")
    finally:
        releases.unregister(rel.name)
    assert "test_marks" not in kinds.answer_tables()


def _text(parts) -> str:
    return " ; ".join(p.as_string(None) for p in parts)


def test_a_test_kind_on_shards_reaches_the_shards_tables():
    """A kind registered here with a shard DDL is created on every shard of a sharded run (its
    foreign table, dropped after the write and ANALYZEd with the others: the same list), with no
    change under ``pm_vector/``; unregistered, it is not."""
    before = _text(sharding.shard_ddl(7, 4, [10, 11, 12], [0, 2]))
    assert '"run_7_test_shardmarks"' not in before
    # the built-in kinds: the prior partitioned by the shard's classes, the fill list, the graph
    assert 'CREATE TABLE "pm_vector"."run_7_prior_2" PARTITION OF "pm_vector"."run_7_prior" FOR VALUES IN (12)' in before
    assert "vector(4)" in before and '"run_7_items" (item_id bigint PRIMARY KEY)' in before
    kinds.register_kind(kinds.RunTable("test_shardmarks", "shards", None, shard_columns="item_id bigint, w vector({d})",
                                       shard_ddl="(item_id bigint NOT NULL, w vector({d}))"))
    try:
        ddl = _text(sharding.shard_ddl(7, 4, [10, 11, 12], [0, 2]))
        assert 'DROP TABLE IF EXISTS "pm_vector"."run_7_items", ' in ddl and '"run_7_test_shardmarks"' in ddl.split(";")[1]
        assert 'CREATE TABLE "pm_vector"."run_7_test_shardmarks" (item_id bigint NOT NULL, w vector(4))' in ddl
        assert "test_shardmarks" in kinds.written_on_shards()
        assert kinds.shard_columns("test_shardmarks", 4).as_string(None) == "item_id bigint, w vector(4)"
    finally:
        kinds.unregister_kind("test_shardmarks")
    assert _text(sharding.shard_ddl(7, 4, [10, 11, 12], [0, 2])) == before


def test_a_kind_kept_on_shards_says_how_and_a_coordinators_does_not():
    with pytest.raises(ValueError, match="shard_columns"):
        kinds.register_kind(kinds.RunTable("test_bad", "shards", None))
    with pytest.raises(ValueError, match="shard_columns"):
        kinds.register_kind(kinds.RunTable("test_bad", "coordinator", None, shard_columns="item_id bigint"))
    with pytest.raises(ValueError, match="only for a kind kept on shards"):
        kinds.register_kind(kinds.RunTable("test_bad", "shards", None, shard_columns="a int", by_class=True))
    assert "test_bad" not in kinds.KINDS
    assert isinstance(kinds.shard_columns("cells"), sql.Composed)
