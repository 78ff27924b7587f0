"""A local cluster for the scale-out tests: a coordinator, two shards and a replica of the
coordinator, embedded servers on loopback ports in a private PM_VECTOR_HOME (fast, throwaway)."""

from __future__ import annotations

import os


import pytest

from pmtest_embedded import ENV_KEYS  # tests/pmtest_embedded.py


@pytest.fixture(scope="package")
def local_cluster(tmp_path_factory):
    from pm_vector.db import postgres
    from pm_vector.db.postgres import cluster

    home = tmp_path_factory.mktemp("pmcluster")
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    postgres.dispose_engines()
    os.environ["PM_VECTOR_HOME"] = str(home)
    os.environ.pop("PM_VECTOR_DATABASE_URL", None)
    os.environ["PM_VECTOR_EMBEDDED_FAST"] = "1"
    st = cluster.start(shards=2, replicas=1)
    assert all(n["running"] for n in st["nodes"]), st
    yield cluster
    postgres.dispose_engines()
    os.environ["PM_VECTOR_HOME"] = str(home)
    postgres.stop_cluster()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def node_urls(local_cluster):
    return {n["name"]: local_cluster.node_url(n) for n in local_cluster.topology()["nodes"]}


def _load(name, sp, ds, settings=None):
    import pm_vector.db as db
    from pm_vector.db.runs.jobs import anchor_frame_embed_fn

    db.drop_collection(name, missing_ok=True)
    db.create_collection(name, ds.dim, ds.classes.tolist(), allow_raw_features=True, **(
        {"settings": settings} if settings else {}))
    Xs, ys = sp.server
    db.ingest(name, Xs, ys, external_ids=[f"d{i}" for i in range(len(ys))])
    db.register_anchor_set(name, *sp.anchor)
    db.register_anchor_set(name, *sp.dummy, role="dummy")
    return db.run_embedding_job(name, {"n_components": 8}, 3, embed_fn=anchor_frame_embed_fn)


@pytest.fixture(scope="package")
def both(local_cluster):
    """The same digits collection on the cluster (sharded) and on a single node."""
    from pm_vector.datasets import load_dataset, split_dataset
    from pm_vector.db import postgres

    ds = load_dataset("digits")
    sp = split_dataset(ds, 800, 300, 150, 100, seed=0)
    coord = local_cluster.coordinator_url()
    single = local_cluster.standalone_database(coord)
    run = _load("cl_digits", sp, ds)
    os.environ["PM_VECTOR_DATABASE_URL"] = single
    postgres.dispose_engines()
    try:
        single_run = _load("cl_digits", sp, ds)
    finally:
        os.environ.pop("PM_VECTOR_DATABASE_URL", None)
        postgres.dispose_engines()
    yield {"split": sp, "run": run, "single_run": single_run, "coord": coord, "single": single}




@pytest.fixture
def admin_urls(local_cluster):
    """Each node's superuser URL (``node_urls`` log in as the owner role, as pm_vector does): for
    what only a superuser may do in a test (CHECKPOINT)."""
    return {n["name"]: local_cluster.admin_node_url(n) for n in local_cluster.topology()["nodes"]}
