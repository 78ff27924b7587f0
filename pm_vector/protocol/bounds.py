"""The wire types of a request: what each number, flag and list a client sends must be.

One home for the bounds, so that the client that builds a request, the HTTP service that
parses one and :mod:`pm_vector.db` that answers one refuse the same things (the request types of
:mod:`pm_vector.protocol` -- :class:`~pm_vector.protocol.class_rows.ClassRowsRequest`,
:class:`~pm_vector.protocol.cell_request.CellRequest`, :class:`~pm_vector.protocol.paper.PrivateMailRequest`
and :class:`~pm_vector.protocol.paper.ReleaseRequest` -- check their fields with these helpers):

* a number is a JSON number (an int or a float, numpy's included), never a boolean or a string,
  finite, and within :data:`MAX_ABS_VALUE`;
* a flag is ``true`` or ``false``, never a string or a number;
* ``k'`` (candidates per query row) is an integer in ``1..MAX_K_PRIME``, and so is the paper's ``k``;
  a request has at most :data:`MAX_QUERY_ROWS` query rows;
* a list of per-row numbers is flat (a nested list is refused, not flattened);
* ``epsilon >= MIN_EPSILON`` and ``MIN_DELTA <= delta < 1``: below them the noise is so large
  that the release answers nothing (and subnormal values such as 1e-320 make the calibration's
  arithmetic meaningless);
* the paper protocol's ``classical`` Gaussian mechanism only below :data:`CLASSICAL_MAX_EPSILON`
  (its calibration is proven for eps < 1 only);
* the paper request's ``params`` hold only :data:`PAPER_PARAMS` (and the frame's
  :data:`FRAME_PARAMS`), each a bounded number, flag or short string: the request log stores
  this validated form, nothing a client invents.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

import numpy as np

from ..errors import InvalidInputError

#: smallest epsilon of a request (the noise grows like 1/epsilon; below this a release says nothing)
MIN_EPSILON = 1e-3
#: smallest delta of a request (1e-12 is far below 1/n for any collection this serves)
MIN_DELTA = 1e-12
#: largest |value| of any number in a request (rows, noise scales, sensitivity). The largest a
#: valid client sends, at MIN_EPSILON and MIN_DELTA, is below 1e8; 1e12 keeps every squared
#: distance pgvector computes in float32 finite (256 x (2e12)^2 ~ 1e27 < 3.4e38).
MAX_ABS_VALUE = 1e12
#: candidates per query row an answer may hold: ``k'`` (a class-rows or cell request's
#: ``shortlist``) and the paper resolve's ``k``. The run's graph keeps this many top hubs per
#: class and the run's first this-many item ids (the zero-score fill), so it is also the most a
#: service may be set to allow (``ServiceSettings.max_shortlist``).
MAX_K_PRIME = 1000
#: query rows per request (each is one HNSW index scan of the resolve statement)
MAX_QUERY_ROWS = 1000
#: the classical Gaussian mechanism's calibration holds for epsilon < 1 only
CLASSICAL_MAX_EPSILON = 1.0
#: post-processing iterations a paper request may name (and a release-only request ask for)
#: longest string anchor id of the paper's requests (ids are ``"S:i"``)
MAX_ANCHOR_ID_CHARS = 200
MAX_POST_ITER = 2000
#: longest string value in a paper request's params (e.g. label_graph "between")
MAX_PARAM_STR = 64
#: the paper protocol's noise mechanisms (pm_vector.client.privatemail)
PAPER_MECHANISMS = ("analytic", "classical")
#: longest digest of published public data a request names (frames, cells, location cells)
MAX_DIGEST_CHARS = 64
#: longest collection name a request names (the collection it was built for)
MAX_COLLECTION_CHARS = 200
#: the paper request's params (pm_vector.client.privatemail.PrivateMail.request)
PAPER_PARAMS = ("dp_sigma", "dp_alpha", "n_post_iter", "post_alpha", "frame", "seeded")
#: params["frame"]: the AnchorFrame's parameters (pm_vector.client.privatemail.frame_params)
FRAME_PARAMS = ("n_components", "sigma", "label_sigma", "alpha", "n_iter", "n_extend_iter", "n_neighbors",
                "label_graph", "label_encoding", "seed")


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def number(v: Any, name: str, *, lo: float = -MAX_ABS_VALUE, hi: float = MAX_ABS_VALUE, lo_open: bool = False,
           hi_open: bool = False) -> float:
    """``v`` as a float if it is a finite real number (not a boolean) in the range, else
    :class:`InvalidInputError` naming the field and the range."""
    ok = _is_number(v)
    f = float(v) if ok else math.nan
    if ok and math.isfinite(f):
        ok = (f > lo if lo_open else f >= lo) and (f < hi if hi_open else f <= hi)
    else:
        ok = False
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise InvalidInputError(f"{name} must be a number in {rng}, got {str(v)[:40]!r}.")
    return f


def integer(v: Any, name: str, lo: int, hi: int) -> int:
    """``v`` as an int if it is an integer (not a boolean, not a float) in ``lo..hi``."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not lo <= int(v) <= hi:
        raise InvalidInputError(f"{name} must be an integer in {lo}..{hi}, got {str(v)[:40]!r}.")
    return int(v)


def shortlist(v: Any) -> int:
    """``k'`` (a request's ``shortlist``): an integer in ``1..MAX_K_PRIME``."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 1 <= int(v) <= MAX_K_PRIME:
        raise InvalidInputError(f"k' (the request's shortlist) must be an integer in 1..{MAX_K_PRIME}, "
                                f"got {v!r}.")
    return int(v)


def k_neighbours(v: Any) -> int:
    """``k`` (neighbours per query row of the paper's resolve): an integer in ``1..MAX_K_PRIME``."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 1 <= int(v) <= MAX_K_PRIME:
        raise InvalidInputError(f"k must be an integer in 1..{MAX_K_PRIME}, got {v!r}.")
    return int(v)


def pure_epsilon(e: Any) -> float:
    """Epsilon of a pure-eps release (the wire's ``PureEpsilon``): a number > 0, or infinity (``"inf"`` too)."""
    if isinstance(e, str) and e.lower() in ("inf", "infinity"):
        e = float("inf")
    if isinstance(e, (bool, np.bool_)) or not isinstance(e, (int, float, np.floating, np.integer)) or \
            not (float(e) > 0) or math.isnan(float(e)):
        raise InvalidInputError(f"epsilon must be a number > 0 (or inf); got {e!r:.40}.")
    return float(e)


def zero_delta(d: Any, what: str) -> float:
    """Delta of a pure-eps release (the wire's ``ZeroDelta``): 0; ``what``: the request, in the message."""
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, float, np.floating)) or float(d) != 0.0:
        raise InvalidInputError(f"{what} is pure eps: delta must be 0; got {d!r:.40}.")
    return 0.0


def digest(v: Any, message: str, *, empty: bool = False) -> str:
    """A digest of published data (the wire's ``Digest``): a string of 1 (0 when ``empty``) to
    :data:`MAX_DIGEST_CHARS` characters, else ``message``."""
    if not isinstance(v, str) or not (0 if empty else 1) <= len(v) <= MAX_DIGEST_CHARS:
        raise InvalidInputError(message)
    return v


def collection(v: Any) -> str | None:
    """The collection a request was built for (the wire's ``Collection``): None or a name of at most
    :data:`MAX_COLLECTION_CHARS` characters."""
    if v is not None and (not isinstance(v, str) or len(v) > MAX_COLLECTION_CHARS):
        raise InvalidInputError("collection must be a collection name.")
    return v


def flag(v: Any, name: str) -> bool:
    """``v`` if it is ``True`` or ``False`` (numpy's too); a string or a number is refused."""
    if not isinstance(v, (bool, np.bool_)):
        raise InvalidInputError(f"{name} must be true or false, got {str(v)[:40]!r}.")
    return bool(v)


def number_list(v: Any, name: str, n: int, *, lo: float = -MAX_ABS_VALUE, hi: float = MAX_ABS_VALUE,
                lo_open: bool = False) -> list[float]:
    """``n`` numbers as a flat list (a list, a tuple or a 1-d array of numbers; nested lists are
    refused), each within the range."""
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.kind not in "iuf":
            raise InvalidInputError(f"{name} must be a flat list of {n} numbers (one per row).")
        v = v.tolist()
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise InvalidInputError(f"{name} must be a flat list of {n} numbers (one per row).")
    return [number(x, f"{name}[{i}]", lo=lo, hi=hi, lo_open=lo_open) for i, x in enumerate(v)]


def check_values(a: np.ndarray, name: str) -> None:
    """Every value of the finite array ``a`` within :data:`MAX_ABS_VALUE`."""
    if a.size and float(np.max(np.abs(a))) > MAX_ABS_VALUE:
        bad = int(np.argwhere(np.abs(a) > MAX_ABS_VALUE)[0][0])
        raise InvalidInputError(f"{name} holds a value beyond +-{MAX_ABS_VALUE:g} (first at row {bad}); no valid "
                                "client sends one.")


def privacy(epsilon: Any, delta: Any) -> tuple[float, float]:
    """``(epsilon, delta)`` of a request: epsilon >= MIN_EPSILON, MIN_DELTA <= delta < 1."""
    return (number(epsilon, "epsilon", lo=MIN_EPSILON),
            number(delta, "delta", lo=MIN_DELTA, hi=1.0, hi_open=True))


def mechanism(name: Any, epsilon: float, known: tuple[str, ...] = PAPER_MECHANISMS) -> str:
    """The paper protocol's noise mechanism; ``classical`` only for epsilon < CLASSICAL_MAX_EPSILON."""
    if not isinstance(name, str) or name not in known:
        raise InvalidInputError(f"mechanism must be one of {list(known)}, got {str(name)[:40]!r}.")
    if name == "classical" and epsilon >= CLASSICAL_MAX_EPSILON:
        raise InvalidInputError(f"the classical Gaussian mechanism is calibrated for epsilon < "
                                f"{CLASSICAL_MAX_EPSILON:g} only (got {epsilon:g}); use mechanism 'analytic'.")
    return name


def param_value(v: Any, name: str):
    """One value of a paper request's params: null, a flag, a 64-bit integer, a short string or a bounded number."""
    if v is None or isinstance(v, (bool, np.bool_)):
        return None if v is None else bool(v)
    if isinstance(v, (int, np.integer)):
        return integer(v, name, -2 ** 63, 2 ** 63 - 1)
    if isinstance(v, str):
        if len(v) > MAX_PARAM_STR or "\x00" in v:
            raise InvalidInputError(f"{name} must be a string of at most {MAX_PARAM_STR} characters (no NUL).")
        return v
    return number(v, name)


def paper_params(params: Any) -> dict[str, Any]:
    """The validated form of a paper request's ``params``: known keys only (:data:`PAPER_PARAMS`,
    ``frame``'s :data:`FRAME_PARAMS`), each a bounded number, a flag, null or a short string."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise InvalidInputError("params must be a JSON object.")
    unknown = sorted(map(str, set(params) - set(PAPER_PARAMS)))
    if unknown:
        raise InvalidInputError(f"unknown params {unknown[:10]}; a PrivateMail request's params are "
                                f"{list(PAPER_PARAMS)}.")
    out: dict[str, Any] = {}
    for k, v in params.items():
        if k == "frame":
            if not isinstance(v, Mapping):
                raise InvalidInputError("params.frame must be a JSON object of the anchor frame's parameters.")
            bad = sorted(map(str, set(v) - set(FRAME_PARAMS)))
            if bad:
                raise InvalidInputError(f"unknown params.frame keys {bad[:10]}; they are {list(FRAME_PARAMS)}.")
            out[k] = {fk: param_value(fv, f"params.frame.{fk}") for fk, fv in v.items()}
        elif k == "seeded":
            out[k] = flag(v, "params.seeded")
        elif k == "n_post_iter":
            out[k] = integer(v, "params.n_post_iter", 0, MAX_POST_ITER)
        else:
            out[k] = param_value(v, f"params.{k}")
    return out
