"""Collection names: what a name may be (a leaf every module that takes a name can import)."""

from __future__ import annotations

import re

from ...errors import InvalidInputError

NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}")  # whole names only: fullmatch


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidInputError(
            f"invalid collection name {name!r}: use 1-128 characters from letters, digits and _ . : - "
            "(starting with a letter, digit or _).")
    return name
