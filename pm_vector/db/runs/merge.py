"""The bulk merge of a run's delta (:mod:`pm_vector.db.runs.delta`): ``pm_vector.db.merge(name)``,
``pm-vector merge NAME``, and the service's sync worker when it is due (:func:`due`).

Everything a change does not need for a correct answer -- the neighbour graph, hub counts, prior rows,
the cell and location rows' counts, refills, and the deleted items' rows in every derived table --
is done here, in bulk, beside the serving run: a merge is **a new run of the active run's
parameters on the current items** (:func:`pm_vector.db.runs.jobs.run_embedding_job`: built beside
the active run, which keeps serving, and switched to in one transaction). In that switch transaction
the changes made during the build are re-applied onto the new run: items deleted since its load
get tombstones in it, items ingested since are placed in its delta. Most of them before the switch,
outside the collection's lock (:func:`catch_up_run`, the job's ``before_switch``: passes until few are
left); the last few in the switch transaction (tombstones: the job's switch,
:func:`~pm_vector.db.runs.delta.tombstone_deleted`; new items:
:func:`~pm_vector.db.runs.new_items.embed_new_items`, ``on_switch``). Answers and writes never wait on
the build; the switch holds the collection row as a delete does, for those last few changes only.
(It once erased every item deleted during the build in the switch, lists refilled: 12,002 erasures
held it, and the sync's writes, for 166 s at 100,000 items.) An item deleted during a merge's build
is thus tombstoned in the new run; its derived rows there leave with the next merge. What the new
run would compute again the same for an unchanged item it takes from the active run: the public
documents (:mod:`pm_vector.db.runs.published`) and the items' product codes
(:mod:`pm_vector.db.runs.carry`).

Then the superseded runs that hold tombstones are dropped (their tables, their delta rows): their
rows hold deleted items, which could only be purged from them with the deleted items' raw
features, gone at the delete's commit. So after a merge no derived table holds a deleted item (a
merge keeps no previous run that holds one: ``keep_previous_runs`` keeps those without).

A sharded run merges the same way: the new run's job places its prior, graph, hubs and cells on the
shards (:mod:`pm_vector.db.runs.sharding`, through the coordinator's foreign tables), the switch is
one transaction on the coordinator, and dropping a superseded run drops its tables on every shard
(``pm_vector.pm_drop_run_tables``; a shard it cannot reach keeps them, named in a WARNING, until
``pm-vector db cleanup``), so a deleted item leaves the shards' tables with the merge too.

When: :data:`pm_vector.defaults.MERGE_DELTA_ITEMS` delta rows or :data:`pm_vector.defaults.MERGE_AGE_S`
seconds for the oldest, or a collection's ``settings["merge"]``; and not before the active run has
served :data:`pm_vector.defaults.MERGE_PAUSE` times its build's time (:func:`due`).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from ...errors import InvalidInputError
from ..errors import NoActiveRunError
from ..postgres import connect
from ..core.collection import collection_row
from ..run_tables import drop_superseded_run
from ... import defaults
from .jobs import anchor_frame_embed_fn, anchor_frame_extend_fn, run_embedding_job
from .delta import copy_placed, tombstone_deleted
from .new_items import embed_new_items


def merge(collection: str, *, embed_fn=None, embed_fn_extend=None, progress=None, url: str | None = None
          ) -> dict[str, Any]:
    """Merge the active run's delta (module doc). ``embed_fn`` / ``embed_fn_extend``: the run's
    embedding and extension (default the AnchorFrame pair). Returns ``{"collection", "run_id" (the
    new run), "previous_run_id", "merged_tombstones", "merged_items", "dropped_runs", "catch_up" (the
    catch-up's ``(tombstoned, placed)`` per pass), "switch_s" (the switch transaction's time, the
    collection row held: the last changes applied), "switch" (in it: the new items ``copied`` and
    ``placed``, and their seconds), "seconds"}``."""
    t = time.perf_counter()
    with connect(url) as conn:
        coll = collection_row(conn, collection)
        rid = coll["active_run_id"]
        if rid is None:
            raise NoActiveRunError(f"collection {collection!r} has no active run: nothing to merge; run "
                                   f"`pm-vector embed {collection}` first.")
        params, seed, cr = conn.execute("SELECT params, seed, class_rows FROM pm_vector.embedding_runs WHERE id = %s",
                                        [rid]).fetchone()
        n_t, n_i = _sizes(conn, rid)
        conn.rollback()
    extend = embed_fn_extend or anchor_frame_extend_fn

    switch: dict[str, Any] = {}

    def reapply(c, new_run: int) -> None:  # (in the switch transaction: the new run is the active one)
        t0 = time.perf_counter()
        switch["copied"] = int(copy_placed(c, rid, new_run))  # those the serving run placed; then any it had not
        t1 = time.perf_counter()
        switch["placed"] = int(embed_new_items(collection, extend, conn=c)["n_new"])
        switch.update(copy_s=round(t1 - t0, 3), place_s=round(time.perf_counter() - t1, 3))

    passes: list = []

    def catch_up(new_run: int) -> None:
        passes.extend(catch_up_run(collection, new_run, extend, url=url, serving=rid))

    info = run_embedding_job(collection, dict(params or {}), int(seed), progress, embed_fn=embed_fn or anchor_frame_embed_fn,
                             class_rows=_class_rows_params(cr), on_switch=reapply, before_switch=catch_up)
    dropped = purge_superseded(collection, url=url)
    return {"collection": collection, "run_id": int(info["run_id"]), "previous_run_id": info.get("previous_run_id"),
            "merged_tombstones": n_t, "merged_items": n_i, "dropped_runs": dropped, "catch_up": passes,
            "switch_s": (info.get("timings") or {}).get("switch_s"), "switch": switch,
            "seconds": round(time.perf_counter() - t, 3)}


#: the catch-up's passes at most, and the changes left below which it stops (the switch applies those)
CATCH_UP_PASSES = 6
CATCH_UP_LEFT = 200


def catch_up_run(collection: str, run_id: int, extend, *, url: str | None = None,
                 serving: int | None = None) -> list[tuple[int, int]]:
    """Before a merge's switch, outside the collection's lock: the changes made while the new run was
    built applied to it -- tombstones for the items deleted since its load
    (:func:`pm_vector.db.runs.delta.tombstone_deleted`) and the items ingested since: those the serving
    run ``serving`` placed in its delta copied as they are (:func:`pm_vector.db.runs.delta.copy_placed`:
    the same embedding, codes and location entries, the runs embedding and publishing alike), any
    other placed in its delta (:func:`~pm_vector.db.runs.new_items.embed_new_items` ``into_run``) --
    in passes, each taking what came in during the one before, until a pass finds fewer than
    :data:`CATCH_UP_LEFT` (or after :data:`CATCH_UP_PASSES`). Writes go on meanwhile; the switch,
    holding the row as a delete does, applies the last ones the same way. Returns ``(tombstoned,
    placed)`` per pass."""
    passes = []
    for _ in range(CATCH_UP_PASSES):
        with connect(url) as conn:
            gone = tombstone_deleted(conn, run_id)
            placed = copy_placed(conn, serving, run_id) if serving is not None else 0
            conn.commit()
        placed += int(embed_new_items(collection, extend, into_run=run_id)["n_new"])
        passes.append((int(gone), placed))
        if gone + placed < CATCH_UP_LEFT:
            break
    return passes


def _class_rows_params(doc) -> dict[str, Any] | None:
    """The class-rows parameters the run was built with (those its document records)."""
    doc = doc or {}
    keep = ("n_components", "clip_quantile", "graph_degree", "max_prior", "min_weight")
    got = {k: doc[k] for k in keep if k in doc}
    return got or None


def _sizes(conn, run_id: int) -> tuple[int, int]:
    n_t = conn.execute("SELECT count(*) FROM pm_vector.delta_tombstones WHERE run_id = %s", [run_id]).fetchone()[0]
    n_i = conn.execute("SELECT count(DISTINCT item_id) FROM pm_vector.delta_entries WHERE run_id = %s",
                       [run_id]).fetchone()[0]
    return int(n_t), int(n_i)


def purge_superseded(collection: str, *, url: str | None = None) -> list[int]:
    """Drop the collection's runs other than the active one that hold tombstones (their tables and
    delta rows; module doc). Returns their ids."""
    out = []
    with connect(url) as conn:
        coll = collection_row(conn, collection)
        rows = conn.execute("SELECT DISTINCT t.run_id FROM pm_vector.delta_tombstones t JOIN pm_vector.embedding_runs r "
                            "ON r.id = t.run_id WHERE r.collection_id = %s AND t.run_id IS DISTINCT FROM %s ORDER BY 1",
                            [coll["id"], coll["active_run_id"]]).fetchall()
        for (rid,) in rows:
            drop_superseded_run(conn, coll["id"], rid)
            conn.execute("DELETE FROM pm_vector.delta_tombstones WHERE run_id = %s", [rid])
            conn.execute("DELETE FROM pm_vector.delta_entries WHERE run_id = %s", [rid])
            conn.commit()
            out.append(int(rid))
    return out


#: the keys of a collection's merge rule (``settings["merge"]``), each with its default and bounds
RULE = {"delta_items": (defaults.MERGE_DELTA_ITEMS, 0, 10**9),
        "age_s": (float(defaults.MERGE_AGE_S), 0.0, 30 * 86_400.0),
        "pause": (float(defaults.MERGE_PAUSE), 0.0, 1_000.0)}


def _rule_value(key: str, value):
    """``value`` as the rule's ``key``, or InvalidInputError: a whole number of delta items, finite
    seconds and pause, each within :data:`RULE`'s bounds (booleans and strings refused)."""
    _, lo, hi = RULE[key]
    whole = key == "delta_items"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not float(value).is_integer()) \
            or not math.isfinite(float(value)) or not lo <= value <= hi:
        kind = "a whole number" if whole else "a finite number"
        zero = "no pause" if key == "pause" else "never by this rule"
        raise InvalidInputError(f"merge rule {key!r} must be {kind} in [{lo:g}, {hi:g}] (0: {zero}), got {value!r}.")
    return int(value) if whole else float(value)


def _own(settings: dict | None) -> dict[str, Any]:
    """The valid values a collection's ``settings["merge"]`` sets (:func:`_rule_value`); any other is left out."""
    stored = (settings or {}).get("merge")
    out = {}
    for key, value in (stored.items() if isinstance(stored, dict) else ()):
        if key in RULE:
            try:
                out[key] = _rule_value(key, value)
            except InvalidInputError:
                pass
    return out


def rule_of(settings: dict | None) -> dict[str, Any]:
    """The merge rule in force for a collection's ``settings``: each key its ``settings["merge"]``
    value when that is a valid one (:func:`_own`), else the default of :data:`RULE`."""
    return {**{k: d for k, (d, _, _) in RULE.items()}, **_own(settings)}


def merge_rule(collection: str, *, delta_items: int | None = None, age_s: float | None = None,
               pause: float | None = None, reset: bool = False, url: str | None = None) -> dict[str, Any]:
    """Read, and change when given, when a collection's delta is merged (an admin's action): after
    ``delta_items`` delta items or when the oldest is ``age_s`` seconds old (0: never by that rule),
    and not before the active run has served ``pause`` times as long as its build took (0: no
    pause). ``reset`` first clears the collection's own values (the defaults apply again). Every
    value is checked before anything is written; a change is one statement on the collection's row,
    which only a change locks (a read does not wait on a sync batch). Returns ``{"collection", "rule"
    (in force), "own" (the keys the collection sets), "defaults", "pause_ends_at" (when the active
    run's pause ends, None without a run)}``.

    A longer pause keeps more of a fast stream's writes (docs/operations.md, "The merge"): the delta
    grows meanwhile, and a deleted item's derived rows wait up to ``1 + pause`` merges' builds."""
    given = {k: _rule_value(k, v) for k, v in (("delta_items", delta_items), ("age_s", age_s), ("pause", pause))
             if v is not None}
    change = bool(given) or reset
    with connect(url) as conn:
        coll = collection_row(conn, collection, lock="FOR NO KEY UPDATE" if change else "")
        own = {**({} if reset else _own(coll["settings"])), **given}
        if change:
            conn.execute("UPDATE pm_vector.collections SET settings = jsonb_set(coalesce(settings, '{}'::jsonb), "
                         "'{merge}', %s::jsonb), updated_at = now() WHERE id = %s", [json.dumps(own), coll["id"]])
        rule = rule_of({"merge": own})
        row = conn.execute("SELECT r.finished_at + %s * (r.finished_at - r.started_at) FROM pm_vector.embedding_runs r "
                           "WHERE r.id = %s", [rule["pause"], coll["active_run_id"]]).fetchone()
        conn.commit()
    return {"collection": collection, "rule": rule, "own": own,
            "defaults": {k: d for k, (d, _, _) in RULE.items()},
            "pause_ends_at": None if row is None or row[0] is None else row[0].isoformat()}


def due(conn, collection: str, settings: dict | None = None) -> bool:
    """Is a merge of the collection's active run due (module doc)? Its delta counted in items: the
    tombstones and the new items (not their entries, one per published level: 10 at 100,000 items);
    never while the active run has served less than ``pause`` times the time its build took (the
    run's ``finished_at - started_at``: a merge's or a job's). The rule: :func:`rule_of`."""
    rule = rule_of(settings)
    n_max, age_max, pause = rule["delta_items"], rule["age_s"], rule["pause"]
    if pause > 0:
        young = conn.execute(
            "SELECT clock_timestamp() - r.finished_at < %s * (r.finished_at - r.started_at) FROM pm_vector.collections c "
            "JOIN pm_vector.embedding_runs r ON r.id = c.active_run_id WHERE c.name = %s", [pause, collection]).fetchone()
        if young is not None and young[0]:
            return False
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pm_vector.delta_tombstones t WHERE t.run_id = c.active_run_id) + "
        "(SELECT count(DISTINCT d.item_id) FROM pm_vector.delta_entries d WHERE d.run_id = c.active_run_id), "
        "extract(epoch FROM clock_timestamp() - least((SELECT min(t.created_at) FROM pm_vector.delta_tombstones t "
        "WHERE t.run_id = c.active_run_id), (SELECT min(d.created_at) FROM pm_vector.delta_entries d "
        "WHERE d.run_id = c.active_run_id))) FROM pm_vector.collections c WHERE c.name = %s", [collection]).fetchone()
    if row is None or not row[0]:
        return False
    return (n_max > 0 and int(row[0]) >= n_max) or (age_max > 0 and row[1] is not None and float(row[1]) >= age_max)


def due_names(conn) -> list[str]:
    """The collections whose merge is due (:func:`due`), by name, read on ``conn`` (rolled back):
    one statement for those with a delta, then the rule of each."""
    names = [(r[0], r[1]) for r in conn.execute(
        "SELECT c.name, c.settings FROM pm_vector.collections c WHERE c.active_run_id IS NOT NULL "
        "AND (EXISTS (SELECT 1 FROM pm_vector.delta_tombstones t WHERE t.run_id = c.active_run_id) "
        "OR EXISTS (SELECT 1 FROM pm_vector.delta_entries d WHERE d.run_id = c.active_run_id)) "
        "ORDER BY c.name").fetchall()]
    todo = [n for n, s in names if due(conn, n, s)]
    conn.rollback()
    return todo


def merge_due(url: str | None = None) -> dict[str, Any]:
    """Merge every collection whose merge is due (:func:`due`): ``{collection: the merge's result, or
    why it failed}``. The service's sync worker runs it in the background."""
    with connect(url) as conn:
        todo = due_names(conn)
    return merge_each(todo, url=url)


def merge_each(names, url: str | None = None) -> dict[str, Any]:
    """Merge each collection of ``names``, due or not: ``{collection: the merge's result, or why it
    failed}`` (one collection's failure does not stop the others)."""
    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = merge(name, url=url)
        except Exception as exc:  # noqa: BLE001 - said in the result
            out[name] = f"{type(exc).__name__}: {exc}"
    return out
