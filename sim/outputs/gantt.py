"""Gantt chart of a Timeline: one row per GPU and stream, so idle time and overlap are visible at a glance.

Large runs switch to one representative GPU per pipeline stage; everything drawn comes from the Timeline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.engine.timeline import FORWARD, STREAM_COMPUTE, Span, Timeline
from sim.outputs import style

FIG_WIDTH_IN = 14.0
MIN_LABEL_PT = 5.0  # smaller micro-batch numbers are unreadable; leave those blocks blank


@dataclass(frozen=True)
class GanttRow:
    """One drawn row: a stream of a GPU and the label shown for it."""

    gpu: int
    stream: str
    label: str


# ---------------------------------------------------------------------------------------------- selection


def all_gpus(timeline: Timeline) -> list[int]:
    """GPUs in the Timeline's own order; spans are the fallback when ``gpus`` was left empty."""
    return list(timeline.gpus) or sorted({s.gpu for s in timeline.spans})


def stages_of(timeline: Timeline) -> dict[int, int]:
    """Pipeline stage per GPU: ``stage_of`` first, else the ``stage`` arg of the GPU's compute spans."""
    stages = dict(timeline.stage_of)
    for span in timeline.spans:
        if span.gpu not in stages and "stage" in span.args:
            stages[span.gpu] = int(span.args["stage"])
    return stages


def representative_gpus(timeline: Timeline) -> list[int]:
    """The lowest GPU id of each pipeline stage, ordered by stage (GPUs without a stage count as stage 0)."""
    stages = stages_of(timeline)
    best: dict[int, int] = {}
    for gpu in all_gpus(timeline):
        stage = stages.get(gpu, 0)
        if stage not in best or gpu < best[stage]:
            best[stage] = gpu
    return [best[s] for s in sorted(best)]


def _streams_by_gpu(spans: Iterable[Span]) -> dict[int, list[str]]:
    found: dict[int, set[str]] = defaultdict(set)
    for span in spans:
        found[span.gpu].add(span.stream)
    return {gpu: sorted(streams, key=style.stream_rank) for gpu, streams in found.items()}


def _gpu_label(timeline: Timeline, gpu: int) -> str:
    label = timeline.labels.get(gpu, f"gpu{gpu}")
    copies = timeline.represents.get(gpu, 1)
    return f"{label} (×{copies})" if copies > 1 else label


def _rows_for(timeline: Timeline, gpus: list[int], streams: dict[int, list[str]]) -> list[GanttRow]:
    # A GPU without spans still gets a (fully idle) compute row: an idle GPU is worth seeing.
    return [
        GanttRow(gpu, stream, f"{_gpu_label(timeline, gpu)} · {stream}")
        for gpu in gpus
        for stream in streams.get(gpu, [STREAM_COMPUTE])
    ]


def _evenly_spaced(items: list[int], k: int) -> list[int]:
    """``k`` items spread over the list, always keeping the first and the last."""
    if k >= len(items):
        return list(items)
    idx = sorted({int(round(i)) for i in np.linspace(0, len(items) - 1, max(k, 1))})
    return [items[i] for i in idx]


def gantt_rows(timeline: Timeline, max_rows: int = 64) -> tuple[list[GanttRow], str]:
    """Rows to draw and a note saying what was left out ("" when every GPU is shown).

    Above ``max_rows`` rows we keep the lowest GPU id of each pipeline stage (the stages are what differ;
    data- and tensor-parallel peers look alike); if that is still too many, evenly spaced stages.
    """
    streams = _streams_by_gpu(timeline.spans)
    gpus = all_gpus(timeline)
    rows = _rows_for(timeline, gpus, streams)
    if len(rows) <= max_rows:
        return rows, ""
    stages = stages_of(timeline)
    reps = representative_gpus(timeline)
    per_stage = defaultdict(int)
    for gpu in gpus:
        per_stage[stages.get(gpu, 0)] += 1
    most = max(per_stage.values())
    few = "" if min(per_stage.values()) == most else "up to "
    note = f"showing 1 of {few}{most} GPUs per stage (lowest id): {len(reps)} of {len(gpus)} GPUs"
    rows = _rows_for(timeline, reps, streams)
    keep = len(reps)
    while len(rows) > max_rows and keep > 1:
        keep -= 1
        rows = _rows_for(timeline, _evenly_spaced(reps, keep), streams)
    if keep < len(reps):
        note += f", {keep} of {len(reps)} stages"
    return rows, note


# ------------------------------------------------------------------------------------------------ drawing


def _row_height_in(n_rows: int) -> float:
    """Rows stay about 0.3 in tall up to 64 rows, then shrink so huge charts remain openable."""
    return min(0.32, max(0.12, 20.0 / max(n_rows, 1)))


def draw_spans(
    ax: Axes, y: float, spans: list[Span], factor: float, pts_per_unit: float, chunked: bool
) -> set[str]:
    """Draw one row's spans grouped by colour; returns the categories drawn."""
    groups: dict[tuple[str, bool], list[Span]] = defaultdict(list)
    for span in spans:
        odd_chunk = chunked and int(span.args.get("chunk", 0)) % 2 == 1
        groups[(span.category, odd_chunk)].append(span)
    for (category, odd_chunk), members in groups.items():
        color = style.category_color(category)
        fill = style.lighten(color, 0.45) if odd_chunk else color
        xranges = [(s.start_s * factor, s.dur_s * factor) for s in members]
        # White separators only where a block is wide enough to keep its colour visible.
        widths = [0.4 if w * pts_per_unit > 4 else 0.0 for _, w in xranges]
        ax.broken_barh(
            xranges,
            (y - 0.4, 0.8),
            facecolors=fill,
            edgecolors="white",
            linewidths=widths,
            hatch=style.CATEGORY_HATCHES.get(category),
            zorder=2,
        )
    return {category for category, _ in groups}


def merge_pipeline_blocks(spans: list[Span]) -> list[Span]:
    """Join consecutive compute spans of one action (same category, micro-batch, chunk) into one block,
    as pipeline diagrams draw them: the gaps inside are the action's own tensor-parallel waits."""
    out: list[Span] = []
    for sp in sorted(spans, key=lambda x: x.start_s):
        key = (sp.category, sp.args.get("microbatch"), sp.args.get("chunk", 0))
        if out and key[1] is not None:
            last = out[-1]
            if (last.category, last.args.get("microbatch"), last.args.get("chunk", 0)) == key:
                out[-1] = Span(last.gpu, last.stream, last.name, last.category, last.start_s,
                               sp.end_s - last.start_s, last.args)
                continue
        out.append(sp)
    return out


def label_blocks(
    ax: Axes, y: float, spans: list[Span], factor: float, pts_per_unit: float, fontsize: float, chunked: bool
) -> int:
    """Write micro-batch numbers on the blocks of one row; returns how many were written.

    Blocks of one category share a font size (shrunk down to 5 pt so two-digit numbers still fit); a
    block too narrow even then stays unlabelled rather than overflowing into its neighbours.
    """
    groups: dict[str, list[tuple[Span, str, float]]] = defaultdict(list)
    for span in spans:
        if "microbatch" in span.args:
            text = str(span.args["microbatch"])
            fits = (span.dur_s * factor * pts_per_unit - 3) / (len(text) * 0.62)
            groups[span.category].append((span, text, fits))
    written = 0
    for category, members in groups.items():
        size = max(MIN_LABEL_PT, min(fontsize, min(fits for _, _, fits in members)))
        for span, text, fits in members:
            if fits < size:
                continue
            fill = style.category_color(category)
            if chunked and int(span.args.get("chunk", 0)) % 2 == 1:
                fill = style.lighten(fill, 0.45)
            ax.text(
                (span.start_s + span.dur_s / 2) * factor,
                y,
                text,
                ha="center",
                va="center",
                fontsize=size,
                color=style.text_color_on(fill),
                clip_on=True,
                zorder=3,
            ).set_in_layout(False)
            written += 1
    return written


def legend_handles(categories: Iterable[str], chunked: bool, extra: list[Patch] | None = None) -> list[Patch]:
    """Legend entries for the categories present only, in the canonical order."""
    handles = [
        Patch(
            facecolor=style.category_color(c),
            hatch=style.CATEGORY_HATCHES.get(c),
            edgecolor="white",
            label=style.category_label(c),
        )
        for c in sorted(set(categories), key=style.category_rank)
    ]
    if chunked:
        handles.append(
            Patch(
                facecolor=style.lighten(style.category_color(FORWARD), 0.45),
                label="lighter: odd virtual chunk",
            )
        )
    return handles + (extra or [])


def axes_width_pts(fig: Figure, ax: Axes) -> float:
    """Width of ``ax`` in points once the layout engine has placed it (decides which labels fit)."""
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
    return ax.get_position().width * fig.get_figwidth() * 72.0


def time_extent(spans: Iterable[Span], end_s: float) -> tuple[float, float]:
    starts, ends = [0.0], [end_s]
    for s in spans:
        starts.append(s.start_s)
        ends.append(s.end_s)
    lo, hi = min(starts), max(ends)
    return lo, (hi if hi > lo else lo + 1.0)


def gantt_figure(timeline: Timeline, summary: dict, max_rows: int = 64) -> Figure:
    """Build the Gantt figure without writing it, so tests and reports can inspect or embed it."""
    rows, note = gantt_rows(timeline, max_rows)
    n = len(rows)
    row_in = _row_height_in(n)
    fig = Figure(figsize=(FIG_WIDTH_IN, max(3.2, n * row_in + 2.1)), layout="constrained")
    ax = fig.add_subplot()

    index = {(r.gpu, r.stream): i for i, r in enumerate(rows)}
    by_row: dict[int, list[Span]] = defaultdict(list)
    for span in timeline.spans:
        i = index.get((span.gpu, span.stream))
        if i is not None:
            by_row[i].append(span)
    drawn = [s for spans in by_row.values() for s in spans]
    lo, hi = time_extent(drawn, timeline.end_s)
    factor, unit = style.time_scale(hi - lo)
    chunked = any(int(s.args.get("chunk", 0)) > 0 for s in drawn)

    row_pts = row_in * 72.0
    label_fs = max(5.0, min(9.0, row_pts * 0.55))
    ax.set_yticks(range(n), labels=[r.label for r in rows], fontsize=label_fs)
    ax.set_ylim(max(n, 1) - 0.5, -0.5)
    ax.set_xlim(lo * factor, hi * factor)
    ax.set_xlabel(f"time ({unit})")
    ax.tick_params(axis="y", length=0)
    ax.grid(axis="x", color="#D0D0D0", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    # Light background per row: whatever shows through between blocks is idle time.
    ax.barh(range(n), (hi - lo) * factor, left=lo * factor, height=0.8, color=style.IDLE_COLOR, zorder=0.1)
    for i in range(1, n):
        if rows[i].gpu != rows[i - 1].gpu:
            ax.axhline(i - 0.5, color="#B0B0B0", linewidth=0.6, zorder=0.2)

    pts_per_unit = axes_width_pts(fig, ax) / ((hi - lo) * factor)
    categories: set[str] = set()
    block_fs = min(7.0, row_pts * 0.8 * 0.6)
    for i, spans in by_row.items():
        categories |= draw_spans(ax, i, spans, factor, pts_per_unit, chunked)
        if block_fs >= MIN_LABEL_PT:
            label_blocks(ax, i, merge_pipeline_blocks(spans), factor, pts_per_unit, block_fs, chunked)

    idle = Patch(facecolor=style.IDLE_COLOR, edgecolor="#B0B0B0", label="idle")
    handles = legend_handles(categories, chunked, [idle])
    fig.legend(
        handles=handles, loc="outside lower center", ncols=min(len(handles), 8), frameon=False, fontsize=9
    )
    fig.suptitle(style.title_figures(summary) or "Timeline", fontsize=12)
    if note:
        ax.set_title(note, fontsize=9, loc="left", color="#444444")
    return fig


def plot_gantt(timeline: Timeline, summary: dict, out_stem: Path, max_rows: int = 64) -> list[Path]:
    """Write ``out_stem.png`` and ``out_stem.svg``; returns the two paths."""
    return style.save_figure(gantt_figure(timeline, summary, max_rows), Path(out_stem))
