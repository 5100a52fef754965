"""Megatron's exchange rounds under the interleaved schedule (sim.schedules.exchanges) and their simulation."""

from __future__ import annotations

import pytest

from sim.api import simulate
from sim.engine.timeline import COMM_PP, STREAM_COMPUTE
from sim.scenario.load import scenario_from_dict
from sim.schedules.actions import interleaved_1f1b
from sim.schedules.exchanges import megatron_interleaved_exchanges
from tests.test_training_sim import _tiny


def _plans(p: int, m: int, v: int):
    return [megatron_interleaved_exchanges(p, m, v, s, interleaved_1f1b(p, m, s, v)) for s in range(p)]


@pytest.mark.parametrize("p,m,v", [(3, 6, 2), (4, 8, 2), (4, 12, 3), (8, 16, 2), (8, 96, 2), (4, 8, 4)])
def test_every_send_meets_a_receive_posted_by_its_peer(p: int, m: int, v: int) -> None:
    """NCCL pairs sends and receives in order per peer: over a step each stage posts as many receives from
    a neighbour as that neighbour sends it, forwards' outputs going to the next stage (the last stage's to
    the first, for its next chunk) and gradients to the previous one."""
    plans = _plans(p, m, v)
    for s in range(p):
        nxt, prv = (s + 1) % p, (s - 1) % p
        forward_sends = sum(1 for e in plans[s][1] if e is not None and e.send_forward is not None)
        backward_sends = sum(1 for e in plans[s][1] if e is not None and e.send_backward is not None)
        first_recv, after = plans[nxt]
        prev_posts = int(first_recv) + sum(1 for e in after if e is not None and e.recv_prev)
        next_posts = sum(1 for e in plans[prv][1] if e is not None and e.recv_next)
        assert forward_sends == prev_posts
        assert backward_sends == next_posts
        # every forward but the last virtual stage's sends its output, every backward but the first's its gradient
        assert forward_sends == m * v - (m if s == p - 1 else 0)
        assert backward_sends == m * v - (m if s == 0 else 0)


def test_the_steady_state_sends_a_forward_with_the_next_backward() -> None:
    """p 4, m 8, v 2, stage 1: warm-up (4 − 1 − 1)·2 + (2 − 1)·4 = 8 forwards, each followed by an exchange
    that sends it and receives the next input (the eighth also the first gradient); then pairs F, B whose
    exchange comes after the B and carries both; then the cool-down backwards, one exchange each."""
    actions = interleaved_1f1b(4, 8, 1, 2)
    first_recv, after = megatron_interleaved_exchanges(4, 8, 2, 1, actions)
    assert first_recv
    warm = after[:8]
    assert all(e is not None and e.send_forward == actions[i] and e.recv_prev for i, e in enumerate(warm))
    assert [e.recv_next for e in warm if e is not None] == [False] * 7 + [True]
    pairs = actions[8:24]
    for i in range(0, 16, 2):
        assert after[8 + i] is None  # nothing right after the pair's forward
        e = after[8 + i + 1]
        assert e is not None and e.send_forward == pairs[i] and e.send_backward == pairs[i + 1]
    cool = after[24:]
    assert all(e is not None and e.send_forward is None and e.send_backward == actions[24 + i]
               for i, e in enumerate(cool))
    assert cool[-1].recv_next is False and all(e.recv_next for e in cool[:-1])


def test_the_simulation_sends_a_steady_forward_only_after_the_next_backward() -> None:
    """Megatron-LM 2021 (waited exchanges), interleaved: on every GPU of a middle stage, the send of each
    steady-state forward's output starts once the backward that follows it has ended; and the step equals
    the every-GPU simulation's."""
    d = _tiny(parallel__data=2, parallel__tensor=2, parallel__pipeline=4, parallel__schedule="interleaved-1f1b",
              parallel__virtual_stages=2, parallel__sequence_parallel=False, training__global_batch=32,
              training__kernels="megatron-lm-2021")
    d["model"]["layers"] = 16
    full = simulate(scenario_from_dict({**d, "simulation": {"symmetry": "off"}}))
    sym = simulate(scenario_from_dict({**d, "simulation": {"symmetry": "on"}}))
    assert sym.summary["step_time_s"] == pytest.approx(full.summary["step_time_s"], rel=1e-9)
    g = next(x for x in full.timeline.gpus if full.timeline.stage_of[x] == 1)
    actions = interleaved_1f1b(4, 8, 1, 2)
    backward_ends = {sp.args["microbatch"] * 10 + sp.args["chunk"]: sp.start_s + sp.dur_s
                     for sp in full.timeline.spans if sp.gpu == g and sp.stream == STREAM_COMPUTE
                     and sp.category == "backward" and "microbatch" in sp.args}
    sends = sorted(sp.start_s for sp in full.timeline.spans
                   if sp.gpu == g and sp.category == COMM_PP and sp.name.startswith("send act"))
    warm = 8
    for k in range(8):  # steady pairs: F(warm + k) then B(k)
        b = actions[warm + 2 * k + 1]
        end_b = backward_ends[b.microbatch * 10 + b.chunk]
        assert sends[warm + k] >= end_b - 1e-12
