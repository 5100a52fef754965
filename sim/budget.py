"""How much work a scenario asks of the simulator, estimated before it runs, and the budget it must fit.

The estimate counts the events that dominate wall time and memory, from the scenario alone (nothing
is built): compute blocks (micro-batches × stages × layers × ops per layer, on the GPUs actually
simulated), the point-to-point transfers and sequential steps of every simulated collective (a ring
all-reduce over g ranks is 2g(g−1) transfers in 2(g−1) steps), pipeline sends, steps and collective
repetitions, each weighted by what it costs the engine. It is an order-of-magnitude figure
(tests hold it within a factor of a few of the counts the shipped scenarios really produce), enough to
refuse a run that would take hours or gigabytes *before* it starts, and to say so with the flag that
raises the limit.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.errors import ScenarioError
from sim.hardware.nccl import chunks_for
from sim.scenario.schema import CollectiveModel, LayersModel, ModelSpec, TransformerModel
from sim.training.step_work import grad_bucket_bytes, reduced_grad_bytes, tp_backward_overlap
from sim.workload.kernels import KERNEL_SETS
from sim.workload.transformer import model_params

if TYPE_CHECKING:
    from sim.engine.world import World
    from sim.scenario.schema import Scenario

# About 3e5 engine events per second on one core (benchmarks/engine_speed.py, resnet50-dp-1024xa100-hdr:
# 4.2 M transfers in ~17 s): 3e7 events is a couple of minutes. Raise it with --max-events.
DEFAULT_MAX_EVENTS = 30_000_000
EVENTS_PER_S = 3e5
# Measured costs in events (1/EVENTS_PER_S s each) on this engine: a transfer ~1.5 (4.9 µs, 256-GPU ring),
# a collective step (a rate recompute and wake-up for all its transfers) ~40 (~125 µs, 8-GPU rings).
EVENTS_PER_TRANSFER = 1.5
EVENTS_PER_STEP = 40.0
# A folded ring's transfer (``FoldedRingRun``: one rate update on the links of the representative's
# node apiece): ~6 more (Llama 3 405B, 16,384 GPUs, ZeRO-2: 260 k such steps in 6.7 s, ~25 µs each).
EVENTS_PER_FOLDED_STEP = 6.0
# Memory: ~400 B per timeline span while simulating (gpt3-175b: 150k spans, +60 MB) and as much again to
# write trace.json and timeline.csv; the interpreter with numpy, SimPy and pydantic is ~55 MB.
BYTES_PER_SPAN = 1000
BASE_MEMORY_BYTES = 55e6
OPS_PER_LAYER = 12  # compute blocks per layer per micro-batch, forward + backward (transformer: ~10)
# simulation.symmetry auto (``auto_symmetric``): one GPU per stage from 16 GPUs up, or below that when
# simulating every GPU is estimated at more than ~3 s of engine work (an 8-GPU tensor-parallel job with
# every collective simulated on every rank: a 22B layer stack took a minute, against half a second).
SYMMETRY_AUTO_MIN_GPUS = 16
SYMMETRY_AUTO_MIN_EVENTS = 1_000_000
PROGRESS_EVENTS = 2_000_000  # say what is coming on stderr above this


@dataclass(frozen=True)
class WorkEstimate:
    events: float
    detail: str
    spans: float = 0.0  # timeline records kept in memory and written out

    @property
    def seconds(self) -> float:
        return self.events / EVENTS_PER_S

    @property
    def memory_bytes(self) -> float:
        return BASE_MEMORY_BYTES + self.spans * BYTES_PER_SPAN


def _collective_steps(op: str, algorithm: str, g: int) -> tuple[float, float]:
    """(point-to-point transfers, sequential steps) of one collective over g ranks."""
    if g <= 1:
        return 0.0, 0.0
    if algorithm in ("tree", "binomial"):
        log = max(1.0, math.log2(g))
        return 2.0 * g * log, 2.0 * log
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return float(g * (g - 1)), float(g - 1)
    return 2.0 * g * (g - 1), 2.0 * (g - 1)  # ring all-reduce (and the upper end of the rest)


def _tree_all_reduce_cost(g: int, size_bytes: float, lockstep: bool = True) -> float:
    """Events of one double-binary-tree all-reduce over g ranks as the engine runs it: each of the
    ``chunks_for(size/2)`` chunks per tree crosses all g − 1 edges of both trees up and down (4(g − 1)
    transfers per chunk), one pipelined step per chunk and tree level each way."""
    k = chunks_for(size_bytes / 2)
    transfers = 4.0 * (g - 1) * k
    steps = 2.0 * k * max(1.0, math.log2(g))
    return EVENTS_PER_TRANSFER * transfers + EVENTS_PER_STEP * (steps if lockstep else transfers)


def _collective_cost(op: str, algorithm: str, g: int, lockstep: bool = True) -> float:
    """Events of one collective; ``lockstep`` False when its ranks arrive apart (every GPU simulated, each
    at its own pace): then each transfer starts and ends at its own instant, one rate update apiece."""
    transfers, steps = _collective_steps(op, algorithm, g)
    return EVENTS_PER_TRANSFER * transfers + EVENTS_PER_STEP * (steps if lockstep else transfers)


def _folded_cost(op: str, g: int, period: int) -> float:
    """Events of one ring collective that a symmetric run folds onto ``period`` ranks (``FoldedRingRun``):
    ``period`` transfers per step."""
    _, steps = _collective_steps(op, "ring", g)
    return (EVENTS_PER_TRANSFER + EVENTS_PER_FOLDED_STEP) * steps * period


def _dp_ring_period(sc: Scenario) -> int | None:
    """The period onto which a symmetric run folds its data-parallel rings (``Symmetry.ring_period``, less
    its mirror groups), or None: the first stage's DP group visiting its nodes in turn with as many ranks on
    each, on a tree whose leaf and pod links cannot bind (no oversubscription)."""
    from sim.engine.symmetry import node_period
    from sim.parallel.layout import Layout

    par, _ = sc.require_training()
    c = sc.cluster
    if c.topology.oversubscription > 1 or c.topology.pod_oversubscription > 1:
        return None
    grp = Layout(par.data * par.cp, par.tensor, par.pipeline, par.ep, par.cp, par.order).dp_group(0)
    return node_period([x // c.gpus_per_node for x in grp])


def auto_symmetric(sc: Scenario) -> bool:
    """Whether ``simulation.symmetry`` (auto unless given) simulates one GPU per pipeline stage: not with
    fixed stragglers (they break the symmetry; random ones are reduced per stage); from
    ``SYMMETRY_AUTO_MIN_GPUS`` GPUs; and below that when simulating every GPU would be long (estimated
    events above ``SYMMETRY_AUTO_MIN_EVENTS``). Small jobs stay whole: cheap, with every GPU in the charts."""
    mode = sc.simulation.symmetry
    if mode in ("on", "off"):
        return mode == "on"
    if sc.cluster.fixed_stragglers:
        return False
    if sc.total_gpus >= SYMMETRY_AUTO_MIN_GPUS:
        return True
    if isinstance(sc.model, CollectiveModel) or sc.parallel is None or sc.training is None:
        return False
    return estimate_work(sc, symmetric=False).events > SYMMETRY_AUTO_MIN_EVENTS


def _params(model: ModelSpec) -> float:
    if isinstance(model, TransformerModel):
        return float(model_params(model.to_dims()))
    if isinstance(model, LayersModel):
        return float(sum(layer.params for layer in model.layers))
    return float(getattr(model, "params_per_layer", 0) * getattr(model, "layers", 0))


def _layers(model: ModelSpec) -> int:
    layers = getattr(model, "layers", 1)
    return len(layers) if isinstance(layers, list) else int(layers) + (2 if model.kind == "transformer" else 0)


def estimate_work(sc: Scenario, symmetric: bool | None = None) -> WorkEstimate:
    """Events the simulation of ``sc`` will process (order of magnitude) and where they come from;
    ``symmetric`` (None: as the scenario resolves it, ``auto_symmetric``) one GPU per stage or every GPU."""
    steps = sc.simulation.steps
    m = sc.model
    if isinstance(m, CollectiveModel):
        per = _collective_cost(m.op, m.algorithm, m.ranks)
        runs = steps * m.iterations * len(m.size_bytes)
        return WorkEstimate(runs * per, f"{len(m.size_bytes)} size(s) × {m.iterations} iteration(s) × "
                                        f"{steps} step(s) × {per:.3g} per {m.op} over {m.ranks} GPUs",
                            spans=runs * m.ranks)
    par, tr = sc.require_training()
    # gradients are summed over data × context parallelism (Megatron's DP×CP group; sim.build's job.dp)
    p, t, d, v = par.pipeline, par.tensor, par.data * par.cp, par.virtual_stages
    mb = max(1, sc.microbatches)
    layers = _layers(sc.model)
    if symmetric is None:
        symmetric = auto_symmetric(sc)
    sim_gpus = p if symmetric else sc.total_gpus
    per_gpu_layers = max(1.0, layers / p)
    compute = sim_gpus * mb * per_gpu_layers * OPS_PER_LAYER
    c = sc.cluster
    # Every GPU simulated at its own pace (stragglers, jitter, each GPU's own speed): ranks reach a
    # collective apart, so its transfers no longer move in lockstep.
    lockstep = symmetric or not (c.stragglers or c.random_stragglers or c.jitter
                                 or (c.gpu_speed_spread > 0 and par.world_size > 1))
    # All-reduce equivalents per layer and micro-batch: 4 (2 forward, 2 backward; with SP each is an
    # all-gather plus a reduce-scatter), + 1 for SP's two backward re-gathers where the stack overlaps them.
    regather = (isinstance(sc.model, TransformerModel) and par.sequence_parallel
                and tp_backward_overlap(KERNEL_SETS[tr.kernels], t, par.schedule))
    tp_occurrences = sim_gpus * mb * per_gpu_layers * (5 if regather else 4) if t > 1 else 0.0
    # Symmetric mode simulates a TP collective on its own links once per shape, then reuses its duration.
    # Without SP they are all-reduces of b·s·h 16-bit values, which the tuner may run as trees (from 4
    # ranks), whose pipelined chunks cost the engine far more than a ring's steps: the larger is counted.
    tp_cost = _collective_cost("all_reduce", "ring", t, lockstep)
    if isinstance(sc.model, TransformerModel) and not par.sequence_parallel and t >= 4:
        size = tr.micro_batch * sc.model.seq_len * sc.model.hidden * 2
        tp_cost = max(tp_cost, _tree_all_reduce_cost(t, size, lockstep))
    tp = tp_occurrences if symmetric else tp_occurrences / t * tp_cost
    pp = 2.0 * mb * v * (p - 1) * (sim_gpus / p) * (EVENTS_PER_STEP + EVENTS_PER_TRANSFER)
    gbytes = reduced_grad_bytes(sc)  # as sim.build reduces them (fp32 main grads for bf16 transformers)
    grad_bytes = _params(sc.model) / max(1, p * t) * gbytes
    bucket = grad_bucket_bytes(par.bucket_MB, transformer=isinstance(sc.model, TransformerModel), data=par.data,
                               grad_elem_bytes=gbytes)
    buckets = max(1, math.ceil(grad_bytes / bucket)) if d > 1 else 0
    # Symmetric mode reuses the duration of a collective of the same shape on links nothing else uses:
    # buckets of one size are then simulated about once per stage (full buckets and the remainder).
    simulated_buckets = min(buckets, 4) if symmetric else buckets
    # A symmetric run folds a ring whose nodes hold q ranks each onto q: q transfers per step. With q > 1
    # under ZeRO-2/3 the other tensor ranks' rings on the node are folded beside it (their hops inside the
    # node cross the links of the representative's tensor-parallel group: Symmetry.mirror_groups).
    period = _dp_ring_period(sc) if symmetric and d > 1 else None
    beside = t if period is not None and period > 1 and par.zero >= 2 else 1
    ring_cost = ((lambda op, g: beside * _folded_cost(op, g, period)) if period is not None
                 else (lambda op, g: _collective_cost(op, "ring", g, lockstep)))
    dp = p * (simulated_buckets * ring_cost("all_reduce", d) + buckets)
    dp_spans: float = sim_gpus * buckets
    if par.zero >= 2 and d > 1:
        # ZeRO-2/3: every layer's gradients reduce-scattered per micro-batch (ZeRO-3 also gathers its
        # weights for F and B), each over the whole DP group in either mode.
        per_gpu = mb * per_gpu_layers * (3 if par.zero >= 3 else 1)
        groups = p if symmetric else sc.total_gpus / d
        dp = groups * per_gpu * ring_cost("reduce_scatter", d)
        dp_spans = sim_gpus * per_gpu
    per_step = compute + tp + pp + dp
    events = steps * per_step
    spans = steps * (compute + tp_occurrences + 2.0 * mb * v * (p - 1) * (sim_gpus / p) + dp_spans)
    return WorkEstimate(
        events,
        f"{_count(steps)} step(s) × ({_count(sim_gpus)} simulated GPUs × {_count(mb)} micro-batches × "
        f"{_count(per_gpu_layers)} layers × "
        f"{OPS_PER_LAYER} ops + {tp + pp + dp:.3g} for communication)",
        spans=spans,
    )


def _count(n: float) -> str:
    """A count as a message shows it: whole up to a million, else three significant digits (a 30-digit
    layer count from a typo is unreadable, and a float's tail digits would be noise)."""
    return f"{n:.0f}" if n < 1e6 else f"{n:.3g}"


def check_budget(
    sc: Scenario, max_events: float | None = None, flag: str | None = "--max-events", announce: bool = True
) -> WorkEstimate:
    """Refuse (one line, exit 2) a scenario whose estimate exceeds the budget; announce long runs.
    ``flag``: the option of this command that raises the budget; None where it has none (compare, sweep,
    plan), and the advice points at ``dtsim run``, which has."""
    limit = DEFAULT_MAX_EVENTS if max_events is None else max_events
    est = estimate_work(sc)
    if est.events > limit:
        raise ScenarioError(
            f"this scenario needs about {est.events:.3g} simulation events ({est.detail}), about "
            f"{_duration(est.seconds)} and {est.memory_bytes / 1e9:.3g} GB, over the budget of {limit:.3g}; "
            f"make it smaller (fewer steps, micro-batches, GPUs or sizes) or "
            + (f"raise the budget with {flag} {_round_up(est.events)}" if flag else
               f"simulate it alone with dtsim run --max-events {_round_up(est.events)}"),
            "budget",
        )
    if announce and est.events > PROGRESS_EVENTS:
        print(f"dtsim: about {est.events:.3g} events to simulate (~{_duration(est.seconds)}, "
              f"~{est.memory_bytes / 1e9:.2g} GB)…", file=sys.stderr, flush=True)
    return est


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.3g} days"


def _round_up(x: float) -> str:
    e = 10 ** max(0, math.floor(math.log10(max(x, 1))))
    return f"{math.ceil(x / e) * e:.0e}".replace("e+0", "e").replace("e+", "e")


def positive_events(text: str) -> float:
    """argparse type for --max-events: a positive count (1e9 or 1000000000)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of events like 1e8, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number of events, got {text!r}")
    return value


PROGRESS_EVERY_S = 10.0


@contextmanager
def progress_on_stderr(world: World, enabled: bool, every_s: float = PROGRESS_EVERY_S) -> Iterator[None]:
    """While a long simulation runs, say every ``every_s`` seconds on stderr how far it has got (wall time,
    transfers, the simulated clock), from a daemon thread that only reads counters."""
    if not enabled:
        yield
        return
    stop = threading.Event()
    t0 = time.perf_counter()

    def report() -> None:
        while not stop.wait(every_s):
            print(f"dtsim: simulating… {time.perf_counter() - t0:.0f} s, {world.network.transfers:,} transfers, "
                  f"{world.compute_events:,} compute ops, simulated clock {world.env.now:.4g} s",
                  file=sys.stderr, flush=True)

    thread = threading.Thread(target=report, name="dtsim-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)
