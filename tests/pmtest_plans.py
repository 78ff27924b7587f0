"""Reading EXPLAIN output in tests without depending on the planner's choice between equivalent
index paths (statistics differ from run to run: a small table may be read by a bitmap scan)."""

import re


def reads_by_index(plan: str, index: str) -> bool:
    """True when the plan reads through `index` by key: an Index Scan, an Index Only Scan or a Bitmap
    Index Scan (each is a key lookup; only a sequential scan of the table is not)."""
    pat = rf"(Index Scan using|Index Only Scan using|Bitmap Index Scan on) {re.escape(index)}\b"
    return re.search(pat, plan) is not None
