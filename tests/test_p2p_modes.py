"""Pipeline exchanges waited for or run beside compute (parallel.overlap_p2p_comm), and the device
synchronisation after a waited one (KernelSet.p2p_device_sync)."""

from __future__ import annotations

import dataclasses

import pytest

from sim.api import simulate
from sim.engine.timeline import COMM_DP, COMM_PP, STREAM_COMPUTE
from sim.scenario.load import scenario_from_dict
from sim.workload import kernels as K
from sim.workload.kernels import KERNEL_SETS, p2p_blocks
from tests.test_training_sim import _tiny


@pytest.mark.parametrize("kernels,schedule,given,blocks", [
    # Megatron-Core waits in its non-interleaved schedule and overlaps with virtual pipelining (NeMo's and
    # Megatron-Bridge's overlap_p2p_comm); Megatron-LM 2021/2022 and DeepSpeed always wait.
    ("transformer-engine", "1f1b", None, True),
    ("transformer-engine", "interleaved-1f1b", None, False),
    ("transformer-engine", "interleaved-1f1b", False, True),
    ("transformer-engine", "1f1b", True, False),
    ("megatron-lm-2021", "interleaved-1f1b", None, True),
    ("megatron-lm-2022", "1f1b", None, True),
    ("megatron-deepspeed-2022", "1f1b", None, True),
])
def test_which_exchanges_are_waited_for(kernels: str, schedule: str, given: bool | None, blocks: bool) -> None:
    assert p2p_blocks(KERNEL_SETS[kernels], schedule, given) is blocks


def _spans(result, gpu: int, pred) -> list[tuple[float, float]]:
    return sorted((s.start_s, s.start_s + s.dur_s) for s in result.timeline.spans if s.gpu == gpu and pred(s))


def _overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(y1, y2) - max(x1, x2)) for x1, y1 in a for x2, y2 in b)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_waited_send_ends_before_the_next_kernel(overlap: bool) -> None:
    """Waited: every send of a GPU ends before the next compute kernel of that GPU starts. Beside compute:
    the GPU computes while some of its sends are in flight."""
    r = simulate(scenario_from_dict(_tiny(parallel__overlap_p2p_comm=overlap, simulation__symmetry="off")))
    assert r.summary["parallel"]["overlap_p2p_comm"] is overlap  # summary.json says which ran
    overlapped = 0.0
    for g in r.timeline.gpus:
        sends = _spans(r, g, lambda s: s.category == COMM_PP and s.args.get("op") == "send")
        compute = _spans(r, g, lambda s: s.stream == STREAM_COMPUTE)
        assert sends
        overlapped += _overlap_s(sends, compute)
        if not overlap:
            for start, end in sends:
                later = [c0 for c0, _ in compute if c0 >= start]
                assert not later or min(later) >= end - 1e-12
    assert (overlapped > 0) is overlap


@pytest.mark.parametrize("sync", [True, False])
def test_device_sync_after_a_waited_exchange_exposes_the_reduction_in_flight(sync: bool, monkeypatch) -> None:
    """Interleaved, gradients reduced per model chunk during the backward pass, exchanges waited for: the
    torch.cuda.synchronize() after each (Megatron's batch_p2p_sync) holds the next kernel until the chunk's
    reduce-scatter is done, so on the last stage no compute runs beside it; without the synchronisation
    (DeepSpeed's dist.send/recv) the remaining backwards of the other chunk overlap it."""
    monkeypatch.setitem(K.KERNEL_SETS, "transformer-engine",
                        dataclasses.replace(KERNEL_SETS["transformer-engine"], p2p_device_sync=sync))
    d = _tiny(parallel__data=4, parallel__tensor=2, parallel__pipeline=2, parallel__schedule="interleaved-1f1b",
              parallel__virtual_stages=2, parallel__overlap_p2p_comm=False, parallel__overlap_grad_sync=True,
              training__global_batch=32, simulation__symmetry="off")
    r = simulate(scenario_from_dict(d))
    last = next(g for g in r.timeline.gpus if r.timeline.stage_of[g] == 1)
    dp = _spans(r, last, lambda s: s.category == COMM_DP)
    compute = _spans(r, last, lambda s: s.stream == STREAM_COMPUTE)
    assert dp
    beside = _overlap_s(dp, compute)
    if sync:
        assert beside == pytest.approx(0.0, abs=1e-12)
    else:
        assert beside > 0.25 * sum(b - a for a, b in dp)
