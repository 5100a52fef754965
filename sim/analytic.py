"""Closed forms from the seeds and reference.md: the oracle tests compare the simulator against, and a
fast estimate when a full simulation is not needed.

Symbols: p ranks (or pipeline stages), m micro-batches, v virtual stages per device, N bytes,
α per-message latency (s), B link bandwidth (bytes/s). Collective times are for idealised, uncontended
links; they return 0 for a single rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sim.errors import ScenarioError
from sim.units import DTYPE_BYTES

MIXED_ADAM_BYTES_PER_PARAM = 16  # 2 weights + 2 gradients + 12 (fp32 master, momentum, variance)

# nccl-tests busbw = algbw × factor(p) (PERFORMANCE.md).
_BUSBW_FACTORS = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
    "send_recv": lambda p: 1.0,
}


# ------------------------------------------------------------------------------------- batch and speedup


def global_batch(p: int, local_batch: int) -> int:
    """B_global = p · B_local."""
    return p * local_batch


def speedup(t1_s: float, tp_s: float) -> float:
    """S_p = T_1 / T_p."""
    return t1_s / tp_s


def efficiency(t1_s: float, tp_s: float, p: int) -> float:
    """E_p = S_p / p."""
    return speedup(t1_s, tp_s) / p


def overhead(t1_s: float, tp_s: float, p: int) -> float:
    """T_o = p·T_p − T_1 (processor-time units of the inputs)."""
    return p * tp_s - t1_s


def dp_step_time(compute_times_s: Iterable[float], all_reduce_s: float) -> float:
    """T_step ≈ max_i T_compute,i + T_all-reduce (the slowest worker, then the collective)."""
    return max(compute_times_s) + all_reduce_s


def mfu(model_flops: float, time_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation; peak_flops_per_s is the aggregate peak of all GPUs used."""
    return model_flops / (time_s * peak_flops_per_s)


# ------------------------------------------------------------------------------------------- pipelines


def pipeline_time(s: int, m: int, t: float) -> float:
    """Ideal forward pipeline time (m + s − 1)·t for s balanced stages of time t."""
    return (m + s - 1) * t


def pipeline_speedup(s: int, m: int) -> float:
    """S = m·s / (m + s − 1) over running the stages sequentially."""
    return m * s / (m + s - 1)


def pipeline_utilisation(s: int, m: int) -> float:
    """U = m / (m + s − 1)."""
    return m / (m + s - 1)


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Idle share of the total pipeline time: (p − 1) / (v·m + p − 1) (v = 1: GPipe / 1F1B).

    Normalised to total time, so 1 − bubble_fraction = utilisation. bubble_ratio gives the reference's
    normalisation to the ideal (bubble-free) time.
    """
    return (p - 1) / (v * m + p - 1)


def bubble_ratio(p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal compute time: (p − 1) / (v·m) (reference.md's (p − 1)/m, interleaved /v)."""
    return (p - 1) / (v * m)


def one_f_one_b_bubble_time(p: int, t_f: float, t_b: float, t_w: float) -> float:
    """1F1B bubble per stage with backward split into B and W: (p − 1)(T_F + T_B + T_W)."""
    return (p - 1) * (t_f + t_b + t_w)


def zb_h1_bubble_time(p: int, t_f: float, t_b: float, t_w: float) -> float:
    """ZB-H1 (Qi et al. 2023): (p − 1)(T_F + T_B − T_W), same memory as 1F1B."""
    return (p - 1) * (t_f + t_b - t_w)


def zb_h2_bubble_time(p: int, t_f: float, t_b: float, t_w: float) -> float:
    """ZB-H2: (p − 1)(T_F + T_B − 2T_W), never negative; needs 2p − 1 micro-batches of memory."""
    return max(0.0, (p - 1) * (t_f + t_b - 2 * t_w))


# ----------------------------------------------------------------------------------------- collectives


def send_recv_time(n_bytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Point-to-point: α + N/B."""
    return alpha_s + n_bytes / bandwidth_Bps


def ring_all_reduce_time(p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring all-reduce: 2(p − 1) steps of N/p bytes, 2(p − 1)(α + N/(pB))."""
    return 2 * (p - 1) * (alpha_s + n_bytes / (p * bandwidth_Bps))


def ring_reduce_scatter_time(p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring reduce-scatter of a full size N: (p − 1)(α + N/(pB))."""
    return (p - 1) * (alpha_s + n_bytes / (p * bandwidth_Bps))


def ring_all_gather_time(p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Ring all-gather to a gathered size N: (p − 1)(α + N/(pB))."""
    return (p - 1) * (alpha_s + n_bytes / (p * bandwidth_Bps))


def tree_broadcast_time(p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Binomial-tree broadcast: ⌈log2 p⌉ rounds of the whole message, ⌈log2 p⌉(α + N/B)."""
    return math.ceil(math.log2(p)) * (alpha_s + n_bytes / bandwidth_Bps) if p > 1 else 0.0


def tree_reduce_time(p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Binomial-tree reduce: the broadcast run backwards, ⌈log2 p⌉(α + N/B) (reduction arithmetic free)."""
    return tree_broadcast_time(p, n_bytes, alpha_s, bandwidth_Bps)


def pipelined_chain_broadcast_time(
    p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float, chunks: int
) -> float:
    """Broadcast down a chain in k chunks: (p − 1 + k − 1)(α + N/(kB)) (fill, then one chunk per step)."""
    if p == 1:
        return 0.0
    return (p - 1 + chunks - 1) * (alpha_s + n_bytes / (chunks * bandwidth_Bps))


def parameter_server_time(p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float) -> float:
    """Push then pull through one server among p ranks: its link carries (p − 1)·N each way,
    2(α + (p − 1)N/B)."""
    if p == 1:
        return 0.0
    return 2 * (alpha_s + (p - 1) * n_bytes / bandwidth_Bps)


def hierarchical_all_reduce_time(
    nodes: int,
    gpus_per_node: int,
    n_bytes: float,
    alpha_intra_s: float,
    bandwidth_intra_Bps: float,
    alpha_inter_s: float,
    bandwidth_inter_Bps: float,
) -> float:
    """Intra-node ring reduce-scatter, inter-node ring all-reduce of each GPU's N/g shard (g parallel
    rings, one per local rank), intra-node ring all-gather."""
    g = gpus_per_node
    intra = ring_reduce_scatter_time(g, n_bytes, alpha_intra_s, bandwidth_intra_Bps)
    inter = ring_all_reduce_time(nodes, n_bytes / g, alpha_inter_s, bandwidth_inter_Bps)
    return 2 * intra + inter


def busbw_factor(collective: str, p: int) -> float:
    """nccl-tests bus-bandwidth factor: all-reduce 2(p − 1)/p; all-gather, reduce-scatter, all-to-all
    (p − 1)/p; broadcast, reduce, send/recv 1."""
    if collective not in _BUSBW_FACTORS:
        raise ScenarioError(f"{collective!r} is not one of {', '.join(_BUSBW_FACTORS)}", field="collective")
    return _BUSBW_FACTORS[collective](p)


def algbw(n_bytes: float, time_s: float) -> float:
    """nccl-tests algorithm bandwidth N / t (bytes/s)."""
    return n_bytes / time_s


def busbw(collective: str, p: int, n_bytes: float, time_s: float) -> float:
    """nccl-tests bus bandwidth algbw × factor: comparable to the link's peak across collectives."""
    return algbw(n_bytes, time_s) * busbw_factor(collective, p)


# -------------------------------------------------------------------------------------- memory and ZeRO


def tensor_bytes(n_values: float, dtype: str) -> float:
    """Bytes of n values: 1e9 fp32 values = 4 GB, fp16 = 2 GB."""
    return n_values * DTYPE_BYTES[dtype]


def zero_memory_bytes(params: float, stage: int, dp: int, k: int = 12) -> float:
    """ZeRO model-state bytes per GPU: (2 + 2 + K)Ψ, 4Ψ + KΨ/N_d, 2Ψ + (2 + K)Ψ/N_d, (4 + K)Ψ/N_d."""
    if stage == 0:
        return (4 + k) * params
    if stage == 1:
        return 4 * params + k * params / dp
    if stage == 2:
        return 2 * params + (2 + k) * params / dp
    if stage == 3:
        return (4 + k) * params / dp
    raise ScenarioError(f"must be 0, 1, 2 or 3, got {stage}", field="parallel.zero")


def zero_comm_volume(params: float, stage: int) -> float:
    """Per-GPU data-parallel traffic in parameter elements per step: 2Ψ for stages 0–2, 3Ψ for stage 3."""
    if stage not in (0, 1, 2, 3):
        raise ScenarioError(f"must be 0, 1, 2 or 3, got {stage}", field="parallel.zero")
    return (3.0 if stage == 3 else 2.0) * params


def zero_comm_bytes(params: float, stage: int, bytes_per_elem: int = 2) -> float:
    """zero_comm_volume in bytes (16-bit gradients and parameters by default)."""
    return zero_comm_volume(params, stage) * bytes_per_elem


def full_activation_memory(layers: int, per_layer_bytes: float) -> float:
    """M_full = L · M_layer."""
    return layers * per_layer_bytes


def checkpoint_memory(checkpoints: int, per_layer_bytes: float) -> float:
    """M_checkpoint ≈ C · M_layer (seeds' approximation; memory.activation_bytes_per_stage refines it)."""
    return checkpoints * per_layer_bytes


def scale_loss(value: float, scale: float) -> float:
    """L' = S·L, and equally ∇L' = S·∇L."""
    return value * scale


def unscale(value: float, scale: float) -> float:
    """g = g' / S, restoring the unscaled gradient before the optimizer step."""
    return value / scale


# ------------------------------------------------------------------------------------------------ FLOPs


def korthikanti_model_flops(global_batch: int, layers: int, seq: int, hidden: int, vocab: int) -> float:
    """72·B·L·s·h²(1 + s/(6h) + V/(12hL)): model FLOPs per iteration of a GPT-style transformer."""
    b, n, s, h, v = global_batch, layers, seq, hidden, vocab
    return 72.0 * b * n * s * h * h * (1 + s / (6 * h) + v / (12 * h * n))


def korthikanti_hardware_flops_full_recompute(
    global_batch: int, layers: int, seq: int, hidden: int, vocab: int
) -> float:
    """96·B·L·s·h²(1 + s/(6h) + V/(16hL)): with full recomputation (layers' forward run twice)."""
    b, n, s, h, v = global_batch, layers, seq, hidden, vocab
    return 96.0 * b * n * s * h * h * (1 + s / (6 * h) + v / (16 * h * n))


# ------------------------------------------------------------------------ pipelined and in-network (NCCL)


def pipelined_chain_time(p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float, chunks: int) -> float:
    """Chain broadcast/reduce pipelined as NCCL runs it (a hop's later chunks do not wait its latency
    again): (p − 1)α + (p − 1 + k − 1)·N/(kB) → (p − 1)α + N/B for many chunks."""
    if p == 1:
        return 0.0
    return (p - 1) * alpha_s + (p + chunks - 2) * n_bytes / (chunks * bandwidth_Bps)


def double_binary_tree_all_reduce_time(p: int, n_bytes: float, alpha_s: float, bandwidth_Bps: float,
                                       depth: int, chunks: int) -> float:
    """NCCL's double binary tree, pipelined in k chunks per tree (N/2 each): up and down the depth-d
    trees, 2dα, while every rank's links carry 2N (inner in one tree: 2·N/2 from its children, N/2
    from its parent, 2·N/2 to its children; leaf in the other: N/2 each way), plus a fill of about
    d chunks: 2dα + (2N/B)(1 + d/(2k)). Holds for p ≥ 4 on equal links (p ≤ 3 has fewer inner nodes)."""
    if p == 1:
        return 0.0
    return 2 * depth * alpha_s + 2 * n_bytes / bandwidth_Bps * (1 + depth / (2 * chunks))


def sharded_parameter_server_time(workers: int, servers: int, n_bytes: float, alpha_s: float,
                                  server_Bps: float, aggregate_Bps: float | None = None,
                                  colocated: bool = False) -> float:
    """S servers each own N/S; each server's link carries every other worker's shard in (push) and out
    (pull): 2(α + W'·(N/S)/B_server) with W' = W − 1 colocated (its own shard stays), W dedicated; the
    sum reads W' + 1 shards and writes one at ``aggregate_Bps`` (BytePS's CPU summation)."""
    w = workers - 1 if colocated else workers
    shard = n_bytes / servers
    agg = 0.0 if not aggregate_Bps else (w + (1 if colocated else 0) + 1) * shard / aggregate_Bps
    return 2 * (alpha_s + w * shard / server_Bps) + agg


def nvls_all_reduce_time(p: int, n_bytes: float, alpha_s: float, nvls_Bps: float) -> float:
    """NVLS (NVLink SHARP) all-reduce: every GPU sends and receives N(p + 1)/p through the NVSwitch,
    pipelined: α + N(p + 1)/(p·B_nvls); busbw = 2(p − 1)/(p + 1)·B_nvls for large N."""
    if p == 1:
        return 0.0
    return alpha_s + n_bytes * (p + 1) / (p * nvls_Bps)
