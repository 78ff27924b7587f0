"""Helpers of the cluster tests."""

from __future__ import annotations

import os
import signal
import time


def kill_tree(pid: int) -> None:
    """SIGKILL a postmaster and its children (a node that dies with its backends)."""
    from pathlib import Path

    kids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
    for p in [pid] + kids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


