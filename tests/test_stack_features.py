"""What each software stack could run (KernelSet.missing, read from its code: sim/workload/kernels.py), the
notes `dtsim run` prints for a layout its stack could not run, and the planner keeping to the stack."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.cli import main
from sim.explore.search import enumerate_candidates
from sim.scenario.load import load_scenario
from sim.training.step_work import stack_notes
from sim.workload.kernels import KERNEL_SETS

ROOT = Path(__file__).resolve().parents[1]
SC21 = ROOT / "scenarios" / "published" / "gpt3-175b-1024xa100-sc21.yaml"
LAYOUT = dict(tensor=8, pipeline=8, schedule="1f1b", zero=0, checkpointing="full", sequence_parallel=False)


def _missing(kernels: str, **change) -> list[tuple[str, str]]:
    return KERNEL_SETS[kernels].missing(**{**LAYOUT, **change})


def test_each_stack_lacks_what_its_code_lacked() -> None:
    # Megatron-LM of 2021: no sequence parallelism, selective recompute or distributed optimizer (all 2022)
    assert _missing("megatron-lm-2021", sequence_parallel=True, checkpointing="selective", zero=1) == [
        ("parallel.sequence_parallel", "true"), ("training.checkpointing", "selective"), ("parallel.zero", "1")]
    assert _missing("megatron-lm-2022", sequence_parallel=True, checkpointing="selective", zero=1) == []
    assert _missing("megatron-lm-2022", zero=2) == [("parallel.zero", "2")]  # its optimizer shards states only
    # DeepSpeed's pipeline engine: 1F1B-like TrainSchedule only, ZeRO < 2 with a pipeline (any without one)
    assert _missing("megatron-deepspeed-2022", schedule="interleaved-1f1b") == [("parallel.schedule",
                                                                                 "interleaved-1f1b")]
    assert _missing("megatron-deepspeed-2022", zero=2) == [("parallel.zero", "2")]
    assert _missing("megatron-deepspeed-2022", zero=3, pipeline=1) == []
    # llm-foundry's 2023 stack: FSDP only, no model parallelism
    assert _missing("pytorch-fsdp-2023", zero=3) == [("parallel.tensor", "8"), ("parallel.pipeline", "8")]
    assert _missing("pytorch-fsdp-2023", tensor=1, pipeline=1, zero=1) == [("parallel.zero", "1")]
    every = dict(sequence_parallel=True, checkpointing="selective", schedule="interleaved-1f1b")
    assert all(_missing("transformer-engine", zero=z, **every) == [] for z in (0, 1, 2, 3))


def test_megatron_lm_ran_only_even_stages() -> None:
    """Megatron-LM 2021/2022 assert num_layers % pipeline == 0, each stage's layers divisible by its chunks,
    and pipeline > 2 under interleaving; DeepSpeed's engine and Megatron-Core split any way."""
    for ks in ("megatron-lm-2021", "megatron-lm-2022"):
        assert _missing(ks, pipeline=5, layers=96) == [("parallel.pipeline", "5 (for 96 layers)")]
        assert _missing(ks, pipeline=8, layers=96) == []
        assert _missing(ks, pipeline=8, layers=96, schedule="interleaved-1f1b", virtual_stages=5) == [
            ("parallel.pipeline", "8 × 5 chunks of 96 layers")]
        assert _missing(ks, pipeline=8, layers=96, schedule="interleaved-1f1b", virtual_stages=4) == []
        assert _missing(ks, pipeline=2, layers=96, schedule="interleaved-1f1b", virtual_stages=2) == [
            ("parallel.schedule", "interleaved-1f1b")]
        assert _missing(ks, pipeline=2, layers=4, stage_layers=[1, 3]) == [("parallel.stage_layers", "[1, 3]")]
        assert _missing(ks, pipeline=2, layers=4, stage_layers=[2, 2]) == []
    assert _missing("megatron-deepspeed-2022", pipeline=5, layers=96) == []
    assert _missing("transformer-engine", pipeline=2, layers=4, stage_layers=[1, 3], schedule="interleaved-1f1b",
                    virtual_stages=2) == []


def test_plan_keeps_megatron_lm_stages_even() -> None:
    sc = load_scenario(SC21)  # 96 layers, megatron-lm-2021
    cands, _ = enumerate_candidates(sc, 1024)
    assert cands and all(96 % (c.pipeline * c.virtual_stages) == 0 for c in cands)
    assert not any(c.schedule == "interleaved-1f1b" and c.pipeline < 3 for c in cands)


def test_shipped_scenarios_run_what_their_stack_ran() -> None:
    """Every published case and shipped scenario uses only what its training.kernels could run."""
    for path in sorted((ROOT / "scenarios").rglob("*.yaml")):
        assert stack_notes(load_scenario(path)) == [], path.name


def test_run_notes_a_layout_its_stack_could_not_run(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["run", str(SC21), "--set", "parallel.sequence_parallel=true", "--no-charts", "--no-trace",
                 "--out", str(out)]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("dtsim: note: ")]
    assert len(notes) == 1
    assert "parallel.sequence_parallel: true" in notes[0] and "megatron-lm-2021" in notes[0]
    assert "megatron-lm-2022 or transformer-engine" in notes[0]  # the stacks that run the whole layout
    assert (out / "summary.json").is_file()  # simulated all the same


def test_plan_searches_only_what_the_stack_could_run() -> None:
    sc = load_scenario(SC21)
    cands, pruned = enumerate_candidates(sc, 1024)
    assert cands and pruned.get("not in training.kernels megatron-lm-2021", 0) > 0
    assert not any(c.sequence_parallel or c.checkpointing == "selective" or c.zero for c in cands)
    assert {c.schedule for c in cands} >= {"1f1b", "interleaved-1f1b"}
    te, _ = enumerate_candidates(load_scenario(SC21, ["training.kernels=transformer-engine"]), 1024)
    assert len(te) > len(cands) and any(c.sequence_parallel for c in te)


@pytest.mark.parametrize("kernels", sorted(KERNEL_SETS))
def test_every_stack_says_where_its_limits_come_from(kernels) -> None:
    ks = KERNEL_SETS[kernels]
    limited = not (ks.sequence_parallel and ks.selective_recompute and ks.zero_stages == (0, 1, 2, 3)
                   and ks.pipeline_zero_stages is None and ks.interleaved_schedule and ks.model_parallel)
    assert bool(ks.features_source) == limited


def test_deepspeed_bf16_shards_the_optimizer_whatever_the_zero_stage() -> None:
    """DeepSpeed runs bf16 with ZeRO stage 0 through its BF16_Optimizer, which partitions the fp32 master
    weights and optimizer state over the data-parallel ranks: a megatron-deepspeed-2022 bf16 scenario with
    zero 0 resolves to ZeRO-1 (fp16 keeps its stage 0, and one replica has nothing to shard over)."""
    mtnlg = ROOT / "scenarios" / "published" / "mtnlg-530b-2240xa100.yaml"
    assert load_scenario(mtnlg, ["parallel.zero=0", "training.precision=bf16"]).parallel.zero == 1
    assert load_scenario(mtnlg, ["parallel.zero=0"]).parallel.zero == 0  # fp16: FP16_Optimizer, unsharded
    assert load_scenario(mtnlg, ["parallel.zero=0", "training.precision=bf16", "parallel.data=1",
                                 "cluster.nodes=35"]).parallel.zero == 0
    assert load_scenario(SC21, ["parallel.zero=0"]).parallel.zero == 0  # Megatron-LM: its own optimizer
    sc = load_scenario(mtnlg, ["training.precision=bf16"])
    cands, pruned = enumerate_candidates(sc, 2240)
    assert not any(c.zero == 0 and c.data > 1 for c in cands)
    assert pruned.get("ZeRO 0 runs as ZeRO 1 (DeepSpeed's BF16_Optimizer)", 0) > 0
