"""The one table of releases (pm_vector/protocol/releases.py, issue #37): every release that exists
is in it, its hooks load, the lookups agree, the default is picked by one rule, and the partial
tables that were elsewhere are views of it."""

from __future__ import annotations

import math

import pytest

from pm_vector.errors import InvalidInputError
from pm_vector.protocol import formats, releases


def test_every_release_and_format_is_in_the_table():
    assert list(releases.RELEASES) == ["location", "cells", "gaussian", "privatemail", "privatemail-release"]
    fmts = {getattr(formats, n) for n in dir(formats) if n.endswith("_FORMAT")}
    assert {r.wire_format for r in releases.RELEASES.values()} == fmts


@pytest.mark.parametrize("name", ["location", "cells", "gaussian", "privatemail", "privatemail-release"])
def test_each_release_is_found_by_name_format_and_request_and_its_hooks_load(name):
    rel = releases.by_name(name)
    assert releases.by_format(rel.wire_format) is rel
    assert releases.by_request({"format": rel.wire_format}) is rel
    for hook in (rel.resolver, rel.service_check, rel.wire_model, rel.check_request, rel.explain, rel.client_plan):
        if hook is not None:
            assert callable(releases.load(hook)), hook
    assert rel.answers and set(rel.answers) <= {"compact", "full", "features"}


def test_unknown_names_and_formats():
    with pytest.raises(InvalidInputError, match="release must be one of"):
        releases.by_name("nope")
    assert releases.by_format("nope/1") is None and releases.by_format(["unhashable"]) is None
    assert releases.by_request(object()) is None


def test_the_default_rule_is_one_function_of_eps_and_what_is_served():
    d = releases.default_release
    assert d(1.0).name == "location" and d(511.0).name == "location"
    assert d(releases.GAUSSIAN_ABOVE).name == "gaussian" and d(math.inf).name == "gaussian"
    assert d(4.0, class_rows=True).name == "cells"  # a class-rows option: among those only
    assert d(4.0, served={"cells", "gaussian"}).name == "cells"  # a run without the location release
    assert d(4.0, served={"gaussian"}).name == "gaussian"
    for bad in (0, -1.0, float("nan"), "x"):
        with pytest.raises(InvalidInputError):
            d(bad)


def test_the_old_eps_rule_agrees_with_the_table():
    from pm_vector.privacy.cell_release import release_for_epsilon

    for e in (0.5, 4.0, 64.0, 511.9, 512.0, 1e4, math.inf):
        assert release_for_epsilon(e) == releases.default_release(e, class_rows=True).name


def test_each_release_states_its_charge():
    loc = releases.by_name("location").guarantee
    assert loc.pure and loc.charge({"epsilon": 2.0, "delta": 0.5}) == (2.0, 0.0)  # pure eps whatever it says
    g = releases.by_name("gaussian").guarantee
    assert not g.pure and g.charge({"epsilon": 2.0, "delta": 1e-6}) == (2.0, 1e-6)
    from pm_vector.client.privatemail import paper_charge

    p = releases.by_name("privatemail").guarantee.charge({"epsilon": 1.0, "delta": 1e-5, "mechanism": "analytic"})
    assert p == paper_charge(1.0, 1e-5, "analytic") and p[0] > 1.0  # the paper's conversion, not its nominal eps


def test_the_partial_tables_are_views_of_the_table():
    from pm_vector.manifold.codes import CODE_PREFIX_RULES, compact_answer_shape
    from pm_vector.protocol.requests import RELEASE_TYPES, REQUEST_CLASSES, REQUEST_TYPES

    assert dict(REQUEST_TYPES) == {r.wire_format: r.request_type for r in releases.RELEASES.values()}
    assert dict(RELEASE_TYPES) == {n: r.request_type for n, r in releases.RELEASES.items()}
    assert CODE_PREFIX_RULES == {n: r.code_prefix for n, r in releases.RELEASES.items() if r.code_prefix}
    for name in CODE_PREFIX_RULES:  # by name or by the table's release: the same shape
        assert compact_answer_shape(10, name, 4.0, (32, 64)) == compact_answer_shape(10, releases.by_name(name), 4.0,
                                                                                      (32, 64))
    with pytest.raises(InvalidInputError):
        compact_answer_shape(10, "location", 4.0, (32, 64))
    # a request object of a release, not its document (parse_request parses a document)
    assert not isinstance({"format": "x"}, REQUEST_CLASSES)
    assert not isinstance({"format": releases.by_name("cells").wire_format}, REQUEST_CLASSES)


def test_register_refuses_a_taken_name_format_or_type_and_unregisters():
    cells = releases.by_name("cells")
    with pytest.raises(InvalidInputError, match="already registered"):
        releases.register(cells)

    class Req:
        @classmethod
        def from_dict(cls, d):
            return cls()

    new = releases.Release(name="t", wire_format="t/1", request_type=Req, answer_type=None, check_answer=None,
                           guarantee=releases.Guarantee("eps", 0.0), client_plan=None, resolver=lambda *a, **k: {})
    releases.register(new)
    try:
        from pm_vector.protocol.requests import REQUEST_CLASSES, REQUEST_TYPES

        assert REQUEST_TYPES["t/1"] is Req and isinstance(Req(), REQUEST_CLASSES)
        assert releases.default_release(1.0).name == "location"  # no default_for: never a default
        with pytest.raises(InvalidInputError):
            releases.register(new)
    finally:
        releases.unregister("t")
    assert releases.by_format("t/1") is None and "t" not in releases.RELEASES


def test_describe_names_the_release_and_its_shape():
    assert releases.describe({"release": "cells", "n_cells": 64}) == "cells K=64"
    assert releases.describe({"release": "location", "level": 256, "candidates": 40, "code_bytes": 16}) == \
        "location M=256, 40x16 B"
    assert releases.describe({"release": "cells"}) == "cells"  # a field missing: the name
    assert releases.describe({"release": "gaussian"}) == "gaussian"
