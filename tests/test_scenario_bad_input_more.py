"""More bad input: absurd reliability figures, union fields, YAML nulls, settings that cannot apply.

Every refusal is ONE line on stderr naming the field, the value, the rule and a fix, with exit status 2 and
no traceback; a setting that cannot apply but is harmless (plan and sweep vary tensor over a base that sets
it) earns a ``dtsim: note:`` line from ``dtsim run`` instead.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from sim.cli import main
from sim.errors import ScenarioError
from sim.run import goodput
from sim.run import reliability as rel
from sim.scenario import load_scenario, scenario_from_dict
from sim.scenario.base import show
from sim.scenario.load import apply_overrides
from sim.training.step_work import stack_notes

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "scenarios" / "gpt3-1.3b-16xa100.yaml"
SEED = ROOT / "scenarios" / "seed-pipeline.yaml"
RESNET = ROOT / "scenarios" / "resnet50-dp-1xa100.yaml"
# field: value — rule; fix
ONE_LINE = re.compile(r"^[^\n]+?: [^\n]+ — [^\n]+; [^\n]+$")

# A small, fast training run with a reliability section (as tests/test_reliability.py's).
RUN = {
    "name": "rel-bad",
    "cluster": {"nodes": 2, "gpus_per_node": 4, "gpu": "A100-80GB"},
    "model": {"kind": "synthetic", "layers": 4, "forward_ms": 10, "params_per_layer": 250_000_000},
    "parallel": {"data": 8},
    "training": {"global_batch": 8, "train_steps": 1000, "precision": "bf16"},
    "reliability": {"gpu_mtbf_hours": 2000, "checkpoint": {"interval": "auto", "write_GBps": 10.0},
                    "restart_s": 600, "monte_carlo_trials": 20},
}


def _with_reliability(**changes) -> dict:
    d = copy.deepcopy(RUN)
    for key, value in changes.items():
        if key in ("interval", "write_GBps"):
            d["reliability"]["checkpoint"][key] = value
        else:
            d["reliability"][key] = value
    return d


def _refused(d: dict, overrides: list[str] | None = None) -> str:
    """The one-line message scenario_from_dict gives for ``d`` (with ``overrides`` as --set)."""
    data, origins = apply_overrides(d, overrides or [])
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(data, origins=origins)
    text = str(info.value)
    assert "\n" not in text and info.value.field and text.startswith(info.value.field + ": "), text
    assert ONE_LINE.match(text), text
    return text


def _cli(capsys, argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of ``dtsim ARGV``, run in this process."""
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def _one_error_line(code: int, err: str, field: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert lines[0].startswith(f"dtsim: error: {field}: "), lines[0]
    return lines[0]


# ---- 1. an MTBF so large that the job MTBF overflowed: bounded, and the interval math robust ----------


def test_astronomical_mtbf_is_refused_in_one_line(capsys, tmp_path):
    text = _refused(_with_reliability(gpu_mtbf_hours=1e308))
    assert text.startswith("reliability.gpu_mtbf_hours: 1e+308 — must be ≤ 1e+300")
    for cmd in (["run", str(GPT), "--out", str(tmp_path / "r"), "--no-charts", "--no-trace"],
                ["compare", str(GPT), str(GPT), "--out", str(tmp_path / "c"), "--no-charts", "--no-progress"]):
        code, err = _cli(capsys, [*cmd, "--set", "reliability={gpu_mtbf_hours: 1e308, restart_s: 600, "
                                  "checkpoint: {write_GBps: 10}}", "--set", "training.train_steps=1000"])
        assert code == 2 and "reliability.gpu_mtbf_hours: 1e+308" in err and "internal error" not in err, err


@pytest.mark.parametrize("field, value", [("gpu_mtbf_hours", 5e-324), ("node_mtbf_hours", 1e-300),
                                          ("link_mtbf_hours", 1e301)])
def test_mtbfs_have_physical_bounds(field, value):
    assert _refused(_with_reliability(**{field: value})).startswith(f"reliability.{field}: {show(value)} — must be")


def test_infinite_optimum_checkpoints_once_per_run():
    """An optimum interval beyond the run (infinite when failures never come) is the run's own length."""
    assert goodput.auto_interval_steps(math.inf, 0.2, 200.0) == 1000
    assert goodput.auto_interval_steps(math.nan, 0.2, 200.0) == 1000
    assert goodput.auto_interval_steps(1e300, 0.2, 200.0) == 1000
    assert goodput.auto_interval_steps(10.0, 0.2, 200.0) == 50  # the Daly optimum in whole steps, as before


def test_no_failures_at_all_is_a_failure_free_run():
    """A job MTBF that overflowed to ∞ is a run without failures, not NaN."""
    plan = rel.Plan(work_s=1000.0, mtbf_s=math.inf, interval_s=1000.0, checkpoint_s=5.0, restart_s=600.0)
    out = rel.expected(plan)
    assert out.wall_s == pytest.approx(1005.0) and out.failures == 0 and out.restart_s == 0
    assert not any(math.isnan(v) for v in out.as_dict().values())


def test_huge_finite_mtbf_runs_with_one_checkpoint(capsys, tmp_path):
    path = tmp_path / "rel.yaml"
    path.write_text(yaml.safe_dump(_with_reliability(gpu_mtbf_hours=1e300)))
    code, err = _cli(capsys, ["run", str(path), "--out", str(tmp_path / "r"), "--no-charts", "--no-trace"])
    assert code == 0, err
    r = json.loads((tmp_path / "r" / "summary.json").read_text())["reliability"]
    assert r["interval_steps"] == 1000  # the whole run: one checkpoint, at the end
    assert r["closed_form"]["failures"] < 1e-3 and r["closed_form"]["restart_s"] < 1


def test_huge_fixed_interval_is_refused():
    text = _refused(_with_reliability(interval=10**400))
    assert text.startswith("reliability.checkpoint.interval: ") and "≤ 1000000000000" in text


# ---- 2. Monte-Carlo trials: a maximum that runs in seconds --------------------------------------------


def test_monte_carlo_trials_have_a_maximum(capsys, tmp_path):
    text = _refused(_with_reliability(monte_carlo_trials=1_000_000_000))
    assert text.startswith("reliability.monte_carlo_trials: 1000000000 — must be ≤ 1000000")
    path = tmp_path / "rel.yaml"
    path.write_text(yaml.safe_dump(_with_reliability(monte_carlo_trials=1_000_000_000)))
    code, err = _cli(capsys, ["run", str(path), "--out", str(tmp_path / "r"), "--no-charts"])
    _one_error_line(code, err, "reliability.monte_carlo_trials")


# ---- 3. ratios in compact form; restart_s bounded ------------------------------------------------------


def test_restart_s_has_an_upper_bound():
    text = _refused(_with_reliability(restart_s=1e300))
    assert text.startswith("reliability.restart_s: 1e+300 — must be ≤ 1e+06")


def test_write_bandwidth_has_a_floor():
    text = _refused(_with_reliability(write_GBps=1e-300))
    assert text.startswith("reliability.checkpoint.write_GBps: 1e-300 — must be ≥ 0.001")


def test_hopeless_run_ratio_is_compact(capsys, tmp_path):
    path = tmp_path / "rel.yaml"
    path.write_text(yaml.safe_dump(_with_reliability(gpu_mtbf_hours=1e-6, restart_s=1e6)))
    code, err = _cli(capsys, ["run", str(path), "--out", str(tmp_path / "r"), "--no-charts"])
    line = _one_error_line(code, err, "reliability")
    # 8 GPUs failing every 3.6 ms: a job MTBF of 0.45 ms against a 10⁶ s restart, a 2.2·10⁹ ratio
    assert "never finish" in line and "— 2.22e+09× shorter than" in line, line
    assert not re.search(r"\d{7}", line), line  # no ratio (or other figure) written out digit by digit


# ---- 4. union fields: the value's field, every arm's rule ---------------------------------------------


@pytest.mark.parametrize("value", [0, 2.5, "sometimes", None, True, -3])
def test_checkpoint_interval_names_both_forms(value):
    text = _refused(_with_reliability(interval=value))
    assert text.startswith(f"reliability.checkpoint.interval: {show(value)} — must be 'auto' or a whole number "
                           "of steps ≥ 1; write e.g. interval: auto"), text
    assert "literal" not in text and "constrained" not in text and "more problem" not in text


def test_checkpoint_interval_did_you_mean():
    assert "did you mean 'auto'?" in _refused(_with_reliability(interval="aut"))


def test_checkpoint_interval_from_set_on_the_command_line(capsys, tmp_path):
    code, err = _cli(capsys, ["run", str(GPT), "--out", str(tmp_path / "r"), "--no-charts",
                              "--set", "reliability={gpu_mtbf_hours: 2000, restart_s: 600, checkpoint: "
                              "{write_GBps: 10}}", "--set", "training.train_steps=1000",
                              "--set", "reliability.checkpoint.interval=0"])
    line = _one_error_line(code, err, "reliability.checkpoint.interval")
    assert "reliability.checkpoint.interval: 0 — must be 'auto' or a whole number of steps ≥ 1" in line


# ---- 5. YAML's null; no placeholders; whole numbers written as decimals -------------------------------


def test_null_is_shown_as_yaml_writes_it(capsys, tmp_path):
    for setting in ("parallel.data=null", "parallel.data="):
        code, err = _cli(capsys, ["run", str(GPT), "--out", str(tmp_path / "r"), "--no-charts",
                                  "--set", setting])
        line = _one_error_line(code, err, "parallel.data")
        assert "parallel.data: null — must be a whole number" in line and "None" not in line


def test_show_spells_yaml_scalars_inside_containers():
    assert show(None) == "null"
    assert show([1, None, True]) == "[1, null, true]"
    assert show({"a": None}) == "{'a': null}"
    assert show(list(range(100_000))).endswith("…") and len(show(list(range(100_000)))) == 60


def test_reliability_rules_show_the_setting_not_a_placeholder():
    d = copy.deepcopy(RUN)
    del d["training"]["train_steps"]
    text = _refused(d)
    assert text.startswith("reliability: set, but training has neither tokens nor train_steps — goodput")
    assert "(given)" not in text and "set training.train_steps, or remove reliability" in text
    collective = {"name": "c", "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "A100-80GB"},
                  "model": {"kind": "collective", "op": "all_reduce", "size_bytes": 1024},
                  "reliability": RUN["reliability"]}
    text = _refused(collective)
    assert text.startswith("reliability: set for a collective model — failures and checkpoints apply")


def test_preset_and_layers_together_show_both():
    d = copy.deepcopy(RUN)
    d["model"] = {"kind": "layers", "preset": "resnet50",
                  "layers": [{"name": "a", "params": 1, "forward_flops": 1, "activation_bytes": 1}]}
    text = _refused(d)
    assert text.startswith("model.layers: 1 layer(s) beside preset 'resnet50' — give either preset or layers")


@pytest.mark.parametrize("value, expect", [
    (1e30, "cluster.nodes: 1e+30 — too large: must be a whole number ≤ 1000000; use nodes ≤ 1000000"),
    (10**30, "cluster.nodes: 1000000000000000000000000000000 — must be ≤ 1000000"),
    (1e3, "cluster.nodes: 1000.0 — must be a whole number, written without a decimal point or exponent; "
          "write nodes: 1000"),
])
def test_nodes_too_large_or_written_as_decimals(value, expect):
    d = copy.deepcopy(RUN)
    d["cluster"]["nodes"] = value
    assert _refused(d).startswith(expect)


def test_gpus_per_node_has_a_maximum():
    d = copy.deepcopy(RUN)
    d["cluster"]["gpus_per_node"] = 100_000
    assert _refused(d).startswith("cluster.gpus_per_node: 100000 — must be ≤ 1024")


# ---- 6. an empty scenario path -------------------------------------------------------------------------


def test_empty_scenario_path(capsys):
    code, err = _cli(capsys, ["run", ""])
    line = _one_error_line(code, err, "scenario")
    assert "the scenario path is empty" in line and "directory" not in line
    with pytest.raises(ScenarioError, match="path is empty"):
        load_scenario("")


# ---- 7. tensor parallelism needs a transformer ---------------------------------------------------------


@pytest.mark.parametrize("path, sets", [
    (SEED, ["parallel.tensor=2", "parallel.pipeline=2"]),
    (RESNET, ["parallel.tensor=2", "cluster.gpus_per_node=2"]),
])
def test_tensor_needs_a_transformer(capsys, tmp_path, path, sets):
    argv = ["run", str(path), "--out", str(tmp_path / "r"), "--no-charts"]
    for s in sets:
        argv += ["--set", s]
    code, err = _cli(capsys, argv)
    line = _one_error_line(code, err, "parallel.tensor")
    assert "parallel.tensor: 2 — tensor parallelism needs a transformer model" in line
    assert "--set parallel.tensor=1 --set parallel.data=2" in line


def test_tensor_on_a_transformer_is_still_fine():
    sc = load_scenario(GPT)  # tensor 2
    assert sc.parallel.tensor == 2


# ---- 8. settings that cannot apply: notes, not refusals ------------------------------------------------


def test_sequence_parallel_at_tensor_1_is_noted():
    sc = load_scenario(GPT, ["parallel.tensor=1", "parallel.data=4", "parallel.sequence_parallel=true"])
    notes = stack_notes(sc)
    assert notes == ["parallel.sequence_parallel: true — has no effect with tensor 1 (Megatron disables it too, "
                     "with a warning): there is no tensor-parallel group to split the sequence over; simulated "
                     "without it"]


def test_tp_comm_overlap_at_tensor_1_is_noted():
    sc = load_scenario(GPT, ["parallel.tensor=1", "parallel.data=4", "parallel.sequence_parallel=true",
                             "parallel.tp_comm_overlap=true", "training.kernels=transformer-engine"])
    notes = [n for n in stack_notes(sc) if n.startswith("parallel.tp_comm_overlap")]
    assert notes == ["parallel.tp_comm_overlap: true — has no effect with tensor 1: there are no tensor-parallel "
                     "collectives to overlap (NeMo and Megatron-Bridge switch it off too); simulated without it"]


def test_fp8_recipe_without_fp8_is_noted():
    sc = load_scenario(GPT, ["training.fp8_recipe=delayed"])
    assert stack_notes(sc) == ["training.fp8_recipe: delayed — has no effect with precision bf16: the recipe "
                               "scales fp8 GEMMs; set training.precision: fp8 to use it, or remove fp8_recipe"]
    # the default, not given, says nothing; nor does the resolved form of a run that did not give it
    plain = load_scenario(GPT)
    assert stack_notes(plain) == []
    assert stack_notes(scenario_from_dict(plain.resolved())) == []
    assert scenario_from_dict(plain.resolved()) == plain


def test_notes_also_for_other_model_kinds():
    sc = load_scenario(SEED, ["parallel.sequence_parallel=true"])
    assert [n.split(" — ")[0] for n in stack_notes(sc)] == ["parallel.sequence_parallel: true"]


def test_run_prints_the_notes(capsys, tmp_path):
    code, err = _cli(capsys, ["run", str(SEED), "--out", str(tmp_path / "r"), "--no-charts", "--no-trace",
                              "--set", "parallel.sequence_parallel=true"])
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("dtsim: note: ")]
    assert len(notes) == 1 and "parallel.sequence_parallel: true — has no effect with tensor 1" in notes[0]


@pytest.mark.parametrize("written, whole", [(1e3, 1000), (4.0, 4)])
def test_a_whole_interval_written_as_a_decimal_says_how_to_write_it(written, whole) -> None:
    """YAML reads `interval: 1e3` as the float 1000.0: the union's message says to drop the decimal point or
    exponent and gives the exact fix, as whole-number fields outside unions do."""
    text = _refused(_with_reliability(interval=written))
    assert text.startswith("reliability.checkpoint.interval: ") and "without a decimal point or exponent" in text
    assert text.endswith(f"; write interval: {whole}"), text
    fixed = _with_reliability(interval=whole)
    assert scenario_from_dict(fixed).reliability is not None  # the fix, applied, loads


@pytest.mark.parametrize("written", [0.0, -3.0, 2.5])
def test_a_decimal_interval_outside_the_whole_arm_keeps_the_general_advice(written) -> None:
    text = _refused(_with_reliability(interval=written))
    assert "decimal point" not in text and "write e.g. interval: auto or interval: 100" in text, text
