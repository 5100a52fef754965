"""`dtsim validate --published`: the published-figures set loads, converts with each source's own FLOP
formula (checked against hand calculations and against the sources' own figure pairs), and the command
runs and computes its table. It does not assert that dtsim's errors are small: that is what it reports."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.cli import main
from sim.scenario.load import load_scenario
from sim.validation.flops import (
    llm_foundry_mfu,
    matmul_params,
    megatron_2024,
    megatron_causal_2025,
    narayanan_2021_eq4,
    palm_model_flops,
)
from sim.validation.published import DEFAULT_CASES, load_cases, published_time_s, scenario_path

ROOT = Path(__file__).resolve().parent.parent
CASES = load_cases()
BY_NAME = {c.name: c for c in CASES.cases}
SMALL = "llama3-8b-8xh100-nemo"  # one DGX H100: simulates in about a second


def _scenario(name: str):
    return load_scenario(scenario_path(BY_NAME[name], DEFAULT_CASES))


def test_case1_published_seconds_from_eq4_by_hand() -> None:
    # Narayanan et al. SC'21 Eq. 4 for GPT-3 175B, B 1536, s 2048, l 96, h 12288, V 51200, written out:
    flops = 96 * 1536 * 2048 * 96 * 12288**2 * (1 + 2048 / (6 * 12288) + 51200 / (16 * 96 * 12288))
    hand_s = flops / (140e12 * 1024)
    assert hand_s == pytest.approx(31.5, abs=0.3)  # the dev set's ≈ 31.5 s per iteration
    sc = _scenario("gpt3-175b-1024xa100-sc21")
    seconds, origin = published_time_s(BY_NAME["gpt3-175b-1024xa100-sc21"], sc.model, sc.training.global_batch,
                                       sc.total_gpus)
    assert origin == "TFLOP/s"
    assert seconds == pytest.approx(hand_s, rel=1e-12)


@pytest.mark.parametrize(("name", "tokens_per_s", "gpus", "batch"), [
    ("gpt3-175b-128xa100-nemo-jul2022", 20642, 128, 1536), ("gpt3-175b-1024xa100-nemo-jul2022", 141306, 1024, 1536),
    ("gpt3-175b-64xa100-nemo-sep2022", 7500, 64, 2048), ("gpt3-175b-1024xa100-nemo-sep2022", 109684, 1024, 2048)])
def test_nemo_2022_seconds_from_the_readmes_cluster_tokens(name: str, tokens_per_s: int, gpus: int, batch: int) -> None:
    # The NeMo Megatron launcher README gives tokens/s for the whole cluster; the case stores it per GPU
    # (rounded to 1e-3): the iteration is then global batch × 2048 tokens over the cluster's rate.
    sc = _scenario(name)
    assert (sc.total_gpus, sc.training.global_batch, sc.model.seq_len) == (gpus, batch, 2048)
    seconds, origin = published_time_s(BY_NAME[name], sc.model, batch, gpus)
    assert origin == "tokens/s"
    assert seconds == pytest.approx(batch * 2048 / tokens_per_s, rel=1e-5)


def test_mfu_alone_gives_seconds_against_the_16bit_peak() -> None:
    # Llama 3 405B at 8K GPUs states 430 TFLOP/s and "43 % BF16 MFU". With the MFU alone the iteration is
    # PaLM's model FLOPs over 0.43 × the H100's 989 TFLOP/s dense bf16 peak × 8,192 GPUs, written out.
    from sim.validation.published import Case

    name = "llama3-405b-8192xh100"
    sc = _scenario(name)
    case = BY_NAME[name]
    only_mfu = Case.model_validate({**case.model_dump(), "published": {"mfu": 0.43}})
    peak = sc.cluster.gpu.peak_16bit_flops()
    assert peak == pytest.approx(989e12)
    seconds, origin = published_time_s(only_mfu, sc.model, sc.training.global_batch, sc.total_gpus, peak)
    assert origin == "MFU"
    hand_s = palm_model_flops(sc.model, sc.training.global_batch) / (0.43 * 989e12 * 8192)
    assert seconds == pytest.approx(hand_s, rel=1e-12)
    # Consistent with the TFLOP/s the same table gives (430 ≈ 0.43 × 989 = 425): within 1.2 %
    by_tflops, _ = published_time_s(case, sc.model, sc.training.global_batch, sc.total_gpus, peak)
    assert seconds == pytest.approx(by_tflops, rel=0.012)
    # A time-giving figure, when present, is preferred over the MFU
    both = Case.model_validate({**case.model_dump(), "published": {"mfu": 0.5, "tflops_per_gpu": 430}})
    assert published_time_s(both, sc.model, sc.training.global_batch, sc.total_gpus, peak)[1] == "TFLOP/s"


def test_mfu_alone_needs_a_16bit_peak() -> None:
    from sim.errors import ScenarioError
    from sim.hardware.gpu import GPUSpec
    from sim.validation.published import Case

    fp32_only = GPUSpec(peak_tflops={"fp32": 20.0}, memory_GB=16, memory_bandwidth_GBps=900)
    assert fp32_only.peak_16bit_flops() is None
    v100 = GPUSpec(peak_tflops={"fp32": 15.7, "fp16": 125.0}, memory_GB=32, memory_bandwidth_GBps=900)
    assert v100.peak_16bit_flops() == pytest.approx(125e12)
    name = "llama3-405b-8192xh100"
    sc = _scenario(name)
    only_mfu = Case.model_validate({**BY_NAME[name].model_dump(), "published": {"mfu": 0.43}})
    with pytest.raises(ScenarioError, match="published.mfu"):
        published_time_s(only_mfu, sc.model, sc.training.global_batch, sc.total_gpus, None)


def test_table_columns_stay_aligned_past_long_case_names() -> None:
    from sim.validation.published import CaseResult, format_table

    def row(name: str) -> CaseResult:
        return CaseResult(name=name, gpus=8, gpu="A100-80GB", flop_formula="palm-model-flops", flops_per_iteration=1.0,
                          published_s=2.0, published_from="tokens/s", published_tflops_per_gpu=1.0, simulated_s=1.0,
                          simulated_tflops_per_gpu=2.0, time_error=-0.5, tflops_error=1.0, wall_s=0.0, source="s",
                          source_label="s")

    lines = format_table([row("short"), row("a-case-name-longer-than-the-column")]).splitlines()
    gpus_col = lines[0].index("GPUs") + len("GPUs")  # right-aligned header
    assert [ln[gpus_col - 1] for ln in (lines[2], lines[3])] == ["8", "8"]


@pytest.mark.parametrize("name", ["mtnlg-530b-2240xa100", "mtnlg-530b-2800xa100", "mtnlg-530b-3360xa100"])
def test_eq4_reproduces_mtnlg_time_and_tflops_pairs(name: str) -> None:
    # MT-NLG publishes both seconds per iteration and TFLOP/s per GPU: Eq. 4 on the scenario's model must
    # turn one into the other (an independent check of the formula and of the scenario's dimensions).
    case, sc = BY_NAME[name], _scenario(name)
    flops = narayanan_2021_eq4(sc.model, sc.training.global_batch)
    implied = flops / (case.published.iteration_s * sc.total_gpus) / 1e12
    assert implied == pytest.approx(case.published.tflops_per_gpu, rel=0.01)


@pytest.mark.parametrize("name", ["llama3-70b-64xh100-nemo", "llama3-8b-8xh100-nemo", "llama31-405b-1024xh100-nemo"])
def test_megatron_formula_reproduces_nemo_tokens_and_tflops_pairs(name: str) -> None:
    case, sc = BY_NAME[name], _scenario(name)
    flops_per_token = megatron_causal_2025(sc.model, 1) / sc.model.seq_len
    implied_tflops = flops_per_token * case.published.tokens_per_s_per_gpu / 1e12
    assert implied_tflops == pytest.approx(case.published.tflops_per_gpu, rel=0.005)


@pytest.mark.parametrize("name", ["gpt3-5b-64xh100-nemo2407", "llama2-7b-8xh100-nemo2407", "llama2-13b-16xh100-nemo2407",
                                  "llama3-8b-8xh100-nemo2407"])
def test_megatron_2024_formula_reproduces_nemo_2407_tokens_and_tflops_pairs(name: str) -> None:
    """NeMo 24.07's table counts the full s×s of attention (Megatron's formula before its causal halving):
    tokens/s per GPU × those FLOPs per token = its model TFLOP/s; the causal 2025 count falls 4-9 % short."""
    case, sc = BY_NAME[name], _scenario(name)
    flops_per_token = megatron_2024(sc.model, 1) / sc.model.seq_len
    implied_tflops = flops_per_token * case.published.tokens_per_s_per_gpu / 1e12
    assert implied_tflops == pytest.approx(case.published.tflops_per_gpu, rel=0.005)
    causal = megatron_causal_2025(sc.model, 1) / sc.model.seq_len * case.published.tokens_per_s_per_gpu / 1e12
    assert causal < 0.97 * case.published.tflops_per_gpu


@pytest.mark.parametrize("name, peak_flops_per_s", [
    *((f"mpt-{size}-8xa100-llmfoundry", 312e12) for size in ("3b", "7b", "13b", "30b")),
    *((f"mpt-{size}-8xh100-llmfoundry", 989e12) for size in ("7b", "13b", "30b")),
])
def test_llm_foundry_formula_reproduces_the_tables_mfu(name: str, peak_flops_per_s: float) -> None:
    """tokens/s per GPU × llm-foundry's FLOPs per token ÷ the GPU's dense bf16 peak (A100 312, H100 989
    TFLOP/s, as Composer counts them) = the table's MFU."""
    case, sc = BY_NAME[name], _scenario(name)
    flops_per_token = llm_foundry_mfu(sc.model, 1) / sc.model.seq_len
    assert case.published.mfu is not None and case.published.tokens_per_s_per_gpu is not None
    mfu = flops_per_token * case.published.tokens_per_s_per_gpu / peak_flops_per_s
    assert mfu == pytest.approx(case.published.mfu, rel=0.005)


def test_narayanan_model_flops_are_eq4_without_the_recomputed_forward() -> None:
    # GPT-3 175B, B 1536: Eq. 4 counts 4 passes of the layers (3 of the logits); the model count 3 and 3.
    from sim.validation.flops import narayanan_2021_model

    m = _scenario("gpt3-175b-1024xa100-sc21").model
    b, s, n, h, v = 1536, 2048, 96, 12288, 51200
    layers = n * (24 * b * s * h * h + 4 * b * s * s * h)  # one forward pass of every layer
    logits = 2 * b * s * h * v
    assert narayanan_2021_model(m, b) == pytest.approx(3 * layers + 3 * logits, rel=1e-12)
    assert narayanan_2021_eq4(m, b) == pytest.approx(4 * layers + 3 * logits, rel=1e-12)


def test_palm_model_flops_by_hand_for_llama3_405b() -> None:
    m = _scenario("llama3-405b-8192xh100").model
    h, f, layers, vocab, s = 16384, 53248, 126, 128256, 8192
    params = layers * (2 * h * h + 2 * h * 8 * 128 + 3 * h * f) + vocab * h  # q,o; k,v (8 KV heads × 128); SwiGLU
    assert matmul_params(m) == params
    assert palm_model_flops(m, 2048) == pytest.approx(2048 * s * (6 * params + 12 * layers * h * s), rel=1e-12)
    # 430 TFLOP/s on 8,192 GPUs is 43 % of the H100's 989 TFLOP/s dense BF16 peak, as the paper says
    assert BY_NAME["llama3-405b-8192xh100"].published.tflops_per_gpu / 989.4 == pytest.approx(0.43, abs=0.006)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_case_scenario_loads(name: str) -> None:
    case, sc = BY_NAME[name], _scenario(name)
    assert scenario_path(case, DEFAULT_CASES).is_relative_to(ROOT / "scenarios" / "published")
    assert sc.parallel is not None and sc.parallel.world_size == sc.total_gpus
    assert case.source.url.startswith("https://")


def test_errors_are_summarised_per_source_in_first_seen_order() -> None:
    from sim.validation.published import CaseResult, aggregate_by_source, format_table

    def row(name: str, label: str, err: float) -> CaseResult:
        return CaseResult(name=name, gpus=8, gpu="H100-SXM", flop_formula="palm-model-flops", flops_per_iteration=1.0,
                          published_s=1.0, published_from="tokens/s", published_tflops_per_gpu=1.0,
                          simulated_s=1.0 + err, simulated_tflops_per_gpu=1.0 / (1.0 + err), time_error=err,
                          tflops_error=1.0 / (1.0 + err) - 1.0, wall_s=0.0, source=label, source_label=label)

    rows = [row("a", "Paper B", -0.20), row("b", "Paper A", 0.02), row("c", "Paper B", 0.10)]
    by = aggregate_by_source(rows)
    assert list(by) == ["Paper B", "Paper A"]
    assert by["Paper B"]["cases"] == 2
    assert by["Paper B"]["mean_abs_time_error"] == pytest.approx(0.15)  # (20 % + 10 %) / 2
    assert by["Paper B"]["max_abs_time_error"] == pytest.approx(0.20)
    assert by["Paper A"]["mean_abs_time_error"] == pytest.approx(0.02)
    assert by["Paper B"]["mean_time_error"] == pytest.approx(-0.05)  # (−20 % + 10 %) / 2
    assert by["Paper B"]["cases_within_10pct"] == 1 and by["Paper A"]["cases_within_10pct"] == 1
    text = format_table(rows)
    assert "mean signed error -2.7%" in text and "2 of 3 cases within 10%" in text  # (−20 + 2 + 10) / 3
    assert "by source" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("Paper B"))
    assert "2 cases" in line and "15.0%" in line and "20.0%" in line and "signed  -5.0%" in line
    assert "by source" not in format_table(rows[:1])  # one source: the overall line says it all


def test_every_shipped_case_names_its_source_briefly() -> None:
    labels = {c.name: c.source.label for c in CASES.cases}
    assert all(labels.values()), [n for n, label in labels.items() if not label]
    assert labels["gpt3-175b-1024xa100-nemo-jul2022"] != labels["gpt3-175b-64xa100-nemo-sep2022"]
    assert labels["mpt-7b-8xa100-llmfoundry"] != labels["mpt-7b-8xh100-llmfoundry"]


def test_command_runs_one_case_and_computes_the_table(capsys, tmp_path) -> None:
    out = tmp_path / "table.json"
    assert main(["validate", "--published", "--case", SMALL, "--json", "--out", str(out)]) == 0
    table = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == table
    (row,) = table["cases"]
    assert row["name"] == SMALL and row["gpus"] == 8
    assert list(table["by_source"]) == [row["source_label"]] == [BY_NAME[SMALL].source.label]
    assert row["published_s"] == pytest.approx(128 * 8192 / (14451 * 8), rel=1e-12)  # tokens/s → seconds
    for key in ("simulated_s", "time_error", "tflops_error", "simulated_tflops_per_gpu"):
        assert math.isfinite(row[key])
    assert row["simulated_s"] > 0
    assert row["time_error"] == pytest.approx((row["simulated_s"] - row["published_s"]) / row["published_s"])
    # simulated TFLOP/s is the source's FLOPs over the simulated time, not dtsim's own MFU
    assert row["simulated_tflops_per_gpu"] == pytest.approx(
        row["flops_per_iteration"] / (row["simulated_s"] * 8) / 1e12)
    assert table["summary"]["mean_abs_time_error"] == pytest.approx(abs(row["time_error"]))


def test_breakdown_splits_the_iteration_and_prices_the_published_time(capsys) -> None:
    from sim.api import simulate

    name = "mpt-3b-8xa100-llmfoundry"  # one DGX A100, simulates in well under a second
    assert main(["validate", "--published", "--case", name, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["cases"]
    summary = simulate(_scenario(name)).summary  # same scenario and seed: the same iteration
    assert row["simulated_compute_s"] == pytest.approx(summary["compute_s"], rel=1e-12)
    assert 0 < row["simulated_compute_s"] <= row["simulated_s"]
    assert row["simulated_compute_s"] + row["simulated_exposed_comm_s"] <= row["simulated_s"] * (1 + 1e-9)
    hw_tflop = summary["hardware_tflops_per_gpu"] * summary["step_time_s"]  # per GPU per iteration
    assert row["compute_tflops_per_gpu"] == pytest.approx(hw_tflop / summary["compute_s"], rel=1e-9)
    # What the published time leaves for the same compute once the simulated time outside it is taken off
    outside_s = row["simulated_s"] - row["simulated_compute_s"]
    assert row["implied_compute_tflops_per_gpu"] == pytest.approx(hw_tflop / (row["published_s"] - outside_s),
                                                                  rel=1e-9)
    assert main(["validate", "--published", "--case", name, "--breakdown"]) == 0
    text = capsys.readouterr().out
    assert "busy TF/s" in text and "implied" in text and text.count(name) == 2


def test_text_table_has_the_case_and_the_mean(tmp_path, capsys) -> None:
    assert main(["validate", "--published", "--case", SMALL]) == 0
    text = capsys.readouterr().out
    assert SMALL in text and "mean |error|" in text and "megatron-causal-2025" in text


def _one_line_exit_2(argv: list[str], needle: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err


def test_out_replaces_only_an_earlier_table(tmp_path, capsys) -> None:
    """--out never overwrites the case set it reads nor a file it did not write; its own table it replaces."""
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}')
    _one_line_exit_2(["validate", "--published", "--case", SMALL, "--out", str(mine)], "not a table", capsys)
    assert mine.read_text() == '{"my": "notes"}'
    cases = tmp_path / "cases.json"
    cases.write_text(DEFAULT_CASES.read_text())
    _one_line_exit_2(["validate", "--published", "--cases", str(cases), "--case", SMALL, "--out", str(cases)],
                     "is the --cases file", capsys)
    table = tmp_path / "table.json"
    for _ in range(2):  # written, then replaced
        assert main(["validate", "--published", "--case", SMALL, "--out", str(table)]) == 0
    assert json.loads(table.read_text())["cases"][0]["name"] == SMALL


def test_bad_input_exits_2(tmp_path, capsys) -> None:
    _one_line_exit_2(["validate", "--published", "--case", "gpt3-175b"], "not a case of the set", capsys)
    _one_line_exit_2(["validate", "--published", "--cases", str(tmp_path / "none.yaml")], "no such file", capsys)
    (tmp_path / "d.json").mkdir()
    _one_line_exit_2(["validate", "--published", "--out", str(tmp_path / "d.json")], "is a folder", capsys)
    _one_line_exit_2(["validate", "--published", "--out", str(tmp_path / "t.txt")], "must end in .json", capsys)
    _one_line_exit_2(["validate", "--published", "--bogus"], "unrecognized arguments", capsys)
    data = yaml.safe_load(DEFAULT_CASES.read_text())
    bad = tmp_path / "bad.yaml"
    typo = dict(data["cases"][-1], flop_formula="dtsim-mfu")
    bad.write_text(yaml.safe_dump({"cases": [typo]}))
    _one_line_exit_2(["validate", "--published", "--cases", str(bad)], "flop_formula", capsys)
    missing = dict(data["cases"][-1], scenario="scenarios/published/nope.yaml")
    bad.write_text(yaml.safe_dump({"cases": [missing]}))
    _one_line_exit_2(["validate", "--published", "--cases", str(bad)], "no such file", capsys)


def test_published_needs_neither_torch_nor_calibrate() -> None:
    code = ("import sys\nfrom sim.cli import main\nassert main(['validate', '--published', '--list']) == 0\n"
            "assert 'calibrate' not in sys.modules and 'torch' not in sys.modules, 'imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert SMALL in proc.stdout


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_every_published_run_fits_in_its_gpus(name: str) -> None:
    """These runs happened on the GPUs they name, so the memory model must find them a fit (analytic: the
    job is built, not simulated)."""
    from sim.build import build_job, cost_model_for
    from sim.memory import fits

    sc = _scenario(name)
    _, info = build_job(sc, cost_model_for(sc))
    worst = max(d["peak"] for d in info.memory_by_stage)
    assert fits(worst, sc.gpu.memory_bytes), f"{name}: {worst / 1e9:.1f} GB > {sc.gpu.memory_bytes / 1e9:.0f} GB"


def test_cases_run_in_worker_processes_give_the_same_table_in_the_given_order() -> None:
    from sim.validation.published import run_cases

    picked = [BY_NAME["mpt-3b-8xa100-llmfoundry"], BY_NAME[SMALL]]
    alone = run_cases(picked, DEFAULT_CASES, None, jobs=1)
    pooled = run_cases(picked, DEFAULT_CASES, None, jobs=2)
    assert [r.name for r in pooled] == [c.name for c in picked]
    assert [r.simulated_s for r in pooled] == [r.simulated_s for r in alone]  # same simulation, same seed


def test_bad_input_inside_a_worker_is_one_line_and_exit_2(capsys) -> None:
    code = main(["validate", "--published", "--case", "mpt-3b-8xa100-llmfoundry", "--case", SMALL,
                 "--jobs", "2", "--set", "training.bogus=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "training.bogus" in err[0] and "unknown key" in err[0]


def test_the_cases_expected_to_take_longest_start_first() -> None:
    """With several workers, the few long cases (Meta's 405B runs: per-micro-batch reduce-scatters over
    64- to 128-GPU rings) start first, side by side, instead of one of them last and alone."""
    from sim.validation.published import longest_first

    picked = [BY_NAME[SMALL], BY_NAME["mtnlg-530b-2240xa100"], BY_NAME["llama3-405b-16384xh100"]]
    assert longest_first(picked, DEFAULT_CASES, None) == [2, 1, 0]


def test_the_budget_counts_gradient_rings_over_data_times_context_parallelism() -> None:
    """Gradients are reduce-scattered over the data × context-parallel group (128 GPUs in Meta's
    131,072-token run: data 8 × CP 16), so the estimate's per-micro-batch reduce-scatters under ZeRO-2 cost
    at least those rings' steps, not those of 8 ranks. (One GPU per node in each ring, on a non-blocking
    tree: a symmetric run folds each ring onto one rank, ``FoldedRingRun``.)"""
    from sim.budget import _dp_ring_period, _folded_cost, estimate_work

    path = scenario_path(BY_NAME["llama3-405b-131k-16384xh100-cp16"], DEFAULT_CASES)
    sc2, sc1 = load_scenario(path), load_scenario(path, ["parallel.zero=1"])
    assert _dp_ring_period(sc2) == 1
    p, mb, layers = sc2.parallel.pipeline, sc2.microbatches, sc2.model.layers / sc2.parallel.pipeline
    rings = p * mb * layers * _folded_cost("reduce_scatter", 128, 1)
    assert estimate_work(sc2).events - estimate_work(sc1).events >= 0.9 * rings
    assert rings > 10 * p * mb * layers * _folded_cost("reduce_scatter", 8, 1)
