"""The mixed stream of ``pm-vector bench writes`` (:mod:`pm_vector.bench.writes_bench`): which changes
each system is given, in which order, and which of them a check times.

:class:`Stream` draws a third each of inserts, vector updates and deletes: fresh keys and data rows
for the new vectors; the victims of the checked updates and deletes from the initial items a check
can see change (their own cell's answer holds them, their old vector known), the other updates and
deletes from any other key, and once those ran out from the keys the stream's unchecked inserts and
updates made live before them (an updated key is still live: a stream that dropped it, and counted
live the keys of a phase only plain pgvector ran, grew the collection in long streams; docs/benchmarks.md,
"What the collection was"), so that a stream of any length keeps the
collection's size and its mix. :meth:`Stream.take_apart` draws a phase only one system runs (plain
pgvector's saturating phase) on keys of its own, so that it takes no key from the streams after it
(drawn from the shared keys, a saturating phase of 600 s deleted nearly every key of a kept
collection from pgvector's table, and the streams after it became mostly inserts). :func:`fresh` copies a stream
unstamped for each system; :func:`sample` and :func:`check_stride` spread the checked changes
evenly over it.
"""

from __future__ import annotations

import math

from .writes_targets import Change


class Stream:
    """The changes drawn for every system (module doc): kinds at random, fresh keys and rows for the
    new vectors; the victims of updates and deletes from ``victims`` (items a check can see change)
    for the checked changes and from ``others`` (any other key; once they ran out, the keys of the
    unchecked inserts and updates streamed before) for the rest. An unchecked delete has no ``row`` and no ``old_row``
    (its key's vector is not needed). A key a checked change hit is never changed again (its check
    reads the key's item); one an unchecked insert or update made live may be, after it."""

    def __init__(self, items: int, n_rows: int, victims: list[int], rng, next_key: int | None = None,
                 others: list[int] = ()):
        self.rng, self.victims, self.items, self.n_rows = rng, list(victims), int(items), int(n_rows)
        self.others = list(others)
        self.streamed: list[int] = []  # the keys of the unchecked inserts streamed so far, not changed since
        self.next_key = int(next_key or items + 1)
        self.made = self.next_key - items - 1  # (a reused collection: the rows after those its keys took)

    def _row(self) -> int:
        """The next new vector's row (after the items'; again from the first once all were used)."""
        self.made += 1
        return self.items + (self.made - 1) % (self.n_rows - self.items)

    def take(self, n: int, most_checked: int = 0) -> list[Change]:
        """``n`` changes; at most ``most_checked`` of them marked checked, evenly spread (every one when
        fewer): an update or delete among those hits a victim a check can see, the others any other
        initial item (a victim when none is left)."""
        stride = check_stride(n, most_checked) if most_checked > 0 else 0
        out = []
        for j in range(n):
            checked = bool(stride) and j % stride == 0
            pools = (self.victims, self.others) if checked else (self.others, self.victims)
            pool = next((p for p in pools + (self.streamed,) if p), None)
            kind = ("insert", "update", "delete")[int(self.rng.integers(3))] if pool else "insert"
            if kind == "insert":
                out.append(Change("insert", self.next_key, self._row(), checked=checked))
                if not checked:  # (a later unchecked change may hit it once the other keys ran out)
                    self.streamed.append(self.next_key)
                self.next_key += 1
                continue
            key = pool.pop(int(self.rng.integers(len(pool))))
            checked = checked and pool is self.victims
            old = key - 1 if checked else None  # (the old vector: known for a victim, what a check needs)
            if kind == "update":
                out.append(Change("update", key, self._row(), old_row=old, checked=checked))
                if not checked:  # (the key is still live: a later unchecked change may hit it again)
                    self.streamed.append(key)
            else:
                out.append(Change("delete", key, old, old_row=old, checked=checked))
        return out

    def take_apart(self, n: int) -> list[Change]:
        """``n`` unchecked changes on keys of their own (module doc): :meth:`take` on a stream with no
        pool of keys yet, the same keys and rows counted on -- kinds at random, a third each, each
        update or delete on a key an insert of these ``n`` made live (an insert when there is none).
        The keys of this stream's pools are left as they were; the phase's keys are never drawn again."""
        apart = Stream(self.items, self.n_rows, [], self.rng, next_key=self.next_key)
        apart.made = self.made
        out = apart.take(n)
        self.next_key, self.made = apart.next_key, apart.made
        return out


def fresh(spec: list[Change]) -> list[Change]:
    """The same changes, unstamped (one copy per system)."""
    return [Change(c.kind, c.key, c.row, c.old_row, checked=c.checked) for c in spec]


def check_stride(n: int, most: int) -> int:
    """Every how many changes of a stream of ``n`` one is checked, for at most ``most`` checked."""
    return max(1, math.ceil(n / max(1, most)))


def sample(spec: list[Change], most: int) -> None:
    """Mark at most ``most`` changes of the stream to be checked, evenly spread (every one when fewer)."""
    stride = check_stride(len(spec), most)
    for j, c in enumerate(spec):
        c.checked = j % stride == 0
