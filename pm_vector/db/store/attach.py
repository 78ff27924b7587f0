"""A user's own table as a collection: ``attach_table``, ``sync`` and ``sync_status``.

``attach_table(name, table="public.documents", id_column="id", vector_column="embedding",
label_column=None, payload_columns=())`` (also ``pm-vector attach`` and, in SQL,
``SELECT pm_vector.pm_attach_table('docs', 'public.documents', 'id', 'embedding')``) makes
collection ``name`` from the table: its items rows keep the key (``external_id``), the label and
the payload columns (JSON), and NO features -- every reader of raw features reads the table's
vector column by key (:mod:`pm_vector.db.store._source`). The run tables (embeddings, codes, lists)
stay in pm_vector's schema. Rows whose vector is NULL or of another dimension are skipped and
counted (pgvector refuses NaN and infinite values on input, so a stored vector is finite).

Changes: statement-level triggers on the table queue every insert, update and delete in
``pm_vector.attach_changes`` (in the writer's transaction: a change is queued exactly when it
commits). :func:`sync` (``pm-vector sync NAME``; the service's worker runs :func:`sync_pending`
every ``sync_interval_s``) applies the queue in order, in batches, each ONE
transaction that also deletes the queue rows it applied: exactly once, and a sync killed at any
point leaves the old state and its queue for the next sync to resume. Per key, the batch's net
effect: a row gone or no longer valid erases its item (:mod:`pm_vector.db.store.erase`'s erasure:
every run table); a new row, or a changed vector or label, replaces the item (erase the old, insert
the new, placed in the active run as ``embed --new-items`` does); a change of other columns updates
the payload only. Skipped rows are reported with their reason. How far behind the sync is:
:func:`sync_status` (``pm-vector sync-status``, ``GET /collections/{name}/sync``, the view
``pm_vector.attach_status``): the changes queued and how long the oldest has waited.

A batch's cost: the erasure and the placement search the run's items by their features, which the
syncing process keeps between batches (:mod:`pm_vector.db.runs.item_cache`: read once from the
table, then followed batch by batch, read again when another process changed the run); the cell
and location rows both touch are read once and written once (:func:`pm_vector.db.runs.array_rows.deferred`),
and the class rows' prior lists (``nbrs``/``nhub``) both change are written once
(:func:`pm_vector.db.runs.prior_rows.deferred`).

Privileges: the role pm_vector connects as needs ``SELECT`` and ``TRIGGER`` on the table (or owns
it); the table's writers need nothing on pm_vector's schema (the capture function is ``SECURITY
DEFINER``).

SQLAlchemy: ``attach_table("docs", column=Document.embedding, label=Document.category,
payload=[Document.title])`` reads the table and columns from the mapped attributes.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from ...errors import InvalidInputError
from ..errors import CollectionNotFoundError, translate_sql_error
from ..postgres import connect
from ._common import collection_row, iso_datetime
from .capture import check_attached

#: queue rows one sync transaction applies
SYNC_BATCH = 5_000


def _column_of(attr) -> tuple[str, str]:
    """``(qualified table, column)`` of a SQLAlchemy mapped attribute or Column."""
    col = getattr(attr, "expression", attr)
    table = getattr(col, "table", None)
    if table is None or not getattr(col, "name", None):
        raise InvalidInputError(f"{attr!r} is not a mapped column (e.g. Document.embedding).")
    schema = getattr(table, "schema", None)
    return (f'"{schema}"."{table.name}"' if schema else f'"{table.name}"'), col.name


def attach_table(name: str, table: str | None = None, id_column: str | None = None,
                 vector_column: str | None = None, label_column: str | None = None,
                 payload_columns: Sequence[str] = (), *, labels: Sequence[int] | None = None, dim: int | None = None,
                 column=None, label=None, payload=(), id=None) -> dict[str, Any]:
    """Make collection ``name`` from a table of the database (module doc). Either the names
    (``table``, ``id_column``, ``vector_column``, ``label_column``, ``payload_columns``) or SQLAlchemy
    attributes (``column``, ``label``, ``payload``, ``id``: default the table's primary key).
    ``labels``: the label set (default: the distinct labels of the table; one label 0 without a
    label column). ``dim``: needed when the column is a ``vector`` without dimension (rows of another
    dimension are then skipped). Returns ``{"collection", "items", "skipped", "dim", "labels", "seconds"}``."""
    if column is not None:
        table, vector_column = _column_of(column)
        if label is not None:
            label_column = _column_of(label)[1]
        payload_columns = [_column_of(p)[1] for p in payload]
        if id is not None:
            id_column = _column_of(id)[1]
        else:
            pk = list(getattr(getattr(column, "expression", column).table, "primary_key", []))
            if len(pk) != 1:
                raise InvalidInputError("the table needs a one-column primary key, or pass id=Document.id.")
            id_column = pk[0].name
    if not (isinstance(table, str) and isinstance(id_column, str) and isinstance(vector_column, str)):
        raise InvalidInputError("give table, id_column and vector_column (or column=Document.embedding).")
    payload_columns = [str(c) for c in payload_columns]
    t = time.perf_counter()
    with connect() as conn:
        try:
            out = conn.execute("SELECT pm_vector.pm_attach_table(%s, %s::regclass, %s, %s, %s, %s::text[], %s::bigint[], %s)",
                               [name, table, id_column, vector_column, label_column, payload_columns,
                                None if labels is None else [int(v) for v in labels],
                                None if dim is None else int(dim)]).fetchone()[0]
            conn.commit()
        except Exception as exc:  # noqa: BLE001 - SQL errors become pm_vector's
            conn.rollback()
            err = translate_sql_error(exc)
            if err is exc:
                raise
            raise err from exc
    out["seconds"] = round(time.perf_counter() - t, 3)
    return out


def _not_attached(collection: str) -> InvalidInputError:
    return InvalidInputError(f"collection {collection!r} is not attached to a table (pm-vector attach).")


def sync_status(collection: str | None = None, *, url: str | None = None) -> dict[str, Any] | list[dict[str, Any]]:
    """How far behind the sync is (the view ``pm_vector.attach_status``, ``sql/0019_attach_status.sql``).

    With a name, that collection's ``{"collection", "source_table", "queued", "oldest_queued_at",
    "lag_s"}``: the changes queued and not yet applied, when the oldest of them was queued (ISO
    string) and how many seconds it has waited (float); both None when nothing is queued;
    ``broken`` and ``broken_at``: why and since when the collection is refused
    (:mod:`pm_vector.db.store.capture`), None when it is not. CollectionNotFoundError for an unknown
    collection, InvalidInputError for one that is not attached. Without a name, the list of every
    attached collection's, by name."""
    from psycopg.rows import dict_row

    with connect(url) as conn:
        if collection is not None:
            coll = collection_row(conn, collection)
            if not (coll["settings"] or {}).get("attached"):
                raise _not_attached(collection)
        with conn.cursor(row_factory=dict_row) as cur:
            if collection is None:
                rows = cur.execute("SELECT * FROM pm_vector.attach_status ORDER BY collection").fetchall()
            else:
                rows = cur.execute("SELECT * FROM pm_vector.attach_status WHERE collection = %s",
                                   [collection]).fetchall()
    out = [{"collection": r["collection"], "source_table": r["source_table"], "queued": int(r["queued"]),
            "oldest_queued_at": iso_datetime(r["oldest_queued_at"]),
            "lag_s": None if r["lag_s"] is None else float(r["lag_s"]),
            "broken": r["broken"], "broken_at": iso_datetime(r["broken_at"])} for r in rows]
    if collection is None:
        return out
    if not out:  # (dropped since the check above)
        raise CollectionNotFoundError(f"unknown collection {collection!r}; list_collections() shows the existing ones.")
    return out[0]


def sync(collection: str, *, batch: int = SYNC_BATCH, embed_fn_extend=None, max_batches: int | None = None,
         url: str | None = None) -> dict[str, Any]:
    """Apply the changes queued before the call, in order, ``batch`` at a time, each batch one
    transaction (module doc). Returns the counts and the skipped rows (``[(key, reason)]``).
    ``url``: the database (None: pm_vector's, starting the embedded server if it is the mode; the
    service's worker gives its pool's, so that it never starts a server)."""
    total = {"collection": collection, "applied": 0, "inserted": 0, "replaced": 0, "deleted": 0, "payloads": 0,
             "skipped": [], "batches": 0}
    t = time.perf_counter()
    with connect(url) as conn:  # the changes queued before this call: a sync ends under a steady stream
        coll = collection_row(conn, collection)
        if (coll["settings"] or {}).get("attached"):
            check_attached(conn, coll)  # (refused when broken, also with nothing queued)
        upto = conn.execute("SELECT max(seq) FROM pm_vector.attach_changes WHERE collection_id = %s",
                            [coll["id"]]).fetchone()[0]
    while upto is not None and (max_batches is None or total["batches"] < max_batches):
        done = _sync_batch(collection, int(batch), embed_fn_extend, int(upto), url)
        if done is None:
            break
        total["batches"] += 1
        for k in ("applied", "inserted", "replaced", "deleted", "payloads"):
            total[k] += done[k]
        total["skipped"] += done["skipped"]
    total["seconds"] = round(time.perf_counter() - t, 3)
    return total


def sync_pending(url: str | None = None) -> dict[str, Any]:
    """:func:`sync` every attached collection that has queued changes (what the service's worker
    runs every ``sync_interval_s``, with its pool's ``url``: it never starts a server). Returns
    ``{name: changes applied}``, and for a collection whose sync failed ``{name: "the error's
    type"}`` (its queue stays for the next pass). A broken collection is left out (its queue waits
    for ``pm-vector attach NAME --resync``; ``sync_status`` shows it).

    Several processes may run it at once: a batch locks its collection's row, and a batch that
    finds its changes already applied by another process applies nothing."""
    with connect(url) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT c.name FROM pm_vector.collections c WHERE EXISTS (SELECT 1 FROM pm_vector.attach_changes a "
            "WHERE a.collection_id = c.id) AND NOT (c.settings ? 'broken') ORDER BY c.name").fetchall()]
    out: dict[str, Any] = {}
    for name in names:
        try:
            out[name] = sync(name, url=url)["applied"]
        except Exception as exc:  # noqa: BLE001 - one collection's failure must not stop the others
            out[name] = type(exc).__name__
    return out


def _source_rows(conn, att: dict, keys: list) -> dict:
    """The user's table's rows of the changed keys: key -> (vector is NULL, its dimensions, label,
    payload)."""
    from ._source import quote_ident

    lab = f"s.{quote_ident(att['label_column'])}::bigint" if att.get("label_column") else "0::bigint"
    pcols = att.get("payload_columns") or []
    pay = ("jsonb_build_object(" + ", ".join(f"'{c}', s.{quote_ident(c)}" for c in pcols) + ")") if pcols else "NULL::jsonb"
    v = f"s.{quote_ident(att['vector_column'])}"
    return {r[0]: r[1:] for r in conn.execute(
        f"SELECT pm_vector.pm_attach_key(s.{quote_ident(att['id_column'])}), {v} IS NULL, CASE WHEN {v} IS NULL THEN NULL ELSE "
        f"vector_dims({v}) END, {lab}, {pay} FROM {att['table']} AS s "
        f"WHERE s.{quote_ident(att['id_column'])} = ANY(%s::{att['id_type']}[])", [keys]).fetchall()}


def _classify_changes(coll, keys: list, ops: dict, src: dict, items: dict) -> tuple:
    """Per changed key, what the batch does: the items to erase, the rows to insert, the payloads to
    update, the rows skipped and why. Returns (erase, insert, payloads, skipped)."""
    allowed = set(int(x) for x in coll["labels"])
    erase, insert, payloads, skipped = [], [], [], []
    for key in keys:
        s = src.get(key)
        reason = None
        if s is not None:
            isnull, dims, label, _p = s
            if isnull:
                reason = "vector is NULL"
            elif dims != coll["feature_dim"]:
                reason = f"vector has {dims} dimensions, the collection {coll['feature_dim']}"
            elif label is None or int(label) not in allowed:
                reason = f"label {label} is not in the collection's label set"
        if reason is not None:
            skipped.append((key, reason))
        valid = s is not None and reason is None
        item = items.get(key)
        replace = any(op in ("I", "U", "D") for op, _ in ops[key])
        if item is not None and (not valid or replace):
            erase.append(item[0])
        if valid and (item is None or replace):
            insert.append((key, int(s[2]), s[3]))
        elif valid and item is not None:
            payloads.append((s[3], item[0]))
    return erase, insert, payloads, skipped


def _items_as_built(conn, coll, rid: int) -> dict[str, np.ndarray]:
    """The run's items read from the user's table, each with the vector it was built from: the
    table's now, or -- for a row changed or gone since (changes still queued) -- the first vector
    queued for it (``old_vector``)."""
    from .api import load_items

    have = load_items(conn, coll, in_run=rid)
    feats = np.asarray(have["features"], np.float32).copy()
    pos = {int(i): k for k, i in enumerate(have["id"])}
    queued = dict(conn.execute(
        "SELECT DISTINCT ON (it.id) it.id, c.old_vector FROM pm_vector.items it JOIN pm_vector.attach_changes c "
        "ON c.collection_id = it.collection_id AND c.key = it.external_id WHERE it.collection_id = %s "
        f"AND c.old_vector IS NOT NULL AND EXISTS (SELECT 1 FROM pm_vector.run_{int(rid)}_items e "
        "WHERE e.item_id = it.id) ORDER BY it.id, c.seq", [coll["id"]]).fetchall())
    miss = []
    for i, v in queued.items():
        vec = np.asarray(v.strip("[]").split(","), dtype=np.float32)
        if vec.shape[0] != int(coll["feature_dim"]):
            continue
        if int(i) in pos:
            feats[pos[int(i)]] = vec
        else:  # the row is gone (or no longer valid): only its queued vector is left
            miss.append((int(i), vec))
    if not miss:
        return {"id": have["id"], "label": have["label"], "features": feats}
    labs = dict(conn.execute("SELECT id, label FROM pm_vector.items WHERE id = ANY(%s)",
                             [[i for i, _ in miss]]).fetchall())
    ids = np.concatenate([have["id"], np.array([i for i, _ in miss], np.int64)])
    order = np.argsort(ids, kind="stable")
    return {"id": ids[order],
            "label": np.concatenate([have["label"], np.array([labs[i] for i, _ in miss], np.int64)])[order],
            "features": np.concatenate([feats.reshape(-1, coll["feature_dim"]), np.stack([v for _, v in miss])])[order]}


class _RunItems:
    """The items of each run a batch changes, as built: from this process's cache
    (:mod:`pm_vector.db.runs.item_cache`) when it holds the run's current version, else read
    (:func:`_items_as_built`); followed through the batch's erasure and placements, and cached
    under the runs' new versions once the batch has committed."""

    def __init__(self, conn, coll, runs):
        self.conn, self.coll = conn, coll
        self.docs = {int(r[0]): r[1] for r in runs}
        self.items: dict[int, dict] = {}

    def load(self, rid: int) -> dict[str, np.ndarray]:
        from ..runs import item_cache

        rid = int(rid)
        if rid not in self.items:
            got = item_cache.get(self.conn, rid, self.docs.get(rid))
            self.items[rid] = got if got is not None else _items_as_built(self.conn, self.coll, rid)
        return self.items[rid]

    def erased(self, gone) -> None:
        from ..runs import item_cache

        for rid, items in self.items.items():
            self.items[rid] = item_cache.after(items, gone)

    def placed(self, rid: int, added: dict) -> None:
        from ..runs import item_cache

        self.items[int(rid)] = item_cache.after(self.load(rid), (), added)

    def keys(self) -> dict:
        """Before the commit: each run's cache key under its new version (the kept cell rows,
        :mod:`pm_vector.db.runs.row_cache`, are kept under it too)."""
        from ..runs import item_cache

        out = {}
        for rid in self.docs:
            doc = self.conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()
            out[rid] = item_cache.key(self.conn, rid, doc[0] if doc else None)
        return out

    def keep(self, keys: dict) -> None:
        """After the commit."""
        from ..runs import item_cache

        for rid, items in self.items.items():
            item_cache.put(keys.get(rid), items)


def _sync_batch(collection: str, batch: int, embed_fn_extend, upto: int, url: str | None = None
                ) -> dict[str, Any] | None:
    from ..runs import array_rows, erase as _erase, prior_rows, row_cache
    from .erase import erase_kahm, runs_with_tables

    with connect(url, watch_client=True) as conn:
        coll = collection_row(conn, collection, lock="FOR NO KEY UPDATE")
        att = (coll["settings"] or {}).get("attached")
        if not att:
            raise _not_attached(collection)
        check_attached(conn, coll)  # (a table changed under it: marked broken, refused)
        rows = conn.execute("SELECT seq, op, key, old_vector FROM pm_vector.attach_changes WHERE collection_id = %s "
                            "AND seq <= %s ORDER BY seq LIMIT %s", [coll["id"], upto, batch]).fetchall()
        if not rows:
            conn.rollback()
            return None
        last = rows[-1][0]
        ops: dict[str, list] = {}
        for _seq, op, key, old in rows:
            ops.setdefault(key, []).append((op, old))
        keys = sorted(ops)
        src = _source_rows(conn, att, keys)
        items = {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT external_id, id, label FROM pm_vector.items WHERE collection_id = %s AND external_id = ANY(%s)",
            [coll["id"], keys]).fetchall()}
        erase, insert, payloads, skipped = _classify_changes(coll, keys, ops, src, items)
        gone = np.array(sorted(int(i) for i in erase), dtype=np.int64)
        runs = runs_with_tables(conn, coll["id"])
        run_items = _RunItems(conn, coll, runs)
        kept = row_cache.Kept(conn, runs)
        # the cell and location rows, and the class rows' prior lists: written once, by the batch
        with array_rows.deferred(conn), prior_rows.deferred(conn):
            kept.seed(conn)  # the rows this process held after its last batch, still as the tables hold them
            if gone.size:
                _erase.erase_in_runs(conn, gone, runs, run_items.load, quick=True)
                run_items.erased(gone)
                erase_kahm(conn, coll, gone)
                conn.execute("DELETE FROM pm_vector.items WHERE id = ANY(%s)", [gone.tolist()])
            _write_items(conn, coll, insert, payloads)
            if insert and coll["active_run_id"] is not None:
                _place_new(conn, collection, coll, embed_fn_extend, run_items)
            kept.collect(conn)
        conn.execute("DELETE FROM pm_vector.attach_changes WHERE collection_id = %s AND seq <= %s", [coll["id"], last])
        cache_keys = run_items.keys()
        conn.commit()
    run_items.keep(cache_keys)
    kept.keep(cache_keys)
    n_replaced = sum(1 for k, _l, _p in insert if k in items)
    return {"applied": len(rows), "inserted": len(insert) - n_replaced, "replaced": n_replaced,
            "deleted": int(gone.size) - n_replaced, "payloads": len(payloads), "skipped": skipped}


def _write_items(conn, coll, insert: list, payloads: list) -> None:
    """The batch's new items rows and payload updates."""
    from psycopg.types.json import Jsonb

    if insert:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO pm_vector.items (collection_id, external_id, label, payload) "
                            "VALUES (%s, %s, %s, %s)",
                            [(coll["id"], k, lab_, None if p is None else Jsonb(p)) for k, lab_, p in insert])
    if payloads:
        with conn.cursor() as cur:
            cur.executemany("UPDATE pm_vector.items SET payload = %s WHERE id = %s",
                            [(None if p is None else Jsonb(p), i) for p, i in payloads])


def _place_new(conn, collection: str, coll, embed_fn_extend, run_items: _RunItems) -> None:
    """The batch's new items placed in the active run (``embed --new-items``, against the run's items
    as built); a sharded run takes them with the next full job."""
    from ..runs.jobs import anchor_frame_extend_fn
    from ..runs.new_items import embed_new_items

    rid = int(coll["active_run_id"])
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0] or {}
    if doc.get("shards"):
        return
    ready = doc.get("status") == "ready"
    if ready and rid not in run_items.items:  # (its current version: the batch erased nothing from it)
        run_items.docs[rid] = doc
    embed_new_items(collection, embed_fn_extend or anchor_frame_extend_fn, conn=conn,
                    run_items=run_items.load(rid) if ready else None,
                    on_placed=(lambda added: run_items.placed(rid, added)) if ready else None)
