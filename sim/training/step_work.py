"""The work of a training step besides the layers' own kernels, as the Megatron family runs it: pricing op
lists into engine blocks (with the host-dispatch bound), the fp32 main-grad accumulation pass, gradient
buckets, and the optimizer and gradient-norm passes. The simulation (sim/build.py) and the planner's screen
(sim/explore/estimate.py) both price a step with these, so they agree by construction."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sim.cost.base import CostModel
from sim.engine.job import Block
from sim.engine.timeline import CLIP_GRAD, FSDP_COPY, GRAD_ACCUM, WEIGHT_CAST
from sim.parallel.layout import deepspeed_type_partition
from sim.schedules.actions import SPLIT_BACKWARD
from sim.units import DTYPE_BYTES, FULL_PRECISIONS, MB, storage_dtype
from sim.workload.kernels import (
    CHECKPOINT_PARTITIONS,
    DDP_BUCKET_BYTES,
    KERNEL_SETS,
    KernelSet,
    fused_softmax_runs,
    megatron_bucket_params,
    persistent_norm,
    with_overrides,
)
from sim.workload.ops import GEMM, TE_ATTENTION, Op, elementwise
from sim.workload.transformer import (
    LayerOps,
    Segment,
    TransformerDims,
    fp8_weight_cast,
    fp8_weight_elems,
    layer_ops,
)

if TYPE_CHECKING:
    from sim.scenario.schema import Scenario

# Bytes the optimizer step reads + writes per parameter it updates (memory-bound pass).
# Mixed-precision Adam: read fp32 master, m, v, fp32 grad (16), write master, m, v (12) + 16-bit copy (2).
# fp32 Adam: read 16, write 12. SGD with momentum: read master, momentum, grad; write master, momentum.
OPTIMIZER_BYTES_PER_PARAM = {("adam", True): 30, ("adam", False): 28, ("sgd", True): 22, ("sgd", False): 20}
# Megatron's optimizer step per parameter of its shard (megatron/optimizer/optimizer.py,
# Float16OptimizerWithFloat16Params.step): apex FusedAdam reads fp32 param, grad, m, v (16) and writes
# param, m, v (12); copying the fp32 params to the 16-bit model reads 4 and writes 2; zeroing the fp32
# main-grad buffer writes 4. The gradient-norm pass (clip_grad_norm_fp32, multi_tensor_l2norm) reads each
# fp32 gradient once (4). Scaling by the clip coefficient runs only when the norm exceeds the threshold,
# which a stable run rarely does: not priced.
CLIP_NORM_BYTES_PER_GRAD = 4
# fp16 with 16-bit main gradients (no --accumulate-allreduce-grads-in-fp32, which bf16 forces): the step
# first copies them to the fp32 master parameters' gradients (``_copy_model_grads_to_main_grads``:
# ``main_param.grad = model_param.main_grad.float()``, read 2 and write 4), and the norm then reads those
# fp32 copies. With fp32 main gradients ``.float()`` returns the tensor itself: no pass.
COPY_GRADS_TO_FP32_BYTES_PER_GRAD = 6
# An optimizer run as one torch kernel per arithmetic step (KernelSet.optimizer_impl "unfused"), per fp32
# parameter. Adam as Composer's DecoupledAdamW.adamw does it (composer/optim/decoupled_weight_decay.py,
# 2023; no weight decay, as llm-foundry's MPT yamls set 0): exp_avg.mul_ (r 4, w 4), .add_(grad) (r 8,
# w 4), exp_avg_sq.mul_ (r 4, w 4), .addcmul_(grad, grad) (r 8 - the same gradient element twice - w 4),
# sqrt (r 4, w 4), / sqrt(bias_correction2) (r 4, w 4), .add_(eps) (r 4, w 4), param.addcdiv_(exp_avg,
# denom) (r 12, w 4): 48 read + 32 written. SGD with momentum (torch.optim.SGD's per-tensor loop):
# buf.mul_ (r 4, w 4), .add_(grad) (r 8, w 4), param.add_(buf) (r 8, w 4).
UNFUSED_OPTIMIZER_BYTES_PER_PARAM = {"adam": 80, "sgd": 32}
# torch's and FSDP's clip_grad_norm_ scale every gradient by the clamped coefficient (grad.mul_: read and
# write each element once more) after the norm pass.
CLIP_SCALE_BYTES_PER_GRAD = 8
# Host→device copy of a micro-batch's int64 tokens and labels (Megatron's get_batch): PCIe 4.0 x16,
# ~25 GB/s achieved of 31.5 GB/s (PCI-SIG rate; NVIDIA bandwidthTest figures on DGX A100).
H2D_Bps = 25e9


def ops_time_s(cost: CostModel, ops: Sequence[Op], host_s: float = 0.0) -> float:
    """Device time of kernels launched back to back, or the host's time to dispatch them if longer (the
    CPU-bound regime of small kernels: PyTorch eager spends ``host_s`` per operator)."""
    launched = sum(1 for op in ops if op.bytes > 0 or op.flops > 0 or op.fixed_s > 0)  # a no-op launches nothing
    return max(sum(cost.op_time_s(op) for op in ops), launched * host_s)


def blocks(cost: CostModel, segments: Iterable[Segment], prefix: str = "", host_s: float = 0.0) -> tuple[Block, ...]:
    """One engine block per segment: its ops back to back, then its collective."""
    out = []
    for i, seg in enumerate(segments):
        dur = ops_time_s(cost, seg.ops, host_s)
        # Named after its longest kernel (a segment's first op is often a small cast or norm), with how
        # many others share the block: the timeline shows where the time goes.
        if seg.ops:
            main = max(seg.ops, key=cost.op_time_s)
            name = main.name if len(seg.ops) == 1 else f"{main.name} +{len(seg.ops) - 1}"
        else:
            name = seg.comm or f"seg{i}"
        out.append(Block(f"{prefix}{name}", dur, seg.comm, seg.comm_bytes, sum(op.flops for op in seg.ops),
                         overlap=seg.overlap, ctas=seg.ctas, hbm_bytes=sum(op.bytes for op in seg.ops)))
    return tuple(out)


def streaming_Bps(cost: CostModel) -> float:
    """HBM bandwidth a streaming kernel reaches under ``cost`` (a 1 GB copy-like pass, launch excluded):
    what an overlapped collective shares with the compute beside it (``Block.hbm_bytes``)."""
    big, small = (cost.op_time_s(elementwise("hbm probe", n, "fp32")) for n in (2e9, 1e9))
    return 1e9 / (big - small) if big > small else 0.0


def op_block(cost: CostModel, name: str, ops: tuple[Op, ...] | list[Op], host_s: float = 0.0) -> tuple[Block, ...]:
    if not ops:
        return ()
    return (Block(name, ops_time_s(cost, ops, host_s), None, 0.0, sum(op.flops for op in ops)),)


def grad_elem_bytes(precision: str) -> int:
    return 4 if precision in FULL_PRECISIONS else 2


def grad_bucket_bytes(bucket_MB: float | None, *, transformer: bool, data: int, grad_elem_bytes: int) -> float:
    """The data-parallel gradient bucket: ``parallel.bucket_MB`` when given, else the training stack's
    default (Megatron-Core's for transformers, PyTorch DDP's for the other models)."""
    if bucket_MB is not None:
        return bucket_MB * MB
    if transformer:
        return megatron_bucket_params(data) * grad_elem_bytes
    return DDP_BUCKET_BYTES


def optimizer_block(cost: CostModel, scenario: Scenario, params_per_gpu: float) -> tuple[Block, Block | None]:
    par, tr = scenario.require_training()
    mixed = tr.precision not in FULL_PRECISIONS
    opt = "sgd" if tr.optimizer == "sgd" else "adam"
    shard = params_per_gpu / (par.data * par.cp if par.zero >= 1 else 1)
    opt_block = op_block(cost, "optimizer step", [
        elementwise(f"{tr.optimizer} step", shard * OPTIMIZER_BYTES_PER_PARAM[(opt, mixed)], "fp32")])[0]
    unscale = None
    if tr.loss_scaling.kind != "none":
        # Unscale (multiply by 1/S) and check for inf/NaN: read and write the fp32 gradients once.
        grads = params_per_gpu / (par.data * par.cp if par.zero >= 2 else 1)
        unscale = op_block(cost, "unscale+inf check", [elementwise("unscale", grads * 8, "fp32")])[0]
    return opt_block, unscale


def single_gpu_optimizer_s(cost: CostModel, scenario: Scenario, params: float) -> float:
    """One optimizer step over all parameters on one GPU (the T_1 reference job)."""
    _, tr = scenario.require_training()
    mixed = tr.precision not in FULL_PRECISIONS
    opt = "sgd" if tr.optimizer == "sgd" else "adam"
    return cost.op_time_s(elementwise("opt", params * OPTIMIZER_BYTES_PER_PARAM[(opt, mixed)], "fp32"))


def main_grad_bytes(precision: str, ks: KernelSet, grad_reduce_dtype: str = "auto") -> int:
    """Bytes per gradient element as accumulated and reduced: Megatron keeps bf16 models' gradients in an
    fp32 main_grad buffer (megatron/arguments.py forces accumulate_allreduce_grads_in_fp32 for bf16) unless
    the scenario says otherwise (``training.grad_reduce_dtype``: Megatron-Core's --grad-reduce-in-bf16,
    apex DistributedFusedAdam's grad_sync_dtype)."""
    if grad_reduce_dtype != "auto":
        return DTYPE_BYTES[grad_reduce_dtype]
    if ks.grad_reduce_fp32 and precision in ("bf16", "fp8"):  # fp16 keeps fp16 grads (loss scaling)
        return 4
    return grad_elem_bytes(precision)


def optimizer_state_bytes(optimizer_state_dtype: str) -> int:
    """Element size of the optimizer's state (``training.optimizer_state_dtype``)."""
    return DTYPE_BYTES[optimizer_state_dtype]


def kernel_set(scenario: Scenario) -> KernelSet:
    """The scenario's kernel set with its own switches applied (``training.fusion``,
    ``parallel.scatter_gather``, ``training.cross_entropy_kernel``): what the simulation and the plan screen
    both price."""
    par, tr = scenario.require_training()
    return with_overrides(KERNEL_SETS[tr.kernels], tr.fusion.model_dump(), par.scatter_gather,
                          tr.cross_entropy_kernel)


def stage_layer_counts(ks: KernelSet, n_layers: int, pipeline: int, virtual_stages: int,
                       given: list[int] | None, precision: str) -> list[int] | None:
    """Transformer layers per model chunk: ``parallel.stage_layers`` when given; else, on a pipeline without
    interleaving, where the kernel set's code base put them (``KernelSet.pipeline_partition``); None for
    the balanced split (``sim.parallel.layout.partition_layers``)."""
    if given is not None:
        return list(given)
    if ks.pipeline_partition == "deepspeed-type" and pipeline > 1 and virtual_stages == 1:
        return deepspeed_type_partition(n_layers, pipeline, sixteen_bit=precision != "fp32")
    return None


def stack_notes(scenario: Scenario) -> list[str]:
    """One line per part of the scenario's layout that its software stack (``training.kernels``) could not
    run (``KernelSet.missing``), naming the stacks that could: dtsim still simulates it, as a what-if; and
    one per setting given where it cannot apply (``no_effect_notes``)."""
    if scenario.parallel is None or scenario.training is None:
        return []
    if scenario.model.kind != "transformer":
        return no_effect_notes(scenario)
    par, tr = scenario.parallel, scenario.training
    ks = KERNEL_SETS[tr.kernels]
    layout = dict(tensor=par.tensor, pipeline=par.pipeline, schedule=par.schedule, zero=par.zero,
                  checkpointing=tr.checkpointing.kind, sequence_parallel=par.sequence_parallel,
                  layers=scenario.model.num_layers, virtual_stages=par.virtual_stages, stage_layers=par.stage_layers,
                  microbatch_group_size=par.microbatch_group_size, order=par.order,
                  partition_activations=tr.checkpointing.partition_activations)
    gaps = ks.missing(**layout)
    able = [k.name for k in KERNEL_SETS.values() if not k.missing(**layout)]
    notes = [f"{field}: {value} — training.kernels {ks.name} could not run it ({ks.features_source}); simulated "
             f"anyway, as a what-if" + (f"; the whole layout runs under training.kernels {' or '.join(able)}"
                                         if able else "") for field, value in gaps]
    layers = scenario.model.num_layers
    if (ks.pipeline_partition == "deepspeed-type" and par.pipeline > 1 and par.virtual_stages == 1
            and par.stage_layers is None
            and stage_layer_counts(ks, layers, par.pipeline, 1, None, tr.precision) is None):
        notes.append(f"parallel.pipeline: {par.pipeline} — DeepSpeed's partition of {layers} layers would leave "
                     "stages without a transformer layer (its head then on an earlier stage), which dtsim's "
                     "layout cannot express; simulated with the balanced split (set parallel.stage_layers to "
                     "choose the cuts)")
    return notes + no_effect_notes(scenario)


def no_effect_notes(scenario: Scenario) -> list[str]:
    """One line per setting given where it cannot apply. Not refused: ``dtsim plan`` and ``sweep`` vary
    tensor and precision over a base scenario that sets them, and the stacks themselves switch them off
    with a warning (Megatron disables sequence parallelism at tensor 1, NeMo and Megatron-Bridge the
    userbuffers overlap), so a run says so instead of staying silent."""
    if scenario.parallel is None or scenario.training is None:
        return []
    par, tr = scenario.parallel, scenario.training
    notes = []
    if par.sequence_parallel and par.tensor == 1:
        notes.append("parallel.sequence_parallel: true — has no effect with tensor 1 (Megatron disables it too, "
                     "with a warning): there is no tensor-parallel group to split the sequence over; simulated "
                     "without it")
    if par.tp_comm_overlap and par.tensor == 1:
        notes.append("parallel.tp_comm_overlap: true — has no effect with tensor 1: there are no tensor-parallel "
                     "collectives to overlap (NeMo and Megatron-Bridge switch it off too); simulated without it")
    if tr.precision != "fp8" and "fp8_recipe" in tr.model_fields_set:
        notes.append(f"training.fp8_recipe: {tr.fp8_recipe} — has no effect with precision {tr.precision}: the "
                     "recipe scales fp8 GEMMs; set training.precision: fp8 to use it, or remove fp8_recipe")
    return notes


def reduced_grad_bytes(scenario: Scenario) -> int:
    """Bytes per gradient element the data-parallel sync moves for ``scenario``: transformers run a
    Megatron-family kernel set (``main_grad_bytes``), other models reduce their gradients as computed."""
    _, tr = scenario.require_training()
    if scenario.model.kind == "transformer":
        return main_grad_bytes(tr.precision, KERNEL_SETS[tr.kernels], tr.grad_reduce_dtype)
    if tr.grad_reduce_dtype != "auto":
        return DTYPE_BYTES[tr.grad_reduce_dtype]
    return grad_elem_bytes(tr.precision)


def fsdp_flat(ks: KernelSet, zero: int, data: int) -> bool:
    """Whether ZeRO-3 over ``data`` replicas runs as PyTorch FSDP's FlatParameter
    (``KernelSet.fsdp_flat_param``); with one replica nothing is sharded."""
    return ks.fsdp_flat_param and zero == 3 and data > 1


def accumulate_block(cost: CostModel, params: float, gbytes: int, ebytes: int, ks: KernelSet,
                      force: bool = False, fsdp: bool = False) -> tuple[Block, ...]:
    """The per-micro-batch ``main_grad.add_(grad)`` pass: read the new gradient and the accumulator, write
    the accumulator. Absent when the wgrad GEMM accumulates in place (gradient-accumulation fusion),
    unless ``force`` (parameters the fusion does not cover, e.g. embeddings). DeepSpeed's bf16 optimizer
    casts the gradient into an fp32 temporary first (``grad_accum_via_temporary``): two kernels, and the
    temporary is written and read back. Under FSDP's FlatParameter (``fsdp``) there is no main_grad: the
    backward of the split views copies the gradients into one flat gradient instead (read and write each
    16-bit element), and the accumulation happens on the reduced shard."""
    if params <= 0:
        return ()
    if fsdp:
        op = elementwise("flat grad copy", params * 2 * ebytes, "fp32")
        return (Block("flat grad copy", cost.op_time_s(op), category=FSDP_COPY),)
    if ks.gradient_accumulation_fusion and not force:
        return ()
    if ks.grad_accum_via_temporary and gbytes > ebytes:
        ops = [elementwise("grad to fp32 temporary", params * (ebytes + gbytes), "fp32"),
               elementwise("main_grad accumulate", params * 3 * gbytes, "fp32", flops=params)]
        return (Block("grad accumulation", sum(cost.op_time_s(op) for op in ops), category=GRAD_ACCUM),)
    op = elementwise("main_grad accumulate", params * (ebytes + 2 * gbytes), "fp32", flops=params)
    return (Block("grad accumulation", cost.op_time_s(op), category=GRAD_ACCUM),)


def partitioned_checkpoint_blocks(cost: CostModel, input_bytes: float, tp: int, dtype: str, ks: KernelSet,
                                  host_s: float = 0.0) -> tuple[tuple[Block, ...], tuple[Block, ...]]:
    """(forward, recompute) blocks a checkpointed segment gains when its ``input_bytes`` input is kept split
    over the ``tp`` TP ranks, as ``ks``'s code base does it (``KernelSet.checkpoint_partition``,
    ``CHECKPOINT_PARTITIONS``): the forward keeps its slice (a copy of 1/t); before the recompute the whole
    input is all-gathered over the TP group, with the code base's copies around the gather."""
    how = CHECKPOINT_PARTITIONS[ks.checkpoint_partition or "base"]
    part = input_bytes / tp
    keep = op_block(cost, "partition checkpoint", [elementwise("partition checkpoint", 2 * part, dtype)], host_s)
    before = [elementwise("checkpoint zeros", how.zeros * input_bytes, dtype)] if how.zeros else []
    if how.own_slice:
        before.append(elementwise("checkpoint own slice", 2 * part, dtype))
    gather = Block("checkpoint gather", ops_time_s(cost, before, host_s), comm="all_gather", comm_bytes=input_bytes)
    copy_out = op_block(cost, "checkpoint gather copies",
                        [elementwise("checkpoint gather copies", how.copies_out * input_bytes, dtype)]
                        if how.copies_out else [], host_s)
    return keep, (gather, *copy_out)


def fused_wgrad(op: Op, ks: KernelSet, gbytes: int, ebytes: int) -> Op:
    """A weight-gradient GEMM as the kernel set runs it: with gradient-accumulation fusion it reads and
    writes its fp32 output (β = 1) instead of writing a 16-bit one."""
    if ks.gradient_accumulation_fusion and gbytes > ebytes and op.kind == GEMM:
        return dataclasses.replace(op, bytes=op.bytes + op.batch * op.k * op.n * (2 * gbytes - ebytes))
    return op


def inline_wgrads(segments: tuple[Segment, ...], ks: KernelSet, gbytes: int, ebytes: int) -> tuple[Segment, ...]:
    """Segments whose weight-gradient GEMMs run inside the backward (``tp_backward_overlap``), each priced
    as ``fused_wgrad`` prices it in ``weight_blocks``."""
    return tuple(dataclasses.replace(seg, ops=tuple(fused_wgrad(op, ks, gbytes, ebytes)
                                                    if op.name.endswith(".wgrad") else op for op in seg.ops))
                 for seg in segments)


def flash_kernel(flash_attention: str, ks: KernelSet | None = None) -> str:
    """``Op.kernel`` of the fused attention for ``training.flash_attention``: "" = the GPU profile's own,
    ``TE_ATTENTION`` = what Transformer Engine selects on that GPU (``latest`` under a TE kernel set)."""
    if flash_attention != "latest":
        return flash_attention
    return TE_ATTENTION if ks is not None and ks.te_attention else ""


def tp_backward_overlap(ks: KernelSet, tp: int, schedule: str) -> bool:
    """Whether the layers' backward overlaps its column-parallel collectives with the weight-gradient
    GEMMs (the kernel set does, there is TP, and the schedule does not run the weight gradients apart)."""
    return ks.tp_backward_overlap and tp > 1 and schedule not in SPLIT_BACKWARD


def dense_layer_ops(d: TransformerDims, *, micro_batch: int, tp: int, sequence_parallel: bool, dtype: str,
                    attention: str, ks: KernelSet, schedule: str, flash_attention: str, gbytes: int,
                    ebytes: int, norm_kernel: str = "auto", fp8_recipe: str = "delayed",
                    tp_comm_overlap: bool = False) -> LayerOps:
    """One dense transformer layer's ops as the kernel set runs them: its attention kernels, its backward
    collectives blocking or beside the weight-gradient GEMMs (which then sit in the backward, priced as
    ``weight_blocks`` prices them). The simulation (sim.build) and the plan screen both build layers here."""
    overlap = tp_backward_overlap(ks, tp, schedule)
    fused_softmax = fused_softmax_runs(ks, d.seq_len, micro_batch * d.heads // tp, storage_dtype(dtype))
    lo = layer_ops(d, micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel, dtype=dtype,
                   attention=attention, attention_dropout_kernel=ks.attention_dropout_kernel,
                   tp_backward_overlap=overlap, flash_kernel=flash_kernel(flash_attention, ks),
                   persistent_norm=persistent_norm(ks, norm_kernel, d.hidden), fp8_recipe=fp8_recipe,
                   bias_gelu_fusion=ks.bias_gelu_fusion, bias_dropout_fusion=ks.bias_dropout_fusion,
                   fused_softmax=fused_softmax, softmax_in_fp32=ks.softmax_in_fp32,
                   tp_comm_overlap=tp_comm_overlap, qkv_copies=ks.qkv_copies)
    if overlap:
        lo = dataclasses.replace(lo, backward_input=inline_wgrads(lo.backward_input, ks, gbytes, ebytes))
    return lo


@dataclasses.dataclass(frozen=True)
class Fp8Weights:
    """Where a layer's fp8 weight casts run (``fp8_weight_casts``)."""

    layer: LayerOps  # the layer's ops; without a cache, the cast heads its forward
    per_step: tuple[Op, ...] = ()  # with a cache: run once per step, before the chunk's first forward


def fp8_weight_casts(lo: LayerOps, ks: KernelSet, dtype: str, recipe: str) -> Fp8Weights:
    """The layer's fp8 GEMM weights cast to fp8 as Transformer Engine does it: once per step where the
    caller marks the first micro-batch (``KernelSet.fp8_weight_cache``), else at the head of every forward
    (recomputed forwards included). Nothing for other precisions.

    The cached copies (the fp8 weight and its transpose, 2 bytes per element, kept in TE's workspace) are
    not added to the memory model: with them sim.memory puts five published fp8 runs above the 83.8 GB a
    training process holds on an H100 (84.0-100.8 GB), so another of its terms must be larger than those
    runs needed; until that term is found, adding this one would turn real configurations into "does not
    fit"."""
    elems = fp8_weight_elems(lo.forward) if dtype == "fp8" else 0
    if elems == 0:
        return Fp8Weights(lo)
    cast = fp8_weight_cast(elems, recipe)
    if ks.fp8_weight_cache:
        return Fp8Weights(lo, (cast,))
    first, *rest = lo.forward
    return Fp8Weights(dataclasses.replace(lo, forward=(dataclasses.replace(first, ops=(cast, *first.ops)), *rest)))


def per_step_blocks(cost: CostModel, ops: tuple[Op, ...], host_s: float = 0.0) -> tuple[Block, ...]:
    """``ops`` run once per step before a layer's first forward, as one block of their own category."""
    return tuple(dataclasses.replace(b, category=WEIGHT_CAST) for b in op_block(cost, "fp8 weight casts", ops, host_s))


def weight_blocks(cost: CostModel, wgrads: tuple[Op, ...], params: float, ks: KernelSet, gbytes: int,
                   ebytes: int, fsdp: bool = False) -> tuple[Block, ...]:
    """Weight-gradient GEMMs (``fused_wgrad``) and their accumulation into main_grad (FSDP: the flat-grad
    copy, ``accumulate_block``)."""
    wgrads = tuple(fused_wgrad(op, ks, gbytes, ebytes) for op in wgrads)
    return (op_block(cost, "wgrad", wgrads, ks.host_dispatch_us * 1e-6)
            + accumulate_block(cost, params, gbytes, ebytes, ks, fsdp=fsdp))


def fsdp_pre_reduce_s(cost: CostModel, grad_bytes: float) -> float:
    """FSDP's pre-divide before a reduce-scatter: ``div_`` over the whole unsharded gradient (read and
    write it once) on the post-backward stream."""
    return cost.op_time_s(elementwise("grad predivide", 2 * grad_bytes, "fp32"))


def fsdp_pre_gather_s(cost: CostModel, param_bytes: float, ebytes: int, data: int) -> float:
    """FSDP's cast of this rank's fp32 shard to the compute dtype before an all-gather (read 4, write
    ``ebytes`` per shard element) on the unshard stream."""
    shard = param_bytes / ebytes / data
    return cost.op_time_s(elementwise("shard cast", shard * (4 + ebytes), "fp32"))


def fused_adam_bytes(state_bytes: int, gbytes: int) -> int:
    """Bytes fused Adam moves per parameter of its shard: reads the master weight, m and v in the state
    dtype and the gradient, writes the three states (28 with fp32 state and gradients)."""
    return 6 * state_bytes + gbytes


def megatron_optimizer(cost: CostModel, *, precision: str, optimizer: str, params_per_gpu: float, data: int,
                       zero: int, gbytes: int, ks: KernelSet | None = None,
                       state_bytes: int = 4) -> tuple[Block, Block]:
    """(optimizer, gradient-norm) blocks of a step over this GPU's shard as the kernel set runs it (see
    the byte counts above; Megatron's fused kernels when ``ks`` is None). The planner's screen prices the
    step with this too. ``state_bytes``: the optimizer state's element size (``training.optimizer_state_dtype``;
    apex DistributedFusedAdam's ``dtype`` keeps the master weights and the moments in it)."""
    mixed = precision not in FULL_PRECISIONS
    shard = params_per_gpu / (data if zero >= 1 else 1)
    grads = params_per_gpu / (data if zero >= 2 else 1)
    kind = "sgd" if optimizer == "sgd" else "adam"
    if ks is not None and ks.optimizer_impl == "unfused":
        # fp32 parameters, gradients and moments (FSDP keeps its shards' gradients in the parameters'
        # fp32; the 16-bit copy is the all-gather's cast), zero_grad(set_to_none=True): nothing to zero.
        opt = op_block(cost, "optimizer step", [elementwise(f"{optimizer} step (unfused)",
                                                            shard * UNFUSED_OPTIMIZER_BYTES_PER_PARAM[kind],
                                                            "fp32")])[0]
        grad_bytes = 4 if fsdp_flat(ks, zero, data) else gbytes  # FSDP shards keep fp32 gradients
        per_grad = CLIP_NORM_BYTES_PER_GRAD * grad_bytes / 4 + (CLIP_SCALE_BYTES_PER_GRAD * grad_bytes / 4
                                                                  if ks.clip_always_scales else 0)
        norm = elementwise("grad norm", grads * per_grad, "fp32")
        return opt, Block("grad norm", cost.op_time_s(norm), category=CLIP_GRAD)
    if optimizer == "sgd" or not mixed:
        opt_ops = [elementwise(f"{optimizer} step", shard * OPTIMIZER_BYTES_PER_PARAM[(kind, mixed)], "fp32")]
    else:
        grad_read = 4 if gbytes < 4 else gbytes  # 16-bit gradients are copied to fp32 first (below)
        opt_ops = [elementwise("fused adam", shard * fused_adam_bytes(state_bytes, grad_read), "fp32"),
                   elementwise("copy params to 16-bit", shard * (state_bytes + 2), "fp32"),  # read master, write 2
                   elementwise("zero main_grad", grads * gbytes, "fp32")]
    # The norm covers the gradients this rank owns after the reduction: with a sharded optimizer
    # (Megatron's distributed optimizer, get_main_grads_for_grad_norm; DeepSpeed's ZeRO partitions) its
    # shard, not the whole buffer it zeroes.
    norm = elementwise("grad norm", shard * CLIP_NORM_BYTES_PER_GRAD * gbytes / 4, "fp32")
    if mixed and gbytes < 4 and optimizer != "sgd":  # 16-bit main gradients copied to fp32 first (above)
        opt_ops.insert(0, elementwise("copy grads to fp32", shard * COPY_GRADS_TO_FP32_BYTES_PER_GRAD, "fp32"))
        norm = elementwise("grad norm", shard * CLIP_NORM_BYTES_PER_GRAD, "fp32")
    opt = op_block(cost, "optimizer step", opt_ops)[0]
    clip = Block("grad norm", cost.op_time_s(norm), category=CLIP_GRAD)
    return opt, clip
