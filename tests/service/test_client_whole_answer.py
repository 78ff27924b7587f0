"""The client checks the WHOLE answer of a class-rows request before its secret picks a row
(issue: only the real row was checked, so a row malformed by the server raised exactly when it was
the real one, and a huge row slowed the client exactly when it was real). Through a tampering proxy
in front of the real service: whatever the real row, the same refusal."""

from __future__ import annotations

import numpy as np
import pytest
from pmtest_hostile import TamperProxy

from pm_vector.client.budget import MemoryBudget
from pm_vector.client.http import Client
from pm_vector.errors import PMVectorError


@pytest.mark.parametrize("tamper", ["bad codes in row 3", "row 3 too long", "rows cut after row 3",
                                    "duplicate ids in row 3"])
def test_one_bad_row_is_refused_whatever_the_real_row(service, svc_collection, svc_key, svc_split, tamper):
    def change(method, path, doc):
        if path.endswith("/resolve") and isinstance(doc.get("rows"), list):
            rows = doc["rows"]
            r = rows[3]
            if tamper == "bad codes in row 3":
                r["codes"] = r["codes"][:-1]
            elif tamper == "row 3 too long":
                r["item_ids"] = list(range(10_000, 10_000 + 3000))
                r["codes"] = [[0] * len(r["codes"][0])] * 3000
            elif tamper == "rows cut after row 3":
                doc["rows"] = rows[:4]
            else:
                r["item_ids"] = [r["item_ids"][0]] * len(r["item_ids"])
        return doc

    Xq, yq = svc_split.query
    rows_seen, errors = set(), []
    with TamperProxy(service.url, change) as p, \
            Client(p.url, svc_key["key"], budget=MemoryBudget(default_epsilon=1000.0), wire="json") as c:
        for i in range(12):
            with pytest.raises(PMVectorError) as e:
                c.query(svc_collection, Xq[i], None, epsilon=4.0, release="cells")
            errors.append(type(e.value).__name__ + ":" + str(e.value))
            cells = c.private_cells(svc_collection, epsilon=4.0)
            rows_seen.add(cells.nearest_cell(Xq[i] / np.linalg.norm(Xq[i]))[0])
    assert len(rows_seen) > 1  # several real rows, among them rows other than 3
    assert len(set(errors)) == 1, set(errors)  # one refusal, the same text, whatever the real row


def test_bench_hostile_refuses_every_tampered_answer_alike():
    """``pm-vector bench hostile`` (the timing attack of a row the malicious server makes huge):
    every answer tampered, half in the real row, one refusal text for all."""
    import json

    from typer.testing import CliRunner

    from pm_vector.cli import app

    r = CliRunner().invoke(app, ["bench", "hostile", "--queries", "4", "--candidates", "3000", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output.strip().splitlines()[-1])
    assert out["tampered_answers"] == 4 and out["real_row"]["n"] == 2 and out["other_rows"]["n"] == 2
    assert list(out["outcomes"].values()) == [4] and out["outcomes"] != {"answered": 4}
    assert out["median_ratio"] > 0
