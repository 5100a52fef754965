"""The goodput chart with an extreme MTBF: the Young/Daly optimum of a 1e300 h GPU MTBF is ~1e149 minutes,
far beyond the run; drawn at that x on the log axis, matplotlib overflowed (an internal error, exit 1) in
`dtsim run` and in `dtsim plot`. It is now marked at the end of the plotted range and says so."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from sim.cli import main

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parent.parent
GPT = str(ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml")


def _run(out: Path, mtbf_hours: str) -> list[str]:
    rel = f"reliability={{gpu_mtbf_hours: {mtbf_hours}, checkpoint: {{interval: auto, write_GBps: 100}}, restart_s: 600}}"
    return ["run", GPT, "--set", rel, "--set", "training.tokens=1e9", "--out", str(out)]


@pytest.mark.parametrize("mtbf_hours", ["1e300", "1e30", "1e6"])
def test_goodput_chart_of_a_rare_failure_run_is_written(mtbf_hours, tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(_run(out, mtbf_hours)) == 0, capsys.readouterr().err
    assert (out / "goodput.png").is_file() and (out / "goodput.svg").is_file()
    assert "internal error" not in capsys.readouterr().err


def test_goodput_chart_of_a_hopeless_mtbf_is_a_one_line_error(tmp_path, capsys) -> None:
    """1e-6 h: refused as the user's mistake (exit 2), not a crash."""
    assert main(_run(tmp_path / "r", "1e-6")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "internal error" not in err and "reliability" in err, err


def test_dtsim_plot_redraws_the_rare_failure_chart(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main([*_run(out, "1e300"), "--no-charts"]) == 0, capsys.readouterr().err
    assert not (out / "goodput.png").exists()
    assert main(["plot", str(out)]) == 0, capsys.readouterr().err
    assert (out / "goodput.png").is_file()


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("g") / "r"
    assert main([*_run(out, "50000"), "--no-charts"]) == 0
    return json.loads((out / "summary.json").read_text())


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


@pytest.mark.parametrize(("optimum_s", "note"), [
    (6e151, "beyond the run"),  # 1e300 h
    (math.inf, "beyond the run"),
    (1e-300, "below the plotted range"),
    (math.nan, "not defined"),
])
def test_an_optimum_outside_the_range_is_marked_at_its_end(summary, optimum_s, note, tmp_path) -> None:
    from sim.outputs.goodput_chart import goodput_figure

    s = json.loads(json.dumps(summary))
    s["reliability"]["optimal_interval_s"] = optimum_s
    fig = goodput_figure(s)
    fig.savefig(tmp_path / "g.png")  # drawing is where the overflow was
    (label,) = [t for t in _legend(fig) if t.startswith("Young/Daly optimum")]
    assert note in label, label
    lo, hi = fig.axes[0].get_xlim()
    assert 0 < lo < hi < 1e12


def test_huge_hours_and_seconds_are_written_short(tmp_path, capsys) -> None:
    """The job MTBF and the optimum interval of a never-failing MTBF (6.25e298 h, 9.1e150 s): in {:.2f} and
    {:.3f} they were 300- and 150-digit numbers, in the chart and in the printed summary."""
    from sim.outputs.goodput_chart import _time_label
    from sim.units import format_hours, format_seconds

    assert format_hours(3125) == "3125.00 h" and format_hours(6.25e298) == "6.25e+298 h"
    assert _time_label(9.1e150) == "2.53e+147 h"
    assert format_seconds(2035.764) == "2035.764 s" and format_seconds(9.1e150) == "9.1e+150 s"
    assert main(_run(tmp_path / "r", "1e300")) == 0
    printed = capsys.readouterr().out
    assert "job MTBF 6.25e+298 h" in printed and "optimum 9.1e+150 s" in printed, printed
    assert not re.search(r"\d{16}", printed), printed  # no number runs to float64's noise digits


def test_an_optimum_inside_the_range_is_drawn_where_it_is(summary) -> None:
    from sim.outputs.goodput_chart import goodput_figure

    fig = goodput_figure(summary)
    (label,) = [t for t in _legend(fig) if t.startswith("Young/Daly optimum")]
    assert "beyond" not in label and "below" not in label, label
    opt_min = summary["reliability"]["optimal_interval_s"] / 60
    xs = [line.get_xdata()[0] for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert xs == [pytest.approx(opt_min)]
