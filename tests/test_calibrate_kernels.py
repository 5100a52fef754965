"""CPU kernel sections measured by every device's worker at once (calibrate.kernels): the lockstep timing,
retaking samples that other processes disturbed, skipping a point together, and the real 2-worker run."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from calibrate.config import SweepConfig, make_config, tiny_config
from calibrate.launch import HostLoad

torch = pytest.importorskip("torch")

from calibrate import timing  # noqa: E402
from calibrate.gemm import run_gemm  # noqa: E402
from calibrate.timing import PointFailed, set_up_point, time_kernel  # noqa: E402

CFG = replace(tiny_config().timing, warmup=1, repeats=3, retakes=2)


class FakeLockstep:
    """Two workers, the other one a scripted stand-in: slower by ``other_s``, disturbed on given samples."""

    workers = 2

    def __init__(
        self, other_s: float = 0.0, other_disturbed: tuple[int, ...] = (), other_error: bool = False
    ):
        self.other_s, self.other_disturbed, self.other_error = other_s, other_disturbed, other_error
        self.barriers = 0
        self.samples = 0

    def check(self, error):
        if error is not None or self.other_error:
            raise PointFailed(str(error) if error else "could not be set up on worker(s) [1]")

    def agree(self, inner: int) -> int:
        return max(inner, 4)

    def barrier(self) -> None:
        self.barriers += 1

    def all_undisturbed(self, undisturbed: bool) -> bool:
        self.samples += 1
        return undisturbed and self.samples not in self.other_disturbed

    def slowest(self, median_s, min_s, max_s):
        return max(median_s, self.other_s), min(min_s, self.other_s), max(max_s, self.other_s)


def _noop(i: int) -> None:
    pass


def test_lockstep_agrees_on_inner_starts_every_sample_together_and_keeps_the_slowest_median():
    ls = FakeLockstep(other_s=1.0)
    t = time_kernel(_noop, 1, "cpu", CFG, ls)
    assert t.inner >= 4 and ls.barriers == ls.samples == t.repeats == CFG.repeats
    assert t.median_s == 1.0 and t.max_s == 1.0 and t.min_s < 1.0  # the other worker is the slow one
    assert t.retaken == 0 and not t.disturbed


def test_a_sample_another_worker_found_disturbed_is_retaken_by_all():
    ls = FakeLockstep(other_disturbed=(2,))
    t = time_kernel(_noop, 1, "cpu", CFG, ls)
    assert t.repeats == CFG.repeats and t.retaken == 1 and ls.barriers == CFG.repeats + 1


def test_samples_without_cpu_are_retaken_then_flagged(monkeypatch):
    """A sample whose timing thread barely ran (another process had the core) does not count; when no
    sample within the retakes is clean, the figures are kept and flagged."""

    class NoCpu:  # each sample lasts a second of wall time in which the timing thread never ran
        def __init__(self):
            self.now = 0.0

        def perf_counter(self) -> float:
            self.now += 1.0
            return self.now

        def thread_time(self) -> float:
            return 0.0

    monkeypatch.setattr(timing, "time", NoCpu())
    t = time_kernel(_noop, 1, "cpu", CFG)
    assert t.disturbed and t.retaken == 0 and t.repeats == CFG.repeats + CFG.retakes
    assert t.median_s > 0


def test_a_point_that_fails_on_any_worker_is_skipped_by_all():
    with pytest.raises(PointFailed, match="worker"):
        set_up_point(lambda: "buffers", FakeLockstep(other_error=True))
    with pytest.raises(PointFailed, match="no room"):
        set_up_point(lambda: (_ for _ in ()).throw(RuntimeError("no room")), FakeLockstep())
    assert set_up_point(lambda: "buffers", None) == "buffers"
    config = replace(tiny_config(), gemm_shapes=((32, 32, 32),), gemm_dtypes=("fp32",))
    section = run_gemm("cpu", config, FakeLockstep(other_error=True))
    assert section["measurements"] == [] and "worker" in section["skipped"][0]["reason"]


def test_gemm_operands_are_distinct_aligned_and_span_the_rotation():
    from calibrate.timing import carve, clear_pools

    sets = carve(torch.float32, "in", [(3, 5), (5, 7)] * 3)
    assert [tuple(s.shape) for s in sets] == [(3, 5), (5, 7)] * 3
    assert len({s.data_ptr() for s in sets}) == 6 and all(s.data_ptr() % 64 == 0 for s in sets)
    ends = sorted((s.data_ptr(), s.data_ptr() + s.numel() * 4) for s in sets)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ends[:-1], ends[1:], strict=True))
    (out,) = carve(torch.bfloat16, "out", [(1000,)])
    assert out.shape == (1000,) and not out.any()  # outputs start zeroed (faulted in)
    clear_pools()


def test_sweep_config_survives_json():
    for config in (make_config("cpu", True), make_config("cuda", False), tiny_config("cuda")):
        assert SweepConfig.from_dict(json.loads(json.dumps(config.as_dict()))) == config


def test_host_load_counts_other_processes_only():
    # Other processes may keep a core busy (a shared machine): compare this process's busy loop with an
    # idle interval of about the same length, measured back to back. Counting our own work would add a
    # whole core to the busy reading.
    idle = HostLoad()
    time.sleep(0.3)
    baseline = idle.other_cores()
    load = HostLoad()
    x, t_end = 0, time.perf_counter() + 0.3
    while time.perf_counter() < t_end:  # this process's own work is not "other load"
        x += 1
    other = load.other_cores()
    if other is None or baseline is None:
        return
    assert 0.0 <= other < baseline + 0.6


def test_passes_spread_each_point_and_merge_to_the_median_of_pass_medians():
    from contextlib import nullcontext

    from calibrate.timing import sweep

    class Bar:
        def set_postfix_str(self, *_a, **_k):
            pass

        def update(self, n=1):
            pass

    calls = []

    def measure(point):
        calls.append(point)
        attempt = calls.count(point)
        if point == "never" or (point == "once" and attempt == 2):
            raise RuntimeError("out of memory")
        t = {"a": (1.0, 3.0), "once": (2.0,)}[point][attempt - 1]
        rec = {"work": 6.0, "time_s": t, "min_s": t * 0.9, "max_s": t * 1.1, "repeats": 3, "inner": 1}
        return rec | {"retaken": 1, "disturbed": False}

    cfg = replace(CFG, passes=2)
    measured, skipped = sweep(
        "x",
        ["a", "once", "never"],
        measure,
        label=str,
        skip_record=lambda p, why: {"point": p, "reason": why},
        errors=(RuntimeError,),
        device="cpu",
        cfg=cfg,
        lockstep=None,
        progress=lambda desc, total: nullcontext(Bar()),
        work_key="work",
        rate_key="rate",
    )
    assert calls == ["a", "once", "never", "a", "once"]  # pass after pass; a failed point is not retried
    a, once = measured
    assert a["time_s"] == 2.0 and a["rate"] == 3.0 and a["passes"] == 2 and a["repeats"] == 6
    assert a["min_s"] == 0.9 and a["max_s"] == pytest.approx(3.3) and a["retaken"] == 2
    assert once["passes"] == 1 and once["time_s"] == 2.0  # failed in its second pass: the first counts
    assert skipped == [{"point": "never", "reason": "out of memory"}]


def test_quick_cpu_sweep_is_sized_from_the_probe():
    from calibrate.probe import predicted_point_s, size_cpu_sweep

    base = make_config("cpu", True)
    # A CPU without fast bf16 (0.8 GFLOP/s vs 30 for fp32): bf16 is dropped and says why.
    slow = size_cpu_sweep(base, 1, rates={"fp32": 30e9, "bf16": 0.8e9})
    assert slow.gemm_dtypes == ("fp32",)
    assert any(s["dtype"] == "bf16" and "no fast bf16" in s["reason"] for s in slow.gemm_skipped)
    # A slow machine: passes go first, then the largest shapes, until the prediction fits the budget.
    tiny = size_cpu_sweep(base, 1, budget_s=5.0, rates={"fp32": 5e9, "bf16": 5e9})
    assert tiny.timing.passes == 1 and 0 < len(tiny.gemm_shapes) < len(base.gemm_shapes)
    spent = sum(predicted_point_s(2.0 * m * n * k, 5e9, tiny) for m, n, k in tiny.gemm_shapes for _ in range(2))
    assert spent <= 5.0 and tiny.probe["gemm_predicted_s"] == pytest.approx(spent)
    dropped = {(s["m"], s["n"], s["k"]) for s in tiny.gemm_skipped if "m" in s}
    assert dropped == set(base.gemm_shapes) - set(tiny.gemm_shapes)
    assert min(m * n * k for m, n, k in dropped) >= max(m * n * k for m, n, k in tiny.gemm_shapes)
    # The sized config survives the JSON round trip that carries it to the CPU workers.
    assert SweepConfig.from_dict(json.loads(json.dumps(tiny.as_dict()))) == tiny
