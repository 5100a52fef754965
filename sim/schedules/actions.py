"""Schedule builders: pure functions (p stages, m micro-batches, …) → per-stage action lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from sim.errors import ScenarioError


class Action(NamedTuple):
    kind: str  # "F" | "B" | "W"
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def gpipe(p: int, m: int, stage: int) -> list[Action]:
    """All forwards, then all backwards (last micro-batch first, as its gradient arrives first)."""
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in reversed(range(m))]


def one_f_one_b(p: int, m: int, stage: int) -> list[Action]:
    """PipeDream-Flush / Megatron 1F1B: p-stage-1 warm-up forwards, then one forward one backward,
    then the remaining backwards. At most p - stage micro-batches are in flight on a stage."""
    warm = min(p - stage - 1, m)
    acts = [Action("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        acts.append(Action("F", f))
        f += 1
        acts.append(Action("B", b))
        b += 1
    acts.extend(Action("B", i) for i in range(b, m))
    return acts


def interleaved_1f1b(p: int, m: int, stage: int, v: int) -> list[Action]:
    """Megatron's interleaved 1F1B: each device holds v chunks (virtual stages stage, stage+p, …).
    Micro-batches go through the chunks in groups of p; warm-up (p-stage-1)*2 + (v-1)*p forwards."""
    if m % p:
        raise ScenarioError(
            f"interleaved-1f1b needs micro-batches ({m}) to be a multiple of pipeline stages ({p}); "
            "change training.global_batch or parallel.pipeline",
            "training.global_batch",
        )
    total = m * v

    def fwd(k: int) -> Action:
        chunk = (k // p) % v
        mb = (k // (p * v)) * p + k % p
        return Action("F", mb, chunk)

    def bwd(k: int) -> Action:
        chunk = v - 1 - (k // p) % v
        mb = (k // (p * v)) * p + k % p
        return Action("B", mb, chunk)

    warm = min((p - stage - 1) * 2 + (v - 1) * p, total)
    acts = [fwd(k) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        acts.append(fwd(f))
        f += 1
        acts.append(bwd(b))
        b += 1
    acts.extend(bwd(k) for k in range(b, total))
    return acts


def _deferred_w(m: int, warm: int, defer: int, backward_first: bool = False) -> list[Action]:
    """``warm`` forwards, then per micro-batch F (while any remain) and B — B first with
    ``backward_first``, so no more than ``warm`` micro-batches are ever in flight — and, once more
    than ``defer`` W's are pending, the oldest pending W; the still-pending W's close the step."""
    acts = [Action("F", i) for i in range(warm)]
    pending: list[int] = []
    f = warm
    for b in range(m):
        if backward_first:
            acts.append(Action("B", b))
            pending.append(b)
        if f < m:
            acts.append(Action("F", f))
            f += 1
        if not backward_first:
            acts.append(Action("B", b))
            pending.append(b)
        if len(pending) > defer:
            acts.append(Action("W", pending.pop(0)))
    acts.extend(Action("W", i) for i in pending)
    return acts


def zero_bubble_h1(p: int, m: int, stage: int) -> list[Action]:
    """ZB-H1 (Qi et al. 2023): backward split into B (input gradients, the critical path back to stage
    0) and W (weight gradients). 1F1B's warm-up; stage s keeps its first s W's pending, so its early
    B's go straight back upstream; afterwards each B is followed by the oldest pending W and the
    pending ones close the step. Memory as 1F1B; bubble (p-1)(T_F + T_B - T_W)."""
    return _deferred_w(m, min(p - stage - 1, m), stage)


def zero_bubble_h2(p: int, m: int, stage: int) -> list[Action]:
    """ZB-H2 (Qi et al. 2023, §3.1): 2(p-s)-1 warm-up forwards fill the warm-up bubble — exactly the
    slots before the first B comes back, so stage s holds 2(p-s)-1 micro-batches (2p-1 on the first)
    — then B, F and the oldest W in turn, and stage s keeps 2s W's pending to fill the drain. Each stage
    runs as a parallelogram: with the optimizer sync removed (the paper's post-validation; dtsim has no
    barrier between steps) the bubble per iteration is (p-1)(T_F + T_B - 2T_W), 0 when T_F + T_B ≤ 2T_W.
    A single isolated step still shows the last stage's (p-1)·T_F start."""
    return _deferred_w(m, min(2 * (p - stage) - 1, m), 2 * stage, backward_first=True)


def _interleaved(p: int, m: int, stage: int, v: int) -> list[Action]:
    """Interleaved 1F1B with v chunks; with v = 1 Megatron-LM runs plain 1F1B (its schedules.py picks the
    interleaved schedule only when a virtual pipeline size is set)."""
    return interleaved_1f1b(p, m, stage, v) if v > 1 else one_f_one_b(p, m, stage)


# Schedule name → builder of one stage's actions (p stages, m micro-batches, stage, v chunks per GPU).
BUILDERS: dict[str, Callable[[int, int, int, int], list[Action]]] = {
    "gpipe": lambda p, m, s, v: gpipe(p, m, s),
    "1f1b": lambda p, m, s, v: one_f_one_b(p, m, s),
    "interleaved-1f1b": _interleaved,
    "zb-h1": lambda p, m, s, v: zero_bubble_h1(p, m, s),
    "zb-h2": lambda p, m, s, v: zero_bubble_h2(p, m, s),
}
SCHEDULES = tuple(BUILDERS)
SPLIT_BACKWARD = {"zb-h1", "zb-h2"}  # schedules whose backward is split into B (input) and W (weight)


def stage_actions(name: str, p: int, m: int, stage: int, v: int = 1) -> list[Action]:
    """The actions of one stage under schedule ``name``."""
    builder = BUILDERS.get(name)
    if builder is None:
        raise ScenarioError(f"unknown schedule {name!r}; use one of {', '.join(SCHEDULES)}", "parallel.schedule")
    return builder(p, m, stage, v)


def build_schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Per-stage action lists for schedule ``name``."""
    return [stage_actions(name, p, m, s, v) for s in range(p)]


def max_in_flight(actions: list[Action]) -> int:
    """Most micro-batch chunks whose forward ran but whose backward did not (activation memory)."""
    live = peak = 0
    for a in actions:
        if a.kind == "F":
            live += 1
            peak = max(peak, live)
        elif a.kind == "B":
            live -= 1
    return peak
