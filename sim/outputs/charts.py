"""Draw every chart of a result from its timeline and summary (used by ``run`` and ``plot``)."""

from __future__ import annotations

from pathlib import Path

from sim.engine.timeline import Timeline
from sim.outputs.bubble import plot_schedule
from sim.outputs.gantt import plot_gantt
from sim.outputs.goodput_chart import plot_goodput
from sim.outputs.memory_chart import plot_memory


def draw_all(timeline: Timeline, summary: dict, out_dir: Path, skip: tuple[str, ...] = (),
             only: tuple[str, ...] | None = None) -> list[Path]:
    """Every chart of a run (by stem: gantt, pipeline, memory, goodput); ``skip`` or ``only`` split them between
    two processes (``sim.outputs.run_files``)."""
    def want(stem: str) -> bool:
        return stem not in skip and (only is None or stem in only)

    out_dir = Path(out_dir)
    paths = list(plot_gantt(timeline, summary, out_dir / "gantt")) if want("gantt") else []
    if summary.get("workload") not in (None, "collective"):
        if (summary.get("parallel") or {}).get("pipeline", 1) > 1 and want("pipeline"):
            paths += plot_schedule(timeline, summary, out_dir / "pipeline")
        if summary.get("memory_by_stage") and want("memory"):
            paths += plot_memory(summary, out_dir / "memory")
        if summary.get("reliability") and want("goodput"):
            paths += plot_goodput(summary, out_dir / "goodput")
    return paths
