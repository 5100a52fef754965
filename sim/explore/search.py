"""The planner's search space, its objective and its records: which layouts ``dtsim plan`` considers
(every rule a layout must obey to be built), how a step time becomes a score, and the screened / planned
records that ``plan``, ``explain`` and ``plan_output`` share.

Search space (the global batch and precision stay the user's; the GPU count is the cluster's unless
``--gpus`` gives others): tensor t ≤ GPUs per node dividing the heads, KV heads and MLP width; pipeline p
dividing the GPUs left, p ≤ layers; data d = GPUs / (t·p) dividing the global batch; micro-batch b with
d·b dividing the global batch; schedule 1F1B, GPipe or interleaved 1F1B with v chunks (p·v ≤ layers and
the micro-batch count a multiple of p, or, where the stack has Megatron-Core's micro-batch groups, at least
p and run in the smallest group it allows); ZeRO 0–3; checkpointing none, selective or full; sequence
parallelism on or off when t > 1; on an oversubscribed tree, both rank orders (``parallel.order``) when
p > 1 and d > 1; of those, only what the scenario's software stack could run
(``training.kernels``: ``KernelSet.missing``, e.g. no sequence parallelism in Megatron-LM of 2021).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sim.errors import ScenarioError
from sim.explore.estimate import Candidate, Estimate, Estimator, transformer_of
from sim.explore.fabric import tree_oversubscribed
from sim.parallel.layout import RANK_ORDERS, stage_layers_for
from sim.scenario.schema import Scenario
from sim.schedules.actions import interleaved_group_problem
from sim.workload.kernels import KERNEL_SETS, KernelSet
from sim.workload.transformer import CHECKPOINTING_KINDS

OBJECTIVES = ("throughput", "cost", "time-to-train")
# The search space: the schedules the screen has closed forms for (the zero-bubble ones are left to the user),
# chunk counts for the interleaved one, and every checkpointing kind.
SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe")
VIRTUAL_STAGES = (2, 3, 4, 6, 8)
CHECKPOINTING = CHECKPOINTING_KINDS


@dataclass
class Screened:
    """A candidate that passed the cheap filters, with its closed-form estimate and score."""

    candidate: Candidate
    gpus: int
    estimate: Estimate
    score: float  # lower is better, in the objective's terms
    memory: dict | None = None  # exact fullest-stage memory, once checked
    fits: bool | None = None


@dataclass
class PlanResult:
    name: str
    objective: str
    gpu_counts: list[int]
    base: Scenario  # the base scenario (overrides applied)
    rows: list[dict]  # simulated (the top candidates and the given configuration), ranked best first
    screened: list[Screened]
    stats: dict[str, Any] = field(default_factory=dict)
    explanation: list[str] = field(default_factory=list)
    winner: dict | None = None
    given: dict | None = None
    winner_scenario: dict | None = None
    estimators: dict[int, Estimator] = field(default_factory=dict)  # per GPU count


# ---- search space -----------------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending, from its prime factors (trial division to √n: fast for any GPU count)."""
    factors: dict[int, int] = {}
    rest, q = n, 2
    while q * q <= rest:
        while rest % q == 0:
            factors[q] = factors.get(q, 0) + 1
            rest //= q
        q += 1 if q == 2 else 2
    if rest > 1:
        factors[rest] = factors.get(rest, 0) + 1
    out = [1]
    for prime, power in factors.items():
        out = [d * prime**e for d in out for e in range(power + 1)]
    return sorted(out)


def _tensor_rule(model, t: int) -> str | None:
    for name in ("heads", "kv_heads", "ffn_hidden"):
        if getattr(model, name) % t:
            return f"{name} % tensor"
    return None


def enumerate_candidates(
    scenario, gpus: int, max_micro_batch: int = 8, schedules: tuple[str, ...] = SCHEDULES
) -> tuple[list[Candidate], dict[str, int]]:
    """Every layout of the search space for ``gpus`` GPUs, and how many each divisibility rule removed."""
    m, tr = scenario.model, scenario.training
    per_node, layers, batch = scenario.cluster.gpus_per_node, m.layers, tr.global_batch
    ks = KERNEL_SETS[tr.kernels]  # only what the scenario's software stack could run (KernelSet.missing)
    given_layers = scenario.parallel.stage_layers if scenario.parallel is not None else None
    given_order = scenario.parallel.order if scenario.parallel is not None else RANK_ORDERS[0]
    # The rank order moves traffic between the tree's tiers; on a non-blocking tree it changes nothing the
    # screen could see, so only the scenario's is tried there.
    orders = RANK_ORDERS if tree_oversubscribed(scenario) else (given_order,)
    pruned: dict[str, int] = {}
    out: list[Candidate] = []

    def drop(reason: str, n: int = 1) -> None:
        pruned[reason] = pruned.get(reason, 0) + n

    for t in divisors(gpus):
        if t > per_node:
            drop("tensor > GPUs per node")
            continue
        if _tensor_rule(m, t):
            drop("heads/kv_heads/ffn_hidden not divisible by tensor")
            continue
        for p in divisors(gpus // t):
            if p > layers:
                drop("pipeline > layers")
                continue
            d = gpus // (t * p)
            top = min(max_micro_batch, batch // d)  # larger micro-batches cannot divide the global batch
            if max_micro_batch > top:
                drop("global batch not divisible by data × micro-batch", max_micro_batch - top)
            for b in range(1, top + 1):
                if batch % (d * b):
                    drop("global batch not divisible by data × micro-batch")
                    continue
                mbs = batch // (d * b)
                for sched, v, group in _schedules(p, mbs, layers, schedules, drop, ks.microbatch_groups):
                    for zero in (0, 1, 2, 3) if d > 1 else (0,):
                        for ck in CHECKPOINTING:
                            for sp in (False, True) if t > 1 else (False,):
                                if sp and (m.seq_len * b) % t:
                                    drop("seq_len × micro-batch not divisible by tensor (SP)")
                                    continue
                                for order in orders if p > 1 and d > 1 else (given_order,):
                                    cand = Candidate(d, t, p, b, sched, v, zero, ck, sp, group, order)
                                    gap = stack_gap(ks, cand, layers, tr.precision,
                                                    stage_layers_for(given_layers, p, v))
                                    if gap:
                                        drop(gap)
                                        continue
                                    out.append(cand)
    return out, pruned


def stack_gap(ks: KernelSet, c: Candidate, layers: int, precision: str,
              stage_layers: list[int] | None = None) -> str | None:
    """Why the software stack ``ks`` could not run candidate ``c`` (None: it could): a part of the layout
    ``KernelSet.missing`` flags, or ZeRO 0 in bf16 where DeepSpeed's BF16_Optimizer shards anyway (the
    same run as ZeRO 1). The search leaves such candidates out; the winner's explanation names them."""
    if ks.missing(tensor=c.tensor, pipeline=c.pipeline, schedule=c.schedule, zero=c.zero,
                  checkpointing=c.checkpointing, sequence_parallel=c.sequence_parallel, layers=layers,
                  virtual_stages=c.virtual_stages, stage_layers=stage_layers, order=c.order):
        return f"not in training.kernels {ks.name}"
    if c.zero == 0 and c.data > 1 and ks.bf16_optimizer_shards and precision == "bf16":
        return "ZeRO 0 runs as ZeRO 1 (DeepSpeed's BF16_Optimizer)"
    return None


def _schedules(p: int, mbs: int, layers: int, allowed: tuple[str, ...], drop,
               groups: bool = False) -> list[tuple[str, int, int | None]]:
    """(schedule, chunks, micro-batch group) to consider for p stages and ``mbs`` micro-batches. The
    interleaved schedule needs ``mbs`` a multiple of p, unless the stack has micro-batch groups
    (``groups``: Megatron-Core's microbatch_group_size_per_vp_stage), which run any ``mbs`` ≥ p in the
    smallest group whose last one is whole or at least p long (less memory in flight than larger ones)."""
    if p == 1:
        return [("1f1b", 1, None)]  # without a pipeline every schedule is the same
    out: list[tuple[str, int, int | None]] = [(s, 1, None) for s in ("1f1b", "gpipe") if s in allowed]
    if "interleaved-1f1b" in allowed:
        group = None
        if mbs % p and groups and mbs >= p:
            group = next(n for n in range(p, mbs + 1) if interleaved_group_problem(p, mbs, n) is None)
        for v in VIRTUAL_STAGES:
            if p * v > layers:
                drop("pipeline × virtual stages > layers")
            elif mbs % p and group is None:
                drop("interleaved: fewer micro-batches than pipeline" if groups
                     else "interleaved: micro-batches not a multiple of pipeline")
            else:
                out.append(("interleaved-1f1b", v, group))
    return out


def candidate_of(scenario: Scenario) -> Candidate | None:
    """The base scenario's own layout as a candidate, when the search space can express it."""
    par, tr = scenario.require_training()
    if par.schedule not in SCHEDULES or tr.checkpointing.every != 1 or tr.checkpointing.partition_activations:
        return None  # layouts the search does not express (checkpoints every layer, kept whole)
    return Candidate(
        par.data,
        par.tensor,
        par.pipeline,
        tr.micro_batch,
        par.schedule,
        par.virtual_stages,
        par.zero,
        tr.checkpointing.kind,
        par.sequence_parallel and par.tensor > 1,
        par.microbatch_group_size if par.schedule == "interleaved-1f1b" and par.virtual_stages > 1 else None,
        par.order,
    )


# ---- objective ------------------------------------------------------------------------------------
def _steps_total(scenario: Scenario, tokens_per_step: float) -> float | None:
    _, tr = scenario.require_training()
    if tr.train_steps:
        return float(tr.train_steps)
    if tr.tokens:
        return tr.tokens / tokens_per_step
    return None


def score_of(objective: str, scenario: Scenario, gpus: int, step_time_s: float) -> float:
    """Lower is better: −tokens/s, $ per 1M tokens, or seconds to train."""
    _, tr = scenario.require_training()
    tokens_per_step = tr.global_batch * transformer_of(scenario).seq_len
    if objective == "throughput":
        return -tokens_per_step / step_time_s
    if objective == "cost":
        return gpus * scenario.gpu.price_per_gpu_hour * step_time_s / 3600 * 1e6 / tokens_per_step
    steps = _steps_total(scenario, tokens_per_step)
    if steps is None:  # plan's input check requires training.tokens or train_steps for this objective
        raise ScenarioError("time-to-train needs training.tokens or training.train_steps", "--objective")
    return steps * step_time_s


def summary_score(objective: str, summary: dict) -> float:
    if objective == "throughput":
        return -summary["tokens_per_s"]
    if objective == "cost":
        return summary["cost_per_1M_tokens_usd"]
    return summary["time_to_train_s"]


def check_memory(s: Screened, est: Estimator) -> bool:
    if s.fits is None:
        s.memory = est.exact_memory(s.candidate)
        s.fits = s.memory["peak"] <= est.capacity
    return s.fits
