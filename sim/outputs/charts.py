"""Draw every chart of a result from its timeline and summary (used by ``run`` and ``plot``)."""

from __future__ import annotations

from pathlib import Path

from sim.engine.timeline import Timeline
from sim.outputs.bubble import plot_schedule
from sim.outputs.gantt import plot_gantt
from sim.outputs.goodput_chart import plot_goodput
from sim.outputs.memory_chart import plot_memory


def chart_stems(summary: dict) -> list[str]:
    """The charts a result with this summary gets, by stem (gantt, pipeline, memory, goodput): known before
    drawing, so ``dtsim plot`` in place can refuse first when one of their files is the user's."""
    stems = ["gantt"]
    if summary.get("workload") not in (None, "collective"):
        pipeline = (summary.get("parallel") or {}).get("pipeline", 1)
        if isinstance(pipeline, int) and pipeline > 1:
            stems.append("pipeline")
        if summary.get("memory_by_stage"):
            stems.append("memory")
        if summary.get("reliability"):
            stems.append("goodput")
    return stems


def draw_all(timeline: Timeline, summary: dict, out_dir: Path, skip: tuple[str, ...] = (),
             only: tuple[str, ...] | None = None) -> list[Path]:
    """Every chart of a run (``chart_stems``); ``skip`` or ``only`` split them between two processes
    (``sim.outputs.run_files``)."""
    draw = {"gantt": lambda stem: plot_gantt(timeline, summary, stem),
            "pipeline": lambda stem: plot_schedule(timeline, summary, stem),
            "memory": lambda stem: plot_memory(summary, stem),
            "goodput": lambda stem: plot_goodput(summary, stem)}
    out_dir = Path(out_dir)
    paths: list[Path] = []
    for stem in chart_stems(summary):
        if stem not in skip and (only is None or stem in only):
            paths += draw[stem](out_dir / stem)
    return paths
