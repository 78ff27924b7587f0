"""What the machine did during a benchmark's phase: its cores' busy time, every process's (a
system's server backends, the benchmark's threads, its writer's and sync's processes), read before
and after the phase (:func:`busy_cpu_s`). ``pm-vector bench writes`` reports it per system beside
the rates: on a machine whose cores are all busy, a faster rate asks for less CPU a change."""

from __future__ import annotations

import psutil


def busy_cpu_s() -> float:
    """The machine's cores' busy seconds so far: all their time but idle and I/O wait."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))
