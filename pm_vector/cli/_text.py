"""Text from the database or a user's table, made safe to print on one line: a collection name,
a key, a reason, a table name can never start a line of its own (``"x\\r\\nX-Evil: 1"``), hide
characters (zero-width, bidirectional controls) or ring the terminal."""

from __future__ import annotations

import unicodedata


def printable(text) -> str:
    """``text`` with every control, format, surrogate, private-use, unassigned or line/paragraph
    separator character written as its Python escape (``\\r``, ``\\n``, ``\\x1b``, ``\\u200b``);
    a backslash is doubled, so an escape in the output always means an escaped character."""
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)
