"""Class-rows runs spread over shards (postgres_fdw + dblink, ``sql/0011_cluster.sql``).

Shard key: the **class**. Class position ``k`` of a run lives on shard ``k mod S`` (shards in name
order). A class-rows request has exactly one row per class, so every request sends the same
number of rows to every shard whichever row is real, and each row is answered entirely on one
shard: its class's prior (HNSW), the neighbour lists of that prior and the class's hub counts are
shard-local, so a shard returns each of its rows' top ``k'`` and the coordinator only merges
disjoint row sets and joins the items (ids, labels, features) it keeps.

Per sharded run ``R`` and shard ``s`` (classes ``K_s``), on the shard, with the names a
single node uses:

* ``run_R_prior`` partitioned by label with the partitions of ``K_s`` (HNSW in each);
* ``run_R_neighbors`` rows of the items of ``K_s``; ``run_R_hubs`` rows of ``K_s``;
* ``run_R_items (item_id)`` the run's first 1000 item ids (the statement's zero-score fill).

The job writes them through foreign tables the coordinator creates for it
(``run_R_<table>_at_<s>``, dropped after the write) and indexes them through ``dblink``; the run
switch stays one transaction on the coordinator, so a run is visible on every shard at once or not
at all, and a killed job leaves shard tables nothing points at (dropped with the run by
``pm_vector.pm_drop_run_tables``). The placement is recorded in the run's ``class_rows`` document
(``"shards": {shard: [class positions]}``), which is what ``pm_vector.pm_shortlist`` reads to fan
a request out (``pm_vector.pm_shortlist_sharded``).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np
from psycopg import sql

from ...protocol.bounds import MAX_K_PRIME
from ..postgres.privileges import install_on_shards
from ..run_tables import create_foreign_table, drop_foreign_table, on_shard, run_index, run_table
from .kinds import KINDS, shard_columns, shard_table_ddl, written_on_shards
from .run_copy import copy_hubs, copy_pairs, copy_prior

FILL = MAX_K_PRIME  # k' <= MAX_K_PRIME: the zero-score fill needs the run's first MAX_K_PRIME item ids


def placement(n_classes: int, shards: list[str]) -> dict[str, list[int]]:
    """Class positions per shard: position k on shards[k mod S] (public: depends on no data)."""
    return {s: [k for k in range(n_classes) if k % len(shards) == i] for i, s in enumerate(shards)}


#: the shard's mirror of the runs it holds (id, class_rows document): what the statement reads of
#: its run (e.g. min_weight) where there is no catalog
MIRROR = sql.SQL("CREATE TABLE IF NOT EXISTS pm_vector.embedding_runs (id bigint PRIMARY KEY, class_rows jsonb NOT NULL)")


def shard_ddl(run_id: int, n_components: int, classes: list[int], ks: list[int]) -> list[sql.Composable]:
    """The DDL of the run's tables on one shard holding class positions ``ks``: every kind the
    registry has the sharded write create (:func:`pm_vector.db.runs.kinds.written_on_shards`), a kind
    partitioned by class with the shard's partitions."""
    rid, d = int(run_id), int(n_components)
    t = lambda kind: run_table(rid, kind)  # noqa: E731
    made = written_on_shards()
    ddl = [MIRROR, sql.SQL("DROP TABLE IF EXISTS {}").format(sql.SQL(", ").join(t(k) for k in made))]
    for kind in made:
        ddl.append(sql.SQL("CREATE TABLE {} {}").format(t(kind), shard_table_ddl(kind, d)))
        if KINDS[kind].by_class:
            ddl += [sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES IN ({})").format(
                t(f"{kind}_{int(k)}"), t(kind), sql.Literal(int(classes[k]))) for k in ks]
    return ddl


def create_tables(conn, run_id: int, n_components: int, classes: list[int], place: dict[str, list[int]]) -> None:
    """Create the run's tables on every shard and the coordinator's write-side foreign tables."""
    rid, d = int(run_id), int(n_components)
    for s, ks in place.items():
        conn.execute("SELECT pm_vector.pm_shard_exec(%s, %s)", [s, on_shard(conn, shard_ddl(rid, d, classes, ks))])
        for kind in written_on_shards():
            create_foreign_table(conn, rid, kind, s, shard_columns(kind, d), 2000)
    conn.commit()


def write(conn, run_id: int, data, place: dict[str, list[int]], batch: int = 20_000,
          progress: Callable[[int, int], None] | None = None) -> None:
    """COPY each shard's part of the run's prior, graph and hubs (``data``: a
    :class:`pm_vector.db.runs.class_rows.ClassRowsData`) through the write-side foreign tables."""
    rid = int(run_id)
    classes = np.asarray(data.frames.classes_, dtype=np.int64)
    g = data.neighbors.shape[1]
    fill = np.sort(np.asarray(data.item_ids, dtype=np.int64))[:FILL]
    done, total = 0, int(data.prior_ids.shape[0])
    for s, ks in place.items():
        mine = classes[ks]
        sel = np.isin(data.prior_labels, mine)
        def at(kind: str, s: str = s) -> sql.Identifier:
            return run_table(rid, kind, s)
        copy_prior(conn, rid, data.prior_ids[sel], data.prior_labels[sel], data.prior_coords[sel], batch, True,
                    nbrs=data.prior_nbrs[sel], nhub=data.prior_nhub[sel], table=at("prior"))
        rows = np.isin(data.item_ids, data.prior_ids[sel])  # the neighbour lists of this shard's prior
        if g > 0 and rows.any():
            copy_pairs(conn, at("neighbors"), ("item_id", "neighbor_id"), np.repeat(data.item_ids[rows], g),
                        data.neighbors[rows].ravel(), batch * 4, True)
        hs = np.isin(data.hub_labels, mine)
        if hs.any():
            copy_hubs(conn, at("hubs"), data.hub_labels[hs], data.hub_ids[hs], data.hub_counts[hs], batch * 4, True)
        conn.execute(sql.SQL("INSERT INTO {} (item_id) SELECT unnest(%s::bigint[])").format(at("items")), [fill.tolist()])
        conn.commit()
        done += int(sel.sum())
        if progress is not None:
            progress(done, total)
    drop_write_tables(conn, rid, place)


def drop_write_tables(conn, run_id: int, place: dict[str, list[int]]) -> None:
    for s in place:
        for kind in written_on_shards():
            drop_foreign_table(conn, run_id, kind, s)
    conn.commit()


def build_indexes(conn, run_id: int, place: dict[str, list[int]], m: int = 16, ef_construction: int = 64) -> None:
    """On every shard: HNSW on the prior (one per class partition), the graph's and hubs' keys,
    the hubs' top index, ANALYZE; the run's mirror row; and the coordinator's functions installed there
    (:func:`pm_vector.db.postgres.privileges.install_on_shards`: its query login executes only what an
    answer calls there)."""
    rid = int(run_id)
    doc = conn.execute("SELECT class_rows FROM pm_vector.embedding_runs WHERE id = %s", [rid]).fetchone()[0]
    t = lambda kind: run_table(rid, kind)  # noqa: E731
    for s in place:
        ddl = [sql.SQL("SET maintenance_work_mem = '256MB'"),
               sql.SQL("CREATE INDEX {} ON {} USING hnsw (coords vector_l2_ops) WITH (m = {}, ef_construction = {})").format(
                   run_index(rid, "prior_hnsw"), t("prior"), sql.Literal(int(m)), sql.Literal(int(ef_construction))),
               sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY (item_id, neighbor_id)").format(
                   t("neighbors"), run_index(rid, "neighbors_pkey")),
               sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY (label, item_id)").format(
                   t("hubs"), run_index(rid, "hubs_pkey")),
               sql.SQL("CREATE INDEX {} ON {} (label, hub DESC, item_id)").format(run_index(rid, "hubs_top"), t("hubs"))]
        ddl += [sql.SQL("ANALYZE {}").format(t(kind)) for kind in written_on_shards()]
        ddl += [MIRROR, sql.SQL("INSERT INTO pm_vector.embedding_runs (id, class_rows) VALUES ({}, {}::jsonb) "
                                "ON CONFLICT (id) DO UPDATE SET class_rows = EXCLUDED.class_rows").format(
                                    sql.Literal(rid), sql.Literal(json.dumps(doc)))]
        conn.execute("SELECT pm_vector.pm_shard_exec(%s, %s)", [s, on_shard(conn, ddl)])
        install_on_shards(conn, [s])


def doc_placement(place: dict[str, list[int]]) -> dict[str, Any]:
    return {"shards": {s: [int(k) for k in ks] for s, ks in place.items()}}
