"""Pipeline-bubble charts: the stage × time schedule diagram of the GPipe/1F1B papers, and bubble vs m.

The schedule is read from the Timeline (one representative GPU per stage); bubbles are its idle gaps.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullLocator, PercentFormatter, ScalarFormatter

from sim.engine.span_table import span_table
from sim.engine.timeline import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    RECOMPUTE,
    STREAM_COMPUTE,
    Span,
    Timeline,
)
from sim.outputs import style
from sim.outputs.dense import WIDE_PX, DenseLayer
from sim.outputs.gantt import (
    MIN_LABEL_PT,
    GanttRow,
    axes_width_pts,
    category_palette,
    draw_spans,
    label_table_blocks,
    legend_handles,
    merged_blocks,
    pixel_columns,
    representative_gpus,
    row_of_spans,
    stages_of,
)
from sim.summary import SummaryView

FIG_WIDTH_IN = 13.0
# Up to this many blocks (and as many bubbles, hatched) every one is a rectangle, as in the papers' diagrams;
# above it, those under WIDE_PX pixels go to the raster layer (hatching thousands of slivers costs seconds).
VECTOR_BLOCKS_MAX = 2_000
# Above this many blocks the SVG holds the blocks and bubbles as one raster (at the PNG's resolution) rather
# than a hatched path each: the main job's 1,500 blocks write in 0.17 s instead of 0.25 s, 87 KB instead of 190.
SVG_VECTOR_BLOCKS_MAX = 500
FloatOrArray = TypeVar("FloatOrArray", float, np.ndarray)  # closed forms work on one m or a grid of them
PIPELINE_CATEGORIES = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, RECOMPUTE)


def idle_gaps(spans: list[Span], t0: float, t1: float) -> list[tuple[float, float]]:
    """Idle intervals ``(start, duration)`` of one stream within ``[t0, t1]`` (overlapping spans merged)."""
    gaps = []
    cursor = t0
    for span in sorted(spans, key=lambda s: s.start_s):
        if span.start_s > cursor:
            gaps.append((cursor, min(span.start_s, t1) - cursor))
        cursor = max(cursor, span.end_s)
        if cursor >= t1:
            break
    if cursor < t1:
        gaps.append((cursor, t1 - cursor))
    return [(start, dur) for start, dur in gaps if dur > 0]


def closed_form_bubble(m: FloatOrArray, p: int, virtual_stages: int = 1) -> FloatOrArray:
    """Bubble fraction (p−1)/(v·m+p−1) of GPipe/1F1B (v=1) and interleaved 1F1B (v>1)."""
    return (p - 1) / (virtual_stages * m + p - 1)


def _row_gaps(starts: np.ndarray, ends: np.ndarray, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
    """``idle_gaps`` on arrays (blocks sorted by start): gap starts and durations within ``[t0, t1]``."""
    cursor = np.maximum.accumulate(np.r_[t0, ends])  # busy-until before each block, then after the last
    gap_start = cursor
    gap_end = np.r_[starts, t1]
    gap_end = np.minimum(gap_end, t1)
    keep = gap_end > gap_start
    return gap_start[keep], (gap_end - gap_start)[keep]


def schedule_figure(timeline: Timeline, summary: SummaryView) -> Figure:
    """Stage rows (stage 0 on top) × time with blocks, micro-batch numbers and hatched bubbles.

    Up to ``VECTOR_BLOCKS_MAX`` blocks every block and bubble is a rectangle; above that, those narrower
    than ``WIDE_PX`` pixels go to one raster layer (``sim.outputs.dense``), so a 10⁵-span run costs what a 10³-span one does."""
    stages = stages_of(timeline)
    reps = representative_gpus(timeline)
    table = span_table(timeline)
    rows = [GanttRow(g, STREAM_COMPUTE, "") for g in reps]
    blocks = merged_blocks(table, row_of_spans(table, rows))
    t0 = float(blocks.start_s.min()) if len(blocks) else 0.0
    t_end = float(blocks.end_s.max()) if len(blocks) else timeline.end_s
    t_end = t_end if t_end > t0 else t0 + 1.0
    # Bubbles are counted up to the last pipeline block: the optimizer step after it is not a bubble.
    pipeline_codes = [i for i, c in enumerate(table.categories) if c in PIPELINE_CATEGORIES]
    in_pipeline = np.isin(blocks.category, pipeline_codes)
    t1 = float(blocks.end_s[in_pipeline].max()) if in_pipeline.any() else t_end
    factor, unit = style.time_scale(t_end - t0)
    chunked = bool((blocks.chunk > 0).any())

    n = len(reps)
    row_in = min(0.5, max(0.15, 16.0 / max(n, 1)))
    fig = Figure(figsize=(FIG_WIDTH_IN, max(3.0, n * row_in + 1.9)), layout="constrained")
    ax = fig.add_subplot()
    row_pts = row_in * 72.0
    labels = [f"stage {stages.get(g, 0)} · gpu{g}" for g in reps]
    ax.set_yticks(range(n), labels=labels, fontsize=max(5.0, min(9.0, row_pts * 0.5)))
    ax.set_ylim(max(n, 1) - 0.5, -0.5)
    ax.set_xlim(t0 * factor, t_end * factor)
    ax.set_xlabel(f"time ({unit})")
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)

    # Everything that takes part in the layout first (the idle shares right of the axes, the titles, the
    # legend), so that the layout is done once; then the blocks and bubbles, which stay inside the axes.
    gaps = [_row_gaps(blocks.start_s[blocks.row == i], blocks.end_s[blocks.row == i], t0, t1) for i in range(n)]
    idle_fractions = [float(gap_dur.sum()) / max(t1 - t0, 1e-12) for _, gap_dur in gaps]
    for i, idle in enumerate(idle_fractions):
        ax.annotate(
            f"{idle:.1%} idle",
            xy=(1.005, i),
            xycoords=("axes fraction", "data"),
            va="center",
            fontsize=8,
            color="#8A3030",
        )
    categories = {table.categories[c] for c in np.unique(blocks.category).tolist()}
    if summary.get("bubble_fraction") is not None:
        bubble = f"bubble fraction {float(summary['bubble_fraction']):.1%}"
    else:
        bubble = f"idle on compute streams {np.mean(idle_fractions) if idle_fractions else 0.0:.1%}"
    name = f"{summary['name']} · " if summary.get("name") else ""
    fig.suptitle(f"Pipeline schedule · {name}{n} stages · {bubble}", fontsize=12)
    ax.set_title(
        "one GPU per stage (lowest id); hatched = bubble (compute stream idle before the last F/B block ends)",
        fontsize=9,
        loc="left",
        color="#444444",
    )
    bubble_patch = Patch(
        facecolor=style.BUBBLE_COLOR, edgecolor="#C07070", hatch=style.BUBBLE_HATCH, label="bubble (idle)"
    )
    handles = legend_handles(categories, chunked, [bubble_patch])
    fig.legend(
        handles=handles, loc="outside lower center", ncols=min(len(handles), 8), frameon=False, fontsize=9
    )

    width_pts = axes_width_pts(fig, ax, final=True)
    pts_per_unit = width_pts / ((t_end - t0) * factor)
    dense = DenseLayer(n, pixel_columns(width_pts), t0 * factor, t_end * factor)
    bubble_id = dense.color_id(style.BUBBLE_COLOR)
    for i, (gap_start, gap_dur) in enumerate(gaps):
        wide = (dense.px(gap_dur * factor) >= WIDE_PX) | (len(blocks) <= VECTOR_BLOCKS_MAX)
        dense.add_many(np.full(int((~wide).sum()), i), np.full(int((~wide).sum()), bubble_id),
                       gap_start[~wide] * factor, gap_dur[~wide] * factor)
        ax.broken_barh(
            list(zip((gap_start[wide] * factor).tolist(), (gap_dur[wide] * factor).tolist(), strict=True)),
            (i - 0.4, 0.8),
            facecolors=style.BUBBLE_COLOR,
            edgecolors="#C07070",
            linewidths=0.0,
            hatch=style.BUBBLE_HATCH,
            zorder=1,
        )

    lut = category_palette(dense, table, chunked)
    odd = (blocks.chunk % 2 == 1) & chunked
    narrow = dense.px((blocks.end_s - blocks.start_s) * factor) < WIDE_PX
    if len(blocks) <= VECTOR_BLOCKS_MAX:
        narrow[:] = False
    nb = blocks.select(narrow)
    dense.add_many(nb.row, lut[2 * nb.category + odd[narrow]], nb.start_s * factor, (nb.end_s - nb.start_s) * factor)
    wb = blocks.select(~narrow)
    for i in range(n):
        mine = np.flatnonzero(wb.row == i).tolist()
        spans = [Span(reps[i], STREAM_COMPUTE, "", table.categories[wb.category[k]], float(wb.start_s[k]),
                      float(wb.end_s[k] - wb.start_s[k]),
                      {"chunk": int(wb.chunk[k])}) for k in mine]
        draw_spans(ax, i, spans, factor, pts_per_unit, chunked)
    block_fs = min(8.0, row_pts * 0.8 * 0.6)
    if block_fs >= MIN_LABEL_PT:
        label_table_blocks(ax, table, blocks, factor, pts_per_unit, block_fs, chunked)
    dense.draw(ax, zorder=1.5)
    if len(blocks) > SVG_VECTOR_BLOCKS_MAX:
        for collection in ax.collections:  # the blocks and bubbles: one raster in the SVG (text stays text)
            collection.set_rasterized(True)
    ax.set_ylim(max(n, 1) - 0.5, -0.5)
    ax.set_xlim(t0 * factor, t_end * factor)
    return fig


def plot_schedule(timeline: Timeline, summary: SummaryView, out_stem: Path) -> list[Path]:
    """Write the schedule diagram as ``out_stem.png`` and ``out_stem.svg``."""
    return style.save_figure(schedule_figure(timeline, summary), Path(out_stem))


ABOVE_CLOSED_FORM = 0.005  # simulated points more than 0.5 points above the line get the note below
SIMULATED_NOTE = (
    "simulated = idle share of each GPU's whole step: besides the\n"
    "schedule's bubble it holds waits around TP/DP collectives and\n"
    "pipeline sends, and the step's tail (DP sync, optimizer);\n"
    "the closed form is the schedule's bubble alone"
)


def bubble_vs_microbatches_figure(points: list[tuple[int, float]], p: int, virtual_stages: int = 1) -> Figure:
    """Simulated bubble fractions (markers) over the closed form (line) against the micro-batch count m."""
    pts = sorted(points)
    ms = np.array([m for m, _ in pts], dtype=float)
    fracs = np.array([f for _, f in pts], dtype=float)
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    ax = fig.add_subplot()
    lo, hi = (ms.min(), ms.max()) if len(ms) else (1.0, 64.0)
    log_x = hi / max(lo, 1e-9) > 10.0
    grid = np.geomspace(lo, hi, 200) if log_x else np.linspace(lo, hi, 200)
    v = virtual_stages
    form = "(p−1)/(m+p−1)" if v == 1 else "(p−1)/(v·m+p−1)"
    ax.plot(
        grid,
        closed_form_bubble(grid, p, v),
        color="#555555",
        linewidth=1.5,
        label=f"closed form {form}",
        zorder=1,
    )
    ax.plot(
        ms,
        fracs,
        linestyle="none",
        marker="o",
        markersize=7,
        color="#0072B2",
        markeredgecolor="white",
        label="simulated",
        zorder=2,
    )
    if log_x:
        ax.set_xscale("log")
    if 0 < len(ms) <= 12:
        ax.xaxis.set_major_locator(FixedLocator(ms.tolist()))
        ax.xaxis.set_minor_locator(NullLocator())
        fmt = ScalarFormatter()
        fmt.set_scientific(False)
        ax.xaxis.set_major_formatter(fmt)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    top = max([closed_form_bubble(lo, p, v), *fracs.tolist()]) if len(ms) else 1.0
    ax.set_ylim(0, top * 1.1 + 0.01)
    ax.set_xlabel("micro-batches per step (m)")
    ax.set_ylabel("bubble fraction")
    ax.grid(color="#DDDDDD", linewidth=0.6)
    ax.legend(frameon=False)
    above = len(ms) and bool(np.any(fracs > closed_form_bubble(ms, p, v) + ABOVE_CLOSED_FORM))
    if above:
        # Say why the markers sit above the line, on the chart itself (they are not a simulation error).
        ax.text(0.99, 0.80, SIMULATED_NOTE, transform=ax.transAxes, ha="right", va="top", fontsize=7.5,
                color="#444444", wrap=True)
    stages = f"p={p} stages" + (f", v={v} virtual stages" if v > 1 else "")
    ax.set_title(f"Pipeline bubble vs micro-batches ({stages})", fontsize=11)
    return fig


def plot_bubble_vs_microbatches(
    points: list[tuple[int, float]], p: int, out_stem: Path, virtual_stages: int = 1
) -> list[Path]:
    """Write the bubble-vs-m chart as ``out_stem.png`` and ``out_stem.svg``."""
    return style.save_figure(bubble_vs_microbatches_figure(points, p, virtual_stages), Path(out_stem))
