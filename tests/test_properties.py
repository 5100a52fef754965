"""Property-based tests (hypothesis), bounded in time: random valid small scenarios keep the simulator's
invariants; random mutations of shipped scenarios and profiles end in exit 0 or one line and exit 2,
quickly, never a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sim.api import simulate  # noqa: E402
from sim.cli import main  # noqa: E402
from sim.engine.timeline import COMPUTE_CATEGORIES, STREAM_COMPUTE  # noqa: E402
from sim.outputs.writers import summary_json, timeline_csv  # noqa: E402
from sim.scenario.load import read_scenario_file, scenario_from_dict  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["seed-pipeline", "seed-data-parallel", "seed-checkpointing", "seed-pipeline-s6-m18",
         "nccl-allreduce-8xa100", "resnet50-dp-1xa100", "gpt3-1.3b-16xa100"]
PROFILE = ROOT / "calibrate" / "profiles" / "cpu-amd-epyc.json"
PER_CASE_S = 5.0
FAST = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


# ---- random valid scenarios keep the invariants ----------------------------------------------------


@st.composite
def small_scenarios(draw) -> dict:
    pipeline = draw(st.sampled_from([1, 2, 3, 4]))
    data = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 6))
    layers = pipeline * draw(st.integers(1, 3))
    fwd = draw(st.floats(0.1, 20.0))
    return {
        "name": "prop",
        "cluster": {"nodes": 1, "gpus_per_node": pipeline * data, "gpu": draw(st.sampled_from(["A100-80GB", "H100"])),
                    "intra_node": "nvlink3", "gpu_speed_spread": 0.0},  # identical GPUs: symmetry is exact
        "model": {"kind": "synthetic", "layers": layers, "forward_ms": fwd,
                  "backward_ms": fwd * draw(st.floats(0.5, 3.0)),
                  "params_per_layer": draw(st.integers(0, 50_000_000)),
                  "activation_bytes": draw(st.floats(0.0, 5e7))},
        "parallel": {"data": data, "pipeline": pipeline, "schedule": draw(st.sampled_from(["gpipe", "1f1b"]))},
        "training": {"global_batch": m * data, "micro_batch": 1},
        "simulation": {"steps": draw(st.integers(1, 2))},
    }


@FAST
@given(small_scenarios())
def test_random_valid_scenarios_hold_the_invariants(d: dict) -> None:
    sc = scenario_from_dict(d)
    r = simulate(sc)
    s = r.summary
    steps = d["simulation"]["steps"]
    compute_per_gpu: dict[int, float] = {}
    for span in r.timeline.spans:
        if span.stream == STREAM_COMPUTE and span.category in COMPUTE_CATEGORIES:
            compute_per_gpu[span.gpu] = compute_per_gpu.get(span.gpu, 0.0) + span.dur_s
    assert s["step_time_s"] >= max(compute_per_gpu.values()) / steps * (1 - 1e-9)
    assert 0.0 <= s["bubble_fraction"] < 1.0
    mb = s["memory_bytes"]
    assert mb["peak"] >= mb["weights"] + mb["gradients"] + mb["optimizer"] - 1e-6
    # symmetry (one GPU per stage) = full simulation
    on = simulate(scenario_from_dict({**d, "simulation": {**d["simulation"], "symmetry": "on"}})).summary
    off = simulate(scenario_from_dict({**d, "simulation": {**d["simulation"], "symmetry": "off"}})).summary
    assert on["step_time_s"] == pytest.approx(off["step_time_s"], rel=1e-9)
    # identical bytes on rerun
    again = simulate(scenario_from_dict(d))
    assert summary_json(again.summary) == summary_json(s)
    assert timeline_csv(again.timeline) == timeline_csv(r.timeline)


# ---- random mutations: exit 0 or one line and exit 2, within seconds ---------------------------------


def _leaves(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(node, list) and node:
        for i, v in enumerate(node[:4]):
            yield from _leaves(v, (*path, i))
    yield path


def _set(root, path, value):
    node = root
    for seg in path[:-1]:
        node = node[seg]
    node[path[-1]] = value


def _delete(root, path):
    node = root
    for seg in path[:-1]:
        node = node[seg]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        node.pop(path[-1])


HOSTILE = st.one_of(
    st.sampled_from([None, True, "x", "", [], {}, [1, 2], {"a": 1}, 0, -1, 1e308, -1e308, 1e-300, 10**30,
                     2**63, math.nan, math.inf, -math.inf, 1e9, 0.5, "1e3", "auto"]),
    st.integers(-10**6, 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _run(argv: list[str]) -> tuple[int, str, float]:
    err, out = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    return code, err.getvalue(), time.perf_counter() - t0


def _check(code: int, err: str, wall_s: float) -> None:
    assert "Traceback" not in err, err
    assert code in (0, 2), (code, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    assert wall_s < PER_CASE_S, (wall_s, err)


@FAST
@given(st.sampled_from(SMALL), st.data())
def test_mutated_shipped_scenarios_fail_cleanly(name: str, data) -> None:
    doc = read_scenario_file(ROOT / "scenarios" / f"{name}.yaml")
    paths = [p for p in _leaves(doc) if p]
    path = data.draw(st.sampled_from(paths))
    kind = data.draw(st.sampled_from(["value", "value", "delete", "unknown"]))
    if kind == "value":
        _set(doc, path, data.draw(HOSTILE))
    elif kind == "delete":
        _delete(doc, path)
    else:
        parent = path[:-1]
        node = doc
        for seg in parent:
            node = node[seg]
        if isinstance(node, dict):
            node["no_such_key"] = 1
    tmp = Path(tempfile.mkdtemp(prefix="dtsim-prop-"))
    try:
        f = tmp / "s.yaml"
        f.write_text(yaml.safe_dump(doc, sort_keys=False))
        _check(*_run(["run", str(f), "--out", str(tmp / "out"), "--no-charts", "--max-events", "2e5"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@FAST
@given(st.data())
def test_mutated_profiles_fail_cleanly(data) -> None:
    prof = json.loads(PROFILE.read_text())
    paths = [p for p in _leaves(prof["fits"]) if p]
    path = data.draw(st.sampled_from(paths))
    if data.draw(st.booleans()):
        _set(prof["fits"], path, data.draw(HOSTILE))
    else:
        _delete(prof["fits"], path)
    tmp = Path(tempfile.mkdtemp(prefix="dtsim-prop-"))
    try:
        f = tmp / "p.json"
        f.write_text(json.dumps(prof))  # NaN/inf written as JSON's non-standard tokens: must be refused
        _check(*_run(["run", str(ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml"), "--calibration", str(f),
                      "--set", "training.global_batch=4", "--set", "parallel.data=1", "--set", "parallel.tensor=4",
                      "--out", str(tmp / "out"), "--no-charts"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
