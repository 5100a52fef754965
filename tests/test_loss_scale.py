"""Dynamic loss scaling with PyTorch GradScaler semantics, and the seed's scaling numerical."""

from __future__ import annotations

import numpy as np
import pytest

from sim.errors import ScenarioError
from sim.training.loss_scale import (
    LossScaleConfig,
    LossScaleState,
    scale_gradient,
    simulate,
    unscale_gradient,
    update,
)


def test_seed_numerical_scale_and_unscale():
    scaled = scale_gradient(3e-8, 1024)
    assert scaled == pytest.approx(3.072e-5, rel=1e-12)
    assert unscale_gradient(scaled, 1024) == pytest.approx(3e-8, rel=1e-12)


def test_gradscaler_defaults():
    c = LossScaleConfig()
    assert (c.init_scale, c.growth_factor, c.backoff_factor, c.growth_interval) == (65536.0, 2.0, 0.5, 2000)


def test_overflow_skips_step_and_halves_scale():
    records = simulate(4, overflow_steps=[1, 2])
    assert [r.scale for r in records] == [65536.0, 65536.0, 32768.0, 16384.0]
    assert [r.overflow for r in records] == [False, True, True, False]
    assert [r.skipped for r in records] == [False, True, True, False]
    assert [r.step for r in records] == [0, 1, 2, 3]


def test_growth_after_interval_of_clean_steps():
    config = LossScaleConfig(init_scale=8.0, growth_interval=3)
    records = simulate(8, config, overflow_steps=[4])
    # Steps 0-2 clean → ×2 from step 3; step 4 overflows → ×0.5; the tracker restarts from step 5.
    assert [r.scale for r in records] == [8, 8, 8, 16, 16, 8, 8, 8]


def test_growth_every_2000_steps_by_default():
    records = simulate(4001, overflow_steps=[])
    assert records[1999].scale == 65536.0
    assert records[2000].scale == 131072.0
    assert records[4000].scale == 262144.0


def test_static_keeps_scale_but_skips_overflows():
    config = LossScaleConfig(mode="static", init_scale=1024.0)
    records = simulate(5, config, overflow_steps=[2])
    assert all(r.scale == 1024.0 for r in records)
    assert [r.skipped for r in records] == [False, False, True, False, False]


def test_probabilistic_overflows_are_seeded():
    a = simulate(2000, overflow_prob=0.01, rng=np.random.default_rng(7))
    b = simulate(2000, overflow_prob=0.01, rng=7)
    assert a == b
    n = sum(r.overflow for r in a)
    assert 5 <= n <= 40  # Binomial(2000, 0.01): mean 20, sd ≈ 4.4
    # Every overflow halves the scale relative to the preceding record (no growth within 2000 steps).
    assert a[-1].scale == pytest.approx(65536.0 * 0.5 ** sum(r.overflow for r in a[:-1]))


def test_update_is_pure():
    config = LossScaleConfig(growth_interval=2)
    s0 = LossScaleState(scale=4.0)
    s1 = update(s0, False, config)
    assert s0 == LossScaleState(scale=4.0, good_steps=0)
    assert s1 == LossScaleState(scale=4.0, good_steps=1)
    assert update(s1, False, config) == LossScaleState(scale=8.0, good_steps=0)


def test_bad_inputs():
    with pytest.raises(ScenarioError):
        LossScaleConfig(mode="auto")
    with pytest.raises(ScenarioError):
        LossScaleConfig(backoff_factor=1.5)
    with pytest.raises(ScenarioError):
        simulate(3)
    with pytest.raises(ScenarioError):
        simulate(3, overflow_prob=0.1)


def test_loss_scaling_without_overflows_is_a_clean_run(tmp_path) -> None:
    # kind static/dynamic with neither overflow_steps nor overflow_probability: no step overflows (it was
    # refused with a message naming a key that does not exist).
    from pathlib import Path

    from sim.api import simulate
    from sim.scenario.load import load_scenario

    seed = Path(__file__).resolve().parent.parent / "scenarios" / "seed-pipeline.yaml"
    for kind in ("static", "dynamic"):
        sc = load_scenario(seed, [f"training.loss_scaling={{kind: {kind}, init_scale: 1024}}",
                                  "simulation.steps=3"])
        result = simulate(sc)
        assert len(result.summary.step_times_s) == 3
        records = result.summary.to_dict().get("loss_scale") or []
        assert records and not any(r["overflow"] or r["skipped"] for r in records), records
