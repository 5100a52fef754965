"""End to end through the command line: shipped scenarios, result files, and bad input (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.cli import main
from sim.scenario.load import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
BAD = sorted((ROOT / "tests" / "data" / "bad").glob("*.yaml"))


def _header(path: Path) -> tuple[str, list[str]]:
    expect, sets = "", []
    for raw in path.read_bytes().splitlines()[:5]:
        line = raw.decode("utf-8", "replace")
        if line.startswith("# expect:"):
            expect = line.split(":", 1)[1].strip()
        elif line.startswith("# set:"):
            sets.append(line.split(":", 1)[1].strip())
    return expect, sets


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_scenario_exits_2_with_one_line(path: Path, capsys, tmp_path) -> None:
    expect, sets = _header(path)
    argv = ["run", str(path), "--out", str(tmp_path / "out"), "--no-charts"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert expect[:40] in lines[0] or expect.split("—")[0].strip() in lines[0], (expect, lines[0])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,needle", [
    (["run", "no/such/file.yaml"], "no such file"),
    (["run"], "scenario"),
    (["frobnicate"], "invalid choice"),
    (["run", "scenarios/seed-pipeline.yaml", "--set", "parallel.pipeline=3"], "data×tensor×pipeline"),
    (["run", "scenarios/seed-pipeline.yaml", "--set", "training.global_batch=-8"], "global_batch"),
    (["plot", "no/such/dir"], "not found"),
])
def test_bad_command_lines(argv: list[str], needle: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_directory_instead_of_file(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_run_writes_results_that_load_back(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", "scenarios/seed-pipeline.yaml", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "110.000 ms" in table
    for f in ("summary.json", "timeline.csv", "trace.json", "resolved.yaml", "gantt.png", "pipeline.png",
              "memory.png"):
        assert (out / f).is_file(), f
    s = json.loads((out / "summary.json").read_text())
    for key in ("step_time_s", "samples_per_s", "global_batch", "num_gpus", "compute_s", "exposed_comm_s",
                "bubble_fraction", "pipeline_utilisation"):
        assert key in s
    trace = json.loads((out / "trace.json").read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 32 and {e["pid"] for e in xs} == {0, 1, 2, 3}
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(110_000)  # µs
    # The resolved scenario loads back to the same scenario.
    original = load_scenario(ROOT / "scenarios" / "seed-pipeline.yaml")
    again = scenario_from_dict(yaml.safe_load((out / "resolved.yaml").read_text()))
    assert again == original


def test_json_flag_and_set_override(tmp_path, capsys) -> None:
    assert main(["run", "scenarios/seed-pipeline.yaml", "--json", "--no-charts", "--out", str(tmp_path),
                 "--set", "training.global_batch=16"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["step_time_s"] == pytest.approx((16 + 4 - 1) * 0.010)


def test_collective_sweep_scenario(tmp_path, capsys) -> None:
    assert main(["run", "scenarios/nccl-allreduce-8xa100.yaml", "--json", "--no-charts", "--out", str(tmp_path)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert isinstance(s["busbw_GBps"], list) and len(s["busbw_GBps"]) == len(s["collectives"]) > 3
    assert s["busbw_GBps"] == sorted(s["busbw_GBps"])  # bigger messages amortise latency


def test_plot_redraws_run_charts(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", "scenarios/seed-pipeline.yaml", "--out", str(out)]) == 0
    redraw = tmp_path / "redraw"
    assert main(["plot", str(out), "--out", str(redraw)]) == 0
    for f in ("gantt.png", "pipeline.png", "memory.png"):
        # drawn from the saved files only, the charts come out pixel for pixel the same
        assert (redraw / f).read_bytes() == (out / f).read_bytes()


def test_schema_command(capsys) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "cluster" in schema["properties"]


def test_python_dash_m_and_no_traceback_on_bad_input(tmp_path) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("name: x\ncluster: {nodes: 1, gpus_per_node: 4, gpu: A100-80GB, nvlinks: 3}\n")
    p = subprocess.run([sys.executable, "-m", "sim", "run", str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert "nvlinks" in p.stderr


def test_run_with_shipped_cpu_profile_reports_calibration(tmp_path, capsys) -> None:
    prof = ROOT / "calibrate" / "profiles" / "cpu-amd-epyc.json"
    assert main(["run", "scenarios/gpt3-1.3b-16xa100.yaml", "--calibration", str(prof), "--json", "--no-charts",
                 "--out", str(tmp_path), "--set", "training.global_batch=4", "--set", "parallel.data=1",
                 "--set", "parallel.tensor=4"]) == 0
    s = json.loads(capsys.readouterr().out)
    cal = s["calibration"]
    assert cal["profile"] == str(prof) and isinstance(cal["extrapolated_ops"], int)
    # A CPU is far slower than an A100: the calibrated step is much longer than the datasheet one.
    assert main(["run", "scenarios/gpt3-1.3b-16xa100.yaml", "--json", "--no-charts", "--out", str(tmp_path),
                 "--set", "training.global_batch=4", "--set", "parallel.data=1", "--set", "parallel.tensor=4"]) == 0
    roof = json.loads(capsys.readouterr().out)
    assert "calibration" not in roof and s["step_time_s"] > 10 * roof["step_time_s"]


def test_trace_gz_and_no_trace_flags(tmp_path, capsys) -> None:
    import gzip

    gz = tmp_path / "gz"
    assert main(["run", "scenarios/seed-pipeline.yaml", "--out", str(gz), "--trace-gz", "--no-charts"]) == 0
    assert not (gz / "trace.json").exists()
    raw = (gz / "trace.json.gz").read_bytes()
    trace = json.loads(gzip.decompress(raw))
    assert len([e for e in trace["traceEvents"] if e["ph"] == "X"]) == 32
    assert "trace.json.gz" in (gz / "report.html").read_text()
    # deterministic bytes: no file name or time in the gzip header
    assert main(["run", "scenarios/seed-pipeline.yaml", "--out", str(gz), "--trace-gz", "--no-charts"]) == 0
    assert (gz / "trace.json.gz").read_bytes() == raw
    bare = tmp_path / "bare"
    assert main(["run", "scenarios/seed-pipeline.yaml", "--out", str(bare), "--no-trace", "--no-charts"]) == 0
    assert (bare / "timeline.csv").is_file() and not list(bare.glob("trace.json*"))


@pytest.mark.parametrize("text_s_per_span", [8e-6, 1.0])  # child draws the other charts / the text only
def test_outputs_written_by_two_processes_equal_those_written_by_one(tmp_path, monkeypatch, text_s_per_span):
    from sim.api import simulate, write_results
    from sim.outputs import run_files

    if run_files._fork_context() is None:  # one core or no fork: "two" would be written by one process too
        pytest.skip("needs fork and two cores")
    result = simulate(load_scenario(ROOT / "scenarios" / "seed-pipeline.yaml"))
    one = write_results(result, tmp_path / "one")
    monkeypatch.setattr(run_files, "PARALLEL_MIN_SPANS", 0)
    monkeypatch.setattr(run_files, "TEXT_S_PER_SPAN", text_s_per_span)
    two = write_results(result, tmp_path / "two")
    assert [p.name for p in two] == [p.name for p in one]
    for a, b in zip(one, two, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


@pytest.mark.parametrize("child_fails", [False, True])
def test_trace_written_beside_the_csv_equals_the_one_written_after_it(tmp_path, monkeypatch, child_fails):
    """Above SPLIT_TEXT_MIN_SPANS a forked process writes trace.json while this one writes timeline.csv:
    the same bytes as in turn; a child that fails leaves the trace to this process, with no stray file."""
    from sim.api import simulate
    from sim.outputs import run_files, writers

    if run_files._fork_context() is None:
        pytest.skip("needs fork and two cores")
    result = simulate(load_scenario(ROOT / "scenarios" / "seed-pipeline.yaml"))
    meta = {"scenario": "x"}
    one = run_files._write_big_files(result.timeline, _mkdir(tmp_path / "one"), meta, True, False)
    monkeypatch.setattr(run_files, "SPLIT_TEXT_MIN_SPANS", 0)
    parent, marker = os.getpid(), tmp_path / "child-ran"
    real = writers.write_chrome_trace

    def trace(*a, **k):
        if os.getpid() != parent:
            marker.touch()  # proof that the trace process ran (it shares no memory with this one)
            if child_fails:
                raise RuntimeError("child fails")
        return real(*a, **k)

    monkeypatch.setattr(run_files, "write_chrome_trace", trace)
    two = run_files._write_big_files(result.timeline, _mkdir(tmp_path / "two"), meta, True, False, split=True)
    assert [p.name for p in two] == [p.name for p in one] == ["timeline.csv", "trace.json"]
    for a, b in zip(one, two, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["timeline.csv", "trace.json"]
    assert marker.exists()


def _mkdir(path):
    path.mkdir()
    return path


@pytest.mark.parametrize("fail", [None, "before", "while drawing"])
def test_chart_worker_writes_the_charts_one_process_writes(tmp_path, monkeypatch, fail):
    """Charts drawn by the worker (from the span table sent to it) are the bytes this process draws from the
    timeline itself; a worker that died, before the job or while drawing, leaves the charts to this process,
    with the same files."""
    import signal

    from sim.api import simulate, write_results
    from sim.outputs import charts, run_files

    parent = os.getpid()
    real = charts.draw_all

    def draw_all(*a, **k):
        if os.getpid() != parent:
            raise RuntimeError("worker fails")
        return real(*a, **k)

    if fail == "while drawing":
        monkeypatch.setattr(charts, "draw_all", draw_all)  # before the fork: the worker inherits it
    worker = run_files.ChartWorker.start()
    if worker is None:
        pytest.skip("needs fork and two cores")
    result = simulate(load_scenario(ROOT / "scenarios" / "seed-pipeline.yaml"))
    one = write_results(result, tmp_path / "one")
    if fail == "before":
        os.kill(worker._proc.pid, signal.SIGKILL)
        worker._proc.join()
    two = write_results(result, tmp_path / "two", worker=worker)
    assert not worker._proc.is_alive()
    assert worker._done == (fail is None)
    assert [p.name for p in two] == [p.name for p in one]
    assert {"gantt.png", "gantt.svg", "pipeline.png", "memory.svg"} <= {p.name for p in two}
    for a, b in zip(one, two, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_run_with_chart_worker_matches_plot(tmp_path, capsys, monkeypatch):
    """`dtsim run` with its chart worker (forced on a small scenario) writes the charts `dtsim plot` redraws."""
    from sim import cli
    from sim.outputs import run_files

    monkeypatch.setattr(cli, "CHART_WORKER_EVENTS", 0)
    used = []
    real = run_files._write_with_worker
    monkeypatch.setattr(run_files, "_write_with_worker", lambda *a: used.append(a[-1]) or real(*a))
    out = tmp_path / "r"
    assert main(["run", "scenarios/seed-pipeline-s6-m18.yaml", "--out", str(out)]) == 0
    if run_files._fork_context() is not None:
        assert len(used) == 1 and used[0]._done  # the worker drew them
    redraw = tmp_path / "redraw"
    assert main(["plot", str(out), "--out", str(redraw)]) == 0
    for f in ("gantt.png", "gantt.svg", "pipeline.png", "memory.png"):
        assert (redraw / f).read_bytes() == (out / f).read_bytes(), f


def test_run_without_charts_never_imports_matplotlib(tmp_path):
    """`--no-charts` skips matplotlib's import (about half a second of every bare run), in a fresh process."""
    code = ("import sys; from sim.cli import main; "
            f"rc = main(['run', 'scenarios/seed-pipeline.yaml', '--no-charts', '--no-trace', '--out', {str(tmp_path)!r}]); "
            "print(rc, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip().splitlines()[-1] == "0 False"
