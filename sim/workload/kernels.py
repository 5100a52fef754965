"""Kernel sets: which kernels a training code base of a given period launched, and how it fused them.

The same model on the same GPUs runs at different speeds under different software: Megatron-LM of 2021
ran attention as two batched GEMMs around a fused scale-mask-softmax and a separate dropout, accumulated
each micro-batch's weight gradients into fp32 with an extra pass, and all-reduced the gradients only after
the last micro-batch; today's Megatron-Core with Transformer Engine runs one flash-attention kernel, fuses
the accumulation into the weight-gradient GEMM and overlaps the reduction with the backward pass. A
``KernelSet`` records those choices, read from each code base at that period (sources per field below), so
the workload emits the kernels that code really launched and the executor orders them as it did.

Sources (public code, read at the period named):
- megatron-lm-2021: NVIDIA/Megatron-LM as of the SC'21 paper (tag v2.x, spring-summer 2021):
  ``megatron/model/transformer.py`` (ParallelAttention: ``torch.baddbmm`` scores, ``FusedScaleMaskSoftmax``,
  ``attention_dropout`` as its own ``torch.nn.Dropout``, ``torch.bmm`` context; ``bias_gelu_impl`` and
  ``bias_dropout_add_fused_train`` as TorchScript fusions), ``megatron/model/fused_layer_norm.py`` (apex
  ``FusedLayerNormAffineFunction``), ``megatron/optimizer/__init__.py`` (apex ``FusedAdam``),
  ``megatron/model/distributed.py`` (``main_grad.add_(grad)`` hook per micro-batch, one all-reduce of the
  contiguous fp32 buffer in ``allreduce_gradients`` after the last micro-batch),
  ``megatron/p2p_communication.py`` (``batch_isend_irecv`` then ``torch.cuda.synchronize()``: blocking
  sends; scatter/gather of the activation over the tensor-parallel ranks), ``megatron/arguments.py``
  (bf16 forces ``accumulate_allreduce_grads_in_fp32``; ``clip_grad`` default 1.0).
- megatron-lm-2022: the same tree at Korthikanti et al. 2022 (v3.0): sequence parallelism and selective
  recompute, ``--gradient-accumulation-fusion`` (``fused_weight_gradient_mlp_cuda``: the wgrad GEMM
  accumulates straight into ``main_grad``), and the asynchronous backward of column-parallel linears
  (``megatron/mpu/layers.py``: ``ColumnParallelLinearWithAsyncAllreduce``, on unless
  ``--no-async-tensor-model-parallel-allreduce``; with sequence parallelism
  ``ColumnParallelLinearWithSequenceParallelism``: the input all-gathered during dgrad, dgrad's output
  reduce-scattered during wgrad); ``megatron/model/fused_layer_norm.py``'s ``MixedFusedLayerNorm`` runs
  apex contrib's persistent ``FastLayerNormFN`` for the hidden sizes in its ``persist_ln_hidden_sizes``
  (unless ``--no-persist-layer-norm``), the affine kernels for others; attention, softmax, dropout and
  the DP all-reduce as in 2021. The 2021
  tree and Megatron-DeepSpeed (``copy_to_tensor_model_parallel_region``) all-reduce the input gradient
  before going on.
- megatron-deepspeed-2022: microsoft/Megatron-DeepSpeed of 2022 (Megatron-LM 2021 model code under
  DeepSpeed's engine): the 2021 kernels; gradients accumulated in fp32 by DeepSpeed's bf16 optimizer
  and reduced after the backward pass. DeepSpeed's pipeline engine (deepspeed/runtime/pipe/engine.py)
  partitions the activations and gradients it sends between stages over the tensor-parallel group
  (``is_pipe_partitioned = is_grad_partitioned = is_model_parallel``; the receiver rebuilds them with
  ``PartitionedTensor.full()``, an all-gather), and with bf16 its ``_exec_reduce_grads`` calls
  ``_bf16_reduce_grads`` → ``buffered_allreduce_fallback``: a full all-reduce of the fp32 gradients
  even under ZeRO-1 (the optimizer then updates its 1/d shard and all-gathers the parameters); with
  fp16 the ZeRO-1 optimizer reduces them itself, and as fully: stage 1 runs without contiguous
  gradients (deepspeed/runtime/engine.py, ``_configure_zero_optimizer``), so ``reduce_gradients`` goes
  through ``buffered_reduce_fallback`` to ``allreduce_bucket``, which sets ``rank = None`` and calls
  ``dist.all_reduce`` (deepspeed/runtime/zero/stage2.py of v0.5, stage_1_and_2.py of v0.6-0.7). Its
  ``BF16_Optimizer.update_hp_grads`` (deepspeed/runtime/bf16_optimizer.py, "bf16+pipeline parallelism",
  April 2022), called after every micro-batch's backward, runs
  ``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))``: the cast writes an fp32 temporary that the add
  reads back, 2 + 4 + 4 + 4 + 4 = 18 bytes per parameter where Megatron's ``main_grad.add_(grad)`` moves 10.
- transformer-engine: Megatron-Core with NVIDIA Transformer Engine (2024-): fused attention (cuDNN /
  FlashAttention kernels), fused bias/activation/dropout/residual and norm kernels, wgrad GEMMs
  accumulating in fp32 (``gradient_accumulation_fusion``), ``overlap_grad_reduce`` bucketed reduction
  during the backward pass, pipeline exchanges beside compute under the interleaved schedule
  (``overlap_p2p_comm``) and waited for in plain 1F1B; ``transformer_engine.pytorch.Linear``'s backward
  overlaps the column-parallel collectives with the GEMMs as Megatron does (no userbuffers overlap of
  the forward's collectives is modelled). Its norms are its own persistent kernels (descended from apex
  contrib's FastLayerNorm).
- pytorch-fsdp-2023: PyTorch 2.1 eager with FSDP (its FlatParameter implementation) and MosaicML Composer,
  as llm-foundry ran its 2023 benchmarks (scripts/train/benchmarking: ``fsdp_config`` FULL_SHARD,
  ``mixed_precision`` PURE or DEFAULT, ``low_precision_layernorm``, the Triton or
  FlashAttention kernels). Read from torch/distributed/fsdp (_flat_param.py, _runtime_utils.py,
  _init_utils.py) and composer/optim/decoupled_weight_decay.py of that period:
  each FSDP unit's parameters are ``torch.split`` views of one flat tensor, so autograd's backward of the
  split concatenates the unit's gradients into a new flat gradient (a copy: 2 + 2 bytes per 16-bit
  element); before the reduce-scatter ``_reduce_grad`` divides that whole unsharded gradient by the
  pre-divide factor (``DefaultState._get_gradient_predivide_factor``: > 1 for every world size > 1), and
  before each all-gather the fp32 shard is cast to the 16-bit compute dtype (4 + 2 bytes per shard
  element); gradients reduce in the 16-bit dtype (PURE sets it; under DEFAULT, which leaves
  ``reduce_dtype`` unset, FSDP takes ``param_dtype``: ``_init_param_reduce_dtypes``) and land in fp32
  shards. Composer's
  ``DecoupledAdamW.adamw`` updates each parameter with separate torch kernels (mul_, add_, mul_, addcmul_,
  sqrt, div, add_, addcdiv_: 80 bytes per fp32 parameter, see ``UNFUSED_OPTIMIZER_BYTES_PER_PARAM``), and
  FSDP's ``clip_grad_norm_`` multiplies every gradient by the clamped coefficient whatever the norm.
  Gradients accumulate on the fp32 shard after each reduce-scatter (no full-size main_grad).
- The norm kernels' speeds, by family, are the GPU reference profile's (``sim.workload.ops.MEMORY_FAMILIES``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

ATTENTION_KINDS = ("flash", "standard")


@dataclass(frozen=True)
class KernelSet:
    """What a training code base launched. Every field is a fact about that code, not a tuning knob."""

    name: str
    attention: str  # default model.attention: "standard" (bmm + softmax + dropout) or "flash"
    attention_dropout_kernel: bool  # standard attention: dropout on the probabilities is its own kernel
    gradient_accumulation_fusion: bool  # wgrad GEMM accumulates into fp32 main_grad (else a separate add)
    grad_reduce_fp32: bool  # data-parallel gradients reduced in fp32 (Megatron with bf16 always does)
    overlap_grad_reduce: bool  # default parallel.overlap_grad_sync
    # Pipeline exchanges complete before the GPU computes on (Megatron's batch_isend_irecv followed by waits,
    # DeepSpeed's dist.send/recv); else they run beside compute. See ``overlap_p2p_interleaved`` and
    # ``p2p_blocks`` for the interleaved schedule and parallel.overlap_p2p_comm.
    blocking_p2p: bool
    scatter_gather_p2p: bool  # activations sent 1/t per TP rank, all-gathered on arrival (Megatron)
    zero1_grad_all_reduce: bool = False  # ZeRO-1: gradients all-reduced in full, not reduce-scattered
    # Column-parallel linears overlap their backward collective with their weight-gradient GEMM, and with
    # sequence parallelism re-gather their input during the input-gradient GEMM (transformer.layer_ops).
    tp_backward_overlap: bool = False
    grad_accum_via_temporary: bool = False  # the accumulation casts the 16-bit gradient into an fp32 temporary first
    # How full checkpointing keeps each checkpointed input split over the TP ranks when asked
    # (training.checkpointing.partition_activations): "list", "base" or "deepspeed", a key of
    # CHECKPOINT_PARTITIONS; None where the code base could not
    checkpoint_partition: str | None = None
    # The norm kernels' family (Op.family): "framework" (apex's affine LayerNorm kernels, which Megatron
    # copied as fused_mix_prec_layer_norm_cuda; torch.nn.functional.layer_norm) or "persistent" (the row
    # kept in registers: apex contrib FastLayerNorm, Transformer Engine's norms), the latter only for
    # ``persistent_norm_hidden`` sizes when that is given (else any).
    norm_kernel: str = "framework"
    persistent_norm_hidden: tuple[int, ...] = ()
    description: str = ""
    # Host time to dispatch one operator in PyTorch eager mode (Python, dispatcher, launch): a few µs to
    # ~10 µs (H. He, "Making Deep Learning Go Brrrr From First Principles", 2022, §Overhead). Kernels
    # shorter than this leave the GPU waiting on the CPU.
    host_dispatch_us: float = 6.0
    # Its fused attention is Transformer Engine's DotProductAttention, which on Hopper and newer picks
    # cuDNN's fused attention over FlashAttention "for performance reasons" (transformer_engine/pytorch/
    # attention/dot_product_attention/utils.py, get_attention_backend): priced by the GPU profile's
    # ``flash_attention_te`` fit where it has one, else by its own.
    te_attention: bool = False
    # precision fp8: the caller tells Transformer Engine which micro-batch is a model chunk's first of the
    # step, so TE casts the weights to fp8 then and reuses the copies for the rest of the step (Megatron-Core
    # forward_step calls model.set_is_first_microbatch(), and TELinear passes is_first_microbatch, e.g.
    # megatron/core/pipeline_parallel/schedules.py and transformer/custom_layers/transformer_engine.py at
    # core_r0.8.0; TE 1.8 module/linear.py: update_workspace = is_first_microbatch is None or
    # is_first_microbatch). Code calling TE's modules without the flag casts them in every forward.
    fp8_weight_cache: bool = False
    # The optimizer step's kernels: "fused" (apex FusedAdam / multi-tensor apply: each tensor read and
    # written once) or "unfused" (one torch kernel per arithmetic step, e.g. Composer's DecoupledAdamW).
    optimizer_impl: str = "fused"
    # Under the interleaved schedule the exchanges run beside compute: Megatron-Core's overlap_p2p_comm
    # (posted early, waited just before use), which NeMo's launcher yamls and Megatron-Bridge's
    # CommOverlapConfig (src/megatron/bridge/training/comm_overlap.py: overlap_p2p_comm with virtual
    # pipelining, else batch_p2p_comm) turn on with virtual pipelining. Its non-interleaved schedule always waits
    # (megatron/core/pipeline_parallel/p2p_communication.py, ``send_forward`` & co. call ``_communicate``
    # with wait_on_reqs=True; core_r0.8.0, 2024).
    overlap_p2p_interleaved: bool = False
    # After each waited exchange the host synchronizes the whole device: Megatron-LM 2021-22's
    # ``torch.cuda.synchronize()`` after batch_isend_irecv, and Megatron-Core's ``batch_p2p_sync`` (on by
    # default, and NeMo sets it), so a gradient reduction in flight on another stream must finish before the
    # next kernel is launched. DeepSpeed's pipeline engine waits on its own p2p only (dist.send/recv).
    p2p_device_sync: bool = True
    # Gradient clipping multiplies every gradient by the clamped coefficient (torch's clip_grad_norm_ and
    # FSDP's), not only when the norm exceeds the threshold (Megatron's clip_grad_norm_fp32).
    clip_always_scales: bool = False
    # ZeRO-3 runs as PyTorch FSDP's FlatParameter does (module docstring): a flat-gradient copy in each
    # backward, a pre-divide over the unsharded gradient before each reduce-scatter, a cast of the shard
    # before each all-gather.
    fsdp_flat_param: bool = False
    # Megatron's three elementwise fusions (its --no-bias-gelu-fusion, --no-bias-dropout-fusion and
    # --no-masked-softmax-fusion turn them off; training.fusion overrides these): bias + GeLU in one
    # TorchScript kernel, bias + dropout + residual add in one, and the scale-mask-softmax CUDA kernel of
    # standard attention. Off, Megatron runs their eager fallbacks (sim.workload.transformer,
    # sim.workload.attention).
    bias_gelu_fusion: bool = True
    bias_dropout_fusion: bool = True
    masked_softmax_fusion: bool = True
    # The fused softmax kernel's shape limits (``FusedScaleMaskSoftmax.is_kernel_available``): it runs
    # for 16 < key length <= ``fused_softmax_max_seq`` with the query length a multiple of
    # ``fused_softmax_seq_multiple`` and (micro-batch × heads per GPU) a multiple of 4; any other shape
    # takes the torch path, which with ``softmax_in_fp32`` (Megatron's default
    # --apply-query-key-layer-scaling forces it) casts the 16-bit scores to fp32 first.
    fused_softmax_max_seq: int = 2048
    fused_softmax_seq_multiple: int = 4
    softmax_in_fp32: bool = True
    # The loss: Megatron-Core's fused vocab-parallel cross-entropy (cross_entropy_loss_fusion, June 2024,
    # which NeMo's and Megatron-Bridge's GPT configs turn on) or, before it, the fp32 cast of the logits and
    # five passes over them (sim.workload.transformer.head_ops).
    fused_cross_entropy: bool = True
    # Which fused loss (sim.workload.transformer.head_ops): "native" (Megatron-Core's torch.compile'd steps,
    # its cross_entropy_fusion_impl default), "te" (Transformer Engine's Triton kernels, which Megatron-Bridge's
    # recipes select) or "xentropy" (flash-attn's CUDA kernel, llm-foundry's default loss_fn).
    cross_entropy_kernel: str = "native"

    # How the receiver rebuilds an activation (or gradient) scattered over the TP ranks
    # (``scatter_gather_p2p``; P2P_GATHERS): "base" (one all-gather into the full buffer), "list"
    # (an all-gather into a list of views, which PyTorch copies out of a flat buffer) or "partitioned"
    # (DeepSpeed's PartitionedTensor.full(), and the backward rebuilds the stage's own output too).
    p2p_gather: str = "base"
    # What the code base could run at all (``missing``): Megatron's sequence parallelism, selective
    # recomputation, the ZeRO stages (with a pipeline: ``pipeline_zero_stages``), the interleaved
    # schedule, tensor and pipeline parallelism; ``features_source`` says where each absence is read.
    # GPipe and the zero-bubble schedules are dtsim's yardsticks (no stack here ran them as such) and are
    # never flagged, so the seed scenarios can set them beside 1F1B under any kernel set.
    sequence_parallel: bool = True
    selective_recompute: bool = True
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    pipeline_zero_stages: tuple[int, ...] | None = None
    interleaved_schedule: bool = True
    # Micro-batch groups other than the pipeline size under the interleaved schedule (parallel.
    # microbatch_group_size): Megatron-Core's microbatch_group_size_per_vp_stage (core_r0.8.0 on); Megatron-LM
    # 2021-22 walked the chunks in groups of exactly p (megatron/schedules.py, get_model_chunk_id).
    microbatch_groups: bool = True
    # With as many micro-batches as stages, the interleaved schedule runs every forward first, then every
    # backward (``all_warmup_microbatches``): Megatron-LM v2.5 (2021) through Megatron-Core core_r0.9.0
    # (megatron/schedules.py, megatron/core/pipeline_parallel/schedules.py: "if num_microbatches ==
    # pipeline_parallel_size"). From core_r0.10.0 only stages whose warm-up reaches the total do (the cap in
    # sim.schedules.actions.interleaved_1f1b), which the transformer-engine set follows.
    interleaved_all_warmup: bool = False
    model_parallel: bool = True
    # The rank orders it could build its groups in (parallel.order): Megatron-LM 2021-22 (megatron/mpu/
    # initialize.py: tensor groups of consecutive ranks, data groups strided by the tensor size inside each
    # pipeline block) and DeepSpeed (PipeModelDataParallelTopology: axes pipe, data, model) only "tp-dp-pp";
    # Megatron-Core also the replica-contiguous "tp-pp-dp" (--use-tp-pp-dp-mapping: initialize_model_parallel's
    # order "tp-cp-ep-pp-dp" instead of "tp-cp-ep-dp-pp").
    rank_orders: tuple[str, ...] = ("tp-dp-pp",)
    features_source: str = ""
    # bf16 training shards the fp32 master weights and the optimizer state over the data-parallel ranks
    # whatever ZeRO stage is configured (DeepSpeed's BF16_Optimizer: sim.scenario.schema resolves zero 0 to 1)
    bf16_optimizer_shards: bool = False
    # Where the layers go on a pipeline without interleaving when the scenario gives no parallel.stage_layers:
    # "balanced" (as even as possible, earlier stages take the extra: Megatron-LM asserts an even split)
    # or "deepspeed-type" (DeepSpeed's PipelineModule with partition_method 'type:transformer', which fills
    # the first stages and leaves the deficit to the last: sim.parallel.layout.deepspeed_type_partition).
    pipeline_partition: str = "balanced"
    # Megatron-LM (2021, 2022) builds num_layers // pipeline layers on every stage after asserting that the
    # division is exact ("num_layers must be divisible by ...", megatron/model/transformer.py), and under the
    # interleaved schedule that each stage's layers split evenly into its chunks and that the pipeline is
    # deeper than 2 (megatron/arguments.py, v2.5 of Aug. 2021 and 189e72a of July 2022): no uneven stages.
    even_pipeline_layers: bool = False
    interleaved_min_pipeline: int = 2

    def missing(self, *, tensor: int, pipeline: int, schedule: str, zero: int, checkpointing: str,
                sequence_parallel: bool, layers: int = 0, virtual_stages: int = 1,
                stage_layers: Sequence[int] | None = None,
                microbatch_group_size: int | None = None, order: str = "tp-dp-pp",
                partition_activations: bool = False) -> list[tuple[str, str]]:
        """The parts of a layout this code base had no way to run, as (scenario field, value) pairs; empty
        when it could run all of it. dtsim simulates such a layout with the method it knows (a what-if);
        the planner leaves it out of its search. ``layers`` (0: not checked), ``virtual_stages`` and
        ``stage_layers`` describe how the model's layers are cut into stages."""
        gaps = []
        if order not in self.rank_orders and pipeline > 1:  # without a pipeline both orders are one
            gaps.append(("parallel.order", order))
        if not self.model_parallel and tensor > 1:
            gaps.append(("parallel.tensor", str(tensor)))
        if not self.model_parallel and pipeline > 1:
            gaps.append(("parallel.pipeline", str(pipeline)))
        if not self.sequence_parallel and sequence_parallel and tensor > 1:
            gaps.append(("parallel.sequence_parallel", "true"))
        if not self.selective_recompute and checkpointing == "selective":
            gaps.append(("training.checkpointing", "selective"))
        if partition_activations and self.checkpoint_partition is None:
            gaps.append(("training.checkpointing.partition_activations", "true"))
        stages = self.pipeline_zero_stages if pipeline > 1 and self.pipeline_zero_stages is not None \
            else self.zero_stages
        if zero not in stages:
            gaps.append(("parallel.zero", str(zero)))
        interleaved = pipeline > 1 and schedule == "interleaved-1f1b"
        if interleaved and (not self.interleaved_schedule or pipeline < self.interleaved_min_pipeline):
            gaps.append(("parallel.schedule", schedule))
        if (interleaved and not self.microbatch_groups and microbatch_group_size is not None
                and microbatch_group_size != pipeline):
            gaps.append(("parallel.microbatch_group_size", str(microbatch_group_size)))
        if self.even_pipeline_layers and pipeline > 1:
            chunks = pipeline * (virtual_stages if interleaved else 1)
            if stage_layers is not None and len(set(stage_layers)) > 1:
                gaps.append(("parallel.stage_layers", "[" + ", ".join(map(str, stage_layers)) + "]"))
            elif layers and layers % chunks:
                gaps.append(("parallel.pipeline", f"{pipeline} × {chunks // pipeline} chunks of {layers} layers"
                             if chunks > pipeline else f"{pipeline} (for {layers} layers)"))
        return gaps

    @property
    def qkv_copies(self) -> str:
        """The copies of Q, K, V and their gradients around the attention (sim.workload.transformer.
        qkv_layout_copies): "megatron-te" where Megatron-Core's SelfAttention feeds TE's DotProductAttention,
        else "split-cat" (Megatron-LM's split_tensor_along_last_dim, llm-foundry's qkv.chunk: views whose
        gradients the backward concatenates)."""
        return "megatron-te" if self.te_attention else "split-cat"


# Hidden sizes Megatron-LM's MixedFusedLayerNorm runs with apex contrib's persistent FastLayerNorm (its
# persist_ln_hidden_sizes, megatron/model/fused_layer_norm.py, 2022; `--no-persist-layer-norm` turns it
# off); other sizes fall back to the affine kernels.
MEGATRON_PERSIST_LN_HIDDEN = (1024, 1536, 2048, 2304, 3072, 3840, 4096, 5120, 6144, 8192, 10240, 12288, 12800,
                              15360, 16384, 18432, 20480, 24576, 25600, 30720, 32768, 40960, 49152, 65536)
NORM_KERNELS = ("auto", "framework", "persistent")  # training.norm_kernel


@dataclass(frozen=True)
class P2PGather:
    """What rebuilding one scattered p2p tensor costs the receiver beside its TP all-gather: memory traffic
    in multiples of the full tensor's bytes (``copies_per_tensor`` + ``copies_per_slice`` / t), and how many
    such rebuilds a backward pass runs before its compute."""

    copies_per_tensor: float
    copies_per_slice: float
    backward_gathers: int

    def copy_bytes(self, tensor_bytes: float, tp: int) -> float:
        """Bytes the receiver's copies move per rebuild of a tensor of ``tensor_bytes`` over ``tp`` ranks."""
        return (self.copies_per_tensor + self.copies_per_slice / tp) * tensor_bytes


# Sources, at the period of each kernel set:
# - "base": Megatron-LM from Feb. 2022 (NVIDIA/Megatron-LM 37181ef, megatron/mpu/random.py
#   ``gather_split_1d_tensor``: ``torch.distributed._all_gather_base`` straight into the full buffer).
# - "list": Megatron-LM v2.x of 2021 (the same function at tag v2.5: ``all_gather`` into a list of
#   views of the buffer). PyTorch's ProcessGroupNCCL::allgather gathers a list into a flat buffer of its
#   own and then copies each piece out ("Copy the flattened output tensors to the outputs",
#   torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp): the whole tensor read and written once more.
# - "partitioned": DeepSpeed's pipeline engine (deepspeed/runtime/pipe/engine.py and
#   deepspeed/runtime/utils.py ``PartitionedTensor.full``, v0.5.4 of Oct. 2021 through v0.8): a
#   ``torch.zeros`` of the full tensor (written once), its own slice copied in, the same list
#   ``all_gather`` (copied out), then ``.clone()`` of the result (read and written): 5 + 2/t tensors'
#   bytes. ``_exec_backward_pass`` rebuilds the stage's partitioned output with ``full()`` before
#   ``torch.autograd.backward`` as well as the received gradient: two rebuilds per backward. (The 1/t
#   slices it clones when sending and receiving are left out: together about one tensor at t = 8.)
P2P_GATHERS: dict[str, P2PGather] = {
    "base": P2PGather(0.0, 0.0, 1),
    "list": P2PGather(2.0, 0.0, 1),
    "partitioned": P2PGather(5.0, 2.0, 2),
}


@dataclass(frozen=True)
class CheckpointPartition:
    """What keeping a checkpointed input split over the t TP ranks costs beside the all-gather that rebuilds
    it before the recompute, in multiples of the whole input's bytes: the slice kept at the forward
    (read and written: 2/t) and, before the gather, a zero-filled buffer (``zeros``: written once) and the
    own slice copied in (``own_slice``: 2/t); after it, ``copies_out``."""

    zeros: float
    own_slice: bool
    copies_out: float


# Sources, at the period of each kernel set (the same gathers as P2P_GATHERS):
# - "list": Megatron-LM v2.x of 2021, --distribute-checkpointed-activations (megatron/mpu/random.py
#   ``CheckpointFunction``: the first input split with ``split_tensor_into_1d_equal_chunks`` and copied into
#   the preallocated checkpointed-activations buffer; backward ``gather_split_1d_tensor``: an empty buffer
#   and ``all_gather`` into a list of its views, which ProcessGroupNCCL copies out: 2 tensors' bytes).
# - "base": Megatron-LM from Feb. 2022 (--distribute-saved-activations) and Megatron-Core
#   (``distribute_saved_activations``, tensor_parallel/random.py): the slice copied into a new buffer,
#   ``_all_gather_base`` straight into the whole buffer.
# - "deepspeed": DeepSpeed's activation checkpointing with partition_activations
#   (deepspeed/runtime/activation_checkpointing/checkpointing.py, v0.5-0.8; Megatron-DeepSpeed's
#   --partition-activations): ``partition_activations`` clones the slice;
#   ``gather_partitioned_activations`` fills ``torch.zeros`` of the whole input, copies its own slice in and
#   ``all_gather``s into a list of views of it (copied out), on the compute stream (the side-stream variant
#   is commented out there).
CHECKPOINT_PARTITIONS: dict[str, CheckpointPartition] = {
    "list": CheckpointPartition(zeros=0.0, own_slice=False, copies_out=2.0),
    "base": CheckpointPartition(zeros=0.0, own_slice=False, copies_out=0.0),
    "deepspeed": CheckpointPartition(zeros=1.0, own_slice=True, copies_out=2.0),
}

KERNEL_SETS: dict[str, KernelSet] = {
    k.name: k
    for k in (
        KernelSet(
            name="megatron-lm-2021", attention="standard", attention_dropout_kernel=True,
            gradient_accumulation_fusion=False, grad_reduce_fp32=True, overlap_grad_reduce=False,
            blocking_p2p=True, scatter_gather_p2p=True, fused_cross_entropy=False, p2p_gather="list",
            checkpoint_partition="list",
            sequence_parallel=False, selective_recompute=False, zero_stages=(0,),
            even_pipeline_layers=True, interleaved_min_pipeline=3, microbatch_groups=False,
            interleaved_all_warmup=True,
            features_source="NVIDIA/Megatron-LM gained --sequence-parallel and --recompute-granularity selective "
                            "on 2022-05-20 (9aad920) and --use-distributed-optimizer on 2022-06-08 (d07d29d); "
                            "v2.5 asserts num_layers divisible by the pipeline (and each stage's layers by "
                            "its chunks) and a pipeline deeper than 2 for the interleaved schedule, whose "
                            "chunks it walks in groups of exactly the pipeline's micro-batches; mpu/initialize.py "
                            "builds its groups in one rank order (tensor, then data, then pipeline)",
            description="Megatron-LM v2 (SC'21): bmm attention + fused softmax, apex LayerNorm/Adam, "
                        "fp32 grad accumulation pass, DP all-reduce after the backward pass",
        ),
        KernelSet(
            name="megatron-lm-2022", attention="standard", attention_dropout_kernel=True,
            gradient_accumulation_fusion=True, grad_reduce_fp32=True, overlap_grad_reduce=False,
            blocking_p2p=True, scatter_gather_p2p=True, tp_backward_overlap=True,
            norm_kernel="persistent", persistent_norm_hidden=MEGATRON_PERSIST_LN_HIDDEN, fused_softmax_max_seq=4096,
            fused_cross_entropy=False, zero_stages=(0, 1), even_pipeline_layers=True, interleaved_min_pipeline=3,
            microbatch_groups=False, interleaved_all_warmup=True, checkpoint_partition="base",
            features_source="Megatron-LM's distributed optimizer (2022-06-08, d07d29d) shards the optimizer "
                            "state over the data-parallel ranks (ZeRO-1); it has no ZeRO-2 or -3; it asserts "
                            "num_layers divisible by the pipeline (and each stage's layers by its chunks) and a "
                            "pipeline deeper than 2 for the interleaved schedule (189e72a, July 2022), whose "
                            "chunks it walks in groups of exactly the pipeline's micro-batches; mpu/initialize.py "
                            "builds its groups in one rank order (tensor, then data, then pipeline)",
            description="Megatron-LM v3 (2022): as 2021 plus sequence parallelism, selective recompute, "
                        "gradient-accumulation fusion and apex's persistent LayerNorm",
        ),
        KernelSet(
            name="megatron-deepspeed-2022", attention="standard", attention_dropout_kernel=True,
            gradient_accumulation_fusion=False, grad_reduce_fp32=True, overlap_grad_reduce=False,
            blocking_p2p=True, scatter_gather_p2p=True, zero1_grad_all_reduce=True, grad_accum_via_temporary=True,
            p2p_gather="partitioned", p2p_device_sync=False, sequence_parallel=False, selective_recompute=False,
            bf16_optimizer_shards=True, checkpoint_partition="deepspeed",
            pipeline_zero_stages=(0, 1), interleaved_schedule=False, pipeline_partition="deepspeed-type",
            features_source="microsoft/Megatron-DeepSpeed gained --sequence-parallel and --recompute-granularity "
                            "with its 2023-07-04 merge of upstream Megatron-LM (9e72d57); DeepSpeed's pipeline "
                            "engine asserts 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' and "
                            "runs its TrainSchedule only (deepspeed/runtime/pipe, v0.5-0.8): no interleaving; its "
                            "PipeModelDataParallelTopology orders ranks model, then data, then pipe",
            fused_softmax_max_seq=4096, fused_cross_entropy=False,
            description="Megatron-DeepSpeed (2022): Megatron 2021 kernels under DeepSpeed's engine",
        ),
        KernelSet(
            name="transformer-engine", attention="flash", attention_dropout_kernel=False,
            gradient_accumulation_fusion=True, grad_reduce_fp32=True, overlap_grad_reduce=True,
            blocking_p2p=True, overlap_p2p_interleaved=True, scatter_gather_p2p=False, tp_backward_overlap=True,
            checkpoint_partition="base",
            norm_kernel="persistent",
            te_attention=True, fp8_weight_cache=True, fused_softmax_max_seq=16383, fused_softmax_seq_multiple=8,
            rank_orders=("tp-dp-pp", "tp-pp-dp"),
            description="Megatron-Core + Transformer Engine (2024): fused attention and kernels, "
                        "overlapped gradient reduction",
        ),
        KernelSet(
            name="pytorch-fsdp-2023", attention="flash", attention_dropout_kernel=False,
            gradient_accumulation_fusion=False, grad_reduce_fp32=False, overlap_grad_reduce=True,
            blocking_p2p=False, scatter_gather_p2p=False, norm_kernel="framework", optimizer_impl="unfused",
            clip_always_scales=True, fsdp_flat_param=True, cross_entropy_kernel="xentropy",
            # standard attention in eager torch (llm-foundry's attn_impl torch): no fused softmax, and
            # autocast runs torch.softmax in fp32 (priced as Megatron's fp32 fallback)
            masked_softmax_fusion=False,
            model_parallel=False, sequence_parallel=False, selective_recompute=False, zero_stages=(0, 2, 3),
            features_source="llm-foundry's MPT of 2023 has no tensor- or pipeline-parallel layers; Composer wraps "
                            "each block in FSDP (NO_SHARD, SHARD_GRAD_OP or FULL_SHARD: ZeRO 0, 2 or 3) and "
                            "checkpoints whole blocks",
            description="PyTorch 2.1 eager + FSDP (FlatParameter, bf16 mixed precision) + Composer, as llm-foundry ran "
                        "in 2023: torch kernels, unfused AdamW, bf16 gradient reduce-scatter",
        ),
    )
}
KERNEL_SET_NAMES = tuple(KERNEL_SETS)

# PyTorch DistributedDataParallel's default bucket_cap_mb (torch/nn/parallel/distributed.py).
DDP_BUCKET_BYTES = 25e6


def megatron_bucket_params(data_parallel: int) -> int:
    """Megatron-Core's default gradient bucket, in parameters: max(40 M, 1 M × data-parallel size), "so
    that chunks used in NCCL ring-reduce stay bandwidth-bound" (megatron/core/distributed/
    distributed_data_parallel.py, ``DistributedDataParallelConfig.bucket_size``). Every kernel set here is
    a Megatron-family stack; the same file turns bucketing off on pipeline stages after the first and
    (``disable_bucketing``) on model chunks after the first: those reduce each chunk's gradients whole."""
    return max(40_000_000, 1_000_000 * data_parallel)
DEFAULT_KERNEL_SET = "transformer-engine"
FUSIONS = ("bias_gelu", "bias_dropout_add", "masked_softmax", "cross_entropy")  # training.fusion's keys
CE_KERNELS = ("native", "te", "xentropy")  # KernelSet.cross_entropy_kernel, training.cross_entropy_kernel


def with_overrides(ks: KernelSet, fusion: dict[str, bool | None] | None = None,
                   scatter_gather: bool | None = None, cross_entropy_kernel: str = "auto") -> KernelSet:
    """The kernel set as the scenario ran it: ``training.fusion``'s switches (None keeps the set's own),
    ``parallel.scatter_gather`` and ``training.cross_entropy_kernel`` ("auto" keeps the set's own)."""
    fields = {"bias_gelu": "bias_gelu_fusion", "bias_dropout_add": "bias_dropout_fusion",
              "masked_softmax": "masked_softmax_fusion", "cross_entropy": "fused_cross_entropy",
              "gradient_accumulation": "gradient_accumulation_fusion"}
    changes: dict[str, Any] = {fields[k]: v for k, v in (fusion or {}).items() if v is not None}
    if scatter_gather is not None:
        changes["scatter_gather_p2p"] = scatter_gather
    if cross_entropy_kernel != "auto":
        changes["cross_entropy_kernel"] = cross_entropy_kernel
    return replace(ks, **changes) if changes else ks


def p2p_blocks(ks: KernelSet, schedule: str, overlap_p2p_comm: bool | None = None) -> bool:
    """Whether a pipeline exchange completes before its GPU computes on: ``parallel.overlap_p2p_comm`` when
    given (Megatron-Core's name; true: beside compute), else what the kernel set's code did for the schedule
    (``KernelSet.blocking_p2p``, ``overlap_p2p_interleaved``)."""
    if overlap_p2p_comm is not None:
        return not overlap_p2p_comm
    if schedule == "interleaved-1f1b" and ks.overlap_p2p_interleaved:
        return False
    return ks.blocking_p2p


def fused_softmax_runs(ks: KernelSet, seq_len: int, batch_heads: int, dtype: str) -> bool:
    """Whether standard attention's scale-mask-softmax runs the fused kernel for these scores (else the
    torch path): the fusion is on, the scores are 16-bit, and the shape is within the kernel's limits —
    Megatron-LM 2021 16 < s <= 2048, s % 4 == 0 (megatron/model/fused_softmax.py, v2.5); Megatron-LM
    2022 and Megatron-DeepSpeed of 2022 s <= 4096; Transformer Engine 16 < s < 16384, s % 8 == 0
    (transformer_engine/pytorch/attention/dot_product_attention/softmax.py); all with b·heads/t % 4 == 0.
    Self-attention: the query and key lengths are both ``seq_len``."""
    return (ks.masked_softmax_fusion and dtype in ("fp16", "bf16")
            and 16 < seq_len <= ks.fused_softmax_max_seq and seq_len % ks.fused_softmax_seq_multiple == 0
            and batch_heads % 4 == 0)


def persistent_norm(ks: KernelSet, norm_kernel: str, hidden: int) -> bool:
    """Whether the norms run a persistent kernel: ``training.norm_kernel`` when it names one, else what
    the kernel set ran at this hidden size."""
    if norm_kernel != "auto":
        return norm_kernel == "persistent"
    return ks.norm_kernel == "persistent" and (not ks.persistent_norm_hidden or hidden in ks.persistent_norm_hidden)
