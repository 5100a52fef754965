"""Partitioned activation checkpoints (training.checkpointing.partition_activations: Megatron-LM's
--distribute-checkpointed/saved-activations, DeepSpeed's partition_activations): each tensor-parallel rank
keeps 1/t of every checkpointed layer input and all-gathers it before the recompute, with each stack's copies
around the gather (sim.workload.kernels.CHECKPOINT_PARTITIONS; sim.training.step_work.
partitioned_checkpoint_blocks). Memory against the hand count of the inputs kept, time against the blocks
the gather adds, and the rules."""

from __future__ import annotations

import pytest

from sim.api import simulate
from sim.build import build_job, cost_model_for
from sim.engine.timeline import COMM_TP
from sim.errors import ScenarioError
from sim.scenario.load import load_scenario
from sim.training.step_work import stack_notes

# 8 layers on 2 stages of TP 4 (8 GPUs), Megatron-DeepSpeed of 2022, full checkpointing: small and fast.
BASE = [
    "cluster.nodes=1", "cluster.gpus_per_node=8", "cluster.gpu_speed_spread=0",
    "model=gpt3-1.3b", "model.layers=8",
    "parallel.data=1", "parallel.tensor=4", "parallel.pipeline=2", "parallel.schedule=1f1b",
    "parallel.sequence_parallel=false", "parallel.zero=0",
    "training.global_batch=4", "training.micro_batch=1", "training.precision=fp16",
    "training.loss_scaling=none", "training.kernels=megatron-deepspeed-2022", "training.checkpointing=full",
]
MAIN = "scenarios/gpt3-175b-1024xa100-hdr.yaml"


def _scenario(*more: str):
    return load_scenario(MAIN, [*BASE, *more])


def _job(*more: str):
    sc = _scenario(*more)
    return sc, *build_job(sc, cost_model_for(sc))


def test_partitioned_checkpoints_keep_a_tp_share_of_each_layer_input() -> None:
    sc, _, whole = _job()
    _, _, part = _job("training.checkpointing.partition_activations=true")
    s, b, h, t = sc.model.seq_len, 1, sc.model.hidden, 4
    layer_input = s * b * h * 2  # fp16 bytes of one checkpointed layer input
    # 1F1B: stage 0 holds p = 2 micro-batches' checkpoints of its 4 layers (4 micro-batches in the step)
    saved = 2 * 4 * layer_input * (1 - 1 / t)
    got = whole.memory_by_stage[0]["activations"] - part.memory_by_stage[0]["activations"]
    assert got == pytest.approx(saved, rel=1e-9)


def test_the_gather_before_each_segment_recompute_moves_the_whole_input() -> None:
    sc, job, _ = _job("training.checkpointing.partition_activations=true")
    layer_input = sc.model.seq_len * sc.model.hidden * 2
    layers = [lw for c in job.chunks for lw in c.layers if lw.name.startswith("L")]
    assert len(layers) == 8
    for lw in layers:
        gather, copies = lw.recompute[0], lw.recompute[1]
        assert (gather.name, gather.comm, gather.comm_bytes) == ("checkpoint gather", "all_gather", layer_input)
        assert copies.name == "checkpoint gather copies" and copies.comm is None
        assert lw.forward[0].name == "partition checkpoint"
    # every 2 layers: only each segment's first layer partitions and gathers its input
    _, job2, _ = _job("training.checkpointing.partition_activations=true", "training.checkpointing.every=2")
    starts = [lw.recompute[0].name == "checkpoint gather" for c in job2.chunks for lw in c.layers
              if lw.name.startswith("L")]
    assert starts == [True, False] * 4


def test_a_simulated_step_runs_the_gathers_and_takes_their_time() -> None:
    plain = simulate(_scenario())
    part = simulate(_scenario("training.checkpointing.partition_activations=true"))
    spans = [s for s in part.timeline.spans if s.name.endswith("checkpoint gather all_gather")]
    layer_input = plain.scenario.model.seq_len * plain.scenario.model.hidden * 2
    # one gather per layer and micro-batch on each simulated GPU of the two stages, as TP traffic
    per_gpu = {g: sum(1 for s in spans if s.gpu == g) for g in {s.gpu for s in spans}}
    assert set(per_gpu.values()) == {4 * 4} and len(per_gpu) >= 2
    assert all(s.category == COMM_TP and s.args["bytes"] == layer_input for s in spans)
    # the step grows by at least the gathers on the critical path of the last stage's backwards
    gathers_s = sum(s.dur_s for s in spans if s.gpu == max(per_gpu))
    assert part.summary.step_time_s > plain.summary.step_time_s + 0.5 * gathers_s


def test_without_tensor_parallelism_nothing_is_partitioned() -> None:
    _, job, info = _job("parallel.tensor=1", "parallel.data=4", "training.checkpointing.partition_activations=true")
    _, job0, info0 = _job("parallel.tensor=1", "parallel.data=4")
    assert info.memory_by_stage == info0.memory_by_stage
    assert [lw.recompute for c in job.chunks for lw in c.layers] == [lw.recompute for c in job0.chunks for lw in c.layers]


def test_rules_and_stack_notes() -> None:
    with pytest.raises(ScenarioError, match="partition_activations"):
        _scenario("training.checkpointing=selective", "training.checkpointing.partition_activations=true")
    # the mapping without a kind is full checkpointing, as {every: k} is
    sc = load_scenario(MAIN, [*BASE[:-1], "training.checkpointing={partition_activations: true}"])
    assert sc.training.checkpointing.kind == "full" and sc.training.checkpointing.partition_activations
    assert stack_notes(_scenario("training.checkpointing.partition_activations=true")) == []
    for kernels in ("megatron-lm-2021", "megatron-lm-2022", "transformer-engine"):  # their own flags
        assert stack_notes(_scenario("training.checkpointing.partition_activations=true",
                                     f"training.kernels={kernels}")) == []
    notes = stack_notes(_scenario("training.checkpointing.partition_activations=true",
                                  "training.kernels=pytorch-fsdp-2023"))
    assert any(n.startswith("training.checkpointing.partition_activations: true") for n in notes)


def test_each_code_base_copies_around_the_gather_as_its_code_does() -> None:
    """The copies beside the gather, in bytes of the whole input I at t = 4: DeepSpeed fills a zeroed buffer
    (I written) and copies its slice in (2I/4) before, and copies the list out (2I) after; Megatron-LM 2021's
    list gather copies out (2I); from 2022 the gather lands in place (nothing)."""
    from sim.workload.ops import elementwise

    sc, _, _ = _job()
    cost = cost_model_for(sc)
    layer_input = sc.model.seq_len * sc.model.hidden * 2

    def copy_s(nbytes: float) -> float:
        return cost.op_time_s(elementwise("x", nbytes, "fp16"))

    def blocks(kernels: str):
        _, job, _ = _job("training.checkpointing.partition_activations=true", f"training.kernels={kernels}")
        return next(lw for c in job.chunks for lw in c.layers if lw.name.startswith("L")).recompute

    ds = blocks("megatron-deepspeed-2022")
    assert ds[0].dur_s == pytest.approx(copy_s(layer_input) + copy_s(layer_input / 2), rel=1e-9)
    assert ds[1].dur_s == pytest.approx(copy_s(2 * layer_input), rel=1e-9)
    old = blocks("megatron-lm-2021")
    assert old[0].dur_s == 0.0 and old[1].dur_s == pytest.approx(copy_s(2 * layer_input), rel=1e-9)
    new = blocks("megatron-lm-2022")
    assert new[0].dur_s == 0.0 and new[1].name != "checkpoint gather copies"
