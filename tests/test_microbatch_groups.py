"""The interleaved schedule's micro-batch groups (parallel.microbatch_group_size: Megatron-Core's
microbatch_group_size_per_vp_stage, the Llama 3 paper's N) and Megatron-LM's all-forwards-first order when
there are as many micro-batches as stages (KernelSet.interleaved_all_warmup)."""

from __future__ import annotations

import pytest

from sim.api import simulate
from sim.engine.timeline import STREAM_COMPUTE
from sim.errors import ScenarioError
from sim.memory import in_flight_microbatches
from sim.scenario.load import scenario_from_dict
from sim.schedules.actions import (
    interleaved_1f1b,
    interleaved_group_problem,
    interleaved_order,
    max_in_flight,
)
from tests.test_training_sim import _tiny


def test_group_order_is_megatron_cores_table() -> None:
    """The table in Megatron-Core's schedules.py comment (core_r0.10.0): PP 2, N 3, M 5, VP 2."""
    order = interleaved_order(2, 5, 2, 3)
    assert [mb for mb, _ in order] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in order] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


def test_group_of_two_matches_the_config_docstring() -> None:
    """ModelParallelConfig.microbatch_group_size_per_vp_stage's example: PP 2, VP 2, N 2, M 4 runs the
    forwards of rank 0 as micro-batches 0 1 0 1 2 3 2 3."""
    forwards = [a for a in interleaved_1f1b(2, 4, 0, 2, group=2) if a.kind == "F"]
    assert [a.microbatch for a in forwards] == [0, 1, 0, 1, 2, 3, 2, 3]


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 12, 3), (2, 6, 4), (8, 16, 2)])
def test_default_group_is_megatron_lms_depth_first_order(p: int, m: int, v: int) -> None:
    """Group = p (the default): chunk (k // p) % v, micro-batch (k // pv)·p + k % p — Megatron-LM's
    get_model_chunk_id and its micro-batch counter."""
    assert interleaved_order(p, m, v) == [((k // (p * v)) * p + k % p, (k // p) % v) for k in range(m * v)]
    assert interleaved_order(p, m, v, p) == interleaved_order(p, m, v)


@pytest.mark.parametrize("p,m,v,n", [(4, 8, 2, 4), (4, 8, 2, 8), (4, 10, 2, 5), (4, 10, 3, 6), (2, 9, 2, 3)])
def test_warm_up_and_every_pass_once(p: int, m: int, v: int, n: int) -> None:
    """Each stage runs every (micro-batch, chunk) forward and backward once, a backward after its forward,
    after min(2(p − s − 1) + (v − 1)·N, m·v) warm-up forwards."""
    for s in range(p):
        acts = interleaved_1f1b(p, m, s, v, group=n)
        fwd = [(a.microbatch, a.chunk) for a in acts if a.kind == "F"]
        bwd = [(a.microbatch, a.chunk) for a in acts if a.kind == "B"]
        assert sorted(fwd) == sorted(bwd) == sorted((i, c) for i in range(m) for c in range(v))
        warm = 2 * (p - s - 1) + (v - 1) * n  # then the steady state opens with a forward
        assert next(i for i, a in enumerate(acts) if a.kind == "B") == (warm + 1 if warm < m * v else m * v)
        seen: set[tuple[int, int]] = set()
        for a in acts:
            if a.kind == "F":
                seen.add((a.microbatch, a.chunk))
            else:  # a backward needs its own forward first
                assert (a.microbatch, a.chunk) in seen


@pytest.mark.parametrize("p,m,n,ok", [(4, 8, None, True), (4, 10, None, False), (4, 10, 5, True),
                                      (4, 10, 6, True), (4, 10, 7, False), (4, 10, 3, False), (4, 10, 11, False)])
def test_megatron_cores_group_rules(p: int, m: int, n: int | None, ok: bool) -> None:
    """p ≤ N ≤ m, and the last group whole or at least p long (10 % 6 = 4 is, 10 % 7 = 3 is not)."""
    assert (interleaved_group_problem(p, m, n) is None) is ok


@pytest.mark.parametrize("n", [4, 6, 12])
def test_activation_memory_grows_with_the_group(n: int) -> None:
    """Stage 0 holds 2(p − 1) + (v − 1)·N + 1 chunk-micro-batches at its peak (of 1/v of its layers each)."""
    p, m, v = 4, 12, 2
    assert in_flight_microbatches("interleaved-1f1b", p, m, 0, v, group=n) == (2 * (p - 1) + (v - 1) * n + 1) / v


def test_all_forwards_first_with_as_many_micro_batches_as_stages() -> None:
    """Megatron-LM v2.5 – core_r0.9.0 with m = p: every stage runs its m·v forwards, then its backwards,
    so each holds all m micro-batches; from core_r0.10.0 the last stage holds (v − 1)·p + 1 chunks."""
    p, m, v = 4, 4, 2
    for s in range(p):
        acts = interleaved_1f1b(p, m, s, v, all_warmup=True)
        assert [a.kind for a in acts] == ["F"] * (m * v) + ["B"] * (m * v)
        assert in_flight_microbatches("interleaved-1f1b", p, m, s, v, all_warmup=True) == m
    assert max_in_flight(interleaved_1f1b(p, m, p - 1, v)) == (v - 1) * p + 1
    # with more micro-batches than stages the flag changes nothing
    assert interleaved_1f1b(4, 8, 2, 2, all_warmup=True) == interleaved_1f1b(4, 8, 2, 2)


def _grouped(n: int | None, batch: int, **over) -> dict:
    par = dict(parallel__data=2, parallel__tensor=2, parallel__pipeline=4, parallel__schedule="interleaved-1f1b",
               parallel__virtual_stages=2, training__global_batch=batch)
    if n is not None:
        par["parallel__microbatch_group_size"] = n
    return _tiny(**par, **over)


def test_scenario_rules_name_the_field() -> None:
    """m = 10 on 4 stages is refused by default and runs in groups of 5; bad group sizes are refused on
    parallel.microbatch_group_size, and a group without interleaving is refused."""
    with pytest.raises(ScenarioError, match="training.global_batch"):
        scenario_from_dict(_grouped(None, 40))
    scenario_from_dict(_grouped(5, 40))
    for n in (3, 7, 11):
        with pytest.raises(ScenarioError, match="microbatch_group_size"):
            scenario_from_dict(_grouped(n, 40))
    with pytest.raises(ScenarioError, match="microbatch_group_size"):
        scenario_from_dict(_tiny(parallel__microbatch_group_size=4))


@pytest.mark.parametrize("overlap", [True, False])
def test_groups_simulate_alike_symmetric_and_full(overlap: bool) -> None:
    """m = 10 in groups of 5 runs every pass (summary), and the symmetric run equals the every-GPU run,
    with the exchanges beside compute or waited (per action: the exchange rounds are for groups of p)."""
    kw = dict(parallel__overlap_p2p_comm=overlap)
    full = simulate(scenario_from_dict(_grouped(5, 40, simulation__symmetry="off", **kw)))
    sym = simulate(scenario_from_dict(_grouped(5, 40, simulation__symmetry="on", **kw)))
    assert sym.summary["parallel"]["microbatch_group_size"] == 5
    assert sym.summary["step_time_s"] == pytest.approx(full.summary["step_time_s"], rel=1e-9)
    fwd = {(sp.args.get("microbatch"), sp.args.get("chunk")) for sp in full.timeline.spans
           if sp.gpu == 0 and sp.stream == STREAM_COMPUTE and sp.category == "forward"}
    assert {mb for mb, _ in fwd} >= set(range(10))


def test_breadth_first_holds_more_activations_in_the_simulation() -> None:
    """The run's memory model follows the group: stage 0's activations grow by (2·3 + 8 + 1)/(2·3 + 4 + 1)
    from N = 4 to N = 8 (m = 8)."""
    act = {n: simulate(scenario_from_dict(_grouped(n, 32))).summary["memory_by_stage"][0]["activations"]
           for n in (4, 8)}
    assert act[8] / act[4] == pytest.approx(15 / 11, rel=1e-9)


def test_megatron_lm_2021_runs_every_forward_first_when_m_equals_p() -> None:
    """Under megatron-lm-2021 with m = p = 4 the last stage starts no backward before all its forwards
    (v2.5's all_warmup_microbatches); under transformer-engine (core_r0.10.0 on) it does."""
    def first_backward_after_last_forward(kernels: str) -> bool:
        r = simulate(scenario_from_dict(_grouped(None, 16, training__kernels=kernels,
                                                 training__precision="fp16", simulation__symmetry="off")))
        last = r.timeline.gpus[-1]
        spans = [sp for sp in r.timeline.spans if sp.gpu == last and sp.stream == STREAM_COMPUTE]
        f_end = max(sp.start_s + sp.dur_s for sp in spans if sp.category == "forward")
        b_start = min(sp.start_s for sp in spans if sp.category == "backward")
        return b_start >= f_end - 1e-12
    assert first_backward_after_last_forward("megatron-lm-2021")
    assert not first_backward_after_last_forward("transformer-engine")


def test_the_planner_offers_groups_only_where_the_stack_had_them() -> None:
    """10 micro-batches on 4 stages: Megatron-Core (groups) runs them interleaved in groups of 5, the
    smallest valid size; a stack without groups (Megatron-LM 2021/2022) drops interleaving, naming why."""
    from sim.explore.search import SCHEDULES, _schedules

    dropped: dict[str, int] = {}

    def drop(reason: str, n: int = 1) -> None:
        dropped[reason] = dropped.get(reason, 0) + n

    with_groups = _schedules(4, 10, 48, SCHEDULES, drop, groups=True)
    assert [(s, g) for s, v, g in with_groups if s == "interleaved-1f1b"] == [("interleaved-1f1b", 5)] * 5
    assert not dropped
    without = _schedules(4, 10, 48, SCHEDULES, drop, groups=False)
    assert all(s != "interleaved-1f1b" for s, _, _ in without)
    assert dropped == {"interleaved: micro-batches not a multiple of pipeline": 5}
    assert all(g is None for _, _, g in _schedules(4, 12, 48, SCHEDULES, drop, groups=True))
