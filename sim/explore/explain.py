"""Why the planner's winner looks the way it does, in the seeds' terms, with the numbers behind each choice.

Each degree and setting gets one line: what it buys (NVLink-local tensor collectives, model states split
over a replica, the bubble (p − 1)/(v·m + p − 1), the exposed gradient sync) and, where the search had a
fitting alternative, how much slower the closed-form estimate says it would be. Memory trade-offs
(checkpointing, ZeRO, sequence parallelism) use the exact per-stage memory from ``sim.build``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from sim.explore.estimate import Candidate, Estimator
from sim.explore.search import (
    CHECKPOINTING,
    PlanResult,
    Screened,
    candidate_of,
    check_memory,
    score_of,
    stack_gap,
)
from sim.parallel.layout import Layout
from sim.training.step_work import dense_layer_ops

GB = 1e9
CHECKPOINT_WHAT = {
    "none": "keeps every activation (no recomputation)",
    "selective": "recomputes only the attention core in backward (cheap), keeping the rest",
    "full": "keeps only each layer's input and recomputes the whole forward in backward",
}
ZERO_WHAT = {
    0: "plain data parallelism, no extra collectives",
    1: "shards the optimizer states over the replicas",
    2: "shards optimizer states and gradients over the replicas",
    3: "shards weights too, gathering each layer's weights before use",
}
SP_WHAT = {False: "every TP rank keeps the whole norm and dropout activations",
           True: "splits the norm and dropout activations over the TP ranks"}


def plural(count: int, noun: str) -> str:
    """ "1 GPU", "8 GPUs", "2 micro-batches"."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}es" if noun.endswith("h") else f"{count} {noun}s"


def best_other(
    result: PlanResult, win: Screened, attr: str, keep: tuple[str, ...] = (), limit: int = 400
) -> Screened | None:
    """The best-estimated fitting candidate (same GPU count and ``keep`` values) whose ``attr`` differs."""
    mine = getattr(win.candidate, attr)
    tried = 0
    for s in result.screened:
        same = all(getattr(s.candidate, k) == getattr(win.candidate, k) for k in keep)
        if s.gpus != win.gpus or getattr(s.candidate, attr) == mine or not same:
            continue
        tried += 1
        if tried > limit:
            return None
        if check_memory(s, result.estimators[s.gpus]):
            return s
    return None


def slower(win: Screened, other: Screened | None, attr: str, name: str | None = None) -> str:
    """ " (best with tensor 4: <label>, est. +12% step time)", or "" when nothing else fits."""
    if other is None:
        return ""
    pct = (other.estimate.step_time_s / win.estimate.step_time_s - 1) * 100
    value = getattr(other.candidate, attr)
    return f" (best with {name or attr} {value}: {other.candidate.label()}, est. {pct:+.0f}% step time)"


def winner_screened(result: PlanResult) -> Screened | None:
    """The winner as a screened candidate (the given configuration is estimated here if it won), or None
    when the winner is a given configuration the search space cannot express."""
    assert result.winner is not None  # explain runs only when a candidate was simulated
    s = result.winner.get("_screened")
    if s is not None:
        return s
    base, n = result.base, result.base.total_gpus
    c = candidate_of(base)
    if c is None:
        return None
    e = result.estimators[n].estimate(c)
    s = Screened(c, n, e, score_of(result.objective, base, n, e.step_time_s))
    check_memory(s, result.estimators[n])
    return s


def _tensor(result: PlanResult, win: Screened) -> str:
    c, e = win.candidate, win.estimate
    est = result.estimators[win.gpus]
    cl = est.scenario.cluster
    if c.tensor == 1:
        why = "TP 1: no tensor-parallel collectives on the critical path; each GPU holds whole layers"
    else:
        kind = "all-gathers/reduce-scatters" if c.sequence_parallel else "all-reduces"
        size_mb = c.micro_batch * est.model.seq_len * est.model.hidden * 2 / 1e6
        where = (
            f"on {cl.intra_node.name} inside a node ({cl.intra_node.bandwidth_Bps / GB:.0f} GB/s, vs "
            f"{cl.inter_node.bandwidth_Bps / GB:.0f} GB/s per {cl.inter_node.name} NIC)"
        )
        lo = dense_layer_ops(est.dims, micro_batch=c.micro_batch, tp=c.tensor,
                             sequence_parallel=c.sequence_parallel, dtype=est.precision,
                             attention=est.model.attention, ks=est.kernels, schedule=c.schedule,
                             flash_attention=est.training.flash_attention, gbytes=est.gbytes, ebytes=est.ebytes,
                             norm_kernel=est.training.norm_kernel, fp8_recipe=est.training.fp8_recipe)
        n_fwd = sum(1 for s in lo.forward if s.comm)
        n_bwd = sum(1 for s in lo.backward_input if s.comm)
        beside = sum(1 for s in lo.backward_input if s.comm and s.overlap)
        besides = f", {beside} of them beside a GEMM" if beside else ""
        why = (
            f"TP {c.tensor}: splits each layer's weights and GEMMs {c.tensor} ways; its tensor {kind} "
            f"({n_fwd} per layer forward, {n_bwd} backward{besides}; {size_mb:.0f} MB each) stay {where}; "
            f"est. {e.tp_comm_s:.2f} s added to the step by TP communication"
        )
    return why + slower(win, best_other(result, win, "tensor"), "tensor")


def _pipeline(result: PlanResult, win: Screened, m: int) -> str:
    c, e = win.candidate, win.estimate
    est = result.estimators[win.gpus]
    sc = est.scenario
    cap = sc.gpu.memory_bytes
    states = est.model_state_bytes()
    need = math.ceil(states / cap)
    why = (
        f"PP {c.pipeline}: the model's {states / GB:,.0f} GB of weights, gradients and "
        f"{est.training.optimizer} "
        f"states ({est.params_total() / 1e9:.1f} B parameters) need ≥ {plural(need, 'GPU')} of "
        f"{cap / GB:.0f} GB without ZeRO; a replica of tensor × pipeline = "
        f"{plural(c.tensor * c.pipeline, 'GPU')}"
        f" holds {e.states_bytes / GB:.1f} GB of them per GPU"
    )
    if c.zero:
        why += f" (ZeRO-{c.zero} shards them over the {c.data} replicas)"
    if c.pipeline == 1:
        why += "; no pipeline, so no bubble"
    else:
        v, p = c.virtual_stages, c.pipeline
        why += f"; bubble (p−1)/(v·m+p−1) = ({p}−1)/({v}·{m}+{p}−1) = {e.bubble_fraction:.1%}"
        why += _fabric_note(est, c, "pp")
    return why + slower(win, best_other(result, win, "pipeline"), "pipeline")


def _data(result: PlanResult, win: Screened, m: int) -> str:
    c, e = win.candidate, win.estimate
    est = result.estimators[win.gpus]
    cl = est.scenario.cluster
    if c.data == 1:
        return "DP 1: every GPU is needed inside the one replica (tensor × pipeline)"
    link = cl.intra_node.name if est.dp_span_nodes(c) <= 1 else cl.inter_node.name
    op = {0: "ring all-reduce", 3: "per-layer gathers and reduce-scatters"}.get(
        c.zero, "all-reduce + all-gather" if c.zero == 1 and est.kernels.zero1_grad_all_reduce
        else "reduce-scatter + all-gather"
    )
    return (
        f"DP {c.data} gets the remaining GPUs for throughput: {c.data} replicas each run "
        f"{plural(m, 'micro-batch')} per step; the gradient sync ({op} over {link}{_fabric_note(est, c, 'dp')}) "
        f"takes est. {e.dp_comm_s:.2f} s, {e.dp_exposed_s:.2f} s of it exposed after overlapping the last backward"
    )


def _fabric_note(est, c, kind: str) -> str:
    """Where the screen found the layout's groups of ``kind`` sharing an oversubscribed tree's uplinks
    (``sim.explore.fabric``), what that costs them; else ""."""
    lay = Layout(dp=c.data, tp=c.tensor, pp=c.pipeline, order=c.order)
    share = est.fabric_shares(lay)[kind]
    if share <= 1.0 + 1e-9:
        return ""
    if kind == "dp":
        return (f", each ring at 1/{share:.3g} of its NICs' speed: every data-parallel ring crosses the "
                f"oversubscribed tree at once, cluster.topology")
    return (f"; its sends cross the oversubscribed tree at 1/{share:.3g} of the NICs' speed, every stage "
            f"boundary at once (cluster.topology)")


ORDER_WHAT = {
    "tp-dp-pp": "Megatron's default: a pipeline stage's GPUs together, so the data-parallel rings stay near and "
                "the pipeline sends cross the tree",
    "tp-pp-dp": "Meta's [TP, CP, PP, DP] (Megatron-Core's --use-tp-pp-dp-mapping): a replica's stages together, "
                "so the pipeline sends stay near and the data-parallel rings cross the tree",
}


def _order(result: PlanResult, win: Screened) -> str | None:
    """The rank order, where the search tried both (an oversubscribed tree, a pipeline and replicas)."""
    c = win.candidate
    other = best_other(result, win, "order", keep=("data", "tensor", "pipeline"))
    if other is None:
        return None
    return f"rank order {c.order}: {ORDER_WHAT[c.order]}" + slower(win, other, "order", "rank order")


def _schedule(result: PlanResult, win: Screened, m: int) -> str | None:
    c, e = win.candidate, win.estimate
    if c.pipeline == 1:
        return None
    if c.schedule == "interleaved-1f1b":
        plain = (c.pipeline - 1) / (m + c.pipeline - 1)
        why = (
            f"schedule interleaved-1f1b with {c.virtual_stages} chunks per GPU: cuts the bubble to "
            f"{e.bubble_fraction:.1%} from {plain:.1%} (v = 1) for {c.virtual_stages}× more pipeline sends"
        )
        if c.microbatch_group is not None:
            why += (f"; {m} micro-batches are not a multiple of pipeline {c.pipeline}, so they go through "
                    f"each chunk in groups of {c.microbatch_group} (Megatron-Core's micro-batch groups)")
    elif c.schedule == "1f1b":
        why = (
            f"schedule 1f1b: the bubble of GPipe ({e.bubble_fraction:.1%}) with at most p = {c.pipeline} "
            f"micro-batches' activations in flight instead of all {m}"
        )
    else:
        why = f"schedule gpipe: all {m} micro-batches' activations fit; bubble {e.bubble_fraction:.1%}"
    other = best_other(result, win, "schedule", keep=("data", "tensor", "pipeline"))
    return why + slower(win, other, "schedule")


def _shown(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def memory_choice(est: Estimator, c: Candidate, attr: str, options, what: dict, name: str) -> str:
    """ "<name> X: what it does; peak P GB of C GB; Y would need Q GB (does not fit); Z: R GB, est. +s%";
    an alternative the software stack could not run says so instead of a price."""
    cap = est.capacity
    mine = getattr(c, attr)
    parts = [
        f"{name} {_shown(mine)}: {what[mine]}; peak {est.exact_memory(c)['peak'] / GB:.1f} GB of "
        f"{cap / GB:.0f} GB"
    ]
    base_t = est.estimate(c).step_time_s
    for opt in options:
        if opt == mine:
            continue
        alt = replace(c, **{attr: opt})
        lacks = stack_gap(est.kernels, alt, est.dims.layers, est.precision)
        if lacks:
            parts.append(f"{_shown(opt)}: {lacks}")
            continue
        peak = est.exact_memory(alt)["peak"]
        if peak > cap:
            parts.append(f"{_shown(opt)} would need {peak / GB:.1f} GB (does not fit)")
        else:
            pct = (est.estimate(alt).step_time_s / base_t - 1) * 100
            parts.append(f"{_shown(opt)}: {peak / GB:.1f} GB, est. {pct:+.1f}% step time")
    return "; ".join(parts)


def explain(result: PlanResult) -> list[str]:
    """One line per choice of the winner (layout, TP, PP, DP, micro-batch, schedule, memory settings)."""
    win = winner_screened(result)
    if win is None:
        return [
            "the given configuration simulated fastest; its schedule or checkpointing interval is outside "
            "the search space, so there is nothing to compare it with setting by setting"
        ]
    c = win.candidate
    est = result.estimators[win.gpus]
    sc = est.scenario
    batch = est.training.global_batch
    m = batch // (c.data * c.micro_batch)
    lines = [
        f"layout: data {c.data} × tensor {c.tensor} × pipeline {c.pipeline} on {win.gpus} {sc.gpu.name} "
        f"({sc.cluster.gpus_per_node} per node); global batch {batch} = data {c.data} × micro-batch "
        f"{c.micro_batch} × {plural(m, 'micro-batch')}",
        _tensor(result, win),
        _pipeline(result, win, m),
        _data(result, win, m),
        f"micro-batch {c.micro_batch}: larger micro-batches use the GEMMs better but leave fewer to fill the "
        f"pipeline" + slower(win, best_other(result, win, "micro_batch"), "micro_batch", "micro-batch"),
    ]
    schedule = _schedule(result, win, m)
    if schedule:
        lines.append(schedule)
    order = _order(result, win)
    if order:
        lines.append(order)
    lines.append(memory_choice(est, c, "checkpointing", CHECKPOINTING, CHECKPOINT_WHAT, "checkpointing"))
    if c.data > 1:
        lines.append(memory_choice(est, c, "zero", (0, 1, 2, 3), ZERO_WHAT, "ZeRO"))
    if c.tensor > 1:
        lines.append(
            memory_choice(est, c, "sequence_parallel", (False, True), SP_WHAT, "sequence parallelism")
        )
    lines.append(f"precision {est.training.precision}: kept as given (the planner does not change numerics)")
    w, given = result.winner, result.given
    assert w is not None
    if given and given.get("tokens_per_s") and w.get("tokens_per_s"):
        gain = w["tokens_per_s"] / given["tokens_per_s"] - 1
        same = " (the given configuration is already the best found)" if w is given else ""
        lines.append(
            f"vs the given configuration: {w['tokens_per_s']:,.0f} vs {given['tokens_per_s']:,.0f} "
            f"tokens/s simulated ({gain:+.1%}){same}"
        )
    return lines
