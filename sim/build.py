"""Joins the three inputs late: hardware + model + strategy → topology, cost model and TrainingJob.

This is the only module that knows all three; the executor runs what it builds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypedDict

from sim import memory as mem
from sim.cost.base import INTER_NODE, INTRA_NODE, CostModel
from sim.cost.calibrated import CalibratedCostModel
from sim.cost.roofline import RooflineCostModel
from sim.engine.job import Block, ChunkWork, LayerWork, TrainingJob
from sim.engine.timeline import DATA
from sim.hardware.topology import Topology
from sim.parallel import context as ctx
from sim.parallel.layout import partition_layers
from sim.scenario.schema import LayersModel, Scenario, SyntheticModel, TransformerModel
from sim.training import step_work as sw
from sim.training.loss_scale import LossScaleConfig
from sim.training.loss_scale import simulate as simulate_loss_scale
from sim.units import DTYPE_BYTES, storage_dtype
from sim.workload import moe as moe_ops
from sim.workload import transformer as tf
from sim.workload.kernels import P2P_GATHERS, fused_softmax_runs, p2p_blocks, persistent_norm
from sim.workload.layers import checkpoint_bytes, generic_layer_ops
from sim.workload.ops import elementwise


def cost_model_for(scenario: Scenario, calibration: str | Path | None = None) -> CostModel:
    """The datasheet roofline, or a calibrated profile with the roofline filling its gaps."""
    roof = RooflineCostModel(scenario.gpu)
    path = calibration or scenario.calibration
    if not path:
        return roof
    return CalibratedCostModel(path, fallback=roof)


def topology_for(scenario: Scenario, cost: CostModel, max_nodes: int | None = None) -> Topology:
    """The scenario's topology; ``max_nodes`` builds only that many nodes (same links and per-link
    figures: what a closed-form screen needs to read link speeds without building a huge cluster)."""
    c = scenario.cluster
    n = c.gpus_per_node
    return Topology(
        nodes=c.nodes if max_nodes is None else min(c.nodes, max_nodes),
        gpus_per_node=n,
        intra=c.intra_node,
        inter=c.inter_node,
        nics_per_node=c.nics_per_node,
        kind=c.topology.kind,
        oversubscription=c.topology.oversubscription,
        nodes_per_leaf=c.topology.nodes_per_leaf,
        nodes_per_pod=c.topology.nodes_per_pod,
        pod_oversubscription=c.topology.pod_oversubscription,
        intra_override=cost.link_params(INTRA_NODE, n),
        inter_override=cost.link_params(INTER_NODE, c.nodes),
    )


@dataclass
class JobInfo:
    """What metrics need besides the timeline: FLOPs, tokens, memory estimates, loss-scale history."""

    model_flops_per_step: float = 0.0
    hardware_flops_per_step: float = 0.0
    tokens_per_sample: int = 1
    single_gpu_time_s: float = 0.0  # the same step's compute, all on one GPU (T_1)
    memory_by_stage: list[dict] = field(default_factory=list)
    loss_scale: list[dict] = field(default_factory=list)
    params_total: float = 0.0
    notes: list[str] = field(default_factory=list)


def _stage_chunks(n_layers: int, pp: int, v: int, counts: list[int] | None = None) -> list[list[int]]:
    """Layer indices of each virtual stage (index vs = chunk * pp + stage); ``counts`` = parallel.stage_layers."""
    return partition_layers(n_layers, pp * v, counts)


def build_job(scenario: Scenario, cost: CostModel) -> tuple[TrainingJob, JobInfo]:
    kind = scenario.model.kind
    if kind == "synthetic":
        return _synthetic(scenario, cost)
    if kind == "transformer":
        return _transformer(scenario, cost)
    return _layers(scenario, cost)


def _bucket_bytes(scenario: Scenario, grad_elem_bytes: int) -> float:
    par, _ = scenario.require_training()
    return sw.grad_bucket_bytes(par.bucket_MB, transformer=scenario.model.kind == "transformer",
                             data=par.data, grad_elem_bytes=grad_elem_bytes)


def _common(scenario: Scenario, chunks: list[ChunkWork], static: list[float], opt_block: Block,
            unscale: Block | None, grad_bytes_per_gpu: float, cost: CostModel, info: JobInfo) -> TrainingJob:
    par, tr = scenario.require_training()
    overflow: frozenset[int] = frozenset()
    if tr.loss_scaling.kind != "none":
        ls = tr.loss_scaling
        cfg = LossScaleConfig(mode=ls.kind, init_scale=ls.init_scale, growth_factor=ls.growth_factor,
                              backoff_factor=ls.backoff_factor, growth_interval=ls.growth_interval)
        by_chance = ls.overflow_probability is not None  # else the given steps overflow (none: a clean run)
        recs = simulate_loss_scale(scenario.simulation.steps, cfg,
                                   overflow_steps=None if by_chance else ls.overflow_steps,
                                   overflow_prob=ls.overflow_probability, rng=scenario.simulation.seed)
        info.loss_scale = [{"step": r.step, "scale": r.scale, "overflow": r.overflow, "skipped": r.skipped}
                           for r in recs]
        overflow = frozenset(r.step for r in recs if r.skipped)
    gc = tr.gradient_compression
    compress = decompress = None
    ratio = None
    if gc is not None:
        ratio = gc.ratio
        e = sw.grad_elem_bytes(tr.precision)
        n = grad_bytes_per_gpu / e  # gradient elements on this GPU
        k = n * ratio
        # Top-k by radix select over fp32 magnitudes: 4 passes of 8-bit digits, each reading every
        # element, then writing k values + indices. Decompress: zero a dense fp32 buffer and
        # scatter-add the dp·k received pairs.
        compress = sw.op_block(cost, "topk compress", [
            elementwise("topk radix select", 4 * 4 * n + k * (e + 4), "fp32")])[0]
        decompress = sw.op_block(cost, "topk decompress", [
            elementwise("topk scatter-add", 4 * n + par.data * k * (e + 4 + 2 * 4), "fp32")])[0]
    return TrainingJob(
        dp=par.data * par.cp, tp=par.tensor, pp=par.pipeline, virtual_stages=par.virtual_stages,
        microbatch_group=par.microbatch_group_size, microbatches=scenario.microbatches, schedule=par.schedule,
        chunks=chunks, zero=par.zero,
        bucket_bytes=_bucket_bytes(scenario, sw.reduced_grad_bytes(scenario)),
        overlap_grad_sync=par.overlap_grad_sync, overlap_param_gather=par.overlap_param_gather,
        optimizer=opt_block,
        unscale=unscale, overflow_steps=overflow, compression_ratio=ratio, compress=compress,
        decompress=decompress, grad_elem_bytes=sw.reduced_grad_bytes(scenario), static_bytes=static,
        steps=scenario.simulation.steps, ep=par.ep, cp=par.cp, rank_order=par.order,
    )


def _memory_by_stage(scenario: Scenario, params_by_stage: list[float], act_by_stage: list[float],
                     buffers_by_stage: list[float], grad_bytes_per_param: float | None = None,
                     expert_by_stage: list[float] | None = None) -> list[dict]:
    """Per stage: model states (ZeRO over data parallelism; MoE experts' over their expert-DP group),
    activations and buffers."""
    par, tr = scenario.require_training()
    out = []
    opt = "sgd" if tr.optimizer == "sgd" else "adam"
    sb = sw.optimizer_state_bytes(tr.optimizer_state_dtype)
    for s, params in enumerate(params_by_stage):
        st = mem.model_state_bytes(params, zero_stage=par.zero, dp=par.data * par.cp, precision=tr.precision,
                                   optimizer=opt, grad_bytes_per_param=grad_bytes_per_param, state_bytes=sb)
        if expert_by_stage:
            ex = mem.model_state_bytes(expert_by_stage[s], zero_stage=par.zero, precision=tr.precision,
                                       dp=par.data // par.ep * par.tensor, optimizer=opt,
                                       grad_bytes_per_param=grad_bytes_per_param, state_bytes=sb)
            st = {k: st[k] + ex[k] for k in st}
        b = mem.MemoryBreakdown(st["weights"], st["gradients"], st["optimizer"], act_by_stage[s], buffers_by_stage[s])
        d = b.as_dict()
        d["stage"] = s
        out.append(d)
    return out


# ---- synthetic ------------------------------------------------------------------------------------
def _synthetic(scenario: Scenario, cost: CostModel) -> tuple[TrainingJob, JobInfo]:
    m, (par, tr) = scenario.model, scenario.require_training()
    assert isinstance(m, SyntheticModel), "build_job sends only synthetic models here"
    e, g = sw.grad_elem_bytes(tr.precision), sw.reduced_grad_bytes(scenario)
    parts = _stage_chunks(m.layers, par.pipeline, par.virtual_stages, par.stage_layers)
    chunks = []
    for layer_ids in parts:
        layers = tuple(
            LayerWork(f"L{i}", (Block("fwd", m.forward_ms / 1e3),),
                      (Block("bwd", m.backward_ms / 1e3),) if m.backward_ms else (), (),
                      grad_bytes=m.params_per_layer * g, param_bytes=m.params_per_layer * e)
            for i in layer_ids)
        chunks.append(ChunkWork(layers, send_bytes=m.activation_bytes))
    info = JobInfo()
    per_stage_layers = [sum(len(parts[c * par.pipeline + s]) for c in range(par.virtual_stages))
                        for s in range(par.pipeline)]
    params_by_stage: list[float] = [n * m.params_per_layer for n in per_stage_layers]
    info.params_total = m.layers * m.params_per_layer
    info.memory_by_stage = _memory_by_stage(scenario, params_by_stage, [0.0] * par.pipeline, [0.0] * par.pipeline, g)
    static = [d["weights"] + d["gradients"] + d["optimizer"] for d in info.memory_by_stage]
    opt = Block("optimizer step", m.optimizer_ms / 1e3)
    info.single_gpu_time_s = (scenario.microbatches * par.data * m.layers * (m.forward_ms + m.backward_ms)
                              + m.optimizer_ms) / 1e3
    return _common(scenario, chunks, static, opt, None, max(params_by_stage) * g, cost, info), info


# ---- transformer ----------------------------------------------------------------------------------
class _FsdpKernels(TypedDict, total=False):
    pre_reduce_s: float
    pre_gather_s: float


def _transformer(scenario: Scenario, cost: CostModel) -> tuple[TrainingJob, JobInfo]:
    m, (par, tr) = scenario.model, scenario.require_training()
    assert isinstance(m, TransformerModel), "build_job sends only transformer models here"
    d = tf.TransformerDims(
        layers=m.layers, hidden=m.hidden, heads=m.heads, ffn_hidden=m.ffn_hidden, vocab=m.vocab,
        seq_len=m.seq_len, kv_heads=m.kv_heads, mlp=m.mlp, bias=m.bias, norm=m.norm, position=m.position,
        tied_embeddings=m.tied_embeddings, dropout=m.dropout)
    b, t, sp, dtype = tr.micro_batch, par.tensor, par.sequence_parallel and par.tensor > 1, tr.precision
    ck = tr.checkpointing
    ks = sw.kernel_set(scenario)
    loss_bytes = tf.loss_memory_bytes_per_logit(ks.fused_cross_entropy, ks.cross_entropy_kernel, dtype)
    act_dtype = storage_dtype(dtype)
    ebytes = DTYPE_BYTES[act_dtype]
    gbytes = sw.reduced_grad_bytes(scenario)  # the same bytes sim.budget counts
    moe = m.to_moe()  # None: dense MLP; else MoE layers with expert parallelism (sim.workload.moe)
    # Context parallelism: each GPU works on seq/cp tokens of every sequence (sim.parallel.context).
    cp, seq = par.cp, m.seq_len // par.cp
    dl = ctx.local_dims(d, cp)
    kw = dict(micro_batch=b, tp=t, sequence_parallel=sp, dtype=dtype)
    pnorm = persistent_norm(ks, tr.norm_kernel, m.hidden)
    if moe is None:
        lo = sw.dense_layer_ops(dl, **kw, attention=m.attention, ks=ks, schedule=par.schedule,
                                flash_attention=tr.flash_attention, gbytes=gbytes, ebytes=ebytes,
                                norm_kernel=tr.norm_kernel, fp8_recipe=tr.fp8_recipe,
                                tp_comm_overlap=par.tp_comm_overlap)
    else:
        lo = moe_ops.layer_ops(d, moe, micro_batch=b, tp=t, ep=par.ep, sequence_parallel=sp, dtype=dtype,
                               flash_kernel=sw.flash_kernel(tr.flash_attention, ks), persistent_norm=pnorm,
                               fp8_recipe=tr.fp8_recipe, qkv_copies=ks.qkv_copies)
    lo = ctx.context_layer_ops(lo, cp=cp, algorithm=par.context_attention or "ring",
                               kv_bytes=ctx.kv_block_bytes(d, micro_batch=b, tp=t, cp=cp, dtype=dtype))
    f8 = sw.fp8_weight_casts(lo, ks, dtype, tr.fp8_recipe)  # fp8: the weights' casts, per step or per forward
    lo = f8.layer
    host = ks.host_dispatch_us * 1e-6
    fwd = sw.blocks(cost, lo.forward, host_s=host)
    bwd = sw.blocks(cost, lo.backward_input, host_s=host)
    fsdp = sw.fsdp_flat(ks, par.zero, par.data * par.cp)
    wgt = sw.weight_blocks(cost, lo.backward_weight, tf.layer_params(d) / t, ks, gbytes, ebytes, fsdp)
    # Partitioned checkpoints (training.checkpointing.partition_activations): each TP rank keeps 1/t of a
    # segment's input and all-gathers it before the recompute; with sequence parallelism the input is split
    # already.
    partitioned = ck.kind == "full" and ck.partition_activations and t > 1 and not sp
    part_fwd: tuple[Block, ...] = ()
    part_rec: tuple[Block, ...] = ()
    if partitioned:
        part_fwd, part_rec = sw.partitioned_checkpoint_blocks(cost, b * seq * m.hidden * ebytes, t, act_dtype, ks,
                                                              host)
    if ck.kind == "full":
        recompute = fwd
    elif ck.kind == "selective":
        ring = cp if (par.context_attention or "ring") == "ring" else 1  # a ring block is one of cp steps
        # the attention core (a ring of cp steps) and, under context parallelism, its bookkeeping kernels
        recompute = sw.op_block(cost, "attention",
                                [op for s in lo.forward for op in s.ops if tf.is_attention_core(op)] * ring
                                + [op for s in lo.forward for op in s.ops if ctx.is_ring_bookkeeping(op)], host)
    else:
        recompute = ()
    fp32_softmax = (m.attention == "standard" and ks.softmax_in_fp32
                    and not fused_softmax_runs(ks, seq, b * m.heads // t, act_dtype))
    layer_act = partial(mem.activation_bytes_per_layer, seq=seq, micro_batch=b, hidden=m.hidden,
                        heads=m.heads, tp=t, sequence_parallel=sp, bytes_per_elem=ebytes,
                        fp8_gemm_inputs=dtype == "fp8", fp32_softmax=fp32_softmax, ffn_hidden=d.ffn_hidden,
                        gated_mlp=d.mlp == "swiglu", kv_heads=d.kv_heads, dropout=d.dropout > 0)
    # Fused (flash) attention never stores the softmax scores (Korthikanti's 5as/h term), so without
    # checkpointing a layer keeps what selective recompute keeps; `attention: standard` keeps the scores,
    # as in the paper's Table 2.
    flash = m.attention == "flash"
    stored = "selective" if flash and ck.kind == "none" else ck.kind
    full_layer_act = layer_act(checkpointing="selective" if flash else "none")
    ckpt_act = layer_act(checkpointing=stored)
    if partitioned:
        ckpt_act /= t
    layer_params = tf.layer_params(d) / t
    expert_local = 0.0  # MoE: this GPU's experts' parameters per layer (synced over the expert-DP group)
    if moe is not None:
        full_layer_act = moe_ops.activation_bytes_per_layer(
            d, moe, dense_bytes=full_layer_act, micro_batch=b, tp=t, sequence_parallel=sp, bytes_per_elem=ebytes)
        if ck.kind != "full":
            ckpt_act = moe_ops.activation_bytes_per_layer(
                d, moe, dense_bytes=ckpt_act, micro_batch=b, tp=t, sequence_parallel=sp, bytes_per_elem=ebytes)
        layer_params = moe_ops.dense_params(d, moe) / t
        expert_local = moe_ops.expert_params(d, moe) / par.ep
    # Per layer kept between forward and backward: the checkpoint (full: one in `every` layers).
    kept = ckpt_act / ck.every if ck.kind == "full" else ckpt_act
    # While a full-checkpointing segment of `every` layers is recomputed, their activations are live again.
    workspace = ck.every * full_layer_act if ck.kind == "full" else 0.0

    def fsdp_kernels(params: float) -> _FsdpKernels:
        """FSDP's DP-stream kernels around a unit of ``params`` parameters (none for other stacks)."""
        if not fsdp:
            return {}
        return {"pre_reduce_s": sw.fsdp_pre_reduce_s(cost, params * gbytes),
                "pre_gather_s": sw.fsdp_pre_gather_s(cost, params * ebytes, ebytes, par.data * par.cp)}

    step_casts = sw.per_step_blocks(cost, f8.per_step, host)
    layer = dict(grad_bytes=layer_params * gbytes, param_bytes=layer_params * ebytes, activation_bytes=kept,
                 workspace_bytes=workspace, expert_grad_bytes=expert_local * gbytes)
    emb = tf.embedding_ops(dl, **kw)
    head = tf.head_ops(dl, **kw, persistent_norm=pnorm, fused_ce=ks.fused_cross_entropy,
                       ce_kernel=ks.cross_entropy_kernel)
    emb_params = tf.embedding_params(d) / t
    vsn = par.pipeline * par.virtual_stages
    head_params = tf.head_params(d, emb_params, vsn)
    parts = _stage_chunks(m.layers, par.pipeline, par.virtual_stages,
                          sw.stage_layer_counts(ks, m.layers, par.pipeline, par.virtual_stages, par.stage_layers,
                                                tr.precision))
    activation = b * seq * m.hidden * ebytes
    # Between stages each TP rank sends 1/t of the activation when it is split already (sequence
    # parallelism) or Megatron's scatter/gather splits it (then an all-gather over TP follows on arrival);
    # otherwise every TP rank sends the whole tensor.
    split_p2p = t > 1 and (sp or ks.scatter_gather_p2p)
    send = activation / t if split_p2p else activation
    gather = activation if (t > 1 and ks.scatter_gather_p2p and not sp and vsn > 1) else 0.0
    # The embedding's gradient is a dense V/t × h tensor accumulated into main_grad by a hook (never fused).
    emb_accumulate = sw.accumulate_block(cost, emb_params, gbytes, ebytes, ks, force=True, fsdp=fsdp)
    chunks = []
    for vs, ids in enumerate(parts):
        works = []
        if vs == 0:
            works.append(LayerWork("embedding", sw.blocks(cost, emb.forward, host_s=host),
                                   sw.blocks(cost, emb.backward_input, host_s=host),
                                   sw.op_block(cost, "wgrad", emb.backward_weight, host) + emb_accumulate, (),
                                   grad_bytes=emb_params * gbytes, param_bytes=emb_params * ebytes,
                                   activation_bytes=b * seq * m.hidden * ebytes / (t if sp else 1),
                                   **fsdp_kernels(emb_params)))
        for n, i in enumerate(ids):
            # a checkpointed segment of `every` layers starts here: its input is partitioned and re-gathered
            first = partitioned and n % ck.every == 0
            works.append(LayerWork(f"L{i}", part_fwd + fwd if first else fwd, bwd, wgt,
                                   part_rec + recompute if first else recompute, **layer, step_forward=step_casts,
                                   **fsdp_kernels(layer_params)))
        if vs == vsn - 1:
            logits, (kept, extra) = b * seq * math.ceil(m.vocab / t), loss_bytes
            works.append(LayerWork("head", sw.blocks(cost, head.forward, host_s=host),
                                   sw.blocks(cost, head.backward_input, host_s=host),
                                   sw.weight_blocks(cost, head.backward_weight, emb_params, ks, gbytes, ebytes,
                                                    fsdp), (),
                                   grad_bytes=head_params * gbytes, param_bytes=head_params * ebytes,
                                   # the logits' gradient lives while the head's backward runs: the
                                   # counter track holds the "logits + their gradient" of the analytic peak
                                   activation_bytes=logits * kept, workspace_bytes=logits * extra,
                                   **fsdp_kernels(head_params)))
        chunks.append(ChunkWork(tuple(works), send_bytes=send if vsn > 1 else 0.0))
    info = JobInfo(tokens_per_sample=m.seq_len)
    gb = tr.global_batch
    info.model_flops_per_step = tf.model_flops_per_iteration(d, gb)
    info.hardware_flops_per_step = tf.hardware_flops_per_iteration(d, gb, ck.kind)
    info.params_total = tf.model_params(d)
    if moe is not None:  # active experts' FLOPs (recompute counted as for the dense shape)
        flops = moe_ops.model_flops_per_iteration(d, moe, gb)
        info.hardware_flops_per_step += flops - info.model_flops_per_step
        info.model_flops_per_step = flops
        info.params_total = moe_ops.model_params(d, moe)
    # Memory per stage (analytic; the simulation's own counter track is compared in metrics).
    params_by_stage, act_by_stage, buf_by_stage, expert_by_stage = [], [], [], []
    for s in range(par.pipeline):
        n_layers = sum(len(parts[c * par.pipeline + s]) for c in range(par.virtual_stages))
        expert_by_stage.append(n_layers * expert_local)
        p_s = n_layers * layer_params + (emb_params if s == 0 else 0) + (head_params if s == par.pipeline - 1 else 0)
        params_by_stage.append(p_s)
        inflight = mem.in_flight_microbatches(par.schedule, par.pipeline, scenario.microbatches, s,
                                              virtual_stages=par.virtual_stages, group=par.microbatch_group_size,
                                              all_warmup=ks.interleaved_all_warmup)
        acts = mem.activation_bytes_per_stage(
            n_layers, full_layer_act if ck.kind == "full" else ckpt_act, checkpointing=ck.kind,
            every_k=ck.every if ck.kind == "full" else None, in_flight_microbatches=inflight,
            checkpoint_bytes=ckpt_act if ck.kind == "full" else None)
        if s == 0:
            acts += inflight * b * seq * m.hidden * ebytes
        if s == par.pipeline - 1:
            acts += b * seq * math.ceil(m.vocab / t) * sum(loss_bytes)  # the loss's logits at its peak
        act_by_stage.append(acts)
        # Buffers: the DDP gradient bucket being reduced (ZeRO-3: two layers' gathered weights, the one in
        # use and the one prefetched; ``layer_params`` is already the whole layer of this TP rank, so the
        # gather does not multiply it again) and, with a pipeline, the two p2p activation buffers.
        buf = 2 * _bucket_bytes(scenario, gbytes) if par.zero < 3 else 2 * layer_params * ebytes
        buf_by_stage.append(buf + (2 * send if vsn > 1 else 0.0))  # no pipeline, no p2p buffers
    # FSDP reduces 16-bit gradients into its fp32 shards (the parameters' own dtype).
    info.memory_by_stage = _memory_by_stage(scenario, params_by_stage, act_by_stage, buf_by_stage,
                                            4 if fsdp else gbytes, expert_by_stage if moe is not None else None)
    static = [x["weights"] + x["gradients"] + x["optimizer"] + x["buffers"] for x in info.memory_by_stage]
    # A Megatron-family step is a norm pass, fused Adam, the copy to the 16-bit model and zeroing the
    # main-grad buffer; PyTorch/Composer's an unfused Adam and a scaling clip (the unscale pass only with
    # loss scaling).
    held = max(p + e for p, e in zip(params_by_stage, expert_by_stage, strict=True))
    _, unscale = sw.optimizer_block(cost, scenario, held)
    opt_block, clip = sw.megatron_optimizer(cost, precision=dtype, optimizer=tr.optimizer, params_per_gpu=held,
                                         data=par.data, zero=par.zero, gbytes=gbytes, ks=ks,
                                         state_bytes=sw.optimizer_state_bytes(tr.optimizer_state_dtype))
    job = _common(scenario, chunks, static, opt_block, unscale, max(params_by_stage) * gbytes, cost, info)
    job.grad_elem_bytes = gbytes
    job.bucket_bytes = _bucket_bytes(scenario, gbytes)
    job.bucket_first_chunk_only = True  # every kernel set is a Megatron-family stack
    job.clip = clip if tr.grad_clip is not None else None
    if d.tied_embeddings and par.pipeline > 1:  # the word embeddings only (positions stay on stage 0)
        job.embedding_sync_bytes = math.ceil(d.vocab / t) * d.hidden * gbytes
    tokens_bytes = 2 * b * seq * 8  # int64 tokens and labels
    job.data = Block("load micro-batch", tokens_bytes / sw.H2D_Bps + cost.op_time_s(
        elementwise("h2d", 0.0, act_dtype)), category=DATA)
    job.blocking_p2p = p2p_blocks(ks, par.schedule, par.overlap_p2p_comm)
    job.p2p_device_sync = job.blocking_p2p and ks.p2p_device_sync
    # Megatron's interleaved schedule with waited exchanges runs them in rounds (sim.schedules.exchanges), ported
    # for its default micro-batch groups of p; with as many micro-batches as stages every forward may run
    # first (KernelSet.interleaved_all_warmup). Those, and other group sizes, exchange per action.
    job.interleaved_all_warmup = ks.interleaved_all_warmup
    job.exchange_rounds = (job.blocking_p2p and par.schedule == "interleaved-1f1b" and par.virtual_stages > 1
                           and par.pipeline > 1 and scenario.microbatches != par.pipeline
                           and par.microbatch_group_size in (None, par.pipeline))
    # DeepSpeed of 2021-22 all-reduces the whole gradients even under ZeRO-1 (sim.workload.kernels).
    job.grad_all_reduce = ks.zero1_grad_all_reduce
    job.gather_bytes = gather
    if gather > 0:
        rebuild = P2P_GATHERS[ks.p2p_gather]
        if (copied := rebuild.copy_bytes(gather, t)) > 0:
            job.gather_copy = Block("p2p gather copies", cost.op_time_s(
                elementwise("p2p gather copies", copied, act_dtype)))
        job.backward_gathers = rebuild.backward_gathers
    job.nccl = scenario.gpu.nccl_ctas()
    job.hbm_Bps = sw.streaming_Bps(cost)
    # T₁: the same global batch on one GPU, built by the same code (embedding, head, accumulation, step).
    one = job if par.world_size == 1 else _transformer(_on_one_gpu(scenario), cost)[0]
    info.single_gpu_time_s = _compute_time_s(one)
    return job, info


def _on_one_gpu(scenario: Scenario) -> Scenario:
    """The scenario's model and batch on a single GPU (for T₁): no parallelism, plain 1F1B."""
    base, _ = scenario.require_training()
    par = base.model_copy(update={"data": 1, "tensor": 1, "pipeline": 1, "virtual_stages": 1,
                                  "schedule": "1f1b", "sequence_parallel": False, "zero": 0,
                                  "expert": None, "context": None, "stage_layers": None})
    cluster = scenario.cluster.model_copy(update={"nodes": 1, "gpus_per_node": 1})
    return scenario.model_copy(update={"parallel": par, "cluster": cluster})


def _compute_time_s(job: TrainingJob) -> float:
    """Compute of one step of a single-GPU job: every micro-batch through every block, then the step."""
    per_mb = sum(b.dur_s for c in job.chunks for lw in c.layers
                 for b in lw.forward + lw.recompute + lw.backward + lw.weight)
    per_mb += job.data.dur_s if job.data else 0.0
    step = job.optimizer.dur_s + sum(x.dur_s for x in (job.clip, job.unscale) if x is not None)
    step += sum(b.dur_s for c in job.chunks for lw in c.layers for b in lw.step_forward)
    return per_mb * job.microbatches + step


# ---- generic layers (CNN / MLP) -------------------------------------------------------------------
def _layers(scenario: Scenario, cost: CostModel) -> tuple[TrainingJob, JobInfo]:
    m, (par, tr) = scenario.model, scenario.require_training()
    assert isinstance(m, LayersModel), "build_job sends only layers models here"
    b, dtype = tr.micro_batch, tr.precision
    gbytes, ebytes = sw.reduced_grad_bytes(scenario), DTYPE_BYTES[storage_dtype(dtype)]
    specs = m.to_layers()
    parts = _stage_chunks(len(specs), par.pipeline, par.virtual_stages, par.stage_layers)
    chunks = []
    single = 0.0
    ck = tr.checkpointing
    every = ck.every if ck.kind == "full" else 1
    for ids in parts:
        works = []
        for i in ids:
            sp_ = specs[i]
            lo = generic_layer_ops(sp_, micro_batch=b, dtype=dtype)
            fwd = sw.op_block(cost, "fwd", [op for s in lo.forward for op in s.ops])
            bwd = sw.op_block(cost, "dgrad", [op for s in lo.backward_input for op in s.ops])
            wgt = sw.op_block(cost, "wgrad", lo.backward_weight)
            recompute = fwd if ck.kind == "full" else ()
            single += sum(x.dur_s for x in fwd + bwd + wgt + recompute)
            # Full checkpointing keeps one layer input in `every`; without it the layer keeps its activations.
            kept = (checkpoint_bytes(sp_) * b / every) if ck.kind == "full" else sp_.activation_bytes * b
            works.append(LayerWork(sp_.name, fwd, bwd, wgt, recompute, grad_bytes=sp_.params * gbytes,
                                   param_bytes=sp_.params * ebytes, activation_bytes=kept))
        last = specs[ids[-1]] if ids else None
        chunks.append(ChunkWork(tuple(works), send_bytes=(last.activation_bytes * b if last else 0.0)
                                if par.pipeline > 1 else 0.0))
    info = JobInfo()
    info.params_total = sum(x.params for x in specs)
    params_by_stage, act_by_stage = [], []
    for s in range(par.pipeline):
        ids = [i for c in range(par.virtual_stages) for i in parts[c * par.pipeline + s]]
        params_by_stage.append(sum(specs[i].params for i in ids))
        inflight = mem.in_flight_microbatches(par.schedule, par.pipeline, scenario.microbatches, s,
                                              virtual_stages=par.virtual_stages, group=par.microbatch_group_size)
        kept = sum(lw.activation_bytes for c in range(par.virtual_stages) for lw in chunks[c * par.pipeline + s].layers)
        # While one checkpointed segment is recomputed its `every` layers' activations are live again.
        workspace = every * max((specs[i].activation_bytes * b for i in ids), default=0.0) if ck.kind == "full" else 0.0
        act_by_stage.append(inflight * kept + workspace)
    info.memory_by_stage = _memory_by_stage(scenario, params_by_stage, act_by_stage,
                                            [2 * _bucket_bytes(scenario, gbytes)] * par.pipeline, gbytes)
    static = [x["weights"] + x["gradients"] + x["optimizer"] + x["buffers"] for x in info.memory_by_stage]
    info.model_flops_per_step = 3 * sum(x.forward_flops for x in specs) * tr.global_batch
    info.hardware_flops_per_step = info.model_flops_per_step + (
        sum(x.forward_flops for x in specs) * tr.global_batch if ck.kind == "full" else 0.0)
    info.single_gpu_time_s = single * scenario.microbatches * par.data + sw.single_gpu_optimizer_s(
        cost, scenario, info.params_total)
    opt_block, unscale = sw.optimizer_block(cost, scenario, max(params_by_stage))
    return _common(scenario, chunks, static, opt_block, unscale, max(params_by_stage) * gbytes, cost, info), info
