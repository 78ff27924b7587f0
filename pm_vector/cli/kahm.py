"""``pm-vector kahm ...``: the KAHM roles of a collection (:mod:`pm_vector.db.kahm.roles`) as commands.

::

    kahm anchor COLLECTION --epsilon E [--unit row|element] [--embed]  DP fabricated anchor + dummy pool
    kahm fit COLLECTION [--kind raw|noisy|fabricated] [--new-items]     per-class models + item scores
    kahm models [COLLECTION]       kahm audits [COLLECTION]             what is stored
    kahm classify COLLECTION --features Q.npy                           the current model on feature rows
    kahm federate COLL1 COLL2 ... --features Q.npy                      the global classifier (eq 104)
    kahm audit COLLECTION [--epsilon E --value-range LO,HI]             membership-inference audit

Results go to stdout (a table, or one JSON object with --json; numpy arrays as lists and
non-finite numbers as null); progress and errors to stderr. Errors of the library
(:class:`~pm_vector.errors.PMVectorError`) print one line and exit with code 2.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer
from rich.table import Table

from .db import JSON_OPT, JobProgressBar, cli_call, emit, fail, out, frame_defaults, err
from ..db.kahm import roles as dbk
from ..db.kahm.roles import (class_scores, fabricate_anchor_set, federated_classify, list_audits, list_kahm_models,
                             run_membership_audit)
from ..db.runs.jobs import anchor_frame_embed_fn, run_embedding_job

kahm_app = typer.Typer(help="KAHM roles of a collection: DP fabricated anchor, class models and scores, "
                            "federated classification, membership-inference audit.", no_args_is_help=True)

PROGRESS_OPT = typer.Option(True, "--progress/--no-progress", help="Progress bar on stderr.")
EPSILON_HELP = "epsilon per element of the item feature matrix (Definition 10)."
RANGE_HELP = ("Public feature range LO,HI (features are clipped to it; sensitivity HI-LO), e.g. 0,1 for pixels "
              "in [0, 1]. Never computed from the data.")
ANCHOR_EPSILON_HELP = ("epsilon per item (--unit row, the default: each item row clipped to --clip-norm and "
                       "perturbed as a whole) or per element of the item feature matrix (--unit element).")
STOPPING_RULE_HELP = ("The paper's stopping rule (eq 92) instead of 5 fixed public smoothing steps: its threshold r "
                      "comes from the original rows (outside the guarantee).")
NOISE_SEED_HELP = "Seed of the DP noise -- for tests only, the release is then NOT private (default: crypto seed)."


# ----------------------------------------------------------------------------- helpers

def plain(v: Any) -> Any:
    """JSON-safe copy: numpy arrays/scalars to lists/numbers, non-finite floats to None, keys to str."""
    if isinstance(v, np.ndarray):
        return plain(v.tolist())
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, (np.integer, np.bool_)):
        return v.item()
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


def _echo_json(data: Any) -> None:
    typer.echo(json.dumps(plain(data), default=str))


def _value_range(text: Optional[str]) -> Optional[tuple[float, float]]:
    """``"LO,HI"`` -> (lo, hi); None stays None (the job then says why a range is needed)."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        return float(parts[0]), float(parts[1])
    except ValueError:
        raise typer.BadParameter(f"--value-range must be two numbers LO,HI, e.g. 0,1 or -1,1; got {text!r}") from None


def _load_features(path: Path) -> np.ndarray:
    """Feature rows from a .npy file (one row: a 1-D array)."""
    try:
        a = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        fail(f"--features: no such file {str(path)!r}.")
    except (ValueError, OSError) as e:
        fail(f"--features: {str(path)!r} is not a readable .npy array ({e}).")
    if not isinstance(a, np.ndarray):  # an .npz archive
        fail(f"--features: {str(path)!r} is an .npz archive; save one array with numpy.save(path, X).")
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[0] == 0:
        fail(f"--features: expected a (rows, features) array; got shape {a.shape}.")
    return a


def _steps_option(smoothing_steps: Optional[int], stopping_rule: bool) -> dict[str, Any]:
    """--smoothing-steps / --stopping-rule as the jobs' smoothing_steps (empty: the job's public default)."""
    if stopping_rule:
        if smoothing_steps is not None:
            fail("--stopping-rule and --smoothing-steps exclude each other: the rule decides the number of steps.")
        return {"smoothing_steps": None}
    return {} if smoothing_steps is None else {"smoothing_steps": smoothing_steps}


def _bar(progress: bool) -> JobProgressBar:
    """The job's stages as progress bars on stderr (as `pm-vector embed` shows them)."""
    return JobProgressBar(progress and sys.stderr.isatty())


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("-" if v is None else (json.dumps(plain(v)) if isinstance(v, (dict, list)) else str(v))
                    for v in r))
    out.print(t)


def _fmt(v: Any, nd: int = 4) -> str:
    v = plain(v)
    return "-" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def _embed_collection(collection: str, bar: JobProgressBar) -> dict[str, Any]:
    """The full embedding job as ``pm-vector embed COLLECTION`` runs it (frame defaults, seed 0)."""
    return cli_call(run_embedding_job, collection, frame_defaults(), 0, bar, embed_fn=anchor_frame_embed_fn)


# ----------------------------------------------------------------------------- anchor

@kahm_app.command("anchor")
def anchor(
    collection: str = typer.Argument(..., help="The collection whose items the anchor is fabricated from."),
    epsilon: float = typer.Option(..., help=ANCHOR_EPSILON_HELP),
    unit: str = typer.Option("row", help="Privacy unit: row (one item's whole feature row; the default) or element "
                                         "(Definition 10; an item of p features costs p x epsilon)."),
    clip_norm: float = typer.Option(1.0, help="--unit row: public L2 norm each item row is clipped to."),
    value_range: Optional[str] = typer.Option(None, "--value-range", help=RANGE_HELP + " Required with --unit "
                                                                          "element; optional with row."),
    delta: float = typer.Option(1e-5, help="delta of the release."),
    anchors_per_class: int = typer.Option(100, help="Anchor rows per class."),
    dummies_per_class: int = typer.Option(20, help="Dummy-pool rows per class (0: no dummy pool)."),
    source_per_class: Optional[int] = typer.Option(None, help="Items drawn per class (default anchors + dummies); "
                                                              "more smooth the noise better at no privacy cost."),
    n_components: int = typer.Option(20, help="KAHM components of the fabrication."),
    smoothing_steps: Optional[int] = typer.Option(None, help="Fixed number of smoothing steps (public; default: "
                                                             "fabricate_anchor_set's, 5)."),
    stopping_rule: bool = typer.Option(False, "--stopping-rule", help=STOPPING_RULE_HELP),
    sample_seed: int = typer.Option(0, help="Public seed of the per-class draws."),
    noise_seed: Optional[int] = typer.Option(None, hidden=True, help=NOISE_SEED_HELP),
    description: Optional[str] = typer.Option(None, help="Description stored with the sets."),
    do_embed: bool = typer.Option(False, "--embed/--no-embed",
                                  help="Then run the embedding job on the new anchor, as `pm-vector embed` does."),
    as_json: bool = JSON_OPT,
    progress: bool = PROGRESS_OPT,
):
    """Fabricate a DP anchor set and dummy pool from the collection's items and register them.

    KAHM fabricated data (Definitions 13-14) of noisy rows released on a public grid: row level by
    default (epsilon per item), element level with --unit element. The sets become the
    collection's current ones. The next embedding job builds its frame on this anchor (--embed
    runs it right away, as `pm-vector embed` would).

    Example: pm-vector kahm anchor digits --epsilon 4 --anchors-per-class 30 --embed --json

    Example: pm-vector kahm anchor digits --epsilon 1 --unit element --value-range 0,1
    """
    vr = _value_range(value_range)
    steps = _steps_option(smoothing_steps, stopping_rule)
    with _bar(progress) as bar:
        res = cli_call(fabricate_anchor_set, collection, epsilon, unit=unit, clip_norm=clip_norm, value_range=vr,
                    delta=delta,
                    anchors_per_class=anchors_per_class, dummies_per_class=dummies_per_class,
                    source_per_class=source_per_class, n_components=n_components, **steps,
                    sample_seed=sample_seed, noise_seed=noise_seed, description=description, progress=bar)
        if do_embed:
            res["embedding"] = _embed_collection(collection, bar)
    if as_json:
        _echo_json(res)
        return
    prov = res["provenance"]
    summary = {"epsilon per item": prov["per_item_epsilon"], "delta per item": prov["per_item_delta"],
               "unit": prov["unit"], "anchor_set_id": res["anchor"]["anchor_set_id"],
               "anchor_rows": res["anchor"]["n_rows"],
               "dummy_set_id": (res["dummy"] or {}).get("anchor_set_id"),
               "dummy_rows": (res["dummy"] or {}).get("n_rows"),
               "epsilon (per element)" if prov["unit"] == "element" else "clip_norm":
                   prov["epsilon"] if prov["unit"] == "element" else prov["clip_norm"],
               "value_range": prov["value_range"], "grid": prov["grid"], "smoothing": prov["smoothing"],
               "outside the guarantee": prov["outside_guarantee"], "noise": prov["noise_seed"],
               "seconds": res["seconds"]}
    if res.get("embedding"):
        e = res["embedding"]
        summary.update({"embedding_run_id": e.get("run_id"), "embedding_status": e.get("status"),
                        "embedding_dim": e.get("embedding_dim")})
    emit(summary, False, f"{collection}: DP fabricated anchor")
    for w in res.get("warnings") or []:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)


# ----------------------------------------------------------------------------- fit

@kahm_app.command("fit")
def fit(
    collection: str = typer.Argument(..., help="The collection to model."),
    kind: str = typer.Option("raw", help="raw (Definition 7), noisy (Definition 12) or fabricated (Definition 15)."),
    epsilon: Optional[float] = typer.Option(None, help=EPSILON_HELP + " For noisy and fabricated."),
    value_range: Optional[str] = typer.Option(None, "--value-range", help=RANGE_HELP + " For noisy and fabricated."),
    delta: float = typer.Option(1e-5, help="delta of the private kinds."),
    n_components: int = typer.Option(20, help="KAHM components (n <= features; every class needs n+1 items)."),
    n_layers: Optional[int] = typer.Option(None, help="Layers of each class's wide KAHM (default min(5, "
                                                      "n_components); at most n_components)."),
    branch_size: int = typer.Option(1000, help="Rows per branch of a wide KAHM."),
    smoothing_steps: Optional[int] = typer.Option(None, help="Fixed public smoothing steps (kind fabricated; "
                                                             "default 5)."),
    stopping_rule: bool = typer.Option(False, "--stopping-rule", help=STOPPING_RULE_HELP + " Kind fabricated."),
    keep_previous: int = typer.Option(1, help="Older models kept (the rest are deleted)."),
    noise_seed: Optional[int] = typer.Option(None, hidden=True, help=NOISE_SEED_HELP),
    new_items: bool = typer.Option(False, "--new-items", help="Only score the items ingested after the current "
                                                              "model (no new fit)."),
    as_json: bool = JSON_OPT,
    progress: bool = PROGRESS_OPT,
):
    """Fit one KAHM per class and store it with every item's class-matching scores.

    The newest model serves: resolve returns each returned item's scores with its row. With
    --new-items, score only the items that have no scores yet under the current model.

    Example: pm-vector kahm fit digits --n-components 10 --json

    Example: pm-vector kahm fit digits --kind fabricated --epsilon 1 --value-range 0,1

    Example: pm-vector kahm fit digits --new-items
    """
    if new_items:
        given = {"--kind": kind != "raw", "--epsilon": epsilon is not None, "--value-range": value_range is not None,
                 "--smoothing-steps": smoothing_steps is not None, "--noise-seed": noise_seed is not None,
                 "--stopping-rule": stopping_rule}
        if any(given.values()):
            fail("--new-items scores new items with the current model as it was fitted; "
                 f"{', '.join(k for k, v in given.items() if v)} appl{'ies' if sum(given.values()) == 1 else 'y'} "
                 "to a new fit only.")
        res = cli_call(dbk.score_new_items, collection)
        if as_json:
            _echo_json(res)
        else:
            emit(res, False, f"{collection}: new items scored")
        return
    if kind not in dbk.KINDS:
        fail(f"--kind must be one of {', '.join(dbk.KINDS)}; got {kind!r}.")
    if kind == "raw" and value_range is not None:
        fail("--value-range is for the private kinds (noisy, fabricated); kind raw uses the items as stored.")
    vr = _value_range(value_range)
    steps = _steps_option(smoothing_steps, stopping_rule)
    if steps and kind != "fabricated":
        fail("--smoothing-steps and --stopping-rule are for --kind fabricated.")
    with _bar(progress) as bar:
        res = cli_call(dbk.fit_kahm_models, collection, kind=kind, epsilon=epsilon, delta=delta, value_range=vr,
                    n_components=n_components, n_layers=min(5, n_components) if n_layers is None else n_layers,
                    branch_size=branch_size, **steps, noise_seed=noise_seed, keep_previous=keep_previous,
                    progress=bar)
    if as_json:
        _echo_json(res)
        return
    keep = ("model_id", "collection", "kind", "classes", "n_features", "n_items", "n_scored_items", "params",
            "privacy", "model_bytes", "training_accuracy", "timings", "created_at")
    emit(plain({k: res.get(k) for k in keep}), False, f"{collection}: KAHM model {res.get('model_id')}")


# ----------------------------------------------------------------------------- listings

@kahm_app.command("models")
def models(collection: Optional[str] = typer.Argument(None, help="Only this collection's models."),
           as_json: bool = JSON_OPT):
    """Stored KAHM models, newest first (the current one of each collection serves).

    Example: pm-vector kahm models digits --json
    """
    rows = cli_call(list_kahm_models, collection)
    if as_json:
        _echo_json({"models": rows})
        return
    _table("KAHM models" + (f" of {collection}" if collection else ""),
           ["id", "collection", "kind", "current", "classes", "features", "items", "scored", "epsilon", "created"],
           [[r["model_id"], r["collection"], r["kind"], "yes" if r["is_current"] else "", len(r["classes"] or []),
             r["n_features"], r["n_items"], r["n_scored_items"], (r.get("privacy") or {}).get("epsilon"),
             str(r["created_at"])[:19]] for r in rows])


@kahm_app.command("audits")
def audits(collection: Optional[str] = typer.Argument(None, help="Only this collection's audits."),
           as_json: bool = JSON_OPT):
    """Stored membership-inference audit reports, newest first.

    Example: pm-vector kahm audits digits --json
    """
    rows = cli_call(list_audits, collection)
    if as_json:
        _echo_json({"audits": rows})
        return
    _table("KAHM membership-inference audits" + (f" of {collection}" if collection else ""),
           ["id", "collection", "epsilon", "MIS raw", "MIS fabricated", "MIS reduction", "AUC raw", "AUC fab",
            "acc raw", "acc fab", "created"],
           [[r["audit_id"], r["collection"], _fmt(r["epsilon"], 3), _fmt(r["mis_raw"], 5), _fmt(r["mis_fabricated"], 5),
             _fmt(r["mis_reduction"], 3), _fmt(r["auc_raw"], 3), _fmt(r["auc_fabricated"], 3),
             _fmt(r["accuracy_raw"], 3), _fmt(r["accuracy_fabricated"], 3), str(r["created_at"])[:19]]
            for r in rows])


# ----------------------------------------------------------------------------- classify / federate

FEATURES_OPT = typer.Option(..., "--features", help="Query feature rows: a .npy array (rows x features).")


def _score_rows(res: dict[str, Any], limit: int = 50) -> list[list[Any]]:
    S = np.asarray(res["scores"], dtype=np.float64)
    rows = []
    for i in range(min(S.shape[0], limit)):
        extra = [res["party"][i]] if "party" in res else []
        rows.append([i, int(res["predicted"][i]), _fmt(S[i].max()), *extra,
                     " ".join(_fmt(v, 3) for v in S[i])])
    return rows


@kahm_app.command("classify")
def classify(collection: str = typer.Argument(..., help="The collection whose current model classifies."),
             features: Path = FEATURES_OPT,
             model_id: Optional[int] = typer.Option(None, help="A stored model instead of the current one."),
             as_json: bool = JSON_OPT):
    """Class-matching scores, distances and predicted labels of feature rows (the current model).

    Definitions 6-8 under the collection's current KAHM model (or --model-id).

    Example: pm-vector kahm classify digits --features queries.npy --json
    """
    Q = _load_features(features)
    res = cli_call(class_scores, collection, Q, model_id=model_id)
    if as_json:
        _echo_json(res)
        return
    _table(f"{collection}: KAHM model {res['model_id']}, classes {res['classes']}",
           ["row", "predicted", "score", "scores per class"], _score_rows(res))


@kahm_app.command("federate")
def federate(collections: list[str] = typer.Argument(..., help="The parties: collections of this database."),
             features: Path = FEATURES_OPT,
             as_json: bool = JSON_OPT):
    """Federated classification (eq 104) over several collections, from their class distances only.

    Each party sends only its distance per class for every query row (no items, no model); a
    class a party does not hold counts as infinitely far for it.

    Example: pm-vector kahm federate hospital_a hospital_b --features queries.npy --json
    """
    Q = _load_features(features)
    res = cli_call(federated_classify, list(collections), Q)
    if as_json:
        _echo_json(res)
        return
    _table(f"federated over {', '.join(collections)}: classes {res['classes']}",
           ["row", "predicted", "score", "party", "scores per class"], _score_rows(res))


# ----------------------------------------------------------------------------- audit

@kahm_app.command("audit")
def audit(
    collection: str = typer.Argument(..., help="The collection to audit."),
    epsilon: Optional[float] = typer.Option(None, help=EPSILON_HELP + " Default: audit the deployed model's "
                                                       "configuration instead."),
    value_range: Optional[str] = typer.Option(None, "--value-range", help=RANGE_HELP + " With --epsilon."),
    delta: float = typer.Option(1e-5, help="delta of the private models."),
    repeats: int = typer.Option(3, help="Splits, each with its own noise draw."),
    holdout: float = typer.Option(0.3, "--holdout", help="Held-out fraction of the audit sample (0.05..0.95)."),
    max_items: Optional[int] = typer.Option(5000, help="Items in the audit sample (stratified; 0: all)."),
    n_components: int = typer.Option(20, help="KAHM components of the audited models (with --epsilon)."),
    n_layers: Optional[int] = typer.Option(None, help="Layers of each class's wide KAHM (default min(5, "
                                           "--n-components))."),
    smoothing_steps: Optional[int] = typer.Option(None, help="Fixed public smoothing steps of the fabricated model "
                                                             "(default 5)."),
    stopping_rule: bool = typer.Option(False, "--stopping-rule", help=STOPPING_RULE_HELP),
    split_seed: int = typer.Option(0, help="Public seed of the sample and the split."),
    noise_seed: Optional[int] = typer.Option(None, hidden=True, help=NOISE_SEED_HELP),
    as_json: bool = JSON_OPT,
    progress: bool = PROGRESS_OPT,
):
    """Membership-inference audit (stored): the deployed model beside a raw one, or, with --epsilon,
    raw, noisy and fabricated models at that configuration.

    Repeated over --repeats splits and noise draws; reports the attack AUC, its true-positive rate
    at false-positive rates 1 % and 0.1 % (Clopper-Pearson 95 % intervals), the membership-inference
    score (eq 69, on scale-free distances) and the held-out accuracy of each model.

    Example: pm-vector kahm audit digits --json

    Example: pm-vector kahm audit digits --epsilon 1 --value-range 0,1 --n-components 10 --repeats 5
    """
    vr = _value_range(value_range)
    steps = _steps_option(smoothing_steps, stopping_rule)
    with _bar(progress) as bar:
        res = cli_call(run_membership_audit, collection, epsilon, value_range=vr, delta=delta, n_repeats=repeats,
                    holdout_fraction=holdout, max_items=max_items or None, n_components=n_components,
                    n_layers=n_layers, **steps, split_seed=split_seed, noise_seed=noise_seed, progress=bar)
    if as_json:
        _echo_json(res)
        return
    cfg = res["configuration"]
    what = (f"deployed model {cfg['model_id']} ({cfg['kind']})" if cfg["source"] == "deployed" else "given")
    eps = res["params"].get("epsilon")
    _table(f"{collection}: membership-inference audit {res['audit_id']} ({what} configuration"
           + ("" if eps is None else f", epsilon {eps:g} per element")
           + f"; {res['n_repeats']} x {res['n_train']} train / {res['n_holdout']} held out)",
           ["model", "attack AUC (min-max)", "TPR @ FPR 1% [95% CI]", "TPR @ FPR 0.1% [95% CI]", "MIS (eq 69)",
            "held-out accuracy"],
           [[kind, f"{_fmt(res[f'auc_{tag}'], 3)} ({_fmt(res[f'auc_{tag}_range'][0], 3)}-"
                   f"{_fmt(res[f'auc_{tag}_range'][1], 3)})",
             *(_tpr(res[f"tpr_at_fpr_{f}_{tag}"]) for f in ("0.01", "0.001")),
             _fmt(res.get(f"mis_{tag}"), 5), _fmt(res.get(f"accuracy_{tag}"), 3)]
            for kind, tag in (("raw", "raw"), ("noisy", "noisy"), ("fabricated", "fab")) if kind in res["kinds"]])
    if res.get("mis_reduction") is not None:
        out.print(f"MIS reduction fabricated vs raw: {_fmt(res.get('mis_reduction'), 3)}", highlight=False)


def _tpr(t: dict) -> str:
    return f"{t['tpr']:.3f} [{t['ci95'][0]:.3f}, {t['ci95'][1]:.3f}]"
