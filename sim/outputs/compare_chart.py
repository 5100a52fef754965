"""Charts of many runs: compare (small multiples, one panel per figure of merit) and sweep (throughput and
memory per grid point, coloured by feasibility).

Horizontal bars keep long scenario names readable; each scenario keeps one colour across panels, and
every bar carries its value, so the chart reads without the CSV. Points that do not fit in memory are
hatched in the OOM colour; invalid points are marked where their bar would be, with the reason in the CSV.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from sim.outputs import style

# Okabe–Ito without black and yellow (hard to read as thin bars): one colour per compared scenario.
SCENARIO_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#999999", "#332288")
OK_COLOR = "#0072B2"
INVALID_COLOR = "#999999"

# (row key, panel title, scale, unit, lower is better)
COMPARE_PANELS: tuple[tuple[str, str, float, str, bool], ...] = (
    ("step_time_s", "step time", 1.0, "s", True),
    ("tokens_per_s", "throughput", 1e-3, "k tokens/s", False),
    ("mfu", "MFU", 100.0, "%", False),
    ("bubble_fraction", "pipeline bubble", 100.0, "%", True),
    ("exposed_comm_s", "exposed communication / step", 1.0, "s", True),
    ("peak_memory_GB", "peak memory / GPU", 1.0, "GB", True),
    ("cost_per_1M_tokens_usd", "cost / 1M tokens", 1.0, "$", True),
    ("time_to_train_days", "time to train", 1.0, "days", True),
)


ZERO_EPS = 1e-9  # |value| below this (in the panel's unit) is rounding dust from float arithmetic


def _zero_dust(value: float) -> float:
    return 0.0 if abs(value) < ZERO_EPS else value


def _fmt(value: float) -> str:
    if abs(value) < 1e-9:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def compare_figure(rows: list[dict]) -> Figure:
    """One panel per figure of merit, scenarios as horizontal bars in the same colour everywhere."""
    panels = [p for p in COMPARE_PANELS if any(r.get(p[0]) is not None for r in rows)]
    n = len(rows)
    cols = 4 if len(panels) > 6 else 3
    nrows = -(-len(panels) // cols)
    label_w = max(len(r["label"]) for r in rows)
    fig = Figure(figsize=(3.4 * cols + 0.07 * label_w, (0.45 + 0.32 * n) * nrows + 1.3), layout="constrained")
    axes = fig.subplots(nrows, cols, sharey=True, squeeze=False)
    ys = list(range(n))
    colors = [SCENARIO_COLORS[i % len(SCENARIO_COLORS)] for i in range(n)]
    for k, ax in enumerate(axes.flat):
        if k >= len(panels):
            ax.set_visible(False)
            continue
        key, title, scale, unit, lower = panels[k]
        # Float dust (a bubble of 7.65e-17) is zero: drawn as no bar, printed "0", on a sane axis.
        vals = [None if r.get(key) is None else _zero_dust(r[key] * scale) / scale for r in rows]
        xs = [v * scale if v is not None else 0.0 for v in vals]
        bars = ax.barh(ys, xs, color=colors, height=0.7, zorder=2)
        for i, (bar, v) in enumerate(zip(bars, vals, strict=True)):
            no_fit = key == "peak_memory_GB" and rows[i].get("fits_in_memory") is False
            if no_fit:
                bar.set_hatch(style.BUBBLE_HATCH)
                bar.set_edgecolor(style.OOM_COLOR)
            text = "n/a" if v is None else _fmt(v * scale) + (" OOM" if no_fit else "")
            ax.annotate(
                text,
                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                color=style.OOM_COLOR if no_fit else "#222222",
            )
        if key == "peak_memory_GB":
            caps = {float(r["gpu_memory_GB"]) for r in rows if r.get("gpu_memory_GB")}
            for cap in caps:
                ax.axvline(cap, color=style.CAPACITY_COLOR, linestyle="--", linewidth=1, zorder=3)
            if caps:
                unit += ", dashed: GPU capacity " + " / ".join(f"{c:.0f}" for c in sorted(caps))
        best = "lower is better" if lower else "higher is better"
        ax.set_title(f"{title}\n({unit}, {best})", fontsize=9)
        ax.grid(axis="x", color="#DDDDDD", zorder=0)
        ax.margins(x=0.28)
        ax.set_xlim(left=0)
        if max(xs, default=0.0) <= 0.0:
            ax.set_xlim(0, 1)  # every value is zero: a unit axis, not one autoscaled to nothing
        ax.tick_params(labelsize=8)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0][0].set_yticks(ys, [r["label"] for r in rows])
    axes[0][0].invert_yaxis()
    fig.suptitle(f"dtsim compare: {n} scenarios", fontsize=11)
    return fig


def plot_compare(rows: list[dict], out_stem: Path) -> list[Path]:
    """compare.png and compare.svg."""
    return style.save_figure(compare_figure(rows), Path(out_stem))


def sweep_figure(rows: list[dict], keys: list[str] | None = None, title: str = "") -> Figure:
    """Throughput (top) and peak memory against capacity (bottom) per grid point, coloured by status.

    Tick labels are the point's grid values joined by " · " (the keys name the x axis); a thin line
    separates groups of the first key."""
    n = len(rows)
    fig = Figure(figsize=(min(24.0, max(8.0, 1.5 + 0.42 * n)), 7.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    xs = list(range(n))
    tput_max = max([r.get("tokens_per_s") or 0.0 for r in rows] + [1.0]) / 1e3
    for i, r in enumerate(rows):
        status = r.get("status")
        tput = (r.get("tokens_per_s") or 0.0) / 1e3
        if status == "invalid" or status == "error":
            top.plot([i], [0], marker="x", color=INVALID_COLOR, markersize=9, zorder=3)
            top.annotate(
                status,
                (i, tput_max * 0.06),
                rotation=90,
                ha="center",
                va="bottom",
                fontsize=7,
                color="#555555",
            )
            continue
        no_fit = status == "no-fit"
        kw = (
            dict(color="white", edgecolor=style.OOM_COLOR, hatch=style.BUBBLE_HATCH)
            if no_fit
            else dict(color=OK_COLOR)
        )
        top.bar([i], [tput], width=0.75, zorder=2, **kw)
        if n <= 40:
            top.annotate(
                _fmt(tput),
                (i, tput),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                rotation=90 if n > 12 else 0,
                va="bottom",
            )
        peak = r.get("peak_memory_GB") or 0.0
        bottom.bar([i], [peak], width=0.75, zorder=2, **kw)
    caps = {float(r["gpu_memory_GB"]) for r in rows if r.get("gpu_memory_GB")}
    for cap in caps:
        bottom.axhline(cap, color=style.CAPACITY_COLOR, linestyle="--", linewidth=1, zorder=3)
    top.set_ylabel("throughput (k tokens/s)")
    top.set_ylim(0, tput_max * 1.18)
    bottom.set_ylabel("peak memory / GPU (GB)")
    for ax in (top, bottom):
        ax.grid(axis="y", color="#DDDDDD", zorder=0)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    keys = [k for k in (keys or []) if all(k in r for r in rows)]
    if keys:
        labels = [" · ".join(str(r[k]) for k in keys) for r in rows]
        bottom.set_xlabel(" · ".join(k.rsplit(".", 1)[-1] for k in keys))
        if len(keys) > 1:
            for i in range(1, n):
                if rows[i][keys[0]] != rows[i - 1][keys[0]]:
                    for ax in (top, bottom):
                        ax.axvline(i - 0.5, color="#BBBBBB", linewidth=0.8, zorder=1)
    else:
        labels = [r.get("label", str(i)) for i, r in enumerate(rows)]
    step = max(1, n // 60)
    longest = max(len(x) for x in labels)
    turn = n > 6 and longest * n > 90
    bottom.set_xticks(
        xs[::step], labels[::step], rotation=60 if turn else 0, ha="right" if turn else "center", fontsize=8
    )
    handles: list[Artist] = [
        Patch(color=OK_COLOR, label="fits"),
        Patch(
            facecolor="white",
            edgecolor=style.OOM_COLOR,
            hatch=style.BUBBLE_HATCH,
            label="does not fit in memory",
        ),
        Patch(color=INVALID_COLOR, label="invalid (× ; reason in sweep.csv)"),
    ]
    if caps:
        handles.append(Line2D([], [], color=style.CAPACITY_COLOR, linestyle="--", label="GPU memory"))
    top.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ok = sum(1 for r in rows if r.get("status") == "ok")
    fig.suptitle(f"{title + ': ' if title else ''}{n} points, {ok} feasible", fontsize=11)
    return fig


def plot_sweep(
    rows: list[dict], out_stem: Path, keys: list[str] | None = None, title: str = ""
) -> list[Path]:
    """sweep.png and sweep.svg."""
    return style.save_figure(sweep_figure(rows, keys, title), Path(out_stem))
