"""The plot of ``pm-vector bench writes --plot``: the commit-to-answer delay p99 against the rate
asked, one line per system, from :func:`pm_vector.bench.writes_bench.run`'s result."""

from __future__ import annotations

from typing import Any


def plot(result: dict[str, Any], path) -> None:
    """Delay p99 against the rate asked, one line per system (log y), to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = result["config"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for system, style in (("pm_vector", "o-"), ("pgvector_hnsw", "s--")):
        pts = [(r["rate"], r[system]["delay_p99_s"]) for r in result["by_rate"]
               if system in r and r[system]["delay_p99_s"] is not None]
        if pts:
            ax.plot([p[0] for p in pts], [max(p[1], 1e-3) for p in pts], style,
                    label=f"{system} ({cfg['path']})" if system == "pm_vector" else "pgvector HNSW")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([r["rate"] for r in result["by_rate"]])
    ax.set_xticklabels([f"{r['rate']:g}" for r in result["by_rate"]])
    ax.minorticks_off()
    ax.set_xlabel("changes a second asked")
    ax.set_ylabel("commit-to-answer delay p99 (s)")
    ax.set_title(f"writes: {cfg['items']:,} x {cfg['dim']}, {cfg['seconds']:g} s a rate, "
                 f"{cfg['queries_concurrency']} query threads")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
