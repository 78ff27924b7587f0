"""The old module paths are gone: no module of pm_vector only re-exports another's names.

The compatibility modules kept for one release (``pm_vector.db.server``, ``.engine``, ``.cluster``,
``.migrate``, ``.recovery``, ``.replicas``, ``.kahm_common``, ``.resolution``;
``pm_vector.client.wire``, ``.published_codes``) were removed, and the five ``cells.py`` modules
(client, manifold, privacy, protocol, db.runs) were renamed for what each holds, as was ``db.store.erase``
(``db.store.deletes``: ``db.runs.erase`` is the erasure inside a run), and what ``db.store`` and ``db.runs``
both read moved below them to ``db.core``; :data:`MOVED` says where their names live now. The package faces (``pm_vector.db``, ``pm_vector.client``) keep their public
names, imported from the real homes.
"""

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

import pm_vector

MOVED = {
    "pm_vector.db.server": ("pm_vector.db.postgres.config", ["home", "pgdata_dir", "external_url", "mode", "libpq_url",
                                                             "sqlalchemy_url", "redact", "EMBEDDED_DATABASE", "ENV_URL"]),
    "pm_vector.db.engine": ("pm_vector.db.postgres.engine", ["connect", "connection", "get_engine", "session_scope",
                                                             "dispose_engines", "forget_checks"]),
    "pm_vector.db.migrate": ("pm_vector.db.postgres.migrate", ["execute_sql_file", "head_revision", "current_revision",
                                                               "upgrade_to_head", "alembic_config", "sql_dir",
                                                               "migrations_dir", "MIGRATION_LOCK_KEY"]),
    "pm_vector.db.cluster": ("pm_vector.db.postgres.cluster", ["start", "status", "topology", "coordinator_url",
                                                               "replica_urls", "replica_lag_bytes",
                                                               "standalone_database", "register_shard"]),
    "pm_vector.db.recovery": ("pm_vector.db.postgres.recovery", ["postmaster_state", "wait_until_ready", "log_tail",
                                                                 "log_progress", "quiet_pg_ctl_timeout"]),
    "pm_vector.db.replicas": ("pm_vector.db.postgres.replicas", ["ReadRouter"]),
    "pm_vector.db.kahm_common": ("pm_vector.db.kahm.store", ["model_outputs_allowed", "raw_distances_allowed",
                                                             "NoKAHMModelError", "KINDS"]),
    "pm_vector.db.resolution": ("pm_vector.db.resolve.resolution", ["resolve", "explain_resolution", "public_anchor",
                                                                    "client_frame", "class_frames",
                                                                    "post_process_release", "resolve_paper",
                                                                    "explain_paper"]),
    "pm_vector.client.wire": ("pm_vector.protocol.bounds", ["MAX_K_PRIME", "MAX_QUERY_ROWS", "MAX_POST_ITER"]),
    "pm_vector.client.published_codes": ("pm_vector.protocol.published_codes", ["MAX_ELEMENTS", "pack", "row_codes",
                                                                                "summary", "unpack"]),
    # five modules were all called cells.py; each is named for the idea it holds
    "pm_vector.client.cells": ("pm_vector.client.cell_client", ["PrivateCellKNN"]),
    "pm_vector.manifold.cells": ("pm_vector.manifold.public_cells", ["PublicCells", "nearest_centroid",
                                                                     "fit_location_cells"]),
    "pm_vector.privacy.cells": ("pm_vector.privacy.cell_release", ["CellRandomizedResponse", "cell_level_for_epsilon",
                                                                   "release_for_epsilon", "max_cells_for",
                                                                   "cell_weight"]),
    "pm_vector.protocol.cells": ("pm_vector.protocol.cell_request", ["CellRequest"]),
    "pm_vector.db.runs.cells": ("pm_vector.db.runs.cell_data", ["CellsData", "build", "useful_entries"]),
    # store/ and runs/ in one direction (issue #37): two erase.py in sibling packages; what both read moved below
    "pm_vector.db.store.erase": ("pm_vector.db.store.deletes", ["delete_items", "ItemNotFoundError", "MAX_DELETE",
                                                                "erase_or_tombstone", "erase_kahm", "ids_to_erase",
                                                                "resolve_item_ids", "check_not_attached",
                                                                "runs_with_tables"]),
    "pm_vector.db.store._source": ("pm_vector.db.core.features", ["feature_sql", "feature_filter"]),
    # (its run lock kind, fail_run and cleanup_stale_runs: pm_vector.db.core.abandoned, beside cleanup)
    "pm_vector.db.store._common": ("pm_vector.db.core.collection", ["collection_row", "AnchorSet", "load_anchor_set",
                                                                    "iso_datetime", "worker_identity"]),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_old_path_is_gone_and_its_names_live_in_the_new_home(old):
    assert importlib.util.find_spec(old) is None, f"{old} is back: import from {MOVED[old][0]}"
    new, names = MOVED[old]
    n = importlib.import_module(new)
    assert [name for name in names if not hasattr(n, name)] == []


def test_no_module_only_re_exports():
    # a module (not a package face) whose body is only imports (and __all__) is a shim
    shims = []
    for f in sorted(Path(pm_vector.__file__).parent.rglob("*.py")):
        if f.name == "__init__.py":
            continue
        body = [n for n in ast.parse(f.read_text(encoding="utf-8")).body
                if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        if all(isinstance(n, (ast.Import, ast.ImportFrom))
               or (isinstance(n, ast.Assign) and [getattr(t, "id", None) for t in n.targets] == ["__all__"])
               for n in body):
            shims.append(str(f))
    assert shims == []


@pytest.mark.parametrize("face", ["pm_vector.db", "pm_vector.client"])
def test_the_package_faces_keep_their_public_names(face):
    mod = importlib.import_module(face)
    assert [name for name in mod.__all__ if not hasattr(mod, name)] == []


def test_the_db_face_stops_and_upgrades_through_the_postgres_face():
    import pm_vector.db as db
    from pm_vector.db import postgres

    assert db.stop is postgres.stop and db.upgrade is postgres.upgrade  # they clear the engines
    assert db.database_url is postgres.database_url and db.connect is postgres.connect


# Renamed public names, importable under their old names until pm_vector.deprecation.REMOVED_IN
# (the scikit-learn way): pm_vector.deprecation.RENAMED, module -> {old name: new dotted name}.
def _renamed():
    from pm_vector.deprecation import RENAMED

    return sorted((module, old, new) for module, names in RENAMED.items() for old, new in names.items())


@pytest.mark.parametrize("module,old,new", _renamed())
def test_an_old_name_still_imports_with_a_future_warning_naming_the_new_one(module, old, new):
    from pm_vector.deprecation import REMOVED_IN

    mod = importlib.import_module(module)
    with pytest.warns(FutureWarning, match=f"{module}.{old} is renamed {new}; .* removed in pm_vector {REMOVED_IN}"):
        obj = getattr(mod, old)
    home, _, name = new.rpartition(".")
    assert obj is getattr(importlib.import_module(home), name)
    assert old not in getattr(mod, "__all__", ()) and old not in vars(mod)


def test_the_old_names_go_in_the_release_that_the_warning_names():
    from pm_vector.deprecation import REMOVED_IN

    # 0.2.0 renamed them; REMOVED_IN is the next minor release: delete RENAMED's entries then
    major, minor, _ = (int(p) for p in pm_vector.__version__.split("."))
    assert REMOVED_IN == f"{major}.{minor + 1}.0"


def test_an_unknown_name_is_still_an_attribute_error():
    import pm_vector.client

    with pytest.raises(AttributeError):
        pm_vector.client.NoSuchName  # noqa: B018


def test_one_client_secret_for_every_release_and_its_old_row_attribute_warns():
    from pm_vector.client import ClientSecret

    s = ClientSecret(real_row=2, label=7, predicted=True)
    assert s.pick(["a", "b", "c"]) == "c" and s.row_labels == ()
    with pytest.warns(FutureWarning, match="ClientSecret.row is renamed real_row"):
        assert s.row == 2
    with pytest.raises(TypeError):  # keyword arguments only: the two old classes took different orders
        ClientSecret(7, 2)


def test_an_old_keyword_still_works_with_a_future_warning_naming_the_new_one():
    from pm_vector.db.resolve.resolution import resolve
    from pm_vector.privacy.cell_release import max_cells_for

    old = r"max_cells_for\(\.\.\., k_prime=\.\.\.\) is renamed .*shortlist=.* 0\.3\.0"
    with pytest.warns(FutureWarning, match=old):
        assert max_cells_for(1000, 10, k_prime=10) == max_cells_for(1000, 10, shortlist=10)
    with pytest.raises(TypeError, match="both 'k_prime' and 'shortlist'"):
        max_cells_for(1000, 10, k_prime=10, shortlist=10)
    with pytest.raises(TypeError, match="both"):  # resolve takes k' as shortlist= now (k_prime= until 0.3.0)
        resolve("any", {}, k_prime=10, shortlist=10)
