"""``pm-vector ingest``: items, an anchor set or a dummy pool into a collection, from .npy or
.parquet files read strictly (never unpickled; complex, string or ragged data refused with the fix)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from ..errors import PMVectorError
from ._service_common import echo_json, fail, progress_bar, err
from .. import db
from .._validation import as_labels
from ..db.store.payloads import read_jsonl


def read_table_file(path: Path, what: str = "features"):
    """A .npy (never unpickled) or .parquet file as a real-valued or integer array; a clear error
    (exit 2, no traceback) for anything else: unreadable, truncated, pickled, complex, strings."""
    if not path.is_file():
        fail(f"{path}: no such file (--{what}).")
    if path.suffix == ".npy":
        with open(path, "rb") as fh:
            magic = fh.read(6)
        if magic != b"\x93NUMPY":  # np.load would take it for a pickle
            fail(f"{path}: not a .npy file (no numpy header); write it with np.save, or use .parquet.")
        try:
            a = np.load(path, allow_pickle=False)
        except ValueError as e:
            if "allow_pickle" in str(e) or "Object arrays" in str(e):
                fail(f"{path}: holds Python objects (a pickled array), which pm_vector never loads (unpickling "
                      "runs code). Save a plain numeric array: np.save(path, np.asarray(X, dtype=np.float32)).")
            fail(f"{path}: not a readable .npy file ({e}); it may be truncated or not made by numpy.save. "
                  "Write it again with np.save.")
        except (EOFError, OSError) as e:
            fail(f"{path}: not a readable .npy file ({e.__class__.__name__}: {e}); it may be truncated. "
                  "Write it again with np.save.")
        return _real_array(a, path, what)
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # noqa: F401
        except ImportError:
            fail(f"{path} is Parquet, which needs pyarrow; it is not installed. Install it (pip install pyarrow) "
                  "or convert to .npy (numpy.save).")
        try:
            tbl = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
            fail(f"{path}: not a readable Parquet file ({e.__class__.__name__}: {e}).")
        cols = [np.asarray(c.to_numpy(zero_copy_only=False)) for c in tbl.columns]
        if len(cols) == 1 and cols[0].dtype == object:
            try:
                return _real_array(np.stack([np.asarray(v) for v in cols[0]]), path, what)
            except ValueError as e:
                fail(f"{path}: its list column has rows of different lengths or non-numbers ({e}).")
        for c in cols:
            _real_array(c, path, what)
        return _real_array(np.column_stack(cols) if len(cols) > 1 else cols[0], path, what)
    fail(f"{path}: unsupported file type {path.suffix!r}; use .npy (or .parquet with pyarrow).")


def _real_array(a, path: Path, what: str):
    """``a`` if its dtype is real numbers (float, int, bool); else a clear error naming the fix."""
    kind = a.dtype.kind
    if kind in "fiub":
        return a
    if kind == "c":
        fail(f"{path}: --{what} has complex values (dtype {a.dtype}); pm_vector stores real numbers and will not "
              "drop the imaginary part silently. Save the real values you mean (e.g. np.real(X) or "
              "np.hstack([X.real, X.imag])).")
    if kind in "US":
        fail(f"{path}: --{what} holds strings (dtype {a.dtype}); give numbers (labels as integers: map class "
              "names to 0..C-1 first).")
    fail(f"{path}: --{what} has dtype {a.dtype}, not real numbers; save a float or integer array.")


def _checked_rows(X, y, normalize: bool):
    """The features as float64 rows (unit norm with ``normalize``) and the labels flat, refused (with
    nothing written) when their shapes disagree, a value is not finite or a row is all zeros."""
    X = np.asarray(X, dtype=np.float64)
    y = None if y is None else np.asarray(y).ravel()
    if X.ndim != 2 or (y is not None and X.shape[0] != y.shape[0]):
        fail(f"features have shape {X.shape} and labels {None if y is None else y.shape}: need (n, d) and "
              "(n,).")
    if not np.all(np.isfinite(X)):
        fail(f"features row {int(np.argwhere(~np.isfinite(X))[0][0])} has NaN or infinite values; clean or "
              "drop those rows. Nothing was written.")
    if normalize:
        n = np.linalg.norm(X, axis=1, keepdims=True)
        if np.any(n == 0):
            fail(f"row {int(np.flatnonzero(n == 0)[0])} is all zeros and cannot be normalised.")
        X = X / n
    return X, y


def _create_kwargs(y, allow_raw_features: bool, max_payload_bytes: int | None, partitions: int | None) -> dict:
    """With ``--create``: the new collection's arguments (its labels: the distinct labels given; without
    labels, its public partitions)."""
    create_kw = {"labels": None if y is None else np.unique(as_labels(y, y.shape[0], "labels")).tolist(),
                 "allow_raw_features": allow_raw_features, "max_payload_bytes": max_payload_bytes}
    if y is None:
        create_kw["partitions"] = partitions
    return create_kw


def _read_payloads(payloads: Path, n_rows: int) -> list:
    """The payloads file (JSON lines), one value per feature row."""
    pay = read_jsonl(payloads)
    if len(pay) != n_rows:
        fail(f"{payloads}: {len(pay)} line(s) for {n_rows} feature row(s); give one JSON value per row. "
              "Nothing was written.")
    return pay


def ingest(
    collection: str = typer.Argument(..., help="Collection name."),
    features: Path = typer.Option(..., help="Features: .npy (rows x dims) or .parquet (needs pyarrow)."),
    labels: Optional[Path] = typer.Option(None, help="Integer labels: .npy or .parquet, one per row; omit it for "
                                          "a collection without labels (each row gets its nearest public partition)."),
    role: str = typer.Option("items", help="items (searched), anchor (public anchor set) or dummy (public pool)."),
    create: bool = typer.Option(False, help="Create the collection first (labels = the distinct labels given)."),
    allow_raw_features: bool = typer.Option(False, help="With --create: clients may fetch raw item features."),
    partitions: Optional[int] = typer.Option(None, min=2, help="With --create and no --labels: a collection without "
                                             "labels with this many public partitions (default 10), fit on its "
                                             "first anchor set."),
    normalize: bool = typer.Option(True, help="Rescale rows to unit norm (the protocol assumes unit rows)."),
    batch_size: int = typer.Option(10_000, min=1, help="Rows per COPY batch (items; all batches are one "
                                   "transaction)."),
    payloads: Optional[Path] = typer.Option(None, help="Items: a JSON-lines file, one JSON value per line for each "
                                            "row (null: none), returned with every candidate of an answer."),
    max_payload_bytes: Optional[int] = typer.Option(None, help="With --create: the bound on each payload, bytes "
                                                    "of compact JSON (default 256)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
):
    """Load items, an anchor set or a dummy pool into a collection (all-or-nothing).

    Example: pm-vector ingest mycoll --features X.npy --labels y.npy --create && pm-vector ingest mycoll \\
    --features A.npy --labels ya.npy --role anchor

    Without labels: pm-vector ingest mycoll --features A.npy --role anchor --create --partitions 10 &&
    pm-vector ingest mycoll --features X.npy (the anchor first: it fits the partitions)

    With payloads: pm-vector ingest mycoll --features X.npy --labels y.npy --payloads P.jsonl
    """
    if role not in ("items", "anchor", "dummy"):
        fail("--role must be items, anchor or dummy.")
    X = read_table_file(features, "features")
    y = None if labels is None else read_table_file(labels, "labels")
    if partitions is not None and (labels is not None or not create):
        fail("--partitions goes with --create and no --labels (it makes a collection without labels).")
    if payloads is not None and role != "items":
        fail("--payloads goes with --role items (anchor and dummy rows are public and carry no payload).")
    if max_payload_bytes is not None and not create:
        fail("--max-payload-bytes goes with --create (an admin changes it later: pm-vector db payload-limit).")
    try:
        X, y = _checked_rows(X, y, normalize)
        out: dict = {}
        create_kw = None
        if create:
            create_kw = _create_kwargs(y, allow_raw_features, max_payload_bytes, partitions)
        pay = None
        if payloads is not None:
            pay = _read_payloads(payloads, X.shape[0])
        with progress_bar(disable=as_json or not sys.stderr.isatty()) as bar:
            task = bar.add_task(f"ingest {role}", total=X.shape[0])
            if role == "items":
                # the collection is created in the ingest's transaction: a failed or killed ingest leaves none
                r = db.ingest(collection, X, y, payloads=pay, progress=lambda d, t: bar.update(task, completed=d),
                              create=create_kw, batch_size=batch_size)
                if create:
                    out["created"] = collection
                out.update({"collection": collection, "role": role, "ingest_id": r["ingest_id"],
                            "n_rows": r["n_rows"]})
            else:
                if create:
                    out["created"] = db.create_collection(collection, X.shape[1], **create_kw)["name"]
                try:
                    r = db.register_anchor_set(collection, X, y, role=role)
                except BaseException:
                    if create:  # do not leave an empty collection that blocks the retry
                        db.drop_collection(collection, missing_ok=True)
                    raise
                out.update({**r, "role": role})
    except PMVectorError as e:
        fail(str(e))
    if as_json:
        echo_json(out)
    else:
        err.print(f"{out['n_rows']} {role} row(s) written to {collection}.")
