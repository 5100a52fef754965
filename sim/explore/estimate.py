"""Closed-form step time of a transformer training layout, and its exact memory: the planner's screen.

A candidate is priced in microseconds instead of simulated in seconds: per-layer compute comes from the
same roofline op costs the simulator uses (``tf.layer_ops`` priced by the scenario's cost model), tensor-
parallel collectives and the data-parallel gradient sync from the ring formulas in ``sim.analytic``, the
pipeline from the bubble closed form (p − 1)/(v·m + p − 1). Memory is not re-derived here: the ZeRO
model-state formula gives a cheap lower bound for pruning, and ``exact_memory`` asks ``sim.build`` (about
a millisecond), so the planner's memory verdict is the one the simulation will report.

The estimate ranks candidates; the planner then simulates the best ones, so its errors only cost a
missed candidate, never a wrong reported number.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from sim import analytic as an
from sim import memory as mem
from sim.build import OPTIMIZER_BYTES_PER_PARAM, cost_model_for, topology_for
from sim.parallel.layout import partition_layers, stage_layers_for
from sim.units import DTYPE_BYTES, MB
from sim.workload import transformer as tf
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

    @property
    def gpus(self) -> int:
        return self.data * self.tensor * self.pipeline

    def overrides(self) -> list[str]:
        """The ``--set`` strings that turn the base scenario into this candidate."""
        return [
            f"parallel.data={self.data}",
            f"parallel.tensor={self.tensor}",
            f"parallel.pipeline={self.pipeline}",
            f"parallel.schedule={self.schedule}",
            f"parallel.virtual_stages={self.virtual_stages}",
            f"parallel.zero={self.zero}",
            f"parallel.sequence_parallel={'true' if self.sequence_parallel else 'false'}",
            f"training.micro_batch={self.micro_batch}",
            f"training.checkpointing={self.checkpointing}",
        ]

    def label(self) -> str:
        sched = self.schedule if self.virtual_stages == 1 else f"{self.schedule}×{self.virtual_stages}"
        sp = " sp" if self.sequence_parallel else ""
        return (
            f"d{self.data} t{self.tensor} p{self.pipeline} mb{self.micro_batch} {sched} "
            f"z{self.zero} ckpt:{self.checkpointing}{sp}"
        )


@dataclass
class Estimate:
    """Closed-form figures for one candidate (seconds per step and bytes per GPU)."""

    step_time_s: float
    compute_s: float  # busy compute per GPU per step (the slowest stage)
    bubble_fraction: float
    tp_comm_s: float  # tensor-parallel collectives per step (blocking, on the critical path)
    p2p_s: float  # exposed pipeline send/recv per step
    dp_exposed_s: float  # data-parallel sync not hidden behind the backward pass
    dp_comm_s: float  # data-parallel traffic time in total
    optimizer_s: float
    states_bytes: float  # weights + gradients + optimizer states on the fullest stage (a lower bound)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _LayerTimes:
    fwd: float  # compute, one layer, one micro-batch
    bwd: float  # input + weight gradients
    attention: float  # forward attention core (selective recomputation)
    tp_fwd: float  # TP collectives in the forward
    tp_bwd: float
    emb: float  # embedding forward + backward (first stage), collectives included
    head: float  # head forward + backward (last stage), collectives included


class Estimator:
    """Prices candidates of one scenario (a transformer model on a cluster) without simulating."""

    def __init__(self, scenario):
        if scenario.model.kind != "transformer":
            from sim.errors import ScenarioError

            raise ScenarioError(f"plan needs a transformer model, not {scenario.model.kind}", "model")
        if getattr(scenario.model, "experts", None) is not None or scenario.parallel.cp > 1:
            from sim.errors import ScenarioError

            field = "model.experts" if getattr(scenario.model, "experts", None) is not None else "parallel.context"
            raise ScenarioError("plan does not search mixture-of-experts or context-parallel layouts yet (its "
                                "closed forms are dense, without context); simulate them with run or sweep", field)
        self.scenario = scenario
        m = scenario.model
        self.dims = m.to_dims()
        self.cost = cost_model_for(scenario)
        c = scenario.cluster
        self.gpus_per_node = c.gpus_per_node
        self.nodes = c.nodes
        # Links as the simulation sees them: the topology applies a calibration profile's fitted α and
        # bandwidth over the presets, so screen and simulation price a collective alike.
        topo = topology_for(scenario, self.cost, max_nodes=2)
        self.intra = (topo.intra_latency_s, topo.intra_bw_Bps)
        # Per-GPU share of the node's NICs (several NICs per GPU add up, GPUs sharing one split it).
        nic_share = c.nics_per_node / c.gpus_per_node
        self.inter = (topo.inter_latency_s, topo.inter_bw_Bps * nic_share)
        self.leaf_factor = 1.0 / c.topology.oversubscription
        self.nodes_per_leaf = c.nodes if c.topology.kind == "single-switch" else c.topology.nodes_per_leaf
        tr = scenario.training
        self.precision = tr.precision
        self.global_batch = tr.global_batch
        self.optimizer = "sgd" if tr.optimizer == "sgd" else "adam"
        self.bucket_bytes = scenario.parallel.bucket_MB * MB
        self.capacity = scenario.gpu.memory_bytes
        self._times = lru_cache(maxsize=None)(self._layer_times)

    # ---- links -----------------------------------------------------------------------------------
    def _link(self, span_nodes: int) -> tuple[float, float]:
        """(α, B) of a ring whose members sit on ``span_nodes`` nodes (1: inside a node, on NVLink)."""
        if span_nodes <= 1:
            return self.intra
        alpha, bw = self.inter
        if span_nodes > self.nodes_per_leaf:
            bw *= self.leaf_factor
        return alpha, min(bw, self.intra[1])

    def _coll(self, op: str | None, p: int, n_bytes: float, link: tuple[float, float]) -> float:
        if not op or p <= 1 or n_bytes <= 0:
            return 0.0
        alpha, bw = link
        if op == tf.ALL_REDUCE:
            return an.ring_all_reduce_time(p, n_bytes, alpha, bw)
        return an.ring_all_gather_time(p, n_bytes, alpha, bw)  # AG and RS cost the same

    # ---- per-layer times (cached per tensor width, micro-batch and SP) --------------------------
    def _layer_times(self, t: int, b: int, sp: bool) -> _LayerTimes:
        d, dtype, price = self.dims, self.precision, self.cost.op_time_s
        link = self._link(1 if t <= self.gpus_per_node else math.ceil(t / self.gpus_per_node))
        lo = tf.layer_ops(d, micro_batch=b, tp=t, sequence_parallel=sp, dtype=dtype)

        def comp(segs) -> float:
            return sum(price(op) for s in segs for op in s.ops)

        def comm(segs) -> float:
            return sum(self._coll(s.comm, t, s.comm_bytes, link) for s in segs)

        def whole(ops) -> float:
            return (
                comp(ops.forward)
                + comm(ops.forward)
                + comp(ops.backward_input)
                + comm(ops.backward_input)
                + sum(price(op) for op in ops.backward_weight)
            )

        attention = sum(price(op) for s in lo.forward for op in s.ops if tf.is_attention_core(op))
        emb = tf.embedding_ops(d, micro_batch=b, tp=t, sequence_parallel=sp, dtype=dtype)
        head = tf.head_ops(d, micro_batch=b, tp=t, sequence_parallel=sp, dtype=dtype)
        return _LayerTimes(
            fwd=comp(lo.forward),
            bwd=comp(lo.backward_input) + sum(price(op) for op in lo.backward_weight),
            attention=attention,
            tp_fwd=comm(lo.forward),
            tp_bwd=comm(lo.backward_input),
            emb=whole(emb),
            head=whole(head),
        )

    # ---- memory ---------------------------------------------------------------------------------
    def _stage_layers(self, c: Candidate) -> list[int]:
        given = stage_layers_for(self.scenario.parallel.stage_layers, c.pipeline, c.virtual_stages)
        parts = partition_layers(self.dims.layers, c.pipeline * c.virtual_stages, given)
        return [
            sum(len(parts[k * c.pipeline + s]) for k in range(c.virtual_stages)) for s in range(c.pipeline)
        ]

    def states_bytes(self, c: Candidate) -> float:
        """Weights + gradients + optimizer states on the fullest stage (ZeRO formulas): a lower bound on
        its memory, so a candidate whose states alone exceed the GPU can be dropped without building it."""
        st = mem.model_state_bytes(
            max(self._stage_params(c)),
            zero_stage=c.zero,
            dp=c.data,
            precision=self.precision,
            optimizer=self.optimizer,
        )
        return st["weights"] + st["gradients"] + st["optimizer"]

    # ---- step time ----------------------------------------------------------------------------
    def estimate(self, c: Candidate) -> Estimate:
        """Closed-form step time of ``c`` (and its model-state bytes)."""
        d, t, p, v, b, dp = self.dims, c.tensor, c.pipeline, c.virtual_stages, c.micro_batch, c.data
        sp = c.sequence_parallel and t > 1
        lt = self._times(t, b, sp)
        m = self.global_batch // (dp * b)
        recompute = {"full": lt.fwd + lt.tp_fwd, "selective": lt.attention}.get(c.checkpointing, 0.0)
        per_layer = lt.fwd + lt.bwd + lt.tp_fwd + lt.tp_bwd + recompute
        layers = self._stage_layers(c)
        stage_t = [n * per_layer for n in layers]
        stage_t[0] += lt.emb
        stage_t[-1] += lt.head
        t_max = max(stage_t)
        # Pipeline send/recv: activations of one micro-batch (1/t of them per TP rank), each hop on the
        # critical path once forward and once backward per micro-batch in the steady state.
        ebytes = DTYPE_BYTES["bf16" if self.precision == "fp8" else self.precision]
        send = b * d.seq_len * d.hidden * ebytes / t
        p2p_hop = 0.0
        if p > 1:
            cross = t * dp >= self.gpus_per_node  # stage peers are t·dp ranks apart
            alpha, bw = self._link(2 if cross else 1)
            p2p_hop = an.send_recv_time(send, alpha, bw)
        period = t_max + 2 * p2p_hop * (p > 1)
        # (m + (p − 1)/v) periods: the bubble (p − 1)/(v·m + p − 1) of the whole pipeline time.
        pipe = m * period + (sum(stage_t) - t_max + 2 * (p - 1) * p2p_hop) / v if p > 1 else m * t_max
        bubble = an.bubble_fraction(p, m, v) if p > 1 else 0.0
        # Data-parallel gradient sync (ZeRO 1/2: reduce-scatter, then all-gather of updated weights).
        stage_params = max(self._stage_params(c))
        gbytes = 4 if self.precision in ("fp32", "tf32") else 2
        grads = stage_params * gbytes
        dp_link = self._link(self._span_nodes(t, dp))
        opt_shard = stage_params / (dp if c.zero >= 1 else 1)
        mixed = self.precision not in ("fp32", "tf32")
        optimizer = self.cost.op_time_s(
            elementwise("opt", opt_shard * OPTIMIZER_BYTES_PER_PARAM[(self.optimizer, mixed)], "fp32")
        )
        dp_total = dp_exposed = 0.0
        if dp > 1:
            if c.zero == 0:
                sync = self._coll(tf.ALL_REDUCE, dp, grads, dp_link)
                after = 0.0
            elif c.zero in (1, 2):
                sync = self._coll(tf.REDUCE_SCATTER, dp, grads, dp_link)
                after = self._coll(tf.ALL_GATHER, dp, stage_params * ebytes, dp_link)
            else:  # ZeRO-3: every layer's weights gathered for F and B, gradients scattered, per micro-batch
                n_layers = max(layers)
                per_layer_w = stage_params * ebytes / max(1, n_layers)
                gather = self._coll(tf.ALL_GATHER, dp, per_layer_w, dp_link)
                scatter = self._coll(tf.REDUCE_SCATTER, dp, grads / max(1, n_layers), dp_link)
                sync, after = 0.0, m * n_layers * (2 * gather + scatter) * (1 + (p - 1) / (v * m))
            overlap = layers[0] * (lt.bwd + lt.tp_bwd + recompute) / v
            last_bucket = sync * min(1.0, self.bucket_bytes / grads) if grads else 0.0
            dp_exposed = max(sync - overlap, last_bucket) + after
            dp_total = sync + after
        step = pipe + dp_exposed + optimizer
        compute = m * max(
            n * (lt.fwd + lt.bwd + (recompute - lt.tp_fwd if c.checkpointing == "full" else recompute))
            for n in layers
        )
        return Estimate(
            step_time_s=step,
            compute_s=compute,
            bubble_fraction=bubble,
            tp_comm_s=m * max(layers) * (lt.tp_fwd + lt.tp_bwd) * (2 if c.checkpointing == "full" else 1)
            if t > 1
            else 0.0,
            p2p_s=2 * (m + p - 1) * p2p_hop if p > 1 else 0.0,
            dp_exposed_s=dp_exposed,
            dp_comm_s=dp_total,
            optimizer_s=optimizer,
            states_bytes=self.states_bytes(c),
        )

    def _stage_params(self, c: Candidate) -> list[float]:
        d, t = self.dims, c.tensor
        layer_params = tf.layer_params(d) / t
        emb_params = tf.embedding_params(d) / t
        head_params = emb_params if (not d.tied_embeddings or c.pipeline * c.virtual_stages > 1) else 0.0
        layers = self._stage_layers(c)
        return [
            n * layer_params + (emb_params if s == 0 else 0) + (head_params if s == c.pipeline - 1 else 0)
            for s, n in enumerate(layers)
        ]

    def _span_nodes(self, t: int, dp: int) -> int:
        """Nodes a data-parallel group (dp ranks, t apart) spans."""
        return max(1, min(dp, math.ceil(t * dp / self.gpus_per_node)))

    def dp_span_nodes(self, c: Candidate) -> int:
        """Nodes one of ``c``'s data-parallel groups spans (1: its gradient sync stays on NVLink)."""
        return self._span_nodes(c.tensor, c.data)

    def params_total(self) -> float:
        return float(tf.model_params(self.dims))

    def model_state_bytes(self) -> float:
        """Weights + gradients + optimizer states of the whole model (no sharding): what must be split."""
        params = tf.model_params(self.dims)
        st = mem.model_state_bytes(
            params, zero_stage=0, dp=1, precision=self.precision, optimizer=self.optimizer
        )
        return st["weights"] + st["gradients"] + st["optimizer"]

    # ---- exact memory, from the builder the simulation uses ----------------------------------------
    def scenario_for(self, c: Candidate):
        """The base scenario with ``c``'s layout, unvalidated (for ``build_job``; the planner validates the
        candidates it simulates)."""
        from sim.scenario.schema import Checkpointing

        sc = self.scenario
        par = sc.parallel.model_copy(
            update={
                "data": c.data,
                "tensor": c.tensor,
                "pipeline": c.pipeline,
                "schedule": c.schedule,
                "virtual_stages": c.virtual_stages,
                "zero": c.zero,
                "sequence_parallel": c.sequence_parallel,
                "stage_layers": stage_layers_for(sc.parallel.stage_layers, c.pipeline, c.virtual_stages),
            }
        )
        tr = sc.training.model_copy(
            update={"micro_batch": c.micro_batch, "checkpointing": Checkpointing(kind=c.checkpointing)}
        )
        return sc.model_copy(update={"parallel": par, "training": tr})

    def exact_memory(self, c: Candidate) -> dict:
        """The fullest stage's memory breakdown as ``sim.build`` computes it (what the summary reports)."""
        from sim.build import build_job

        _, info = build_job(self.scenario_for(c), self.cost)
        return dict(max(info.memory_by_stage, key=lambda d: d["peak"]))
