"""Profile files: atomic writes, loading errors, sections saved as they finish, --resume skipping them."""

from __future__ import annotations

import json
import os

import pytest

import calibrate.run as run_mod
from calibrate.config import COLLECTIVES, GEMM, MEMORY, tiny_config
from calibrate.profile import (
    SCHEMA_VERSION,
    finished_sections,
    load_profile,
    new_profile,
    record_section,
    save_profile,
)
from calibrate.run import CalibrationOptions, run_calibration
from sim.errors import ScenarioError


def _profile() -> dict:
    p = new_profile({"device_name": "test"}, {"device": "cpu", "sweep": "tiny", "world_size": 2})
    record_section(
        p,
        GEMM,
        {
            "measurements": [
                {
                    "dtype": "fp32",
                    "m": s,
                    "n": s,
                    "k": s,
                    "flops_per_s": 1e9 * s,
                    "time_s": 2 * s**3 / (1e9 * s),
                }
                for s in (32, 64, 128)
            ]
        },
        wall_s=1.0,
    )
    return p


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    save_profile(_profile(), path)
    before = path.read_text()
    assert load_profile(path)["schema_version"] == SCHEMA_VERSION

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    changed = _profile()
    changed["metadata"]["device_name"] = "other"
    with pytest.raises(OSError):
        save_profile(changed, path)
    assert path.read_text() == before  # the old profile is intact
    assert [f.name for f in tmp_path.iterdir()] == ["p.json"]  # and no temp file is left behind


@pytest.mark.parametrize(
    "content,needle",
    [
        (None, "does not exist"),
        ("{not json", "not valid JSON"),
        ('{"kind": "x"}', "not a dtsim calibration profile"),
    ],
)
def test_load_errors_are_user_errors(tmp_path, content, needle):
    path = tmp_path / "p.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ScenarioError, match=needle) as err:
        load_profile(path)
    assert err.value.field == "profile" and "\n" not in str(err.value)


def test_schema_version_mismatch(tmp_path):
    path = tmp_path / "p.json"
    data = _profile()
    data["schema_version"] = 999
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioError, match="schema_version 999"):
        load_profile(path)


def _fake_measure(calls: list[str], fail_on: str | None = None):
    def measure(name, opts, config, fault):
        calls.append(name)
        if name == fail_on:
            raise KeyboardInterrupt
        if name == GEMM:
            return _profile()["sections"][GEMM]
        if name == MEMORY:
            return {
                "measurements": [
                    {
                        "kernel": "copy",
                        "dtype": "fp32",
                        "size_bytes": s,
                        "bytes_moved": 2 * s,
                        "bytes_per_s": 1e9,
                        "time_s": 2 * s / 1e9,
                    }
                    for s in (1e3, 1e4, 1e5)
                ]
            }
        return {"status": "unmeasurable", "reason": "test", "measurements": []}

    return measure


def test_interrupted_run_keeps_finished_sections_and_resume_skips_them(tmp_path, monkeypatch):
    pytest.importorskip("torch")  # these run the real (tiny) measurement
    out = tmp_path / "p.json"
    opts = CalibrationOptions(device="cpu", world=2, out=out)
    calls: list[str] = []
    monkeypatch.setattr(run_mod, "_measure", _fake_measure(calls, fail_on=MEMORY))
    with pytest.raises(KeyboardInterrupt):
        run_calibration(opts, tiny_config(), ["--device", "cpu"])
    assert calls == [GEMM, MEMORY]
    saved = load_profile(out)
    assert finished_sections(saved) == {GEMM} and "gemm" in saved["fits"]
    gemm_finished_at = saved["sections"][GEMM]["finished_at"]

    calls.clear()
    monkeypatch.setattr(run_mod, "_measure", _fake_measure(calls))
    run_calibration(
        CalibrationOptions(device="cpu", world=2, out=out, resume=True), tiny_config(), ["--resume"]
    )
    assert calls == [MEMORY, COLLECTIVES]  # gemm skipped
    resumed = load_profile(out)
    assert finished_sections(resumed) == {GEMM, MEMORY, COLLECTIVES}
    assert resumed["sections"][GEMM]["finished_at"] == gemm_finished_at
    assert resumed["metadata"]["resumed"][0]["command_line"] == "dtsim calibrate --resume"


def test_resume_refuses_a_different_run(tmp_path, monkeypatch):
    pytest.importorskip("torch")  # these run the real (tiny) measurement
    out = tmp_path / "p.json"
    monkeypatch.setattr(run_mod, "_measure", _fake_measure([]))
    run_calibration(CalibrationOptions(device="cpu", world=2, out=out, sections=(GEMM,)), tiny_config(), [])
    with pytest.raises(ScenarioError, match="world_size"):
        run_calibration(CalibrationOptions(device="cpu", world=3, out=out, resume=True), tiny_config(), [])


def test_without_resume_everything_is_measured_again(tmp_path, monkeypatch):
    pytest.importorskip("torch")  # these run the real (tiny) measurement
    out = tmp_path / "p.json"
    calls: list[str] = []
    monkeypatch.setattr(run_mod, "_measure", _fake_measure(calls))
    opts = CalibrationOptions(device="cpu", world=2, out=out, sections=(GEMM, MEMORY))
    run_calibration(opts, tiny_config(), [])
    run_calibration(opts, tiny_config(), [])
    assert calls == [GEMM, MEMORY, GEMM, MEMORY]


def test_quick_cpu_probe_sizes_the_gemms_only_and_not_on_a_resume_that_has_them(tmp_path, monkeypatch):
    """The speed probe's fewer timing passes apply to the GEMM sweep alone (the memory section keeps the
    configured passes), and a --resume whose profile already holds the GEMMs does not probe at all."""
    pytest.importorskip("torch")
    from dataclasses import replace

    import calibrate.probe as probe_mod
    from calibrate.config import make_config

    probed: list[int] = []

    def fake_size(config, threads, budget_s=probe_mod.GEMM_BUDGET_S, rates=None):
        probed.append(threads)
        n = len(config.gemm_shapes)
        return replace(config, timing=replace(config.timing, passes=1), probe={
            "gemm_flops_per_s": {"fp32": 1e10}, "gemm_budget_s": budget_s, "gemm_predicted_s": 1.0, "passes": 1,
            "gemm_shapes_kept": n, "gemm_shapes_planned": n})

    seen: dict[str, int] = {}
    fake = _fake_measure([])

    def measure(name, opts, config, fault):
        seen[name] = config.timing.passes
        return fake(name, opts, config, fault)

    monkeypatch.setattr(probe_mod, "size_cpu_sweep", fake_size)
    monkeypatch.setattr(run_mod, "_measure", measure)
    quick = make_config("cpu", quick=True)
    assert quick.timing.passes > 1
    out = tmp_path / "p.json"
    run_calibration(CalibrationOptions(device="cpu", world=2, out=out, sections=(GEMM, MEMORY)), quick, [])
    assert probed and seen == {GEMM: 1, MEMORY: quick.timing.passes}
    assert load_profile(out)["run"]["sweep_config"]["timing"]["passes"] == quick.timing.passes

    probed.clear()
    seen.clear()
    run_calibration(CalibrationOptions(device="cpu", world=2, out=out, resume=True), quick, ["--resume"])
    assert probed == [] and set(seen) == {COLLECTIVES}
