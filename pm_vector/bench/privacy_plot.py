"""The figure of `pm-vector bench privacy --plot`: nn_recall@k and precision@k against epsilon, and
nn_recall@k against the bytes of a request (the other side of epsilon)."""

from __future__ import annotations


def _rows_of(rows: list[dict], m: str) -> list[dict]:
    return [r for r in rows if r["method"] == m]


def _epsilon_panel(ax, result: dict, metric: str, label: str, rows: list[dict], methods: list, colors: list,
                   finite: list, has_inf: bool, x_inf: float) -> None:
    """One epsilon panel: ``metric`` against epsilon (log x), a line per method; downloads and
    non-private methods horizontal lines, the noise-free endpoint a star at the right edge."""
    lo = finite[0] if finite else 1.0
    hi = finite[-1] if finite else 1.0
    for j, m in enumerate(methods):
        col = colors[j % len(colors)]
        mr = [r for r in rows if r["method"] == m]
        if m in ("download_lists", "download_codes"):  # eps 0: one horizontal line per table / code size
            for n, r in enumerate(mr):
                what = f"K={r.get('n_cells')}" if m == "download_lists" else f"{r.get('code_bytes')} B"
                ax.axhline(r[metric], color=col, linestyle=(0, (1 + n, 2)), linewidth=1.2,
                           label=f"{m} {what} (eps 0)")
            continue
        if mr and mr[0]["epsilon"] is None:
            n_flat = sum(1 for mm in methods[:j] if _rows_of(rows, mm) and _rows_of(rows, mm)[0]["epsilon"] is None)
            ax.axhline(mr[0][metric], color=col, linestyle=("--", "-.", ":")[n_flat % 3], linewidth=1.4,
                       label=f"{m} (non-private)")
            continue
        pts = sorted((r["epsilon"], r[metric]) for r in mr if isinstance(r["epsilon"], (int, float))
                     and r["epsilon"] > 0)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=col, label=m, zorder=20 - j)
        nf = [r[metric] for r in mr if r["epsilon"] == "inf"]
        if nf:
            if pts:
                ax.plot([pts[-1][0], x_inf], [pts[-1][1], nf[0]], color=col, linestyle=":", linewidth=1)
            ax.plot([x_inf], nf, marker="*", markersize=14 - min(j, 6), color=col, linestyle="none",
                    label=None if pts else m, zorder=20 - j)
    ax.set_xscale("log")
    ticks = list(finite) + ([x_inf] if has_inf else [])
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{v:g}" for v in finite] + (["noise-free"] if has_inf else []))
    ax.minorticks_off()
    ax.set_xlim(lo / 1.6, (x_inf if has_inf else hi) * 1.6)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("epsilon (per request; * = noise-free endpoint)")
    ax.set_ylabel(label)
    ax.set_title(f"{result['dataset']}: {label} (k'={result['shortlist']}, delta={result['delta']:g})")
    ax.grid(True, alpha=0.3)


def _bandwidth_panel(bw, result: dict, rows: list[dict], methods: list, colors: list) -> None:
    """The bandwidth panel: nn_recall@k against the bytes of a request on the wire (log x), the
    location release one curve per epsilon across its byte budgets."""
    k = result["k"]
    metric = f"nn_recall_at_{k}"
    for j, m in enumerate(methods):
        col = colors[j % len(colors)]
        mr = _rows_of(rows, m)
        pts = [(r["bytes_per_request"], r[metric], r["epsilon"]) for r in mr]
        if not pts:
            continue
        if m.startswith("pm_vector_location"):
            continue  # drawn below: one curve per epsilon across the budgets
        bw.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=col, linestyle="none", label=m)
        for b, v, e in pts:
            if m in ("pm_vector_compact", "pm_vector_raw", "download_lists", "download_codes") or e is None:
                tag = "non-private" if e is None else ("noise-free" if e == "inf" else f"eps {e:g}")
                if m == "download_lists":
                    tag = f"table K={r_cells(mr, b)}"
                if m == "download_codes":
                    tag = f"codes {next((r.get('code_bytes') for r in mr if r['bytes_per_request'] == b), '?')} B"
                bw.annotate(tag, (b, v),
                            textcoords="offset points", xytext=(5, 2), fontsize=7, color=col)
    loc = [r for r in result["results"] if r["method"] == "pm_vector_location"]
    for j, e in enumerate(dict.fromkeys(r["epsilon"] for r in loc)):
        pts = sorted((r["bytes_per_request"], r[metric]) for r in loc if r["epsilon"] == e)
        bw.plot([p[0] for p in pts], [p[1] for p in pts], marker="s", color=colors[j % len(colors)], linewidth=2,
                label=f"pm_vector_location eps {e}")
        bw.annotate(f"location eps {e}", pts[-1], textcoords="offset points", xytext=(5, -8), fontsize=7,
                    color=colors[j % len(colors)])
    bw.set_xscale("log")
    bw.axvline(result["collection_bytes"], color="grey", linewidth=0.8, linestyle=":")
    bw.set_ylim(-0.02, 1.02)
    bw.set_xlabel("bytes per request on the wire (msgpack, both directions; downloads: once; log)")
    bw.set_ylabel(f"nn_recall@{k}")
    bw.set_title(f"{result['dataset']}: nn_recall@{k} against bandwidth (collection "
                 f"{result['collection_bytes'] / 1e6:.1f} MB)")
    bw.grid(True, alpha=0.3)


def plot(result: dict, path) -> None:
    """nn_recall@k and precision@k against epsilon (log x), one line per method; the noise-free
    endpoint a marked point at the right edge, non-private methods horizontal lines."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    k = result["k"]
    rows = result["results"]
    finite = sorted({r["epsilon"] for r in rows if isinstance(r["epsilon"], (int, float)) and r["epsilon"] > 0})
    has_inf = any(r["epsilon"] == "inf" for r in rows)
    hi = finite[-1] if finite else 1.0
    x_inf = hi * 4 if finite else 1.0
    fig, all_axes = plt.subplots(1, 3, figsize=(19, 6.2))
    axes = all_axes[:2]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # the location release has one row per byte budget: one line per budget in the epsilon panels
    rows = [dict(r, method=f"{r['method']} {r['max_bytes'] / 1e3:g} kB") if r["method"] == "pm_vector_location"
            else r for r in rows]
    methods = [m for m in dict.fromkeys(r["method"] for r in rows)]

    for ax, metric, label in zip(axes, (f"nn_recall_at_{k}", f"precision_at_{k}"),
                                 (f"nn_recall@{k}", f"precision@{k}")):
        _epsilon_panel(ax, result, metric, label, rows, methods, colors, finite, has_inf, x_inf)
    # the third dimension of the trade-off: what a request costs on the wire
    _bandwidth_panel(all_axes[2], result, rows, methods, colors)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def r_cells(rows, b):
    """The level K of the download_lists row whose bytes are ``b``."""
    return next((r.get("n_cells") for r in rows if r["bytes_per_request"] == b), "?")
