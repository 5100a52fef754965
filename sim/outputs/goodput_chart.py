"""Goodput against the checkpoint interval: too often wastes time writing, too rarely loses work.

Drawn from the summary's ``reliability`` block alone (closed-form curve, the Young/Daly optimum, the
interval used and the Monte-Carlo mean with its 95 % interval), so ``dtsim plot`` can redraw it.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.figure import Figure

from sim.outputs import style
from sim.summary import SummaryView
from sim.units import format_hours

CURVE_COLOR = "#0072B2"  # Okabe–Ito blue, as in the other charts
OPTIMUM_COLOR = "#009E73"
CHOSEN_COLOR = "#D55E00"


def _time_label(seconds: float) -> str:
    return format_hours(seconds / 3600) if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _optimum_marker(opt_min: float, lo: float, hi: float) -> tuple[float | None, str]:
    """Where to draw the optimum (minutes) on a plotted range [lo, hi], and how its label ends: an optimum
    outside the range (beyond the run when failures are rare: up to ~1e149 min, which a log axis cannot
    show) is drawn at the range's end and says so; a non-number one is not drawn."""
    if math.isnan(opt_min):
        return None, " (not defined)"
    if opt_min > hi:
        return hi, " — beyond the run; marked at its end"
    if opt_min < lo:
        return lo, " — below the plotted range; marked at its start"
    return opt_min, ""


def goodput_figure(summary: SummaryView) -> Figure:
    rel = summary["reliability"]
    xs = [p["interval_s"] / 60 for p in rel["curve"]]
    ys = [100 * p["goodput"] for p in rel["curve"]]
    fig = Figure(figsize=(8.5, 5.0), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(xs, ys, color=CURVE_COLOR, linewidth=2, label="closed form (Daly 2006)", zorder=2)
    opt = rel["optimal_interval_s"]
    chosen = rel["interval_s"]
    shown = [x for x in [*xs, chosen / 60] if math.isfinite(x) and x > 0]
    opt_x, note = _optimum_marker(opt / 60, min(shown), max(shown)) if shown else (None, " (not drawn)")
    opt_label = f"Young/Daly optimum {_time_label(opt)}{note}"
    if opt_x is not None:
        ax.axvline(opt_x, color=OPTIMUM_COLOR, linestyle="--", linewidth=1.3, label=opt_label, zorder=1)
    else:
        ax.plot([], [], color=OPTIMUM_COLOR, linestyle="--", label=opt_label)  # in the legend only
    ax.plot([chosen / 60], [100 * rel["goodput"]], "o", color=CHOSEN_COLOR, zorder=3,
            label=f"used: every {rel['interval_steps']} steps ({_time_label(chosen)}), "
                  f"{100 * rel['goodput']:.1f} %")
    mc = rel.get("monte_carlo")
    if mc and "wall_s" in mc:
        work = rel["failure_free_s"]
        lo, hi = work / (mc["wall_s"] + mc["wall_ci95_s"]), work / max(mc["wall_s"] - mc["wall_ci95_s"], 1e-9)
        g = 100 * mc["goodput"]
        ax.errorbar([chosen / 60], [g], yerr=[[g - 100 * lo], [100 * hi - g]], fmt="s", color="black",
                    markersize=4, capsize=4, zorder=4,
                    label=f"Monte-Carlo mean, 95 % CI ({mc['trials']} runs)")
    ax.set_xscale("log")
    if shown and max(shown) < 3 * min(shown):  # one point (optimum beyond a short run): show a decade
        ax.set_xlim(min(shown) / 3, max(shown) * 3)
    ax.set_xlabel("compute between checkpoints (minutes, log scale)")
    ax.set_ylabel("goodput (useful / total GPU time, %)")
    ax.grid(color="#DDDDDD", linewidth=0.6, zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(loc="lower center", frameon=False, fontsize=9)
    name = f" · {summary['name']}" if summary.get("name") else ""
    fig.suptitle(f"Goodput vs checkpoint interval{name}\njob MTBF {format_hours(rel['job_mtbf_hours'])}, "
                 f"checkpoint {rel['checkpoint_blocking_s']:.1f} s, restart {rel['restart_s']:.0f} s",
                 fontsize=12)
    return fig


def plot_goodput(summary: SummaryView, out_stem: Path) -> list[Path]:
    """Write the goodput chart as ``out_stem.png`` and ``out_stem.svg``."""
    return style.save_figure(goodput_figure(summary), Path(out_stem))
