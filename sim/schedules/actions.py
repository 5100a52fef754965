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


def interleaved_order(p: int, m: int, v: int, group: int | None = None) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each forward of an interleaved stage, in order: micro-batches go through
    the v chunks in groups of ``group`` (None: p), the last group taking what remains — Megatron-Core's
    schedule table (``microbatch_group_size_per_vp_stage``, megatron/core/pipeline_parallel/schedules.py,
    core_r0.8.0 on), the tunable N of the Llama 3 paper (§3.3.2). With group = p it is Megatron-LM's
    original depth-first order; with group = m, breadth-first (every micro-batch through a chunk first)."""
    n = p if group is None else group
    order: list[tuple[int, int]] = []
    for lo in range(0, m, n):
        hi = m if lo + n >= m else lo + n
        order.extend((mb, c) for c in range(v) for mb in range(lo, hi))
    return order


def interleaved_group_problem(p: int, m: int, group: int | None = None) -> str | None:
    """Why m micro-batches cannot run interleaved in groups of ``group`` (None: p), or None. Megatron-Core
    requires p <= group <= m and the last group to be whole or at least p long ("otherwise, it introduces
    dependency bubbles"); with group = p that is Megatron-LM's m % p == 0."""
    n = p if group is None else group
    if group is not None and not p <= n <= m:
        return f"the micro-batch group ({n}) must lie between pipeline ({p}) and the micro-batch count ({m})"
    if 0 < m % n < p:
        if group is None:
            return f"micro-batches ({m}) must be a multiple of pipeline stages ({p})"
        return (f"the last group of micro-batches ({m} % {n} = {m % n}) must be whole or at least pipeline "
                f"({p}) long")
    return None


def interleaved_1f1b(p: int, m: int, stage: int, v: int, group: int | None = None,
                     all_warmup: bool = False) -> list[Action]:
    """Megatron's interleaved 1F1B: each device holds v chunks (virtual stages stage, stage+p, …).
    Micro-batches go through the chunks in groups of ``group`` (None: p; ``interleaved_order``); warm-up
    (p-stage-1)*2 + (v-1)*group forwards, capped at all m·v of them (Megatron-Core from core_r0.10.0).
    ``all_warmup``: with as many micro-batches as stages every forward runs first, then every backward
    (Megatron-LM v2.5 through Megatron-Core core_r0.9.0, ``all_warmup_microbatches``)."""
    if problem := interleaved_group_problem(p, m, group):
        raise ScenarioError(
            f"interleaved-1f1b: {problem}; change training.global_batch, parallel.pipeline or "
            "parallel.microbatch_group_size",
            "training.global_batch",
        )
    order = interleaved_order(p, m, v, group)
    total = m * v

    def fwd(k: int) -> Action:
        mb, chunk = order[k]
        return Action("F", mb, chunk)

    def bwd(k: int) -> Action:
        mb, chunk = order[k]
        return Action("B", mb, v - 1 - chunk)

    n = p if group is None else group
    warm = total if all_warmup and m == p else min((p - stage - 1) * 2 + (v - 1) * n, total)
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


def stage_actions(name: str, p: int, m: int, stage: int, v: int = 1, group: int | None = None,
                  all_warmup: bool = False) -> list[Action]:
    """The actions of one stage under schedule ``name``; ``group`` and ``all_warmup`` shape the interleaved
    schedule with v > 1 (``interleaved_1f1b``) and are ignored by the others."""
    builder = BUILDERS.get(name)
    if builder is None:
        raise ScenarioError(f"unknown schedule {name!r}; use one of {', '.join(SCHEDULES)}", "parallel.schedule")
    if name == "interleaved-1f1b" and v > 1:
        return interleaved_1f1b(p, m, stage, v, group, all_warmup)
    return builder(p, m, stage, v)


def build_schedule(name: str, p: int, m: int, v: int = 1, group: int | None = None,
                   all_warmup: bool = False) -> list[list[Action]]:
    """Per-stage action lists for schedule ``name``."""
    return [stage_actions(name, p, m, s, v, group, all_warmup) for s in range(p)]


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
