"""The layout rule's suggested --set really makes data×tensor×pipeline×context the GPU count: applied to the
scenario, the layout rule passes (with context parallelism too, and in the fallback)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sim.errors import ScenarioError
from sim.scenario.load import apply_overrides, load_scenario, read_scenario_file

ROOT = Path(__file__).resolve().parent.parent
GPT3 = str(ROOT / "scenarios" / "gpt3-175b-1024xa100-hdr.yaml")  # 1024 GPUs: data 16 × tensor 8 × pipeline 8
LLAMA_CP = str(ROOT / "scenarios" / "published" / "llama3-70b-64xh100-nemo2407.yaml")  # 64: 2 × 4 × 4 × context 2
LAYOUT = "must equal the GPU count"


def _suggestion(path: str, sets: list[str]) -> list[str]:
    """The --set settings the layout error proposes for ``path`` with ``sets`` applied."""
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, sets)
    text = str(info.value)
    assert LAYOUT in text, text
    fix = re.split(r" \((?:from|with) ", text.split("e.g. ", 1)[1])[0]  # not the settings it names as the cause
    found = re.findall(r"--set (\S+=\d+)", fix)
    assert found, f"no --set in the suggestion: {text}"
    return found


def _world(path: str, sets: list[str]) -> tuple[int, int]:
    """(data×tensor×pipeline×context, GPUs) of the scenario file with ``sets`` applied, read from the mapping."""
    d, _ = apply_overrides(read_scenario_file(path), sets)
    par, cl = d["parallel"], d["cluster"]
    product = par.get("data", 1) * par.get("tensor", 1) * par.get("pipeline", 1) * (par.get("context") or 1)
    return product, cl["nodes"] * cl["gpus_per_node"]


@pytest.mark.parametrize(("path", "sets"), [
    (GPT3, ["parallel.data=3"]),  # data branch
    (GPT3, ["parallel.pipeline=3"]),  # pipeline branch
    (GPT3, ["parallel.tensor=3"]),  # tensor branch
    (GPT3, ["parallel.data=3", "parallel.tensor=3"]),  # fallback
    (LLAMA_CP, ["parallel.data=3"]),  # data branch, context 2
    (LLAMA_CP, ["parallel.pipeline=3"]),  # pipeline branch, context 2
    (LLAMA_CP, ["parallel.tensor=3"]),  # tensor branch, context 2
    (LLAMA_CP, ["parallel.data=3", "parallel.tensor=3"]),  # fallback, context 2 kept
    (LLAMA_CP, ["parallel.data=3", "parallel.tensor=3", "parallel.pipeline=3", "parallel.context=5"]),  # 64 % 5
])
def test_layout_suggestion_makes_the_product_the_gpu_count(path: str, sets: list[str]) -> None:
    fix = _suggestion(path, sets)
    product, gpus = _world(path, sets + fix)
    assert product == gpus, (sets, fix)
    try:  # the layout rule now passes (a later rule may still object to the new degrees)
        load_scenario(path, sets + fix)
    except ScenarioError as exc:
        assert LAYOUT not in str(exc), (sets, fix, str(exc))


SEED = str(ROOT / "scenarios" / "seed-pipeline.yaml")  # synthetic model, 4 GPUs: data 1 × pipeline 4


@pytest.mark.parametrize("sets", [
    ["parallel.tensor=2"],  # data branch: tensor reset to 1 is the whole fix (was: pipeline=2)
    ["parallel.data=2", "parallel.tensor=2"],  # data branch (was: pipeline=1, keeping tensor 2)
    ["parallel.tensor=3", "parallel.pipeline=2"],  # data branch, tensor reset
    ["parallel.tensor=3", "parallel.pipeline=3"],  # pipeline branch, tensor reset
    ["parallel.data=3", "parallel.tensor=3", "parallel.pipeline=3"],  # fallback
])
def test_layout_suggestion_for_a_non_transformer_resets_tensor_and_loads(sets: list[str]) -> None:
    """A synthetic model refuses tensor > 1 (a later rule): the layout fix must not keep tensor 2, or applying
    it only leads to that refusal. Applied, the suggestion gives a scenario that loads."""
    fix = _suggestion(SEED, sets)
    assert "parallel.tensor=1" in fix, fix
    load_scenario(SEED, sets + fix)
