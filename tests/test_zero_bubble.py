"""ZB-H2 against Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", §3.1): with the optimizer
synchronisation removed (their post-validation), every stage runs its F, B and W back to back, so the
pipeline is a parallelogram: the per-iteration bubble is (p − 1)(T_F + T_B − 2T_W), 0 when
T_F = T_B = T_W, and the first stage holds 2p − 1 micro-batches of activations."""

from __future__ import annotations

import pytest

from sim import analytic as an
from sim.engine.executor import TrainingExecutor
from sim.engine.job import Block, ChunkWork, LayerWork, TrainingJob
from sim.schedules.actions import build_schedule, max_in_flight
from tests.helpers import world


def _run(schedule: str, p: int, m: int, tf: float, tb: float, tw: float, steps: int = 3):
    lw = LayerWork("L", (Block("f", tf),), (Block("b", tb),), (Block("w", tw),), activation_bytes=1.0)
    job = TrainingJob(dp=1, tp=1, pp=p, virtual_stages=1, microbatches=m, schedule=schedule,
                      chunks=[ChunkWork((lw,)) for _ in range(p)], static_bytes=[0.0] * p, steps=steps)
    w = world(1, p)
    ex = TrainingExecutor(w, job, symmetric=False)
    ex.run()
    return ex, w


def _idle_per_stage(w, p: int) -> list[float]:
    """Idle time between each stage's first and last compute (its own bubble)."""
    out = []
    for g in range(p):
        spans = sorted((s.start_s, s.start_s + s.dur_s) for s in w.timeline.spans
                       if s.gpu == g and s.stream == "compute")
        out.append(spans[-1][1] - spans[0][0] - sum(b - a for a, b in spans))
    return out


@pytest.mark.parametrize("p,m", [(4, 16), (4, 12), (8, 24)])
@pytest.mark.parametrize("tf,tb,tw", [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5), (1.0, 1.0, 2.0)])
def test_zb_h2_iteration_bubble_is_the_papers(p: int, m: int, tf: float, tb: float, tw: float) -> None:
    steps = 3
    ex, w = _run("zb-h2", p, m, tf, tb, tw, steps)
    bubble = an.zb_h2_bubble_time(p, tf, tb, tw)
    if tf == tb == tw:
        assert bubble == 0.0
    # Steady state: one iteration after another takes m(T_F + T_B + T_W) + the paper's bubble.
    for k in range(1, steps):
        period = ex.step_end_s[k] - ex.step_end_s[k - 1]
        assert period - m * (tf + tb + tw) == pytest.approx(bubble, abs=1e-9)
    if bubble == 0.0:  # the parallelogram: no stage ever idles between its first and last op
        assert _idle_per_stage(w, p) == pytest.approx([0.0] * p, abs=1e-9)


@pytest.mark.parametrize("p,m", [(4, 16), (8, 24)])
def test_zb_h1_keeps_its_own_bubble(p: int, m: int) -> None:
    """ZB-H1 (1F1B's memory) cannot fill the warm-up: (p − 1)(T_F + T_B − T_W) per iteration."""
    ex, _ = _run("zb-h1", p, m, 1.0, 1.0, 1.0)
    assert ex.step_end_s[2] - ex.step_end_s[1] - 3 * m == pytest.approx(an.zb_h1_bubble_time(p, 1, 1, 1))


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zb_h2_memory_is_2p_minus_1_microbatches(p: int) -> None:
    """The first stage keeps 2p − 1 micro-batches' activations (stage s: 2(p − s) − 1), read off the
    simulated memory track (1 byte per micro-batch) and the schedule."""
    m = 4 * p
    _, w = _run("zb-h2", p, m, 1.0, 1.0, 1.0, steps=1)
    for s in range(p):
        track = [c.value for c in w.timeline.counters if c.gpu == s and c.name == "memory_bytes"]
        assert max(track) == pytest.approx(2 * (p - s) - 1)
        assert max_in_flight(build_schedule("zb-h2", p, m)[s]) == 2 * (p - s) - 1
    # ZB-H1 stays at 1F1B's p − s.
    assert [max_in_flight(a) for a in build_schedule("zb-h1", p, m)] == [p - s for s in range(p)]
