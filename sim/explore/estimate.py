"""Closed-form step time of a transformer training layout, and its exact memory: the planner's screen.

A candidate is priced in microseconds instead of simulated in seconds, with the simulation's own cost
model: the per-layer blocks are the ones ``sim.build`` makes (kernel set, fp32 main gradients, the
main_grad accumulation pass, host dispatch bound, Megatron's optimizer and gradient-norm passes), and
every collective (tensor-parallel, data-parallel buckets, pipeline send/recv, gradient-norm and
embedding all-reduces) is priced by the simulator's collective tuner (``sim.engine.algorithms``: its
candidates and closed-form ``predict_s``) on the candidate's real group shape over the scenario's
topology, calibrated links included. Only the
pipeline is a closed form: the bubble (p − 1)/(v·m + p − 1) and the exposed gradient sync.

Memory is not re-derived here: the ZeRO model-state formula gives a cheap lower bound for pruning, and
``exact_memory`` asks ``sim.build`` (about a millisecond), so the planner's memory verdict is the one the
simulation will report. The estimate ranks candidates; the planner then simulates the best ones, so its
errors only cost a missed candidate, never a wrong reported number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from sim import memory as mem
from sim.build import build_job, cost_model_for, topology_for
from sim.engine import algorithms as alg
from sim.engine.job import Block
from sim.engine.variability import expected_slowest
from sim.errors import ScenarioError
from sim.explore.fabric import kind_shares, tree_oversubscribed
from sim.parallel.layout import Layout, partition_layers, stage_layers_for
from sim.scenario.schema import Checkpointing, Scenario, TransformerModel
from sim.schedules.actions import SPLIT_BACKWARD, stage_actions
from sim.training.step_work import (
    H2D_Bps,
    accumulate_block,
    blocks,
    dense_layer_ops,
    fp8_weight_casts,
    fsdp_flat,
    fsdp_pre_gather_s,
    fsdp_pre_reduce_s,
    grad_bucket_bytes,
    kernel_set,
    main_grad_bytes,
    megatron_optimizer,
    op_block,
    optimizer_block,
    optimizer_state_bytes,
    per_step_blocks,
    stage_layer_counts,
    weight_blocks,
)
from sim.units import DTYPE_BYTES, storage_dtype
from sim.workload import transformer as tf
from sim.workload.kernels import P2P_GATHERS, p2p_blocks, persistent_norm
from sim.workload.ops import elementwise


@dataclass(frozen=True, order=True)
class Candidate:
    """One point of the planner's search space (the GPU count and global batch are the scenario's)."""

    data: int
    tensor: int
    pipeline: int
    micro_batch: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    zero: int = 0
    checkpointing: str = "none"
    sequence_parallel: bool = False
    # interleaved: micro-batches through each chunk together (parallel.microbatch_group_size; None: pipeline)
    microbatch_group: int | None = None
    order: str = "tp-dp-pp"  # parallel.order: Megatron's, or Meta's replica-contiguous "tp-pp-dp"

    @property
    def gpus(self) -> int:
        return self.data * self.tensor * self.pipeline

    def parallel_fields(self) -> dict[str, object]:
        """The candidate's settings that belong to the scenario's parallel section."""
        return {"data": self.data, "tensor": self.tensor, "pipeline": self.pipeline, "schedule": self.schedule,
                "virtual_stages": self.virtual_stages, "zero": self.zero,
                "sequence_parallel": self.sequence_parallel, "microbatch_group_size": self.microbatch_group,
                "order": self.order}

    def overrides(self) -> list[str]:
        """The ``--set`` strings that turn the base scenario into this candidate."""
        return [
            f"parallel.data={self.data}",
            f"parallel.tensor={self.tensor}",
            f"parallel.pipeline={self.pipeline}",
            f"parallel.schedule={self.schedule}",
            f"parallel.virtual_stages={self.virtual_stages}",
            # a base's group fits its own micro-batch count only
            f"parallel.microbatch_group_size={'null' if self.microbatch_group is None else self.microbatch_group}",
            f"parallel.zero={self.zero}",
            f"parallel.sequence_parallel={'true' if self.sequence_parallel else 'false'}",
            f"parallel.order={self.order}",
            f"training.micro_batch={self.micro_batch}",
            f"training.checkpointing={self.checkpointing}",
            # only a sharded optimizer gathers its update (a base that overlaps it keeps that for ZeRO 1/2)
            *(["parallel.overlap_param_gather=false"] if self.zero not in (1, 2) else []),
            # userbuffers overlap sequence parallelism's collectives: a base that overlaps them keeps that
            *(["parallel.tp_comm_overlap=false"] if not self.sequence_parallel else []),
        ]

    def label(self) -> str:
        sched = self.schedule if self.virtual_stages == 1 else f"{self.schedule}×{self.virtual_stages}"
        if self.microbatch_group is not None:
            sched += f" N{self.microbatch_group}"
        sp = " sp" if self.sequence_parallel else ""
        order = f" {self.order}" if self.order != "tp-dp-pp" else ""
        return (
            f"d{self.data} t{self.tensor} p{self.pipeline} mb{self.micro_batch} {sched} "
            f"z{self.zero} ckpt:{self.checkpointing}{sp}{order}"
        )


@lru_cache(maxsize=256)
def _first_stage_actions(schedule: str, p: int, m: int, v: int, group: int | None, all_warmup: bool) -> tuple:
    """Stage 0's actions (``stage_actions``), built once per schedule shape: thousands of candidates share
    a few shapes."""
    return tuple(stage_actions(schedule, p, m, 0, v, group, all_warmup))


@dataclass
class Estimate:
    """Closed-form figures for one candidate (seconds per step and bytes per GPU)."""

    step_time_s: float
    compute_s: float  # busy compute per GPU per step (the slowest stage)
    bubble_fraction: float
    tp_comm_s: float  # what tensor-parallel collectives add to the step (blocking ones whole; overlapped, the rest)
    p2p_s: float  # exposed pipeline send/recv per step
    dp_exposed_s: float  # data-parallel sync not hidden behind the backward pass
    dp_comm_s: float  # data-parallel traffic time in total
    optimizer_s: float  # optimizer step, gradient norm and their small all-reduces
    states_bytes: float  # weights + gradients + optimizer states on the fullest stage (a lower bound)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _LayerTimes:
    """One layer (or the embedding / head) for one micro-batch: compute and blocking TP collectives."""

    fwd: float  # forward compute
    bwd: float  # input + weight gradients, main_grad accumulation
    recompute: float  # compute re-run in backward (checkpointing)
    tp_fwd: float  # TP collectives in the forward
    tp_bwd: float  # in the backward
    tp_recompute: float  # in the recomputed forward (full checkpointing)
    emb: float  # embedding forward + backward (first stage), collectives included
    head: float  # head forward + backward (last stage), collectives included
    weight_cast: float = 0.0  # once per step: the layer's fp8 weight casts (Transformer Engine's cache)


def _dur(blocks: tuple[Block, ...]) -> float:
    return sum(b.dur_s for b in blocks)


def transformer_of(scenario: Scenario) -> TransformerModel:
    """The scenario's model, which the planner's closed forms need to be a transformer."""
    m = scenario.model
    if not isinstance(m, TransformerModel):
        raise ScenarioError(f"plan needs a transformer model, not {m.kind}", "model")
    return m


class Estimator:
    """Prices candidates of one scenario (a transformer model on a cluster) without simulating."""

    def __init__(self, scenario: Scenario):
        m = transformer_of(scenario)
        par, tr = scenario.require_training()
        if m.experts is not None or par.cp > 1:
            field = "model.experts" if m.experts is not None else "parallel.context"
            raise ScenarioError("plan does not search mixture-of-experts or context-parallel layouts yet (its "
                                "closed forms are dense, without context); simulate them with run or sweep", field)
        self.scenario = scenario
        self._chunks: dict[tuple[int, int], tuple[int, ...]] = {}  # _chunk_layers, by (pipeline, chunks)
        # The scenario's sections, narrowed once (a transformer with parallel and training sections).
        self.model, self.parallel, self.training = m, par, tr
        self.dims = m.to_dims()
        self.cost = cost_model_for(scenario)
        self.kernels = kernel_set(scenario)
        self.host_s = self.kernels.host_dispatch_us * 1e-6
        c = scenario.cluster
        self.gpus_per_node = c.gpus_per_node
        self.nodes = c.nodes
        self.precision = tr.precision
        self.ebytes = DTYPE_BYTES[storage_dtype(self.precision)]
        # fp32 main grads with Megatron + bf16 (unless training.grad_reduce_dtype says otherwise)
        self.gbytes = main_grad_bytes(self.precision, self.kernels, tr.grad_reduce_dtype)
        self.global_batch = tr.global_batch
        self.optimizer = "sgd" if tr.optimizer == "sgd" else "adam"
        self.state_bytes = optimizer_state_bytes(tr.optimizer_state_dtype)
        self.bucket_MB = par.bucket_MB
        self.overlap_grad_sync = par.overlap_grad_sync
        self.overlap_param_gather = par.overlap_param_gather
        self.overlap_p2p_comm = par.overlap_p2p_comm
        self.capacity = scenario.gpu.memory_bytes
        self.nccl = scenario.gpu.nccl_ctas()
        # Synchronous training runs at its slowest GPU's pace: compute × the expected slowest factor of the
        # cluster's GPUs (the simulation draws them; see sim.engine.variability).
        self.slowest = expected_slowest(c.gpu_speed_spread, c.total_gpus)
        # Topologies as the simulation builds them (calibrated α/B applied), with only as many nodes as
        # a group spans: groups are priced on their rank pattern moved to the first nodes (same local
        # GPU indices, so the same NICs), so a screen of a huge cluster never builds it.
        self._topos: dict[int, object] = {}
        self.comm = alg.comm_config_for(scenario, self._topology(1))
        self._priced: dict = {}
        self._times = lru_cache(maxsize=None)(self._layer_times)
        # An oversubscribed tree: every group of a kind shares its uplinks (``sim.explore.fabric``), priced on
        # the whole cluster's topology, once per layout.
        self._tree = topology_for(scenario, self.cost) if tree_oversubscribed(scenario) else None
        self._shares: dict[tuple[int, int, int, str], dict[str, float]] = {}

    def fabric_shares(self, lay: Layout) -> dict[str, float]:
        """Per kind of traffic ("dp", "pp", "emb"), how many times slower the layout's groups cross an
        oversubscribed tree when all of them communicate at once (1.0 without oversubscription)."""
        key = (lay.dp, lay.tp, lay.pp, lay.order)
        got = self._shares.get(key)
        if got is None:
            kinds = ("dp", "pp", "emb")  # tensor parallelism stays inside a node (the planner's rule)
            got = self._shares[key] = (kind_shares(self._tree, lay, kinds) if self._tree is not None
                                       else dict.fromkeys(kinds, 1.0))
        return got

    # ---- collectives, priced by the simulator's tuner ----------------------------------------------
    def _topology(self, nodes: int):
        topo = self._topos.get(nodes)
        if topo is None:
            topo = self._topos[nodes] = topology_for(self.scenario, self.cost, max_nodes=nodes)
        return topo

    def collective_s(self, op: str, kind: str, ranks: list[int], n_bytes: float, share: float = 1.0) -> float:
        """The tuner's predicted time of ``op`` on the group ``ranks`` (global GPU ids), launch included;
        ``share``: its NICs get 1/share of their bandwidth (``fabric_shares``)."""
        if len(ranks) <= 1 or n_bytes <= 0:
            return 0.0
        return self._priced_collective(op, kind, ranks, n_bytes, share)[0]

    def sm_share_of(self, op: str, kind: str, ranks: list[int], n_bytes: float, share: float = 1.0) -> float:
        """The share of the GPU's SMs this collective's NCCL kernel holds, so the compute it overlaps loses
        that share of its time: its CTAs by where the group's ranks are and the algorithm it runs (as the
        simulation's executor prices it)."""
        if len(ranks) <= 1 or n_bytes <= 0:
            return 0.0
        _, a, shape = self._priced_collective(op, kind, ranks, n_bytes, share)
        return self.nccl.share(shape.nodes, shape.per_node, a)

    def _priced_collective(self, op: str, kind: str, ranks: list[int], n_bytes: float, share: float = 1.0):
        """(time, algorithm, group shape) of the tuner's fastest closed-form prediction for the group, its
        rank pattern moved to the first nodes."""
        per = self.gpus_per_node
        nodes = sorted({r // per for r in ranks})
        where = {n: i for i, n in enumerate(nodes)}
        local = [where[r // per] * per + r % per for r in ranks]
        key = (op, kind, n_bytes, tuple(local), share)
        hit = self._priced.get(key)
        if hit is None:
            topo = self._topology(len(nodes))
            shape = alg.group_shape(topo, local)
            # The tuner's closed-form predictions, fastest first (``choose`` without its refinement, which
            # times near-tied candidates by simulating them: ~70 % of a 175B screen's time for < 30 %).
            t, a = min(
                (alg.predict_s(op, a, proto, n_bytes, shape, topo, self.comm, inter_share=share), a)
                for a in alg.candidates(op, kind, shape, self.comm, topo)
                for proto in alg.PIPELINE_PROTOCOLS.get(a, ("Simple",))
            )
            hit = self._priced[key] = (t, a, shape)
        return hit

    def _tp_group(self, t: int) -> list[int]:
        return list(range(t))

    # ---- per-layer times (cached per tensor width, micro-batch, SP, checkpointing, W apart or not) ----
    def _layer_times(self, t: int, b: int, sp: bool, ckpt: str, schedule: str, fsdp: bool = False) -> _LayerTimes:
        """Per-layer times; ``schedule`` only as far as it decides the backward's TP overlap (the cache
        key uses "1f1b" for every schedule that runs weight gradients in the backward); ``fsdp``: ZeRO-3 as
        PyTorch FSDP runs it (``fsdp_flat``: the flat-grad copy instead of the main_grad accumulation)."""
        d, dtype, cost, host, ks = self.dims, self.precision, self.cost, self.host_s, self.kernels
        m = self.model
        kw = dict(micro_batch=b, tp=t, sequence_parallel=sp, dtype=dtype)
        gb, eb = self.gbytes, self.ebytes
        lo = dense_layer_ops(d, **kw, attention=m.attention, ks=ks, schedule=schedule,
                             flash_attention=self.training.flash_attention, gbytes=gb, ebytes=eb,
                             norm_kernel=self.training.norm_kernel, fp8_recipe=self.training.fp8_recipe,
                             tp_comm_overlap=self.parallel.tp_comm_overlap)
        f8 = fp8_weight_casts(lo, ks, dtype, self.training.fp8_recipe)  # as sim.build runs them
        lo = f8.layer
        group = self._tp_group(t)
        k = self.slowest

        def comm(blocks: tuple[Block, ...]) -> float:
            """What the blocks' collectives add to their compute: a blocking one its time C; one run beside
            W of compute (``Block.overlap``) max(C, W + C·x/(1+x)) − W, the SMs it holds slowing W."""
            if t == 1:
                return 0.0
            total = 0.0
            for blk in blocks:
                if blk.comm:
                    c = self.collective_s(blk.comm, "tp", group, blk.comm_bytes)
                    w = k * blk.dur_s
                    if blk.overlap:
                        x = (min(blk.ctas, self.nccl.sm_count - 1) / self.nccl.sm_count if blk.ctas is not None
                             else self.sm_share_of(blk.comm, "tp", group, blk.comm_bytes))
                        total += max(c, w + c * x) - w
                    else:
                        total += c
            return total

        fwd = blocks(cost, lo.forward, host_s=host)
        bwd = blocks(cost, lo.backward_input, host_s=host)
        wgt = weight_blocks(cost, lo.backward_weight, tf.layer_params(d) / t, ks, gb, eb, fsdp)
        if ckpt == "full":
            recompute = fwd
        elif ckpt == "selective":
            recompute = op_block(cost, "attention", [op for s in lo.forward for op in s.ops
                                                       if tf.is_attention_core(op)], host)
        else:
            recompute = ()
        emb = tf.embedding_ops(d, **kw)
        head = tf.head_ops(d, **kw, persistent_norm=persistent_norm(ks, self.training.norm_kernel, d.hidden),
                           fused_ce=ks.fused_cross_entropy,
                           ce_kernel=ks.cross_entropy_kernel)
        emb_params = tf.embedding_params(d) / t
        emb_blocks = (blocks(cost, emb.forward, host_s=host) + blocks(cost, emb.backward_input, host_s=host)
                      + op_block(cost, "wgrad", emb.backward_weight, host)
                      + accumulate_block(cost, emb_params, gb, eb, ks, force=True, fsdp=fsdp))
        head_blocks = (blocks(cost, head.forward, host_s=host) + blocks(cost, head.backward_input, host_s=host)
                       + weight_blocks(cost, head.backward_weight, emb_params, ks, gb, eb, fsdp))
        return _LayerTimes(
            fwd=k * _dur(fwd),
            bwd=k * (_dur(bwd) + _dur(wgt)),
            recompute=k * _dur(recompute),
            tp_fwd=comm(fwd),
            tp_bwd=comm(bwd),
            tp_recompute=comm(recompute),
            emb=k * _dur(emb_blocks) + comm(emb_blocks),
            head=k * _dur(head_blocks) + comm(head_blocks),
            weight_cast=k * _dur(per_step_blocks(cost, f8.per_step, host)),
        )

    # ---- memory ---------------------------------------------------------------------------------
    def _chunk_layers(self, c: Candidate) -> list[int]:
        """Layers of each model chunk, in virtual-stage order (chunk × pipeline + stage), as ``sim.build``
        splits them: a function of the pipeline and its chunks only, worked out once for each."""
        key = (c.pipeline, c.virtual_stages)
        chunks = self._chunks.get(key)
        if chunks is None:
            given = stage_layers_for(self.parallel.stage_layers, c.pipeline, c.virtual_stages)
            counts = stage_layer_counts(self.kernels, self.dims.layers, c.pipeline, c.virtual_stages, given,
                                        self.training.precision)
            chunks = self._chunks[key] = tuple(
                len(part) for part in partition_layers(self.dims.layers, c.pipeline * c.virtual_stages, counts))
        return list(chunks)

    def _zero2_backlog_s(self, c: Candidate, m: int, lt, scatter_s: float, rest_s: float) -> float | None:
        """What the first stage's data-parallel stream still has to reduce-scatter once its last backward
        ends, under ZeRO-2 with the reduce-scatters beside the compute: a flow shop over the stage's own
        actions. A backward of n layers releases n layers' reduce-scatters (the embedding's with chunk 0's)
        as it goes, and the stream works through them while the backward computes (the last layer's only
        after it); a forward releases none and drains the backlog. Where the schedule runs its backwards
        back to back (interleaved 1F1B with m·v within its warm-up: every forward first, then every
        backward) the stream falls behind by what each backward's reduce-scatters outlast it, and all of
        that is exposed at the end. Waits inside the stage's timeline also drain it: left out (an upper
        bound). None for schedules that split the backward (the weight-gradient pass releases them)."""
        if c.schedule in SPLIT_BACKWARD:
            return None
        p, v = c.pipeline, c.virtual_stages
        chunks = self._chunk_layers(c)
        c_fwd = lt.fwd + lt.tp_fwd
        c_bwd = lt.bwd + lt.recompute + lt.tp_bwd + lt.tp_recompute
        backlog = 0.0
        for a in _first_stage_actions(c.schedule, p, m, v, c.microbatch_group, self.kernels.interleaved_all_warmup):
            n = chunks[a.chunk * p]
            if a.kind == "F":
                backlog = max(0.0, backlog - n * c_fwd)
            else:
                work = n * scatter_s + (rest_s if a.chunk == 0 else 0.0)
                backlog = max(backlog + work - n * c_bwd, scatter_s)
        return backlog

    def _stage_layers(self, c: Candidate) -> list[int]:
        chunks = self._chunk_layers(c)
        return [sum(chunks[k * c.pipeline + s] for k in range(c.virtual_stages)) for s in range(c.pipeline)]

    def states_bytes(self, c: Candidate) -> float:
        """Weights + gradients + optimizer states on the fullest stage (ZeRO formulas): a lower bound on
        its memory, so a candidate whose states alone exceed the GPU can be dropped without building it."""
        st = mem.model_state_bytes(
            max(self._stage_params(c)),
            zero_stage=c.zero,
            dp=c.data,
            precision=self.precision,
            optimizer=self.optimizer,
            grad_bytes_per_param=self.gbytes, state_bytes=self.state_bytes,
        )
        return st["weights"] + st["gradients"] + st["optimizer"]

    # ---- step time ----------------------------------------------------------------------------
    def _bucket_bytes(self, dp: int) -> float:
        """The candidate's gradient bucket (the stack's default depends on its data-parallel size)."""
        return grad_bucket_bytes(self.bucket_MB, transformer=True, data=dp, grad_elem_bytes=self.gbytes)

    def _param_gather_s(self, dp_group: list[int], held_bytes: float, layer_bytes: float, share: float) -> float:
        """Exposed time of gathering a ZeRO 1/2 update: all of it after the optimizer step, or with
        ``overlap_param_gather`` the first layer's (the forward waits for it) and the SMs the rest holds
        beside the next forward."""
        whole = self.collective_s("all_gather", "dp", dp_group, held_bytes, share)
        if not self.overlap_param_gather or held_bytes <= layer_bytes:
            return whole
        first = self.collective_s("all_gather", "dp", dp_group, layer_bytes, share)
        return first + (whole - first) * self.sm_share_of("all_gather", "dp", dp_group, layer_bytes, share)

    def _dp_buckets_s(self, op: str, group: list[int], grads_bytes: float, layer_grad_bytes: float,
                      share: float) -> float:
        """The gradient sync as the executor runs it: layers' gradients gathered into buckets of at least
        ``bucket_MB`` (one collective each, serialised on the DP stream); one collective of everything
        when the sync is not overlapped."""
        if grads_bytes <= 0:
            return 0.0
        if not self.overlap_grad_sync or layer_grad_bytes <= 0:
            return self.collective_s(op, "dp", group, grads_bytes, share)
        per_bucket = max(1, -(-self._bucket_bytes(len(group)) // layer_grad_bytes)) * layer_grad_bytes
        full, rest = divmod(grads_bytes, per_bucket)
        return (full * self.collective_s(op, "dp", group, per_bucket, share)
                + self.collective_s(op, "dp", group, rest, share))

    def estimate(self, c: Candidate) -> Estimate:
        """Closed-form step time of ``c`` (and its model-state bytes)."""
        d, t, p, v, b, dp = self.dims, c.tensor, c.pipeline, c.virtual_stages, c.micro_batch, c.data
        sp = c.sequence_parallel and t > 1
        ks, eb, gb = self.kernels, self.ebytes, self.gbytes
        fsdp = fsdp_flat(ks, c.zero, dp)
        lt = self._times(t, b, sp, c.checkpointing, c.schedule if c.schedule in SPLIT_BACKWARD else "1f1b", fsdp)
        lay = Layout(dp=dp, tp=t, pp=p, order=c.order)
        sh = self.fabric_shares(lay)  # all 1.0 unless the tree is oversubscribed
        m = self.global_batch // (dp * b)
        tp_layer = lt.tp_fwd + lt.tp_bwd + lt.tp_recompute
        per_layer = lt.fwd + lt.bwd + lt.recompute + tp_layer
        layers = self._stage_layers(c)
        stage_t = [n * per_layer for n in layers]
        tokens_bytes = 2 * b * d.seq_len * 8  # int64 tokens and labels, as sim.build loads them
        act_dtype = storage_dtype(self.precision)
        stage_t[0] += lt.emb + self.slowest * (tokens_bytes / H2D_Bps
                                             + self.cost.op_time_s(elementwise("h2d", 0.0, act_dtype)))
        stage_t[-1] += lt.head
        # Pipeline send/recv of one micro-batch's activation between stage peers (t·dp ranks apart).
        activation = b * d.seq_len * d.hidden * eb
        split = t > 1 and (sp or ks.scatter_gather_p2p)
        send = activation / t if split else activation
        p2p_hop = gather = 0.0
        rebuild = P2P_GATHERS[ks.p2p_gather]
        if p > 1:
            p2p_hop = self.collective_s("send_recv", "pp", [0, lay.rank(0, 0, 1)], send, sh["pp"])
            if t > 1 and ks.scatter_gather_p2p and not sp:  # as sim.build: the all-gather, then its copies
                copied = rebuild.copy_bytes(activation, t)
                gather = self.collective_s("all_gather", "tp", self._tp_group(t), activation) + (
                    self.slowest * self.cost.op_time_s(elementwise("p2p gather copies", copied, act_dtype))
                    if copied > 0 else 0.0)
        blocking = p2p_blocks(ks, c.schedule, self.overlap_p2p_comm)
        hop = p2p_hop if blocking else 0.0
        # Exchanges beside compute hide behind the chunk computed meanwhile (a forward or a backward of one
        # chunk); what outlasts it (a slow or shared link) delays the next chunk, per chunk and micro-batch.
        late = 0.0
        if p > 1 and not blocking:
            n = max(layers)
            fwd_chunk = n * (lt.fwd + lt.tp_fwd) / v
            bwd_chunk = n * (lt.bwd + lt.recompute + lt.tp_bwd + lt.tp_recompute) / v
            late = v * (max(0.0, p2p_hop - fwd_chunk) + max(0.0, p2p_hop - bwd_chunk))
        t_max = max(stage_t)
        # Per micro-batch a stage receives (and rebuilds) its input once forward and its gradient once
        # backward per chunk (DeepSpeed rebuilds its own output before the backward as well).
        gathers = 1 + rebuild.backward_gathers
        period = t_max + gathers * v * gather + 2 * hop * (p > 1) + late
        # (m + (p − 1)/v) periods: the bubble (p − 1)/(v·m + p − 1) of the whole pipeline time; the
        # fill/drain also pays the unhidden hops.
        fill = sum(stage_t) - t_max
        if v > 1:
            # The interleaved schedule takes each stage's chunks in a fixed round, so each of the p − 1 fill
            # and drain steps lasts as long as the chunk it moves: the longest one where the layers split
            # unevenly (Llama 3 405B's 126 layers in 96 chunks of 1 or 2: the stage totals alone put the
            # bubble at 13.5 %, the simulation at 23.4 %; est. −9.4 % → −3.5 %; tests/test_explore_plan.py).
            fill = max(fill, (p - 1) * v * max(self._chunk_layers(c)) * per_layer)
        pipe = (m * period + (fill + (p - 1) * (2 * p2p_hop + gathers * gather)) / v) if p > 1 else m * t_max
        bubble = (p - 1) / (v * m + p - 1) if p > 1 else 0.0
        # Data-parallel gradient sync of the first stage (the last to finish its backward).
        params = self._stage_params(c)
        held = max(params)
        layer_grads = tf.layer_params(d) / t * gb
        layer_weights = tf.layer_params(d) / t * eb
        dp_group = lay.dp_group(0)
        grads = params[0] * gb
        dp_total = dp_exposed = 0.0
        if dp > 1:
            if c.zero == 3:  # every layer's weights gathered for F and B, gradients scattered, per micro-batch
                n_layers = max(layers)
                gather_w = self.collective_s("all_gather", "dp", dp_group, layer_weights, sh["dp"])
                scatter = self.collective_s("reduce_scatter", "dp", dp_group, layer_grads, sh["dp"])
                if fsdp:  # FSDP's kernels on its DP streams: the shard casts and the gradient pre-divide
                    gather_w += fsdp_pre_gather_s(self.cost, layer_weights, eb, dp)
                    scatter += fsdp_pre_reduce_s(self.cost, layer_grads)
                sync, after = 0.0, m * n_layers * (2 * gather_w + scatter) * (1 + (p - 1) / (v * m))
                # The executor gathers one layer ahead (FSDP's prefetch) and, with overlap_grad_sync,
                # reduce-scatters each layer beside the rest of the backward: exposed stay each action's
                # first gather (forward and backward, per chunk), the step's last reduce-scatter (every
                # one without overlap) and what the DP stream needs beyond the pipeline's own time; its
                # NCCL kernels slow the compute they run beside.
                scatters = scatter if self.overlap_grad_sync else m * v * n_layers * scatter
                # Phase by phase: a forward needs one gather per layer beside its compute, a backward a gather
                # and (overlapped) a reduce-scatter per layer beside its own; where the DP stream's work
                # outweighs the compute it falls behind. A backward's backlog drains in the next forward's
                # slack; the step's last backward's cannot (a flow shop of the two streams).
                c_fwd = lt.fwd + lt.tp_fwd
                c_bwd = lt.bwd + lt.recompute + lt.tp_bwd + lt.tp_recompute
                bwd_dp = gather_w + (scatter if self.overlap_grad_sync else 0.0)
                excess = n_layers * max(0.0, bwd_dp - c_bwd)
                slack = n_layers * max(0.0, c_fwd - gather_w)
                backlog = excess + (m * v - 1) * max(0.0, excess - slack)
                exposed = min(after, 2 * v * m * gather_w + max(backlog, scatters + max(0.0, after - pipe)))
                dp_exposed = exposed + (after - exposed) * self.sm_share_of("all_gather", "dp", dp_group,
                                                                             layer_weights, sh["dp"])
            elif c.zero == 2:  # sharded gradients: every micro-batch's reduce-scattered, layer by layer
                scatter = self.collective_s("reduce_scatter", "dp", dp_group, layer_grads, sh["dp"])
                rest = grads - layers[0] * layer_grads  # the embedding's (and head's) gradients
                per_mb = layers[0] * scatter + (self.collective_s("reduce_scatter", "dp", dp_group, rest, sh["dp"])
                                                if rest > 0 else 0.0)
                sync = m * per_mb
                after = self._param_gather_s(dp_group, held * eb, layer_weights, sh["dp"])
                if self.overlap_grad_sync:  # the DP stream runs beside the whole pipeline, not one backward
                    share = self.sm_share_of("reduce_scatter", "dp", dp_group, layer_grads, sh["dp"])
                    left = self._zero2_backlog_s(c, m, lt, scatter, per_mb - layers[0] * scatter)
                    if left is None:
                        exposed = max(scatter, sync - m * period)
                        dp_exposed = exposed + (sync - exposed) * share + after
                    else:
                        # The compute its NCCL kernels slow down lengthens the backwards the stream runs
                        # beside, and so hides as much more of the backlog: where the stream falls behind,
                        # the step ends with it whatever the compute does.
                        slowed = (sync - min(sync, left)) * share
                        dp_exposed = max(left, slowed + scatter) + after
                else:
                    dp_exposed = sync + after
            else:  # DDP / ZeRO-1: one sync after the last micro-batch, bucketed on the last backward
                # (DeepSpeed of 2021-22 all-reduces the whole gradients even under ZeRO-1)
                whole = c.zero == 0 or ks.zero1_grad_all_reduce
                op = "all_reduce" if whole else "reduce_scatter"
                sync = self._dp_buckets_s(op, dp_group, grads, layer_grads, sh["dp"])
                after = self._param_gather_s(dp_group, held * eb, layer_weights, sh["dp"]) if c.zero == 1 else 0.0
                if self.overlap_grad_sync:
                    overlap = layers[0] * (lt.bwd + lt.recompute + lt.tp_bwd + lt.tp_recompute) / v
                    last_bucket = self._dp_buckets_s(op, dp_group, min(grads, self._bucket_bytes(dp)), layer_grads,
                                                     sh["dp"])
                    hidden = max(0.0, min(sync - last_bucket, overlap))
                    # NCCL's kernels hold SMs while they overlap compute: that compute runs slower.
                    slowed = hidden * self.sm_share_of(op, "dp", dp_group, min(grads, self._bucket_bytes(dp)), sh["dp"])
                    dp_exposed = sync - hidden + slowed + after
                else:
                    dp_exposed = sync + after
            dp_total = sync + after
        # Step end: tied embeddings' gradient all-reduce between first and last stage, loss-scale unscale,
        # gradient norm (its model-parallel and, with ZeRO, data-parallel 4-byte all-reduces), optimizer.
        tail = max(layers) * lt.weight_cast  # fp8 weights cast once per step (on the fullest stage)
        if d.tied_embeddings and p > 1:
            emb_bytes = -(-d.vocab // t) * d.hidden * gb
            tail += self.collective_s("all_reduce", "emb", [0, lay.rank(0, 0, p - 1)], emb_bytes, sh["emb"])
        opt, clip = megatron_optimizer(self.cost, precision=self.precision, optimizer=self.training.optimizer,
                                       params_per_gpu=held, data=dp, zero=c.zero, gbytes=gb, ks=ks,
                                       state_bytes=self.state_bytes)
        mp_group = lay.mp_group(0)
        tail += self.slowest * opt.dur_s
        if self.training.loss_scaling.kind != "none":
            _, unscale = optimizer_block(self.cost, self.scenario_for(c), held)
            tail += self.slowest * (unscale.dur_s if unscale else 0.0) + self.collective_s("all_reduce", "mp", mp_group, 4.0)
        if self.training.grad_clip is not None:
            tail += self.slowest * clip.dur_s + self.collective_s("all_reduce", "mp", mp_group, 4.0)
            if c.zero >= 1:
                tail += self.collective_s("all_reduce", "dp", dp_group, 4.0, sh["dp"])
        step = pipe + dp_exposed + tail
        compute = m * max(n * (lt.fwd + lt.bwd + lt.recompute) for n in layers)
        return Estimate(
            step_time_s=step,
            compute_s=compute,
            bubble_fraction=bubble,
            tp_comm_s=m * max(layers) * tp_layer if t > 1 else 0.0,
            p2p_s=2 * (m + p - 1) * (hop + gather) + m * late if p > 1 else 0.0,
            dp_exposed_s=dp_exposed,
            dp_comm_s=dp_total,
            optimizer_s=tail,
            states_bytes=self.states_bytes(c),
        )

    def _stage_params(self, c: Candidate) -> list[float]:
        d, t = self.dims, c.tensor
        layer_params = tf.layer_params(d) / t
        emb_params = tf.embedding_params(d) / t
        head_params = tf.head_params(d, emb_params, c.pipeline * c.virtual_stages)
        layers = self._stage_layers(c)
        return [
            n * layer_params + (emb_params if s == 0 else 0) + (head_params if s == c.pipeline - 1 else 0)
            for s, n in enumerate(layers)
        ]

    def _span_nodes(self, t: int, dp: int) -> int:
        """Nodes a data-parallel group (dp ranks, t apart) spans."""
        return max(1, min(dp, -(-(t * dp) // self.gpus_per_node)))

    def dp_span_nodes(self, c: Candidate) -> int:
        """Nodes one of ``c``'s data-parallel groups spans (1: its gradient sync stays on NVLink)."""
        return self._span_nodes(c.tensor, c.data)

    def params_total(self) -> float:
        return float(tf.model_params(self.dims))

    def model_state_bytes(self) -> float:
        """Weights + gradients + optimizer states of the whole model (no sharding): what must be split."""
        params = tf.model_params(self.dims)
        st = mem.model_state_bytes(
            params, zero_stage=0, dp=1, precision=self.precision, optimizer=self.optimizer,
            grad_bytes_per_param=self.gbytes, state_bytes=self.state_bytes,
        )
        return st["weights"] + st["gradients"] + st["optimizer"]

    # ---- exact memory, from the builder the simulation uses ----------------------------------------
    def scenario_for(self, c: Candidate) -> Scenario:
        """The base scenario with ``c``'s layout, unvalidated (for ``build_job``; the planner validates the
        candidates it simulates)."""
        sc = self.scenario
        par = self.parallel.model_copy(
            update={
                **c.parallel_fields(),
                "stage_layers": stage_layers_for(self.parallel.stage_layers, c.pipeline, c.virtual_stages),
            }
        )
        tr = self.training.model_copy(
            update={"micro_batch": c.micro_batch,
                    "checkpointing": Checkpointing.model_validate({"kind": c.checkpointing})}
        )
        return sc.model_copy(update={"parallel": par, "training": tr})

    def exact_memory(self, c: Candidate) -> dict:
        """The fullest stage's memory breakdown as ``sim.build`` computes it (what the summary reports)."""
        _, info = build_job(self.scenario_for(c), self.cost)
        return dict(max(info.memory_by_stage, key=lambda d: d["peak"]))
