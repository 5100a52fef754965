"""Megatron's pipeline exchange rounds under the interleaved schedule: which sends and receives each
batched, waited exchange of a stage holds (pure data; the executor runs them).

Megatron-LM's ``forward_backward_pipelining_with_interleaving`` (megatron/schedules.py, v2.5 of 2021; the
same loop in Megatron-Core's schedules.py when ``overlap_p2p_comm`` is off) does not send a forward's output
as soon as it is computed. In the steady state it runs a forward and a backward, then ONE exchange
(``send_forward_backward_recv_forward_backward``: ``batch_isend_irecv`` of up to four operations, waited
for): the forward's output to the next stage, the backward's input gradient to the previous one, and the
receives of the next forward's input and the next backward's gradient. Warm-up forwards each end in an
exchange of their own (the last also receiving the first gradient), cool-down backwards likewise. A send
completes only when the peer has posted the matching receive (NCCL p2p pairs them in order per peer), so
neighbouring stages move in step. Which receives each exchange posts follows that code line by line,
including the first stage's receives from the last stage (which lags it by p − 1 micro-batches) and the
last stage's from the first.
"""

from __future__ import annotations

from typing import NamedTuple

from sim.schedules.actions import Action


class Exchange(NamedTuple):
    """One batched exchange: the forward whose output is sent on (to the next stage), the backward whose
    input gradient is sent back (to the previous stage), and whether it receives from the previous stage
    (the input of a later forward) and from the next (the gradient of a later backward)."""

    send_forward: Action | None
    send_backward: Action | None
    recv_prev: bool
    recv_next: bool


def megatron_interleaved_exchanges(p: int, m: int, v: int, stage: int,
                                   actions: list[Action]) -> tuple[bool, list[Exchange | None]]:
    """(whether the stage receives its first input before its first forward, and for each action of
    ``actions`` — the interleaved 1F1B order of ``sim.schedules.actions.interleaved_1f1b`` — the exchange
    run right after it, or None). ``m`` micro-batches per chunk, ``v`` chunks, ``m`` a multiple of ``p``
    and larger than it (Megatron runs every forward first when ``m == p``)."""
    total = m * v
    first, last = stage == 0, stage == p - 1
    first_b = next((i for i, a in enumerate(actions) if a.kind != "F"), len(actions))
    warm = first_b - 1  # the forward just before the first backward opens the steady state's first pair
    remaining = total - warm
    steady = actions[warm:warm + 2 * remaining]
    if (len(actions) != 2 * total or first_b >= total
            or any(a.kind != ("F" if i % 2 == 0 else "B") for i, a in enumerate(steady))):
        raise ValueError(f"not an interleaved 1F1B order with a steady state: {len(actions)} actions, {warm} warm-up")

    def chunk(i: int, forward: bool) -> int:
        c = (i % (p * v)) // p  # Python's modulo, as Megatron's get_model_chunk_id (negative ids too)
        return c if forward else v - c - 1

    def sends_forward(i: int) -> bool:  # not the last virtual stage
        return not (last and chunk(i, True) == v - 1)

    def sends_backward(i: int) -> bool:  # not the first virtual stage
        return not (first and chunk(i, False) == 0)

    after: list[Exchange | None] = [None] * len(actions)
    forwards = [a for a in actions if a.kind == "F"]
    backwards = [a for a in actions if a.kind == "B"]
    for k in range(warm):
        recv_prev = not (first and chunk(k + 1, True) == 0) and k != total - 1
        recv_next = k == warm - 1 and not last
        after[k] = Exchange(forwards[k] if sends_forward(k) else None, None, recv_prev, recv_next)
    for k in range(remaining):
        fk = k + warm
        recv_prev = chunk(fk - (p - 1), True) != v - 1 if first else True
        recv_next = chunk(k - (p - 1), False) != 0 if last else True
        if k == remaining - 1:
            recv_prev = False
        after[warm + 2 * k + 1] = Exchange(forwards[fk] if sends_forward(fk) else None,
                                           backwards[k] if sends_backward(k) else None, recv_prev, recv_next)
    for k in range(remaining, total):
        recv_next = not (last and chunk(k + 1, False) == v - 1) and k != total - 1
        after[warm + remaining + k] = Exchange(None, backwards[k] if sends_backward(k) else None, False, recv_next)
    return not first, after
