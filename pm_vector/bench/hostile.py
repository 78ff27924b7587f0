"""``pm-vector bench hostile``: does a malicious server's oversized row time the client by its
secret? (The attack of issue 25, item 2, measured again.)

In a private ``PM_VECTOR_HOME`` the benchmark starts an embedded server, a digits collection, an
API key and the real service on loopback. The client talks to it through a transport that plays
the malicious server: in every class-rows cell answer it replaces one row by ``candidates``
candidates (ids and codes of the published width), as the audit did with 300,000. Each query
runs at a large eps (``epsilon``, default 40), so that its real row is its nearest cell
(randomized response keeps the truth with probability ``1 - (M - 1) e^-eps``); the tampered row
is that cell for every other query and another cell for the rest (the malicious server that
guessed right and wrong), and the benchmark splits the queries' wall times by the two.

Before the whole-answer check, the client's time after the answer was a median 4.64 s when the
row was real against 0.84 s otherwise. Now the answer is checked (and, over the byte cap its
published shape gives, refused) before the secret picks a row: the two medians should agree.
Reported: per group the number of queries, the median and the quartiles of the wall time, the
errors (one type and text for every query), and the ratio of the medians.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import httpx
import numpy as np

from .. import db
from ..client.budget import MemoryBudget
from ..client.http import Client
from ..datasets import load_dataset, split_dataset
from ..db import postgres
from ..db.runs.jobs import anchor_frame_embed_fn
from ..errors import PMVectorError
from ..service.auth import create_key
from ..service.runner import ServiceThread
from ..service.settings import ServiceSettings
from ._home import private_home
from .demo import prepare_collection


@dataclass
class HostileConfig:
    #: queries sent (each its own release)
    queries: int = 60
    #: candidates the malicious server puts in the tampered row
    candidates: int = 300_000
    #: the tampered row when it is not the real one (then the next row if it is)
    row: int = 3
    #: the release's eps (large: the real row is the nearest cell)
    epsilon: float = 40.0

    def __post_init__(self):
        if not (4 <= self.queries <= 2000 and 1 <= self.candidates <= 2_000_000 and 0 <= self.row < 64
                and 8 <= self.epsilon <= 200):
            raise ValueError("hostile bench: queries in 4..2000, candidates in 1..2000000, row in 0..63, "
                             "epsilon in [8, 200].")


def _tampering_transport(cfg: HostileConfig):
    """An httpx transport to the real service that rewrites row ``cfg.row`` of every resolve answer
    (JSON) into ``cfg.candidates`` candidates; the answer's bytes are made once per shape."""
    class Tamper(httpx.BaseTransport):
        def __init__(self):
            self._inner = httpx.HTTPTransport()
            self.tampered = 0
            self.row = cfg.row  # the row the next answer has tampered

        def handle_request(self, request):
            r = self._inner.handle_request(request)
            if request.method != "POST" or not request.url.path.endswith("/resolve"):
                return r
            r.read()
            doc = json.loads(r.content)
            rows = doc.get("rows") if isinstance(doc, dict) else None
            if r.status_code == 200 and isinstance(rows, list) and len(rows) > self.row:
                row = rows[self.row]
                width = len(row["codes"][0]) if row.get("codes") else 32
                row["item_ids"] = list(range(10_000_000, 10_000_000 + cfg.candidates))
                row["codes"] = [[7] * width] * cfg.candidates
                self.tampered += 1
            headers = [(k, v) for k, v in r.headers.items() if k.lower() not in ("content-length", "content-encoding")]
            body = json.dumps(doc).encode()
            headers.append(("content-length", str(len(body))))
            return httpx.Response(r.status_code, headers=headers, stream=httpx.ByteStream(body), request=request)

        def close(self):
            self._inner.close()

    return Tamper()


def _summary(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    q = np.percentile(xs, [25, 50, 75])
    return {"n": len(xs), "median_s": round(float(q[1]), 4), "q1_s": round(float(q[0]), 4),
            "q3_s": round(float(q[2]), 4), "max_s": round(max(xs), 4)}


def run(cfg: HostileConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    say = progress or (lambda s: None)
    with private_home("pm_bench_hostile_", stop=postgres.stop):
        say("starting a private embedded server and a digits collection")
        postgres.start()
        split = split_dataset(load_dataset("digits"), 800, 300, 150, 200, seed=0)
        prepare_collection("hostile", split)
        db.run_embedding_job("hostile", {"n_components": 8}, 0, embed_fn=anchor_frame_embed_fn)
        key = create_key("hostile bench")["key"]
        Xq = split.query[0]
        times: dict[str, list[float]] = {"real": [], "other": []}
        errors: dict[str, int] = {}
        with ServiceThread(ServiceSettings(pool_max=2, request_log_retention_days=0)) as svc:
            transport = _tampering_transport(cfg)
            with Client(svc.url, key, budget=MemoryBudget(default_epsilon=1e9), wire="json",
                        transport=transport) as c:
                cells = c.private_cells("hostile", epsilon=cfg.epsilon)
                for i in range(cfg.queries):
                    x = Xq[i % len(Xq)]
                    truth = int(cells.nearest_cell(x / np.linalg.norm(x))[0])
                    real = i % 2 == 0
                    transport.row = truth if real else (cfg.row if cfg.row != truth else cfg.row + 1)
                    t0 = time.perf_counter()
                    try:
                        c.query("hostile", x, None, epsilon=cfg.epsilon, release="cells")
                        outcome = "answered"
                    except PMVectorError as e:  # the text without its figures: one refusal or several
                        outcome = re.sub(r"\d[\d,]*", "N", f"{type(e).__name__}: {e}")
                    times["real" if real else "other"].append(time.perf_counter() - t0)
                    errors[outcome] = errors.get(outcome, 0) + 1
                    if (i + 1) % 10 == 0:
                        say(f"{i + 1}/{cfg.queries} queries")
        real, other = _summary(times["real"]), _summary(times["other"])
        ratio = (round(real["median_s"] / other["median_s"], 3)
                 if real["n"] and other["n"] and other["median_s"] > 0 else None)
        return {"config": asdict(cfg), "tampered_answers": transport.tampered, "real_row": real,
                "other_rows": other, "median_ratio": ratio, "outcomes": errors,
                "audit_before": {"real_row_median_s": 4.64, "other_rows_median_s": 0.84},
                "all_s_median": round(statistics.median(times["real"] + times["other"]), 4)}
