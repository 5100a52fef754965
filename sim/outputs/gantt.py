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

from sim.engine.span_table import NO_MICROBATCH, SpanTable, span_table
from sim.engine.timeline import FORWARD, STREAM_COMPUTE, Span, Timeline
from sim.outputs import style
from sim.outputs.dense import WIDE_PX, DenseLayer

FIG_WIDTH_IN = 14.0
MIN_LABEL_PT = 5.0  # smaller micro-batch numbers are unreadable; leave those blocks blank
# Up to this many drawn spans every span is its own rectangle (a 16-GPU run draws in ~1 s); above it,
# spans narrower than WIDE_PX pixels are summed per pixel column into one raster layer (sim.outputs.dense).
VECTOR_SPANS_MAX = 20_000


@dataclass(frozen=True)
class GanttRow:
    """One drawn row: a stream of a GPU and its full label ("<GPU label> · <stream>"; the chart writes the
    GPU part once per GPU, see ``tick_labels``)."""

    gpu: int
    stream: str
    label: str


def tick_labels(rows: list[GanttRow]) -> list[str]:
    """The y labels: a GPU's first row names the GPU and its stream, the rows below it (up to the next
    separator line) the stream alone; a GPU's label is long and said once it is as clear (and a fraction of
    the text to lay out and render)."""
    return [row.label if i == 0 or rows[i - 1].gpu != row.gpu else row.stream for i, row in enumerate(rows)]


# ---------------------------------------------------------------------------------------------- selection


def all_gpus(timeline: Timeline) -> list[int]:
    """GPUs in the Timeline's own order; spans are the fallback when ``gpus`` was left empty."""
    return list(timeline.gpus) or sorted({s.gpu for s in timeline.spans})


def stages_of(timeline: Timeline) -> dict[int, int]:
    """Pipeline stage per GPU: ``stage_of`` first, else the ``stage`` arg of the GPU's compute spans."""
    stages = dict(timeline.stage_of)
    if timeline.gpus and all(g in stages for g in timeline.gpus):
        return stages  # every GPU placed: no need to read 10⁵ spans
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


def _streams_by_gpu(timeline: Timeline) -> dict[int, list[str]]:
    table = span_table(timeline)
    found: dict[int, set[str]] = defaultdict(set)
    width = max(len(table.streams), 1)
    for key in np.unique(table.gpu * width + table.stream).tolist():
        gpu, stream = divmod(key, width)
        found[gpu].add(table.streams[stream])
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
    streams = _streams_by_gpu(timeline)
    gpus = all_gpus(timeline)
    rows = _rows_for(timeline, gpus, streams)
    if len(rows) <= max_rows:
        return rows, ""
    stages = stages_of(timeline)
    reps = representative_gpus(timeline)
    per_stage: defaultdict[int, int] = defaultdict(int)
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


def span_fill(category: str, odd_chunk: bool):
    """Fill colour of a block: the category's colour, lighter for odd virtual chunks."""
    color = style.category_color(category)
    return style.lighten(color, 0.45) if odd_chunk else color


def draw_spans(
    ax: Axes,
    y: float,
    spans: list[Span],
    factor: float,
    pts_per_unit: float,
    chunked: bool,
) -> set[str]:
    """Draw one row's spans grouped by colour, each a rectangle; returns the categories drawn."""
    groups: dict[tuple[str, bool], list[Span]] = defaultdict(list)
    for span in spans:
        odd_chunk = chunked and int(span.args.get("chunk", 0)) % 2 == 1
        groups[(span.category, odd_chunk)].append(span)
    for (category, odd_chunk), members in groups.items():
        fill = span_fill(category, odd_chunk)
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


def axes_width_pts(fig: Figure, ax: Axes, final: bool = False) -> float:
    """Width of ``ax`` in points once the layout engine has placed it (decides which labels fit).

    ``final``: every artist that takes part in the layout (tick labels, titles, legends, annotations outside
    the axes) is in place, so this layout is the figure's last: the engine is then swapped for matplotlib's
    placeholder, and saving does not lay the figure out a second time (``style.save_figure``)."""
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
        if final:
            fig.set_layout_engine("none")
    return ax.get_position().width * fig.get_figwidth() * 72.0


def pixel_columns(width_pts: float) -> int:
    """Pixel columns of an axes ``width_pts`` wide in the PNG (one raster column per pixel)."""
    return max(1, int(round(width_pts / 72.0 * style.PNG_DPI)))


def row_of_spans(table: SpanTable, rows: list[GanttRow]) -> np.ndarray:
    """Chart row of every span of ``table`` (−1 for spans of GPUs/streams not drawn)."""
    width = max(len(table.streams), 1)
    code = {name: i for i, name in enumerate(table.streams)}
    row_keys = np.array([r.gpu * width + code.get(r.stream, -1) if r.stream in code else -1 for r in rows],
                        dtype=np.int64)
    if not len(table) or not len(row_keys):
        return np.full(len(table), -1, dtype=np.int64)
    order = np.argsort(row_keys, kind="stable")
    sorted_keys = row_keys[order]
    span_keys = table.gpu * width + table.stream
    pos = np.clip(np.searchsorted(sorted_keys, span_keys), 0, len(sorted_keys) - 1)
    return np.where(sorted_keys[pos] == span_keys, order[pos], -1)


def category_palette(layer: DenseLayer, table: SpanTable, chunked: bool) -> np.ndarray:
    """Palette index per (category code · 2 + odd chunk), registered in the canonical category order so the
    picture does not depend on the order spans were recorded in (a redraw from files is byte-identical)."""
    lut = np.zeros(2 * max(len(table.categories), 1), dtype=np.int64)
    for code in sorted(range(len(table.categories)), key=lambda c: (style.category_rank(table.categories[c]),
                                                                    table.categories[c])):
        for odd in (False, True) if chunked else (False,):
            lut[2 * code + odd] = layer.color_id(span_fill(table.categories[code], odd))
    return lut


def draw_table_rows(
    ax: Axes,
    timeline: Timeline,
    table: SpanTable,
    row_of: np.ndarray,
    dense: DenseLayer,
    factor: float,
    pts_per_unit: float,
    chunked: bool,
) -> set[str]:
    """Draw the spans with a row: narrow ones into ``dense`` (only when there are more than
    ``VECTOR_SPANS_MAX``), the others as rectangles (in start order)."""
    drawn = row_of >= 0
    odd = (table.chunk % 2 == 1) & chunked
    px = table.dur_s * factor * dense.px_per_unit
    if int(drawn.sum()) <= VECTOR_SPANS_MAX:
        px = np.full(len(table), np.inf)  # few enough: every span a rectangle, as pipeline diagrams draw them
    narrow = np.flatnonzero(drawn & (px < WIDE_PX))
    lut = category_palette(dense, table, chunked)
    dense.add_many(row_of[narrow], lut[2 * table.category[narrow] + odd[narrow]],
                   table.start_s[narrow] * factor, table.dur_s[narrow] * factor)
    categories = {table.categories[c] for c in np.unique(table.category[drawn]).tolist()}
    wide = np.flatnonzero(drawn & (px >= WIDE_PX))
    wide = wide[np.lexsort((table.start_s[wide], row_of[wide]))]
    spans = timeline.spans
    bounds = np.flatnonzero(np.diff(row_of[wide])) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(wide)], strict=True):
        if hi > lo:
            draw_spans(ax, int(row_of[wide[lo]]), [spans[k] for k in wide[lo:hi].tolist()], factor,
                       pts_per_unit, chunked)
    return categories


@dataclass(frozen=True)
class Blocks:
    """Merged pipeline blocks as columns (see ``merged_blocks``)."""

    row: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    category: np.ndarray  # code into the table's categories
    microbatch: np.ndarray
    chunk: np.ndarray

    def __len__(self) -> int:
        return len(self.start_s)

    def select(self, mask: np.ndarray) -> Blocks:
        return Blocks(*(getattr(self, f)[mask] for f in ("row", "start_s", "end_s", "category", "microbatch",
                                                          "chunk")))


def merged_blocks(table: SpanTable, row_of: np.ndarray) -> Blocks:
    """``merge_pipeline_blocks`` of every chart row at once: consecutive spans of a row (by start) with the
    same category, micro-batch and chunk form one block from the first start to the last end."""
    idx = np.flatnonzero(row_of >= 0)
    idx = idx[np.lexsort((table.start_s[idx], row_of[idx]))]
    row, cat, mb, ch = row_of[idx], table.category[idx], table.microbatch[idx], table.chunk[idx]
    same = (row[1:] == row[:-1]) & (cat[1:] == cat[:-1]) & (mb[1:] == mb[:-1]) & (ch[1:] == ch[:-1])
    new = np.r_[True, ~(same & (mb[1:] != NO_MICROBATCH))] if len(idx) else np.zeros(0, dtype=bool)
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(idx)] - 1
    return Blocks(row[first], table.start_s[idx[first]], table.end_s[idx[last]], cat[first], mb[first], ch[first])


def label_table_blocks(
    ax: Axes,
    table: SpanTable,
    blocks: Blocks,
    factor: float,
    pts_per_unit: float,
    fontsize: float,
    chunked: bool,
) -> int:
    """Micro-batch numbers for every row at once on ``blocks``; blocks of a (row,
    category) share a font size; blocks too narrow for it stay unlabelled. Returns labels written."""
    b = blocks.select(blocks.microbatch != NO_MICROBATCH)
    if not len(b):
        return 0
    digits = np.char.str_len(b.microbatch.astype(str))
    fits = ((b.end_s - b.start_s) * factor * pts_per_unit - 3) / (digits * 0.62)
    group = b.row * max(len(table.categories), 1) + b.category
    order = np.argsort(group, kind="stable")
    bounds = np.flatnonzero(np.diff(group[order])) + 1
    written = 0
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(order)], strict=True):
        members = order[lo:hi]
        size = max(MIN_LABEL_PT, min(fontsize, float(fits[members].min())))
        for k in members[fits[members] >= size].tolist():
            fill = span_fill(table.categories[b.category[k]], bool(chunked and b.chunk[k] % 2 == 1))
            ax.text(
                (b.start_s[k] + (b.end_s[k] - b.start_s[k]) / 2) * factor,
                int(b.row[k]),
                str(int(b.microbatch[k])),
                ha="center",
                va="center",
                fontsize=size,
                color=style.text_color_on(fill),
                clip_on=True,
                zorder=3,
            ).set_in_layout(False)
            written += 1
    return written


def gantt_figure(timeline: Timeline, summary: dict, max_rows: int = 64) -> Figure:
    """Build the Gantt figure without writing it, so tests and reports can inspect or embed it.

    Up to ``VECTOR_SPANS_MAX`` spans, each is a rectangle. Above that, spans at least ``WIDE_PX`` pixels wide
    stay rectangles and narrower ones (most of a large run) are summed per pixel column into one raster
    layer, so the cost follows the picture's size, not the timeline's."""
    rows, note = gantt_rows(timeline, max_rows)
    table = span_table(timeline)
    n = len(rows)
    row_in = _row_height_in(n)
    fig = Figure(figsize=(FIG_WIDTH_IN, max(3.2, n * row_in + 2.1)), layout="constrained")
    ax = fig.add_subplot()

    row_of = row_of_spans(table, rows)
    drawn = row_of >= 0
    lo = min(0.0, float(table.start_s[drawn].min())) if drawn.any() else 0.0
    hi = max(timeline.end_s, float(table.end_s[drawn].max())) if drawn.any() else timeline.end_s
    hi = hi if hi > lo else lo + 1.0
    factor, unit = style.time_scale(hi - lo)
    chunked = bool((table.chunk[drawn] > 0).any())

    row_pts = row_in * 72.0
    label_fs = max(5.0, min(9.0, row_pts * 0.55))
    ax.set_yticks(range(n), labels=tick_labels(rows), fontsize=label_fs)
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

    # Legend and titles before the layout, so that it is the only one (the spans drawn next stay inside the
    # axes and the block numbers are out of the layout).
    categories = {table.categories[c] for c in np.unique(table.category[drawn]).tolist()}
    idle = Patch(facecolor=style.IDLE_COLOR, edgecolor="#B0B0B0", label="idle")
    handles = legend_handles(categories, chunked, [idle])
    fig.legend(
        handles=handles, loc="outside lower center", ncols=min(len(handles), 8), frameon=False, fontsize=9
    )
    fig.suptitle(style.title_figures(summary) or "Timeline", fontsize=12)
    if note:
        ax.set_title(note, fontsize=9, loc="left", color="#444444")

    width_pts = axes_width_pts(fig, ax, final=True)
    pts_per_unit = width_pts / ((hi - lo) * factor)
    dense = DenseLayer(n, pixel_columns(width_pts), lo * factor, hi * factor)
    draw_table_rows(ax, timeline, table, row_of, dense, factor, pts_per_unit, chunked)
    block_fs = min(7.0, row_pts * 0.8 * 0.6)
    if block_fs >= MIN_LABEL_PT:
        # Numbers on the compute rows only: a communication row's spans of one micro-batch (its forward and
        # backward collectives) would merge into one block spanning the compute between them.
        blocks = merged_blocks(table, row_of)
        on_compute = np.array([r.stream == STREAM_COMPUTE for r in rows] or [False], dtype=bool)
        label_table_blocks(ax, table, blocks.select(on_compute[blocks.row]), factor, pts_per_unit, block_fs,
                           chunked)
    dense.draw(ax)
    ax.set_ylim(max(n, 1) - 0.5, -0.5)
    ax.set_xlim(lo * factor, hi * factor)
    return fig


def plot_gantt(timeline: Timeline, summary: dict, out_stem: Path, max_rows: int = 64) -> list[Path]:
    """Write ``out_stem.png`` and ``out_stem.svg``; returns the two paths."""
    return style.save_figure(gantt_figure(timeline, summary, max_rows), Path(out_stem))
