"""Shared look of every dtsim chart: colours, units and atomic figure writing.

Colours come from the Okabe–Ito palette (compute) and Paul Tol's muted palette (communication), both
chosen to stay distinguishable under the common forms of colour blindness. Charts never pick colours
themselves, so the same category looks the same everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.layout_engine import PlaceHolderLayoutEngine

from sim.engine import timeline as tl
from sim.outputs.writers import atomic_open
from sim.summary import SummaryView
from sim.units import MS, US, format_duration

# Category → fill colour. Compute categories (Okabe–Ito) and communication categories (Tol muted) live on
# different rows of a Gantt chart, so the two palettes only have to be distinct within themselves.
# Interleaved schedules draw odd virtual chunks in a lighter shade of the same colour (as in the Megatron
# paper), so no compute colour may be close to a lightened one.
CATEGORY_COLORS: dict[str, str] = {
    tl.FORWARD: "#0072B2",  # blue
    tl.BACKWARD: "#E69F00",  # orange
    tl.BACKWARD_INPUT: "#D55E00",  # vermillion: B of zero-bubble schedules
    tl.BACKWARD_WEIGHT: "#009E73",  # bluish green: W of zero-bubble schedules
    tl.RECOMPUTE: "#F0E442",  # yellow, hatched as well (not a blue: lighter blues mark odd virtual chunks)
    tl.OPTIMIZER: "#CC79A7",  # reddish purple
    tl.COMPUTE: "#AAAAAA",  # grey: anything else on a compute stream
    tl.GRAD_ACCUM: "#88CCEE",  # cyan: per-micro-batch gradient accumulation
    tl.CLIP_GRAD: "#AA4499",  # purple: gradient-norm pass
    tl.FSDP_COPY: "#A6761D",  # ochre: FSDP's flat-grad copy, pre-divide and shard cast
    tl.WEIGHT_CAST: "#44475A",  # slate: fp8 weight casts, once per step
    tl.DATA: "#DDDDDD",  # pale grey: loading a micro-batch
    tl.INTERFERENCE: "#FF6666",  # light red: compute lost to overlapped communication
    tl.COMM_TP: "#999933",  # olive
    tl.COMM_DP: "#332288",  # indigo
    tl.COMM_PP: "#882255",  # wine
    tl.COMM_EMB: "#117733",  # green: tied-embedding gradient all-reduce
    tl.COMM_CLIP: "#661100",  # brown: gradient-norm all-reduce
    tl.COMM_EP: "#DDCC77",  # sand: expert-parallel all-to-all
    tl.COMM_CP: "#CC6677",  # rose: context-parallel K/V ring
    tl.COMM: "#44AA99",  # teal: a standalone collective workload
}
CATEGORY_HATCHES: dict[str, str] = {tl.RECOMPUTE: "////"}
CATEGORY_LABELS: dict[str, str] = {
    tl.FORWARD: "forward (F)",
    tl.BACKWARD: "backward (B)",
    tl.BACKWARD_INPUT: "backward input (B)",
    tl.BACKWARD_WEIGHT: "backward weight (W)",
    tl.RECOMPUTE: "recompute",
    tl.OPTIMIZER: "optimizer",
    tl.COMPUTE: "other compute",
    tl.GRAD_ACCUM: "grad accumulation",
    tl.CLIP_GRAD: "grad-norm clipping",
    tl.FSDP_COPY: "FSDP copies",
    tl.WEIGHT_CAST: "fp8 weight casts",
    tl.DATA: "data loading",
    tl.INTERFERENCE: "slowed by comm",
    tl.COMM_EMB: "embedding grad all-reduce",
    tl.COMM_CLIP: "grad-norm all-reduce",
    tl.COMM_TP: "TP collective",
    tl.COMM_DP: "DP collective",
    tl.COMM_PP: "PP send/recv",
    tl.COMM_EP: "EP all-to-all",
    tl.COMM_CP: "CP K/V exchange",
    tl.COMM: "collective",
}
CATEGORY_ORDER: tuple[str, ...] = tl.COMPUTE_CATEGORIES + tl.COMM_CATEGORIES
UNKNOWN_COLOR = "#777777"

IDLE_COLOR = "#EFEFEF"  # row background: what shows through is idle time
BUBBLE_COLOR = "#F4CCCC"  # pipeline bubbles in the schedule chart
BUBBLE_HATCH = "xx"
OOM_COLOR = "#C00000"
CAPACITY_COLOR = "#222222"

# Memory components, in stacking order (bottom first).
MEMORY_COMPONENTS: tuple[str, ...] = ("weights", "gradients", "optimizer", "activations", "buffers")
MEMORY_COLORS: dict[str, str] = {
    "weights": "#0072B2",
    "gradients": "#E69F00",
    "optimizer": "#CC79A7",
    "activations": "#009E73",
    "buffers": "#BBBBBB",
}

STREAM_ORDER: tuple[str, ...] = (tl.STREAM_COMPUTE, tl.STREAM_COMM, tl.STREAM_P2P)
PNG_DPI = 110
CHART_FORMATS = ("png", "svg")  # every chart is written in each (save_figure)
PNG_COMPRESS_LEVEL = 3  # zlib level: the Gantt of a large run encodes in 0.04 s instead of 0.08 s, 5 % larger


def category_color(category: str) -> str:
    """Colour of a span category; unknown categories get a neutral grey rather than an error."""
    return CATEGORY_COLORS.get(category, UNKNOWN_COLOR)


def category_label(category: str) -> str:
    return CATEGORY_LABELS.get(category, category)


def category_rank(category: str) -> int:
    """Position in legends: compute first, then communication, then anything unknown."""
    try:
        return CATEGORY_ORDER.index(category)
    except ValueError:
        return len(CATEGORY_ORDER)


def stream_rank(stream: str) -> tuple[int, str]:
    """Order streams compute, comm, p2p, then others alphabetically."""
    return (STREAM_ORDER.index(stream) if stream in STREAM_ORDER else len(STREAM_ORDER), stream)


def text_color_on(fill: str) -> str:
    """Black or white text, whichever reads better on ``fill`` (relative luminance)."""
    r, g, b = to_rgb(fill)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.45 else "white"


def lighten(color: str, amount: float) -> tuple[float, float, float]:
    """Blend ``color`` towards white by ``amount`` in [0, 1]."""
    r, g, b = to_rgb(color)
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def time_scale(extent_s: float) -> tuple[float, str]:
    """Factor and unit to show times of about ``extent_s`` seconds with readable numbers."""
    if extent_s < 2 * MS:
        return 1 / US, "µs"
    if extent_s < 2.0:
        return 1 / MS, "ms"
    return 1.0, "s"


def save_figure(fig: Figure, out_stem: Path) -> list[Path]:
    """Write ``out_stem.png`` and ``out_stem.svg`` atomically; a reader never sees a half-written chart.

    SVG text stays text (not paths) so the files are searchable and small; metadata without dates keeps
    repeated runs byte-identical.
    """
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    engine = fig.get_layout_engine()
    if engine is not None:
        # Lay the figure out once for both formats (each savefig would redo it: a quarter of the cost), then
        # drop the engine altogether: with any engine left, even matplotlib's placeholder, every savefig first
        # draws the whole figure once without output (text layout included) before its real draw.
        if not isinstance(engine, PlaceHolderLayoutEngine):
            engine.execute(fig)
        with matplotlib.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
            fig.set_layout_engine(None)  # None, whatever a user's matplotlibrc asks for
    written = []
    options_of: dict[str, dict[str, Any]] = {"png": {"metadata": {"Software": None}, "pil_kwargs": {"compress_level": PNG_COMPRESS_LEVEL}},
                  "svg": {"metadata": {"Date": None}}}
    for fmt in CHART_FORMATS:
        options = options_of[fmt]
        final = out_stem.with_name(f"{out_stem.name}.{fmt}")
        with atomic_open(final, "wb") as fh, matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "dtsim"}):
            fig.savefig(fh, format=fmt, dpi=PNG_DPI, **options)
        written.append(final)
    return written


def title_figures(summary: SummaryView) -> str:
    """Key figures of a run for a chart title: name, GPUs, step time, bubble, MFU (those present)."""
    parts = []
    if summary.get("name"):
        parts.append(str(summary["name"]))
    if summary.get("num_gpus") is not None:
        parts.append(f"{summary['num_gpus']} GPUs")
    if summary.get("step_time_s") is not None:
        parts.append(f"step {format_duration(float(summary['step_time_s']))}")
    if summary.get("bubble_fraction") is not None:
        parts.append(f"bubble {float(summary['bubble_fraction']):.1%}")
    if summary.get("mfu") is not None:
        parts.append(f"MFU {float(summary['mfu']):.1%}")
    return " · ".join(parts)
