"""Timeline → Summary. Every figure here is read off the simulated timeline (plus the job's FLOP and
memory bookkeeping); nothing is re-simulated or taken from a closed form."""

from __future__ import annotations

import re

import numpy as np

from sim.engine.span_table import span_table
from sim.engine.timeline import (
    COMM_CATEGORIES,
    COMM_TP,
    COMPUTE_CATEGORIES,
    RECOMPUTE,
    STREAM_COMPUTE,
    Timeline,
)
from sim.errors import ScenarioError
from sim.summary import Summary


def _union_length(intervals: np.ndarray) -> float:
    """Length of the union of ``intervals`` (an (n, 2) array of start, end): the merged segments' lengths
    added left to right."""
    if not len(intervals):
        return 0.0
    arr = intervals[np.lexsort((intervals[:, 1], intervals[:, 0]))]
    starts, reach = arr[:, 0], np.maximum.accumulate(arr[:, 1])
    new = np.r_[True, starts[1:] > reach[:-1]]  # a segment starts where nothing before reaches it
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(arr)] - 1
    return sum((reach[last] - starts[first]).tolist())


def _intersect_length(a: np.ndarray, b: np.ndarray) -> float:
    """Length of (union a) ∩ (union b)."""
    return _union_length(a) + _union_length(b) - _union_length(np.concatenate([a, b]))


def _breakdown(comp: np.ndarray, comm: np.ndarray, window: float) -> dict[str, float]:
    busy = _union_length(comp)
    comm_total = _union_length(comm)
    exposed = comm_total - _intersect_length(comp, comm)
    return {"compute_s": busy, "exposed_comm_s": exposed, "comm_s": comm_total,
            "idle_s": max(0.0, window - busy - exposed)}


def breakdown_by_gpu(timeline: Timeline, gpus: list[int], t0: float, t1: float) -> dict[int, dict[str, float]]:
    """Per GPU of ``gpus``, within [t0, t1]: compute busy, communication exposed (compute idle, a collective
    in flight), idle. Read off the timeline's columns (``span_table``), not a Python pass over its 10⁵–10⁶
    spans per GPU."""
    table = span_table(timeline)
    a, b = np.maximum(table.start_s, t0), np.minimum(table.end_s, t1)
    live = (table.dur_s > 0) & (b > a)
    codes = {name: i for i, name in enumerate(table.categories)}
    comp_codes = [codes[c] for c in COMPUTE_CATEGORIES if c in codes]
    comm_codes = [codes[c] for c in COMM_CATEGORIES if c in codes]
    compute_stream = table.streams.index(STREAM_COMPUTE) if STREAM_COMPUTE in table.streams else -1
    is_comp = live & (table.stream == compute_stream) & np.isin(table.category, comp_codes)
    is_comm = live & ~is_comp & np.isin(table.category, comm_codes)
    kind = np.where(is_comp, 1, np.where(is_comm, 2, 0))
    keep = np.flatnonzero(kind > 0)
    keep = keep[np.argsort(table.gpu[keep], kind="stable")]
    g_sorted = table.gpu[keep]
    out: dict[int, dict[str, float]] = {}
    for g in gpus:
        lo, hi = np.searchsorted(g_sorted, g, "left"), np.searchsorted(g_sorted, g, "right")
        idx = keep[lo:hi]
        pairs = np.column_stack([a[idx], b[idx]])
        mine = kind[idx]
        out[g] = _breakdown(pairs[mine == 1], pairs[mine == 2], t1 - t0)
    return out


# A transformer layer's spans: "F<micro-batch> L<layer> …" forward, "R…" its recomputation, "B…" its
# backward, "W…" its weight gradients where the schedule runs them apart (zero-bubble), as
# sim.engine.executor names them.
_LAYER_SPAN = re.compile(r"^([FRBW])(\d+) L(\d+) ")


def layer_times(timeline: Timeline, gpu: int, microbatch: int) -> dict[str, float] | None:
    """One transformer layer's forward and backward pass on ``gpu`` for ``microbatch``, read off its spans:
    the wall time from its first span's start to its last's end (``forward_s``, ``backward_s``: the backward
    with its recomputation), the compute kernels' share of it (``*_compute_s``, ``recompute_s``) and the
    tensor-parallel collectives' (``tp_comm_*_s``, overlapped or not; the backward's with the
    recomputation's); ``weight_apart_s``: the weight-gradient kernels a split-backward schedule runs
    apart (else they are in the backward). The median layer of that GPU, by
    forward + backward time (its stage's layers differ only by what runs beside them); None when the GPU ran
    no transformer layer for that micro-batch."""
    table = span_table(timeline)
    spans = timeline.spans
    acc: dict[int, dict[str, float]] = {}
    for k in np.flatnonzero(table.gpu == gpu).tolist():
        sp = spans[k]
        m = _LAYER_SPAN.match(sp.name)
        if m is None or int(m.group(2)) != microbatch:
            continue
        d = acc.setdefault(int(m.group(3)), {"F_lo": np.inf, "F_hi": -np.inf, "B_lo": np.inf, "B_hi": -np.inf,
                                            "forward_compute_s": 0.0, "backward_compute_s": 0.0,
                                            "recompute_s": 0.0, "tp_comm_forward_s": 0.0,
                                            "tp_comm_backward_s": 0.0, "weight_apart_s": 0.0})
        p = m.group(1)
        if p == "W":  # run apart from the backward: its kernels, outside the backward's window
            if sp.stream == STREAM_COMPUTE:
                d["weight_apart_s"] += sp.dur_s
            continue
        w = "F" if p == "F" else "B"  # the backward's window holds its recomputation
        end = sp.start_s + sp.dur_s
        d[f"{w}_lo"], d[f"{w}_hi"] = min(d[f"{w}_lo"], sp.start_s), max(d[f"{w}_hi"], end)
        if sp.category == COMM_TP:
            d["tp_comm_forward_s" if p == "F" else "tp_comm_backward_s"] += sp.dur_s
        elif sp.stream == STREAM_COMPUTE:
            key = ("forward_compute_s" if p == "F" else
                   "recompute_s" if p == "R" or sp.category == RECOMPUTE else "backward_compute_s")
            d[key] += sp.dur_s
    rows = []
    for layer, d in acc.items():
        if d["F_hi"] < d["F_lo"] or d["B_hi"] < d["B_lo"]:
            continue  # the step ended without this layer's backward (not a training step)
        rows.append({"layer": layer, "forward_s": d["F_hi"] - d["F_lo"], "backward_s": d["B_hi"] - d["B_lo"],
                     **{k: v for k, v in d.items() if k.endswith("_s")}})
    if not rows:
        return None
    rows.sort(key=lambda r: (r["forward_s"] + r["backward_s"], r["layer"]))
    median = rows[(len(rows) - 1) // 2]
    return {**median, "gpu": gpu, "microbatch": microbatch, "layers_here": len(rows)}


def training_summary(timeline: Timeline, step_ends: list[float], *, name: str, workload: str, num_gpus: int,
                     global_batch: int, tokens_per_sample: int, peak_flops: float, model_flops: float,
                     hardware_flops: float, single_gpu_time_s: float, microbatches: int = 0) -> Summary:
    """The timeline's figures for a training run (layout, memory and cost are added by ``sim.api``)."""
    steps = len(step_ends)
    t_end = step_ends[-1]
    if not t_end > 0:  # nothing took time: every rate below would divide by zero
        raise ScenarioError(f"a training step that takes {t_end:g} s (the model's layers, optimizer and "
                            "transfers all take 0 s) — there is nothing to time; give model.forward_ms or "
                            "backward_ms a time > 0", "model")
    step_time = t_end / steps
    # Per GPU, over the whole run, per step.
    per_gpu = breakdown_by_gpu(timeline, list(timeline.gpus), 0.0, t_end)
    # The bottleneck GPU (most compute) speaks for the step: its exposed communication is what it
    # really waits for; others may also "wait in a collective" for it (e.g. behind a straggler).
    crit = max(per_gpu, key=lambda g: (per_gpu[g]["compute_s"], -g))
    compute = per_gpu[crit]["compute_s"] / steps
    exposed = per_gpu[crit]["exposed_comm_s"] / steps
    comm_total = per_gpu[crit]["comm_s"] / steps
    idle_fracs = [v["idle_s"] / t_end for v in per_gpu.values()]
    util = [v["compute_s"] / t_end for v in per_gpu.values()]
    samples_per_s = global_batch / step_time
    # A transformer layer of the bottleneck GPU, in the steady state (its middle micro-batch, first step).
    layer = layer_times(timeline, crit, microbatches // 2) if workload == "transformer" and microbatches else None
    model_tflops = hardware_tflops = mfu = hfu = None  # None: not in the summary
    if model_flops > 0 and peak_flops > 0:
        # Model FLOPs count the model once (3 × forward); hardware FLOPs add what recomputation re-runs.
        # Papers quote either (Narayanan et al. 2021 count recompute; Chowdhery et al.'s MFU does not).
        model_tflops = model_flops / step_time / num_gpus / 1e12
        hardware_tflops = hardware_flops / step_time / num_gpus / 1e12
        mfu = model_flops / (step_time * num_gpus * peak_flops)
        hfu = hardware_flops / (step_time * num_gpus * peak_flops)
    one_gpu_s = speedup = efficiency = overhead_gpu_s = None
    if single_gpu_time_s > 0:
        one_gpu_s = single_gpu_time_s
        speedup = single_gpu_time_s / step_time
        efficiency = speedup / num_gpus
        overhead_gpu_s = num_gpus * step_time - single_gpu_time_s
    return Summary(
        name=name,
        workload=workload,
        num_gpus=num_gpus,
        step_time_s=step_time,
        step_times_s=[b - a for a, b in zip([0.0] + step_ends[:-1], step_ends, strict=True)],
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * tokens_per_sample,
        global_batch=global_batch,
        compute_s=compute,
        comm_s=comm_total,
        exposed_comm_s=exposed,
        bubble_fraction=float(np.mean(idle_fracs)),
        pipeline_utilisation=float(np.mean(util)),
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hardware_tflops,
        mfu=mfu,
        hfu=hfu,
        single_gpu_time_s=one_gpu_s,
        speedup=speedup,
        efficiency=efficiency,
        overhead_gpu_s=overhead_gpu_s,
        layer_time_s=layer,
    )


def simulated_peak_memory(timeline: Timeline) -> dict[int, float]:
    """Per simulated GPU, the highest value of its memory counter track."""
    peak: dict[int, float] = {}
    for c in timeline.counters:
        if c.name == "memory_bytes" and c.value > peak.get(c.gpu, -1.0):
            peak[c.gpu] = c.value
    return peak
