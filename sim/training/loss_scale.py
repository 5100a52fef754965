"""Loss scaling as a pure state machine with PyTorch ``GradScaler`` semantics.

Each step runs with the current scale. If the gradients overflow (inf/NaN), the optimizer step is skipped
and the scale is multiplied by backoff_factor; after growth_interval consecutive clean steps it is
multiplied by growth_factor. A static scaler never changes the scale but still skips overflowing steps
(as Megatron's constant scaler does). Overflows come from given step indices or from a seeded draw.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from sim.errors import ScenarioError

MODES = ("dynamic", "static")


@dataclass(frozen=True)
class LossScaleConfig:
    """GradScaler defaults: init 2^16, ×2 after 2000 clean steps, ×0.5 on overflow."""

    mode: str = "dynamic"
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ScenarioError(
                f"{self.mode!r} is not one of {', '.join(MODES)}", field="training.loss_scaling.kind"
            )
        if self.init_scale <= 0:
            raise ScenarioError(f"must be > 0, got {self.init_scale}", field="training.loss_scaling.init_scale")
        if self.growth_factor <= 1:
            raise ScenarioError(
                f"must be > 1, got {self.growth_factor}", field="training.loss_scaling.growth_factor"
            )
        if not 0 < self.backoff_factor < 1:
            raise ScenarioError(
                f"must be in (0, 1), got {self.backoff_factor}", field="training.loss_scaling.backoff_factor"
            )
        if self.growth_interval < 1:
            raise ScenarioError(
                f"must be >= 1, got {self.growth_interval}", field="training.loss_scaling.growth_interval"
            )


@dataclass(frozen=True)
class LossScaleState:
    scale: float
    good_steps: int = 0  # GradScaler's growth tracker: clean steps since the last change


@dataclass(frozen=True)
class StepRecord:
    """step: index; scale: the scale this step ran with; skipped: whether the optimizer step was skipped."""

    step: int
    scale: float
    overflow: bool
    skipped: bool


def initial_state(config: LossScaleConfig) -> LossScaleState:
    return LossScaleState(scale=config.init_scale)


def update(state: LossScaleState, overflow: bool, config: LossScaleConfig) -> LossScaleState:
    """The state after one step that did (or did not) overflow."""
    if config.mode == "static":
        return state
    if overflow:
        return LossScaleState(scale=state.scale * config.backoff_factor, good_steps=0)
    good = state.good_steps + 1
    if good >= config.growth_interval:
        return LossScaleState(scale=state.scale * config.growth_factor, good_steps=0)
    return LossScaleState(scale=state.scale, good_steps=good)


def simulate(
    steps: int,
    config: LossScaleConfig | None = None,
    *,
    overflow_steps: Iterable[int] | None = None,
    overflow_prob: float | None = None,
    rng: np.random.Generator | int | None = None,
) -> list[StepRecord]:
    """Per-step records for ``steps`` steps. Give either overflow_steps (indices) or overflow_prob with a
    seeded ``rng`` (a Generator or a seed; one uniform draw per step, so the same seed gives the same run)."""
    config = config or LossScaleConfig()
    if (overflow_steps is None) == (overflow_prob is None):
        raise ScenarioError(
            "give exactly one of overflow_steps and overflow_prob", field="training.loss_scaling"
        )
    if overflow_prob is not None:
        if not 0 <= overflow_prob <= 1:
            raise ScenarioError(
                f"must be in [0, 1], got {overflow_prob}", field="training.loss_scaling.overflow_probability"
            )
        if rng is None:
            raise ScenarioError(
                "overflow_prob needs a seeded numpy Generator or seed", field="training.loss_scaling"
            )
        overflows = (np.random.default_rng(rng).random(steps) < overflow_prob).tolist()
    else:
        bad = set(overflow_steps or ())
        overflows = [i in bad for i in range(steps)]
    state = initial_state(config)
    records = []
    for step, overflow in enumerate(overflows):
        records.append(StepRecord(step=step, scale=state.scale, overflow=overflow, skipped=overflow))
        state = update(state, overflow, config)
    return records


def scale_gradient(gradient: float, scale: float) -> float:
    """g' = S·g: what backpropagating the scaled loss produces."""
    return gradient * scale


def unscale_gradient(scaled_gradient: float, scale: float) -> float:
    """g = g' / S, applied before the optimizer step."""
    return scaled_gradient / scale
