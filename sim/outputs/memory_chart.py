"""Memory per pipeline stage as stacked bars against the GPU capacity, so an OOM is obvious at a glance."""

from __future__ import annotations

from pathlib import Path

from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from sim.outputs import style
from sim.summary import SummaryView
from sim.units import GB

MANY_STAGES = 12  # above this many bars, labels turn vertical and per-bar totals are dropped


def over_capacity(summary: SummaryView) -> dict[int, float]:
    """Stage → bytes above capacity, for every stage whose peak (or stacked total) exceeds the GPU memory."""
    capacity = summary.get("gpu_memory_bytes")
    if capacity is None:
        return {}
    over = {}
    for row in summary.get("memory_by_stage", []):
        need = _need_bytes(row)
        if need > capacity:
            over[int(row["stage"])] = need - capacity
    return over


def _need_bytes(row: dict) -> float:
    stacked = sum(float(row.get(c, 0.0)) for c in style.MEMORY_COMPONENTS)
    return max(stacked, float(row.get("peak", 0.0)))


def memory_figure(summary: SummaryView) -> Figure:
    """Stacked weights / gradients / optimizer / activations / buffers per stage, capacity line, OOM marks."""
    rows = sorted(summary.get("memory_by_stage", []), key=lambda r: int(r["stage"]))
    n = len(rows)
    capacity = summary.get("gpu_memory_bytes")
    over = over_capacity(summary)
    many = n > MANY_STAGES
    fig = Figure(figsize=(max(8.0, min(16.0, 3.5 + 0.45 * n)), 5.2), layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(n))
    bottoms = [0.0] * n
    for comp in style.MEMORY_COMPONENTS:
        heights = [float(r.get(comp, 0.0)) / GB for r in rows]
        ax.bar(
            xs,
            heights,
            bottom=bottoms,
            width=0.7,
            color=style.MEMORY_COLORS[comp],
            label=comp,
            edgecolor="white",
            linewidth=0.5,
            zorder=2,
        )
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]

    tops = []
    peak_marked = False
    for x, row, stacked in zip(xs, rows, bottoms, strict=True):
        peak = float(row.get("peak", 0.0)) / GB
        top = max(stacked, peak)
        tops.append(top)
        if peak > stacked * 1.005:
            # The peak can exceed the sum of parts (transient buffers): show it as a tick above the stack.
            ax.plot([x - 0.35, x + 0.35], [peak, peak], color="black", linewidth=1.5, zorder=3)
            peak_marked = True
        stage = int(row["stage"])
        if stage in over:
            ax.add_patch(
                Rectangle(
                    (x - 0.35, 0), 0.7, top, fill=False, edgecolor=style.OOM_COLOR, linewidth=2.2, zorder=4
                )
            )
            ax.annotate(
                f"OOM +{over[stage] / GB:.1f} GB",
                xy=(x, top),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                color=style.OOM_COLOR,
                fontsize=8,
                fontweight="bold",
                rotation=90 if many else 0,
            )
        elif not many:
            ax.annotate(
                f"{top:.1f}",
                xy=(x, top),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
                color="#333333",
            )

    handles: list[Artist] = [Patch(facecolor=style.MEMORY_COLORS[c], label=c) for c in reversed(style.MEMORY_COMPONENTS)]
    ymax = max(tops, default=1.0)
    if capacity is not None:
        cap_gb = float(capacity) / GB
        handles.append(
            ax.axhline(
                cap_gb,
                color=style.CAPACITY_COLOR,
                linestyle="--",
                linewidth=1.3,
                zorder=3,
                label=f"GPU capacity {cap_gb:.0f} GB",
            )
        )
        ymax = max(ymax, cap_gb)
    if peak_marked:
        handles.append(Line2D([], [], color="black", linewidth=1.5, label="peak (above the parts)"))
    if over:
        handles.append(Patch(facecolor="none", edgecolor=style.OOM_COLOR, linewidth=2, label="over capacity"))
    # Headroom above the tallest bar for its label (vertical OOM labels need more).
    ax.set_ylim(0, ymax * (1.32 if many and over else 1.15))
    ax.set_xticks(
        xs,
        labels=[str(int(r["stage"])) for r in rows] if many else [f"stage {int(r['stage'])}" for r in rows],
        fontsize=8 if many else 9,
    )
    if many and n > 32:
        for i, label in enumerate(ax.get_xticklabels()):
            label.set_visible(i % 4 == 0 or i == n - 1)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("memory per GPU (GB)")
    ax.set_xlim(-0.6, n - 0.4)
    ax.grid(axis="y", color="#DDDDDD", linewidth=0.6, zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)

    fits = summary.get("fits_in_memory", not over)
    verdict = "fits in memory" if fits else "does NOT fit in memory"
    if over:
        worst = max(over, key=lambda s: over[s])
        verdict += f" (worst: stage {worst}, +{over[worst] / GB:.1f} GB)"
    name = f" · {summary['name']}" if summary.get("name") else ""
    fig.suptitle(
        f"Memory per GPU by pipeline stage{name}\n{verdict}",
        fontsize=12,
        color=style.OOM_COLOR if not fits else "black",
    )
    return fig


def plot_memory(summary: SummaryView, out_stem: Path) -> list[Path]:
    """Write the memory chart as ``out_stem.png`` and ``out_stem.svg``."""
    return style.save_figure(memory_figure(summary), Path(out_stem))
