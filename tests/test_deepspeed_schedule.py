"""DeepSpeed's pipeline schedule is dtsim's 1F1B: the Megatron-DeepSpeed published cases (MT-NLG) run
``parallel.schedule: 1f1b`` on that claim, checked here on pure data.

DeepSpeed's ``TrainSchedule`` (deepspeed/runtime/pipe/schedule.py) runs 2(m + p − 1) steps; in each, a stage
either forwards or backwards one micro-batch (even stages forward on even steps, odd stages on odd ones)
and first exchanges, with blocking sends and receives (deepspeed/runtime/pipe/p2p.py), the activation or
gradient of its previous step with a neighbour: a forward step sends the last gradient to and receives
an activation from the stage before, a backward step receives a gradient from and sends the last
activation to the stage after. The step-to-micro-batch mapping below is that file's."""

from __future__ import annotations

import pytest

from sim.schedules.actions import Action, one_f_one_b


def _step(step: int, stage: int, p: int) -> tuple[int, bool]:
    """(micro-batch, is_forward) of ``stage`` at ``step``: TrainSchedule._step_to_micro_batch."""
    even_step, even_stage = step % 2 == 0, stage % 2 == 0
    if even_step and even_stage:
        return step // 2 - stage // 2, True
    if not even_step and not even_stage:
        return (step - 1) // 2 - stage // 2, True
    if even_step and not even_stage:
        return step // 2 - p + (stage + 1) // 2, False
    return (step - 1) // 2 - p + 1 + stage // 2, False


def _deepspeed(p: int, m: int, tf: float, tb: float) -> tuple[float, list[list[Action]]]:
    """Replay the schedule: a step starts once the stage and every neighbour it exchanges with have
    finished their previous step (blocking paired transfers, taken as instantaneous); returns the
    makespan and each stage's compute order."""
    valid = range(m).__contains__
    end, prev = [0.0] * p, [-1] * p
    order: list[list[Action]] = [[] for _ in range(p)]
    for step in range(2 * (m + p - 1)):
        plan = []
        for s in range(p):
            mb, fwd = _step(step, s, p)
            peer = s - 1 if fwd else s + 1
            talks = 0 <= peer < p and (valid(mb) or valid(prev[s]))
            plan.append((mb, fwd, peer if talks else None))
        start = [max(end[s], end[q]) if q is not None else end[s] for s, (_, _, q) in enumerate(plan)]
        for s, (mb, fwd, _) in enumerate(plan):
            if valid(mb):
                order[s].append(Action("F" if fwd else "B", mb))
            end[s] = start[s] + ((tf if fwd else tb) if valid(mb) else 0.0)
            prev[s] = mb
    return max(end), order


@pytest.mark.parametrize(("p", "m"), [(2, 8), (3, 8), (4, 16), (8, 32), (35, 240)])
def test_deepspeed_train_schedule_is_1f1b(p: int, m: int) -> None:
    tf, tb = 1.0, 3.0  # a forward, and a backward with its recomputation (full checkpointing)
    makespan, order = _deepspeed(p, m, tf, tb)
    assert order == [one_f_one_b(p, m, s) for s in range(p)]  # the same actions in the same order
    assert makespan == pytest.approx((m + p - 1) * (tf + tb), rel=1e-12)  # 1F1B's: no extra lockstep
