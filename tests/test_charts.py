"""Charts: real image files, the expected rows/labels, representative mode on large runs, OOM marking."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import pytest
from matplotlib.patches import Rectangle

from sim.engine import timeline as tl
from sim.engine.timeline import Span, Timeline
from sim.outputs import style
from sim.outputs.bubble import (
    bubble_vs_microbatches_figure,
    closed_form_bubble,
    idle_gaps,
    plot_bubble_vs_microbatches,
    plot_schedule,
    schedule_figure,
)
from sim.outputs.gantt import gantt_figure, gantt_rows, plot_gantt, representative_gpus
from sim.outputs.memory_chart import memory_figure, over_capacity, plot_memory

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GB = 1e9


def gpipe_timeline(
    p: int = 4, m: int = 8, tf: float = 0.010, tb: float = 0.020, dp: int = 1, tp: int = 1, comm: bool = True
) -> Timeline:
    """A GPipe step laid out as the closed form says: all forwards, then all backwards, then the optimizer.

    GPU id = d·p·tp + s·tp + k, so the lowest id of stage s is s·tp.
    """
    t = Timeline()
    pipeline_end = (m + p - 1) * (tf + tb)
    for d in range(dp):
        for s in range(p):
            for k in range(tp):
                g = d * p * tp + s * tp + k
                t.gpus.append(g)
                t.stage_of[g] = s
                t.labels[g] = f"gpu{g} dp{d} tp{k} pp{s}" if dp * tp > 1 else f"gpu{g} pp{s}"
                for i in range(m):
                    f_start = (i + s) * tf
                    b_start = (m + p - 1) * tf + (i + p - 1 - s) * tb
                    args = {"microbatch": i, "stage": s, "chunk": 0}
                    t.add(Span(g, tl.STREAM_COMPUTE, f"F{i}", tl.FORWARD, f_start, tf, dict(args)))
                    t.add(Span(g, tl.STREAM_COMPUTE, f"B{i}", tl.BACKWARD, b_start, tb, dict(args)))
                    if comm and s < p - 1:
                        t.add(
                            Span(
                                g,
                                tl.STREAM_P2P,
                                f"send F{i}",
                                tl.COMM_PP,
                                f_start + tf,
                                tf / 10,
                                {"bytes": 1e6, "op": "send", "microbatch": i},
                            )
                        )
                    if comm and s > 0:
                        t.add(
                            Span(
                                g,
                                tl.STREAM_P2P,
                                f"send B{i}",
                                tl.COMM_PP,
                                b_start + tb,
                                tb / 10,
                                {"bytes": 1e6, "op": "send", "microbatch": i},
                            )
                        )
                    if comm and tp > 1:
                        t.add(
                            Span(
                                g,
                                tl.STREAM_COMM,
                                "tp ar",
                                tl.COMM_TP,
                                f_start + tf / 2,
                                tf / 5,
                                {"bytes": 1e6, "op": "all_reduce"},
                            )
                        )
                if comm:
                    t.add(
                        Span(
                            g,
                            tl.STREAM_COMM,
                            "dp ar",
                            tl.COMM_DP,
                            pipeline_end,
                            0.015,
                            {"bytes": 1e8, "op": "all_reduce"},
                        )
                    )
                t.add(Span(g, tl.STREAM_COMPUTE, "optimizer", tl.OPTIMIZER, pipeline_end + 0.015, 0.005, {}))
    t.end_s = pipeline_end + 0.02
    return t


SUMMARY = {"name": "gpipe-p4-m8", "num_gpus": 4, "step_time_s": 0.35, "bubble_fraction": 3 / 11, "mfu": 0.41}


def assert_images(paths: list[Path], stem: Path) -> str:
    """Both files exist, the PNG decodes to a real image; returns the SVG text."""
    assert paths == [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")]
    png, svg = paths
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    img = mpimg.imread(png)
    assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 400 and img.shape[2] in (3, 4)
    text = svg.read_text(encoding="utf-8")
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    # Atomic writes leave no temporary files behind.
    assert not [p for p in png.parent.iterdir() if p.name.endswith(".tmp")]
    return text


# ------------------------------------------------------------------------------------------------- gantt


def test_gantt_small_writes_png_and_svg_with_one_row_per_gpu_and_stream(tmp_path: Path) -> None:
    timeline = gpipe_timeline()
    stem = tmp_path / "out" / "gantt"
    svg = assert_images(plot_gantt(timeline, SUMMARY, stem), stem)
    rows, note = gantt_rows(timeline)
    assert note == ""
    assert len(rows) == 12  # 4 GPUs × compute, comm, p2p
    assert rows[0].label == "gpu0 pp0 · compute"
    assert [r.stream for r in rows[:3]] == ["compute", "comm", "p2p"]
    for label in ("gpu3 pp3 · compute", ">p2p<", "gpipe-p4-m8", "bubble 27.3%", "MFU 41.0%"):
        assert label in svg


def test_gantt_figure_has_labels_microbatch_numbers_units_and_only_present_categories() -> None:
    fig = gantt_figure(gpipe_timeline(), SUMMARY)
    ax = fig.axes[0]
    # A GPU is named on its first row only; its other streams' rows (down to the separator) say the stream.
    assert [t.get_text() for t in ax.get_yticklabels()][:4] == ["gpu0 pp0 · compute", "comm", "p2p",
                                                                "gpu1 pp1 · compute"]
    assert ax.get_xlabel() == "time (ms)"
    numbers = [t.get_text() for t in ax.texts]
    # 4 stages × 8 micro-batches × (F + B), each block 10-20 ms wide out of 350 ms: all labelled.
    assert len(numbers) == 64 and numbers.count("7") == 8
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["forward (F)", "backward (B)", "optimizer", "DP collective", "PP send/recv", "idle"]
    assert "TP collective" not in legend
    assert "4 GPUs" in fig.get_suptitle() and "step 350 ms" in fig.get_suptitle()


def test_gantt_numbers_micro_batches_on_compute_rows_only() -> None:
    """A communication row's spans of one micro-batch (the collectives of its backward) would merge into one
    block as wide as the compute between them: only compute rows carry micro-batch numbers."""
    t = gpipe_timeline()
    p, m, tf, tb = 4, 8, 0.010, 0.020
    for i in range(m):  # two collectives in each backward of the last stage, at its start and near its end
        b_start = (m + p - 1) * tf + i * tb
        for start in (b_start, b_start + 0.8 * tb):
            t.add(Span(3, tl.STREAM_COMM, f"tp ar mb{i}", tl.COMM_TP, start, tb / 10, {"microbatch": i}))
    fig = gantt_figure(t, SUMMARY)
    rows, _ = gantt_rows(t)
    texts = fig.axes[0].texts
    assert len(texts) == 64  # 4 stages × 8 micro-batches × (F + B), as without the collectives
    assert {rows[round(x.get_position()[1])].stream for x in texts} == {tl.STREAM_COMPUTE}


def test_gantt_representative_mode_above_max_rows(tmp_path: Path) -> None:
    timeline = gpipe_timeline(p=8, m=4, dp=4, tp=4)  # 128 GPUs × 3 streams = 384 rows
    assert len(timeline.gpus) == 128
    rows, note = gantt_rows(timeline, max_rows=64)
    assert sorted({r.gpu for r in rows}) == [0, 4, 8, 12, 16, 20, 24, 28] == representative_gpus(timeline)
    assert len(rows) == 24
    assert "showing 1 of 16 GPUs per stage" in note and "8 of 128 GPUs" in note
    stem = tmp_path / "big"
    svg = assert_images(plot_gantt(timeline, dict(SUMMARY, num_gpus=128), stem), stem)
    assert "showing 1 of 16 GPUs per stage" in svg
    assert "gpu28 dp0 tp0 pp7 · compute" in svg and "gpu29 dp0 tp1 pp7" not in svg
    # Below the threshold every GPU is drawn.
    rows_all, note_all = gantt_rows(timeline, max_rows=400)
    assert len(rows_all) == 384 and note_all == ""


def test_gantt_thins_stages_when_even_one_gpu_per_stage_is_too_many() -> None:
    timeline = gpipe_timeline(p=64, m=2, dp=2, comm=False)
    rows, note = gantt_rows(timeline, max_rows=16)
    stages = [timeline.stage_of[r.gpu] for r in rows]
    assert len(rows) == 16 and stages[0] == 0 and stages[-1] == 63
    assert "16 of 64 stages" in note


def test_gantt_figure_height_scales_with_rows() -> None:
    small = gantt_figure(gpipe_timeline(p=2, m=2, comm=False), {})
    large = gantt_figure(gpipe_timeline(p=8, m=2, tp=2), {})  # 48 rows
    assert large.get_figheight() > 3 * small.get_figheight()


# --------------------------------------------------------------------------------------- schedule / bubble


def test_schedule_rows_are_stages_and_bubbles_match_closed_form(tmp_path: Path) -> None:
    timeline = gpipe_timeline(p=4, m=8, dp=2, tp=2)
    fig = schedule_figure(timeline, SUMMARY)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"stage {s} · gpu{2 * s}" for s in range(4)]
    idle_labels = [t.get_text() for t in ax.texts if t.get_text().endswith("idle")]
    assert idle_labels == ["27.3% idle"] * 4  # (p-1)/(m+p-1) = 3/11 on every stage
    assert "bubble fraction 27.3%" in fig.get_suptitle()
    stem = tmp_path / "schedule"
    svg = assert_images(plot_schedule(timeline, SUMMARY, stem), stem)
    assert "bubble (idle)" in svg and "stage 3 · gpu6" in svg


def test_idle_gaps_merges_overlaps_and_clips_to_window() -> None:
    spans = [
        Span(0, "compute", "a", tl.FORWARD, 1.0, 2.0),
        Span(0, "compute", "b", tl.FORWARD, 2.0, 2.0),
        Span(0, "compute", "c", tl.FORWARD, 6.0, 1.0),
    ]
    assert idle_gaps(spans, 0.0, 8.0) == [(0.0, 1.0), (4.0, 2.0), (7.0, 1.0)]


def test_bubble_vs_microbatches_line_is_closed_form_and_log_x_over_a_decade(tmp_path: Path) -> None:
    points = [(m, closed_form_bubble(m, 4)) for m in (1, 2, 4, 8, 16, 32, 64)]
    fig = bubble_vs_microbatches_figure(points, p=4)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    line, markers = ax.lines
    for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
        assert y == pytest.approx(3 / (x + 3))
    assert list(markers.get_xdata()) == [1, 2, 4, 8, 16, 32, 64]
    assert closed_form_bubble(4, 8, 2) == pytest.approx(7 / 15)
    narrow = bubble_vs_microbatches_figure([(4, 0.47), (8, 0.3)], p=8, virtual_stages=2)
    assert narrow.axes[0].get_xscale() == "linear" and "v=2" in narrow.axes[0].get_title()
    stem = tmp_path / "bubble_vs_m"
    svg = assert_images(plot_bubble_vs_microbatches(points, 4, stem), stem)
    assert "closed form" in svg and "simulated" in svg


# ------------------------------------------------------------------------------------------------- memory


def memory_summary(activations_gb: list[float], capacity_gb: float = 80.0) -> dict:
    rows = []
    for stage, act in enumerate(activations_gb):
        row = {
            "stage": stage,
            "weights": 8 * GB,
            "gradients": 8 * GB,
            "optimizer": 32 * GB,
            "activations": act * GB,
            "buffers": 2 * GB,
        }
        row["peak"] = sum(v for k, v in row.items() if k != "stage")
        rows.append(row)
    over = any(r["peak"] > capacity_gb * GB for r in rows)
    return {
        "name": "mem",
        "memory_by_stage": rows,
        "gpu_memory_bytes": capacity_gb * GB,
        "fits_in_memory": not over,
    }


def test_memory_chart_marks_oom(tmp_path: Path) -> None:
    summary = memory_summary([36.0, 20.0, 12.0, 4.0])  # stage 0 needs 86 GB of 80
    assert over_capacity(summary) == {0: pytest.approx(6 * GB)}
    fig = memory_figure(summary)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert "OOM +6.0 GB" in texts
    red_frames = [
        p
        for p in ax.patches
        if isinstance(p, Rectangle)
        and not p.get_fill()
        and p.get_edgecolor()[:3] == pytest.approx((0.75294, 0.0, 0.0), abs=1e-3)
    ]
    assert len(red_frames) == 1
    assert "does NOT fit" in fig.get_suptitle()
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"stage {s}" for s in range(4)]
    stem = tmp_path / "memory"
    svg = assert_images(plot_memory(summary, stem), stem)
    assert "OOM +6.0 GB" in svg and "GPU capacity 80 GB" in svg


def test_memory_chart_without_oom_has_no_mark() -> None:
    summary = memory_summary([20.0, 10.0])
    assert over_capacity(summary) == {}
    fig = memory_figure(summary)
    assert not [t for t in fig.axes[0].texts if "OOM" in t.get_text()]
    assert "fits in memory" in fig.get_suptitle()


# -------------------------------------------------------------------------------------------------- style


def test_time_units_follow_the_extent() -> None:
    assert style.time_scale(500e-6) == (pytest.approx(1e6), "µs")
    assert style.time_scale(0.35)[1] == "ms"
    assert style.time_scale(12.0) == (1.0, "s")
    assert style.format_duration(0.35) == "350 ms"


def test_every_category_has_a_distinct_colour() -> None:
    colours = [style.CATEGORY_COLORS[c] for c in tl.COMPUTE_CATEGORIES + tl.COMM_CATEGORIES]
    assert len(set(colours)) == len(colours)


# ------------------------------------------------------------------------------------ dense layer / writers


def test_column_coverage_matches_hand_calculation() -> None:
    import numpy as np

    from sim.outputs.dense import column_coverage

    # [0.5, 2.25) covers half of column 0, all of 1, a quarter of 2; [3, 3.1) a tenth of column 3.
    cov = column_coverage(np.array([0.5, 3.0]), np.array([2.25, 3.1]), 5)
    assert cov.tolist() == pytest.approx([0.5, 1.0, 0.25, 0.1, 0.0])


def test_large_gantt_rasterises_narrow_spans_and_keeps_every_row(tmp_path: Path) -> None:
    import numpy as np
    from matplotlib.image import AxesImage

    from sim.outputs.gantt import VECTOR_SPANS_MAX

    t = Timeline()
    t.gpus = [0, 1]
    n = VECTOR_SPANS_MAX  # per GPU: 2n spans in all, each 1/4 of its slot: far below a pixel
    for g in t.gpus:
        t.stage_of[g] = g
        for i in range(n):
            t.add(Span(g, tl.STREAM_COMPUTE, "f", tl.FORWARD, i * 1e-3, 0.25e-3, {"microbatch": i}))
    t.end_s = n * 1e-3
    fig = gantt_figure(t, {})
    ax = fig.axes[0]
    images = [a for a in ax.get_children() if isinstance(a, AxesImage)]
    assert len(images) == 1 and len(ax.collections) < 10  # one raster layer, no per-span rectangles
    rgba = np.asarray(images[0].get_array())
    band = rgba[5, 10:-10, 3] / 255  # row 0's alpha: busy 25 % of every column → floor + 0.65 × 0.25
    assert band.mean() == pytest.approx(0.35 + 0.65 * 0.25, abs=0.02)
    assert [x.get_text() for x in ax.get_yticklabels()] == ["gpu0 · compute", "gpu1 · compute"]


def _csv_module_text(timeline: Timeline) -> str:
    """timeline.csv as ``csv.writer`` writes it, one span at a time (the reference for the fast writer)."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["gpu", "stream", "name", "category", "start_s", "dur_s", "end_s", "microbatch", "bytes"])
    for s in sorted(timeline.spans, key=lambda s: (s.gpu, s.start_s, s.stream)):
        w.writerow([s.gpu, s.stream, s.name, s.category, repr(s.start_s), repr(s.dur_s), repr(s.end_s),
                    s.args.get("microbatch", ""), s.args.get("bytes", "")])
    return buf.getvalue()


def test_fast_csv_writer_matches_csv_module() -> None:
    from sim.outputs.writers import timeline_csv

    timeline = gpipe_timeline(p=3, m=4, tp=2)
    timeline.add(Span(0, tl.STREAM_COMPUTE, 'odd, "name"', tl.COMPUTE, 0.0, 0.1, {"bytes": 3}))
    assert timeline_csv(timeline) == _csv_module_text(timeline)


def test_writers_format_repeated_durations_and_shared_args_once_with_the_same_text() -> None:
    """Past 1,024 spans a chunk's durations are formatted once per distinct value and a shared args dict
    encoded once (the spans of a schedule action share one): the files read as the span-by-span
    encodings do, a zero duration included, and an args dict shared by many spans with the content of its
    own (a later span's equal-but-distinct dict) stays right."""
    import json

    from sim.outputs.writers import chrome_trace, timeline_csv

    t = Timeline()
    t.gpus = [0, 1]
    clock = 0.0
    for i in range(1500):
        shared = {"microbatch": i % 7, "stage": 0}
        for g in t.gpus:
            dur = (0.0, 1e-3, 2.5e-3, 1 / 3)[i % 4]
            t.add(Span(g, tl.STREAM_COMPUTE, f"k{i % 5}", tl.FORWARD, clock, dur, shared))
            t.add(Span(g, tl.STREAM_COMM, "ar", tl.COMM_TP, clock, dur / 3, {"microbatch": i % 7, "bytes": 8}))
        clock += 0.004 + i * 1e-9
    assert timeline_csv(t) == _csv_module_text(t)
    events = [e for e in json.loads(chrome_trace(t))["traceEvents"] if e["ph"] == "X"]
    assert [(e["dur"], e["args"]) for e in events] == [(float(f"{s.dur_s * 1e6:.3f}"), s.args) for s in t.spans]


def test_compare_chart_draws_float_dust_as_zero_on_a_unit_axis() -> None:
    from sim.outputs.compare_chart import compare_figure

    rows = [{"label": "a", "bubble_fraction": 7.65e-17, "step_time_s": 2.0},
            {"label": "b", "bubble_fraction": 0.0, "step_time_s": 1.0}]
    fig = compare_figure(rows)
    bubble = next(ax for ax in fig.axes if ax.get_visible() and ax.get_title().startswith("pipeline bubble"))
    assert [p.get_width() for p in bubble.patches] == [0.0, 0.0]
    assert bubble.get_xlim() == (0.0, 1.0)
    assert [t.get_text() for t in bubble.texts] == ["0", "0"]


def test_bubble_vs_m_says_why_simulated_points_sit_above_the_closed_form() -> None:
    from sim.outputs.bubble import SIMULATED_NOTE

    above = bubble_vs_microbatches_figure([(4, 0.45), (8, 0.34), (32, 0.21)], p=4)
    assert SIMULATED_NOTE in [t.get_text() for t in above.axes[0].texts]
    exact = bubble_vs_microbatches_figure([(m, closed_form_bubble(m, 4)) for m in (4, 8, 32)], p=4)
    assert not exact.axes[0].texts


def test_vectorised_blocks_and_gaps_match_the_span_by_span_definitions() -> None:
    import random

    from sim.engine.span_table import span_table
    from sim.outputs.bubble import _row_gaps
    from sim.outputs.gantt import GanttRow, merge_pipeline_blocks, merged_blocks, row_of_spans

    rng = random.Random(3)
    t = Timeline()
    t.gpus = [0, 1]
    for g in t.gpus:
        clock = 0.0
        for _ in range(300):
            mb = rng.choice([0, 1, 2, None])
            cat = rng.choice([tl.FORWARD, tl.BACKWARD])
            dur = rng.choice([0.001, 0.01, 0.03])
            args = {} if mb is None else {"microbatch": mb, "chunk": rng.choice([0, 1])}
            t.add(Span(g, tl.STREAM_COMPUTE, "x", cat, clock, dur, args))
            clock += dur + rng.choice([0.0, 0.0, 0.005])
    table = span_table(t)
    blocks = merged_blocks(table, row_of_spans(table, [GanttRow(g, tl.STREAM_COMPUTE, "") for g in t.gpus]))
    for row, gpu in enumerate(t.gpus):
        want = merge_pipeline_blocks(t.for_gpu(gpu))
        mine = blocks.row == row
        assert [(s.start_s, s.end_s) for s in want] == list(zip(blocks.start_s[mine], blocks.end_s[mine], strict=True))
        starts, durs = _row_gaps(blocks.start_s[mine], blocks.end_s[mine], 0.0, 7.5)
        gaps = idle_gaps(want, 0.0, 7.5)
        assert [a for a, _ in gaps] == pytest.approx(starts.tolist())
        assert [d for _, d in gaps] == pytest.approx(durs.tolist())


@pytest.mark.parametrize("chunk", [50_000, 7])
def test_fast_trace_writer_matches_one_event_at_a_time(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The column-wise Chrome trace writer gives the events a plain one-dict-per-event encoding gives, in
    the same order, for awkward names (quotes that could fake a separator), unhashable args, a stream
    without a fixed tid and counters; span times in µs to the nanosecond."""
    import json

    def _ns(seconds: float) -> float:
        return float(f"{seconds * 1e6:.3f}")

    from sim.engine.timeline import CounterSample
    from sim.outputs import writers
    from sim.outputs.writers import STREAM_ORDER, chrome_trace

    monkeypatch.setattr(writers, "CHUNK_LINES", chunk)
    timeline = gpipe_timeline(p=3, m=4, tp=2)
    timeline.add(Span(0, tl.STREAM_COMPUTE, 'odd "a","b" name', tl.COMPUTE, 0.0, 0.1, {"bytes": 3}))
    timeline.add(Span(1, "nic", 'end \\"', tl.COMM, 0.2, 0.05, {"ranks": [0, 1]}))
    timeline.add(Span(2, "nic", "ünïcode", tl.COMM, 0.25, 0.05, {}))
    timeline.counters = [CounterSample(0, "allocated_bytes", 0.1, 2e9), CounterSample(1, "other", 0.2, 5)]
    events: list[dict] = []
    for g in timeline.gpus:
        events.append({"ph": "M", "pid": g, "name": "process_name", "args": {"name": timeline.labels[g]}})
        events.append({"ph": "M", "pid": g, "name": "process_sort_index", "args": {"sort_index": g}})
    tids: dict[tuple[int, str], int] = {}
    for lo in range(0, len(timeline.spans), chunk):  # per chunk, the names of its new threads come first
        part = timeline.spans[lo : lo + chunk]
        for s in part:
            if (s.gpu, s.stream) not in tids:
                tids[(s.gpu, s.stream)] = STREAM_ORDER.get(s.stream, 10 + len(tids))
                events.append({"ph": "M", "pid": s.gpu, "tid": tids[(s.gpu, s.stream)], "name": "thread_name",
                               "args": {"name": s.stream}})
        events += [{"ph": "X", "pid": s.gpu, "tid": tids[(s.gpu, s.stream)], "name": s.name, "cat": s.category,
                    "ts": _ns(s.start_s), "dur": _ns(s.dur_s), "args": s.args} for s in part]
    events += [{"ph": "C", "pid": 0, "name": "allocated_GB", "ts": 0.1e6, "args": {"GB": 2.0}},
               {"ph": "C", "pid": 1, "name": "other", "ts": 0.2e6, "args": {"GB": 5e-9}}]
    trace = json.loads(chrome_trace(timeline, {"scenario": "t"}))
    assert trace["traceEvents"] == events
    assert trace["otherData"] == {"scenario": "t"} and trace["displayTimeUnit"] == "ms"
    empty = json.loads(chrome_trace(Timeline()))
    assert empty["traceEvents"] == []


def test_table_timeline_travels_as_its_span_table() -> None:
    """What the chart worker is sent: the timeline as its span table (pickled in milliseconds), whose spans are
    rebuilt on demand with the fields the charts read, and whose span table on arrival is the one sent."""
    import pickle

    import numpy as np

    from sim.engine.span_table import NO_MICROBATCH, TableSpans, adopt_table, span_table, table_timeline

    t = gpipe_timeline(tp=2)
    light = pickle.loads(pickle.dumps(table_timeline(t)))
    adopt_table(light)
    assert isinstance(light.spans, TableSpans) and len(light.spans) == len(t.spans)
    a, b = span_table(t), span_table(light)
    for col in ("gpu", "stream", "category", "start_s", "dur_s", "microbatch", "chunk"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    assert (a.streams, a.categories) == (b.streams, b.categories)
    for k in (0, 5, len(t.spans) - 1):
        src, got = t.spans[k], light.spans[k]
        assert (got.gpu, got.stream, got.category, got.start_s, got.dur_s) == (
            src.gpu, src.stream, src.category, src.start_s, src.dur_s)
        assert got.args.get("chunk", 0) == src.args.get("chunk", 0)
        assert got.args.get("microbatch", NO_MICROBATCH) == src.args.get("microbatch", NO_MICROBATCH)
    assert (light.gpus, light.labels, light.stage_of, light.end_s) == (t.gpus, t.labels, t.stage_of, t.end_s)



def test_trace_times_are_microseconds_to_the_nanosecond() -> None:
    """trace.json writes span times fixed-point to 1 ns (timeline.csv keeps them exactly): 1.2345678 ms
    starts at 1234.568 µs, a 0.4 ns span lasts 0.000 µs, and a non-finite time stays valid JSON."""
    import json

    import numpy as np

    from sim.outputs.writers import _micros, chrome_trace

    timeline = Timeline()
    timeline.add(Span(0, tl.STREAM_COMPUTE, "a", tl.COMPUTE, 1.2345678e-3, 0.4e-9, {}))
    text = chrome_trace(timeline)
    assert '"ts":1234.568,"dur":0.000,' in text
    (event,) = [e for e in json.loads(text)["traceEvents"] if e["ph"] == "X"]
    assert (event["ts"], event["dur"]) == (1234.568, 0.0)
    assert _micros(np.array([1.0, np.inf])) == ["1000000.000", "Infinity"]
