"""Runs a TrainingJob on a World: one SimPy process per simulated GPU executes its stage's schedule
action by action; TP collectives block the compute stream, pipeline sends go through a p2p stream,
data-parallel gradient buckets through a DP stream that overlaps the backward pass.

Symmetry: with ``symmetric=True`` only one GPU per pipeline stage is simulated (data rank 0, tensor
rank 0); its collectives run with every member of the group arriving together (the others mirror it),
and peers that share a NIC with it send their mirrored traffic too, so NIC contention stays exact.
A collective kind (TP or DP) whose links no other traffic of the job can touch is simulated once per
shape and its duration reused: exact, since it always runs on otherwise idle links (the 4-byte
loss-scaling all-reduce is left out of that check). Which mirrored traffic to simulate and which kinds
to reuse is ``sim.engine.symmetry``'s analysis. With ``symmetric=False`` every GPU runs its own process
and every collective is simulated.

Over 500 lines: one class whose GPU loop and the operations it yields to (compute, collectives, sends,
syncs) share the per-GPU state (streams, events, memory, interference); splitting it would scatter that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import simpy

from sim.engine import collective_algorithms as coll
from sim.engine.algorithms import Choice, CommConfig, choose, group_shape
from sim.engine.collective_algorithms import COLLECTIVE_ALGORITHMS
from sim.engine.job import Block, TrainingJob
from sim.engine.symmetry import KINDS, Symmetry
from sim.engine.timeline import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    CLIP_GRAD,
    COMM_CLIP,
    COMM_CP,
    COMM_DP,
    COMM_EMB,
    COMM_EP,
    COMM_PP,
    COMM_TP,
    COMPUTE,
    FORWARD,
    FSDP_COPY,
    INTERFERENCE,
    OPTIMIZER,
    RECOMPUTE,
    STREAM_COMM,
    STREAM_COMPUTE,
    STREAM_P2P,
    WEIGHT_CAST,
    CounterSample,
    Span,
)
from sim.engine.variability import Variability
from sim.engine.world import Stream, World
from sim.errors import SimulationError
from sim.parallel.layout import Layout
from sim.schedules.actions import Action, build_schedule
from sim.schedules.exchanges import Exchange, megatron_interleaved_exchanges

STREAM_DP = "dp"


# HBM accesses per byte a rank receives, as NCCL's ring kernels move it (src/device/all_reduce.h,
# reduce_scatter.h, all_gather.h over prims_simple.h): the peer writes the incoming chunk into this rank's
# buffer (1), which the rank reads (1) and reduces with its own input (read 1) or copies to its output
# before sending it on (the send lands in the next rank's HBM, counted there): 3 for reduce-scatter,
# all-gather and all-reduce; a point-to-point or all-to-all receive writes and copies out, the send reads: 2.
HBM_TOUCHES = {"all_reduce": 3.0, "reduce_scatter": 3.0, "all_gather": 3.0, "send_recv": 2.0, "all_to_all": 2.0}
_BLOCK_COMM_CATEGORY = {"ep": COMM_EP, "cp": COMM_CP}  # span category of a block's collective by group; else TP


class _Plan(NamedTuple):
    """What ``TrainingExecutor._collective`` needs of one (GPU, group kind, op, size), worked out once."""

    group: list[int]  # empty: nobody to talk to, or nothing to send
    choice: Choice | None
    servers: list[int]
    members: list[int]
    ranks_by_node: list[list[int]]
    counted: int | None  # groups this call stands for in the summary's algorithm tally (None: not g's to count)
    cache_key: tuple | None  # key of its reusable duration (symmetric runs, cacheable kinds)
    fold: tuple[int, int] | None  # (period, block start) of its rings, folded (symmetric: Symmetry.ring_period)


_NO_PEERS = _Plan([], None, [], [], [], None, None, None)

class TrainingExecutor:
    def __init__(self, world: World, job: TrainingJob, symmetric: bool, stragglers: dict[int, float] | None = None,
                 variability: Variability | None = None):
        self.world = world
        self.variability = variability  # each GPU's own speed, per-step stragglers, kernel jitter (None: none)
        self._jitter = variability if variability is not None and variability.sigma > 0 else None
        self.env = world.env
        self.job = job
        self.layout = Layout(job.dp, job.tp, job.pp, job.ep, job.cp, job.rank_order)
        self.symmetric = symmetric
        topo = world.topology
        if symmetric:
            self.gpus = [self.layout.rank(0, 0, s) for s in range(job.pp)]
        else:
            self.gpus = list(range(self.layout.world_size))
        self._simulated = set(self.gpus)
        # Each simulated GPU's fixed slow-down (explicit straggler × its own speed), looked up per block
        # group on the hot path instead of recomputed there.
        self._own_factor = {g: (stragglers or {}).get(g, 1.0) * (variability.gpu_factor(g) if variability else 1.0)
                            for g in self.gpus}
        self.schedule = build_schedule(job.schedule, job.pp, job.microbatches, job.virtual_stages,
                                       job.microbatch_group, job.interleaved_all_warmup)
        self._events: dict[tuple, simpy.Event] = {}
        self._waiting: dict[int, str] = {}
        self._finished: set[int] = set()
        self.step_end_s: list[float] = [0.0] * job.steps
        self._streams: dict[tuple[int, str], Stream] = {}
        self._dp_last: dict[int, simpy.Event] = {}  # the last work queued on each GPU's data-parallel stream
        # Exchange rounds (job.exchange_rounds): sends issued and receives posted per (sender, receiver),
        # and each pair's (receive posted, transfer done) events.
        self._sent: dict[tuple[int, int], int] = {}
        self._posted: dict[tuple[int, int], int] = {}
        self._slots: dict[tuple[int, int, int], tuple[simpy.Event, simpy.Event]] = {}
        self._mem: dict[int, float] = {}
        self._cache: dict[tuple, float] = {}
        self.comm = world.comm or CommConfig()
        self._choices: dict = {}
        self._plans: dict[tuple, _Plan] = {}  # (g, kind, op, bytes) -> _plan(...)
        rings = self._ring_route_kinds()  # computed once: both shortcuts below start from it
        sym = Symmetry(topo, self.layout, job.pp, self.comm, self.gpus, symmetric,
                       ring_only=self._ring_only_kinds(rings), apart=self._apart_kinds(),
                       ring_routes=rings if symmetric else set())
        self._group = sym.group
        self._cross_stage_mirrors = sym.cross_stage_mirrors
        self._mirror_groups = sym.mirror_groups
        self._p2p_mirrors = sym.p2p_mirrors
        self._ring_period = sym.ring_period
        self._block_start = sym.block_start
        self._cacheable = sym.cacheable
        self.last_loss_scale: list[dict] = []
        # Compute/communication interference: per GPU, the overlapped collectives in flight and the share
        # of its SMs their NCCL kernels hold together, and the compute time lost to them so far
        # (cumulative up to the mark where the share last changed).
        self._comm_active: dict[int, int] = {}
        self._held: dict[int, float] = {}
        self._lost_cum: dict[int, float] = {}
        self._lost_mark: dict[int, float] = {}
        self._comm_change: dict[int, simpy.Event] = {}  # fires when one of g's overlapped collectives ends
        self._interferes = job.comm_slowdown > 0 or job.nccl is not None
        # The compute keeps at least one SM.
        self._max_share = 1.0 - 1.0 / job.nccl.sm_count if job.nccl is not None and job.nccl.sm_count > 1 else 0.99
        self._shares: dict[tuple, float] = {}  # (g, kind, op, bytes, peer) -> _share_of(...)
        self._stretches: dict[tuple, float] = {}  # _hbm_stretch's, by (kind, op, block duration and bytes)
        tl = world.timeline
        for g in self.gpus:
            tl.gpus.append(g)
            tl.labels[g] = self.layout.label(g, topo.gpus_per_node)
            tl.stage_of[g] = self.layout.coords(g)[2]
            tl.represents[g] = job.dp * job.tp if symmetric else 1

    # ---- public ----------------------------------------------------------------------------------
    def run(self) -> None:
        procs = [self.env.process(self._gpu(g)) for g in self.gpus]
        self.env.run()
        stuck = [g for g in self.gpus if g not in self._finished]
        if stuck:
            desc = "; ".join(f"gpu{g} waits for {self._waiting.get(g, '?')}" for g in stuck[:8])
            more = f" (+{len(stuck) - 8} more)" if len(stuck) > 8 else ""
            raise SimulationError(f"deadlock: {len(stuck)} GPU(s) wait forever: {desc}{more}")
        del procs

    # ---- helpers ---------------------------------------------------------------------------------
    def _event(self, key: tuple) -> simpy.Event:
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = self.env.event()
        return ev

    def _stream(self, g: int, name: str) -> Stream:
        s = self._streams.get((g, name))
        if s is None:
            s = self._streams[(g, name)] = Stream(self.env, name)
        return s

    def _slow(self, g: int, step: int = 0) -> float:
        base = self._own_factor[g]
        var = self.variability
        return base if var is None else base * var.step_factor(g, step)

    def _memory(self, g: int, delta: float) -> None:
        self._mem[g] = self._mem.get(g, 0.0) + delta
        self.world.timeline.counters.append(CounterSample(g, "memory_bytes", self.env.now, self._mem[g]))

    # ---- collectives -----------------------------------------------------------------------------
    def _collective(self, g: int, kind: str, op: str, size_bytes: float, stretch: float = 1.0):
        """Generator: run collective ``op`` of ``size_bytes`` on g's ``kind`` group; returns when g is done,
        with the label of the algorithm (and protocol) the tuner or the scenario chose. ``stretch`` > 1:
        its transfers move at 1/stretch of their speed (HBM shared with the compute it overlaps,
        ``_hbm_stretch``): they carry ``stretch`` × the bytes, while the tuner chooses by the real size
        and the latencies stay."""
        plan = self._plans.get((g, kind, op, size_bytes))
        if plan is None:
            plan = self._plans[(g, kind, op, size_bytes)] = self._plan(g, kind, op, size_bytes)
        group, choice, servers, members, rbn, counted, cache_key, fold = plan
        if not group or choice is None:
            return None
        world = self.world
        if counted is not None:
            world.count_algorithm(f"{kind}:{op}", choice.label, counted)
        if cache_key is not None and stretch != 1.0:
            cache_key = (*cache_key, stretch)
        if cache_key is not None:  # symmetric, and a kind whose duration is reused
            dur = self._cache.get(cache_key)
            if dur is not None:
                yield self.env.timeout(dur)
                return choice.label
        cfg = self.comm
        p = len(group)
        alg = choice.algorithm
        moved = size_bytes * stretch
        factory = lambda: coll.build(op, alg, p, moved, ranks_by_node=rbn,  # noqa: E731
                                     servers=cfg.parameter_servers, aggregate_Bps=cfg.aggregate_Bps,
                                     dedicated=bool(servers))
        proto, launch = choice.protocol, choice.launch_s
        if cache_key is not None:
            t0 = self.env.now
            yield world.run_collective_alone(factory(), members, None, proto, launch, fold).join_all()
            self._cache[cache_key] = self.env.now - t0
            return choice.label
        if not self.symmetric:
            run = world.collective((kind, tuple(group), op), g, factory, members, None, proto, launch)
            for i in range(p, len(members)):
                if not run.arrived[i]:
                    run.join(i)  # dedicated servers are always there
            yield run.join(group.index(g))
            return choice.label
        mine = world.run_collective_alone(factory(), members, None, proto, launch, fold)
        if kind in KINDS:
            for mg in self._mirror_groups(g, kind):
                mg_fold = (fold[0], self._block_start(mg, g)) if fold is not None else None
                world.run_collective_alone(factory(), mg + servers, None, proto, launch, mg_fold).join_all()
        yield mine.join_all()
        return choice.label

    def _plan(self, g: int, kind: str, op: str, size_bytes: float) -> _Plan:
        """``_collective``'s plan for g's ``kind`` group: the tuner's choice and the rest (``_Plan``)."""
        group = self._group(g, kind)
        if len(group) == 1 or size_bytes <= 0:
            return _NO_PEERS
        cfg = self.comm
        choice = choose(op, kind, size_bytes, self.world.topology, group, cfg, self._choices)
        servers = list(cfg.server_gpus) if choice.algorithm == "ps" and cfg.server_gpus else []
        if not self.symmetric:
            counted: int | None = 1 if g == group[0] else None
        elif kind != "mp":
            # One representative per stage stands for every group of this kind at its stage (a model-
            # parallel group spans the stages: counted once, by stage 0's representative).
            counted = self.layout.world_size // (self.job.pp * len(group))
        else:
            counted = self.layout.world_size // len(group) if self.layout.coords(g)[2] == 0 else None
        cache_key = (kind, op, size_bytes, tuple(group)) if self.symmetric and kind in self._cacheable else None
        period = None if servers else self._ring_period(g, kind)
        fold = (period, self._block_start(group, g)) if period is not None else None
        return _Plan(group, choice, servers, group + servers, self._ranks_by_node(group), counted, cache_key, fold)

    def _ranks_by_node(self, group: list[int]) -> list[list[int]]:
        return [list(r) for r in group_shape(self.world.topology, group).ranks_by_node]

    def _send(self, g: int, dst_stage: int, size_bytes: float, key: tuple, name: str,
              posted: simpy.Event | None = None, done: simpy.Event | None = None):
        """Post a pipeline send from g to its peer on ``dst_stage``; the receiver's event fires on arrival.
        ``posted``: an exchange round's send (``job.exchange_rounds``), which moves once the receiver has
        posted the matching receive and runs beside the round's other operations, not queued behind them;
        ``done`` then fires with the arrival too (the receiver's side of the pair)."""
        env = self.env
        world = self.world
        arrive = self._event(key)
        if size_bytes <= 0:  # nothing to send (idealised synthetic pipelines): the data is just there
            arrive.succeed()
            if done is not None:
                done.succeed()
            return arrive
        dst = self.layout.stage_peer(g, dst_stage)

        def body():
            if posted is not None:
                yield posted
            start = env.now
            share = self._comm_begin(g, "pp", "send_recv", size_bytes, dst)
            rt = world.topology.route(g, dst)
            ev = world.network.transfer_event([(rt.links, 1.0)], size_bytes, rt.latency_s)
            if self.symmetric:
                for a, b in self._p2p_mirrors(g, dst_stage):
                    prt = world.topology.route(a, b)
                    world.network.transfer_event([(prt.links, 1.0)], size_bytes, prt.latency_s)
            yield ev
            self._comm_end(g, share)
            world.span(g, STREAM_P2P, name, COMM_PP, start, {"bytes": size_bytes, "op": "send", "dst": dst})
            arrive.succeed()
            if done is not None:
                done.succeed()
            return None

        if posted is not None:
            env.process(body())
        else:
            self._stream(g, STREAM_P2P).submit(body)
        return arrive

    def _pipe_send(self, g: int, stage: int, step: int, a: Action, forward: bool,
                   posted: simpy.Event | None = None, done: simpy.Event | None = None) -> simpy.Event:
        """``_send`` of action ``a``'s result on g: a forward's output to the next virtual stage, a backward's
        input gradient to the previous one."""
        job = self.job
        vs = a.chunk * job.pp + stage
        to = vs + 1 if forward else vs - 1
        key = ("F" if forward else "B", self.layout.stage_peer(g, to % job.pp), step, to, a.microbatch)
        name = f"send {'act' if forward else 'grad'} mb{a.microbatch}"
        return self._send(g, to % job.pp, job.chunks[vs].send_bytes, key, name, posted=posted, done=done)

    def _exchange(self, g: int, stage: int, step: int, ex: Exchange):
        """One of Megatron's batched, waited pipeline exchanges (``sim.schedules.exchanges``): its sends
        and the receives it posts, each send moving once its receiver has posted the matching receive
        (pairs matched in order per sender and receiver, as NCCL's p2p); done when all are, then the device
        synchronization (``job.p2p_device_sync``)."""
        job, lay = self.job, self.layout
        waits: list[simpy.Event] = []
        for a, fwd in ((ex.send_forward, True), (ex.send_backward, False)):
            if a is None:
                continue
            peer = lay.stage_peer(g, (stage + (1 if fwd else -1)) % job.pp)
            posted, done = self._slot((g, peer), self._next(self._sent, (g, peer)))
            waits.append(self._pipe_send(g, stage, step, a, fwd, posted, done))
        for recv, other in ((ex.recv_prev, stage - 1), (ex.recv_next, stage + 1)):
            if recv:
                peer = lay.stage_peer(g, other % job.pp)
                posted, done = self._slot((peer, g), self._next(self._posted, (peer, g)))
                posted.succeed()
                waits.append(done)
        if waits:
            self._waiting[g] = f"pipeline exchange {ex} (step {step})"
            yield self.env.all_of(waits)
        if job.p2p_device_sync:
            yield from self._device_sync(g)

    @staticmethod
    def _next(counts: dict[tuple[int, int], int], channel: tuple[int, int]) -> int:
        n = counts.get(channel, 0)
        counts[channel] = n + 1
        return n

    def _slot(self, channel: tuple[int, int], i: int) -> tuple[simpy.Event, simpy.Event]:
        """The i-th pair of (receive posted, transfer done) events on ``channel`` (sender, receiver)."""
        key = (channel[0], channel[1], i)
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = (self.env.event(), self.env.event())
        return slot

    def _gather(self, g: int, what: str, args: dict):
        """Megatron's scatter/gather p2p: the 1/t slice each TP rank received is all-gathered over TP, then
        copied as the code base does (``job.gather_copy``)."""
        job = self.job
        if job.gather_bytes <= 0 or job.tp == 1:
            return
        start = self.env.now
        yield from self._collective(g, "tp", "all_gather", job.gather_bytes)
        self.world.span(g, STREAM_COMM, f"gather {what} mb{args['microbatch']}", COMM_PP, start,
                        {"bytes": job.gather_bytes, "op": "all_gather", **args})
        if job.gather_copy is not None:
            yield from self._blocks(g, (job.gather_copy,), COMPUTE, args, f"gather {what} mb{args['microbatch']}")

    def _embedding_sync(self, g: int, step: int):
        """Tied embeddings with pipelining: first and last stage all-reduce the word-embedding gradient
        (Megatron's _allreduce_embedding_grads, after the data-parallel reduction, before the step)."""
        job = self.job
        _, _, stage = self.layout.coords(g)
        if job.embedding_sync_bytes <= 0 or stage not in (0, job.pp - 1):
            return
        self._waiting[g] = f"embedding gradient all-reduce (step {step})"
        start = yield from self._cross_stage(g, "emb", job.embedding_sync_bytes, step)
        self.world.span(g, STREAM_COMM, "embedding grads all_reduce", COMM_EMB, start,
                        {"bytes": job.embedding_sync_bytes, "op": "all_reduce", "step": step})

    def _cross_stage(self, g: int, kind: str, size_bytes: float, step: int, what: str = ""):
        """An all-reduce over a group spanning pipeline stages ("emb", "mp"; ``what`` tells apart two of
        one step). Its members arrive as their stages finish, so they rendezvous first; returns when the
        last arrived: the collective runs from then on, and the wait before it is pipeline idle time, not
        communication. With symmetry each stage's representative stands for its own stage only: the first
        to be listed runs the collective (with the mirrors' own groups alongside where they may share its
        links: ``Symmetry.cross_stage_mirrors``), the others wait for it."""
        group = self._group(g, kind)
        tag = (kind, what, step, tuple(group))
        self._event(("arrive", *tag, g)).succeed()
        if not self.symmetric:
            yield self.env.all_of([self._event(("arrive", *tag, x)) for x in group])
            start = self.env.now
            yield from self._collective(g, kind, "all_reduce", size_bytes)
            return start
        members = [x for x in group if x in self._simulated]
        done = self._event(("done", *tag))
        if g != members[0]:
            yield done
            return done.value
        yield self.env.all_of([self._event(("arrive", *tag, x)) for x in members])
        start = self.env.now
        world, p = self.world, len(group)
        choice = choose("all_reduce", kind, size_bytes, world.topology, group, self.comm, self._choices)
        groups = self.job.dp * self.job.tp if kind == "emb" else self.layout.world_size // p
        world.count_algorithm(f"{kind}:all_reduce", choice.label, groups)

        def run(grp: list[int]):
            dag = coll.build("all_reduce", choice.algorithm, p, size_bytes, ranks_by_node=self._ranks_by_node(grp))
            return world.run_collective_alone(dag, grp, None, choice.protocol, choice.launch_s).join_all()

        mine = run(group)
        for other in self._cross_stage_mirrors(g, kind):
            run(other)
        yield mine
        done.succeed(start)
        return start

    # ---- compute ---------------------------------------------------------------------------------
    def _share_of(self, g: int, kind: str, op: str, size_bytes: float, peer: int | None = None) -> float:
        """The share of g's SMs one collective's NCCL kernels hold while it runs: their CTAs (one per
        channel; how many depends on where the group's ranks are and on the algorithm the tuner picks,
        ``job.nccl``) over the SMs; without ``job.nccl``, ``comm_slowdown`` x as x/(1 + x). ``peer``: the
        other end of a pipeline send."""
        job = self.job
        if job.nccl is None:
            x = job.comm_slowdown
            return x / (1.0 + x) if x > 0 else 0.0
        key = (g, kind, op, size_bytes, peer)
        share = self._shares.get(key)
        if share is None:
            group = [g, peer] if peer is not None else self._group(g, kind)
            shape = group_shape(self.world.topology, group)
            alg = "direct" if peer is not None else choose(op, kind, size_bytes, self.world.topology, group,
                                                             self.comm, self._choices).algorithm
            share = self._shares[key] = job.nccl.share(shape.nodes, shape.per_node, alg)
        return share

    def _settle(self, g: int) -> None:
        """Book the compute lost on g since the last mark at the share held meanwhile."""
        now = self.env.now
        held = min(self._held.get(g, 0.0), self._max_share)
        self._lost_cum[g] = self._lost_cum.get(g, 0.0) + (now - self._lost_mark.get(g, now)) * held
        self._lost_mark[g] = now

    def _comm_begin(self, g: int, kind: str, op: str, size_bytes: float, peer: int | None = None,
                    ctas: int | None = None) -> float:
        """An overlapped collective starts on g; returns the SM share it holds (``ctas``: the SMs its
        kernel is given, as userbuffers are, instead of NCCL's CTAs)."""
        nccl = self.job.nccl
        if ctas is not None and nccl is not None:
            share = min(ctas, nccl.sm_count - 1) / nccl.sm_count
        else:
            share = self._share_of(g, kind, op, size_bytes, peer)
        self._settle(g)
        self._comm_active[g] = self._comm_active.get(g, 0) + 1
        self._held[g] = self._held.get(g, 0.0) + share
        return share

    def _comm_end(self, g: int, share: float) -> None:
        self._settle(g)
        self._comm_active[g] -= 1
        # Concurrent collectives' kernels hold their own CTAs: the shares add, and each end frees its own.
        self._held[g] = self._held[g] - share if self._comm_active[g] else 0.0
        change = self._comm_change.pop(g, None)
        if change is not None:  # a compute block slowed by it re-plans the rest at the new rate
            change.succeed()

    def _lost(self, g: int) -> float:
        """Seconds of g's compute lost so far to the SMs its overlapped collectives held."""
        held = min(self._held.get(g, 0.0), self._max_share)
        return self._lost_cum.get(g, 0.0) + (self.env.now - self._lost_mark.get(g, self.env.now)) * held

    def _compute(self, g: int, work_s: float):
        """Run ``work_s`` of compute. While overlapped collectives of g are in flight the SMs their NCCL
        kernels hold are lost: compute runs at (1 − share) of its speed, the shares of concurrent
        collectives adding up (each kernel has its own CTAs). Exact: at each wake-up the work done is the
        elapsed time less the time lost; a slowed wait also ends when a collective does (the rest is
        re-planned at the new rate), and a wait that a collective joined is made up at the next wake-up.
        (``_blocks`` waits the usual case, nothing in flight, inline, and calls ``_compute_after`` only
        when a collective joined that wait.)"""
        env = self.env
        if not self._interferes:
            yield env.timeout(work_s)
            return
        yield from self._compute_after(g, work_s, env.now, self._lost(g), waited=False)

    def _compute_after(self, g: int, work_s: float, t0: float, l0: float, waited: bool = True):
        """The rest of ``_compute``: ``t0`` its start, ``l0`` the time lost on g by then; ``waited``: its
        first wait (at full speed) is over."""
        env = self.env
        remaining = work_s - ((env.now - t0) - (self._lost(g) - l0)) if waited else work_s
        # Stop once what is left is below the clock's resolution (a timeout that short cannot advance it).
        while remaining > max(1e-12 * work_s, 4 * math.ulp(env.now)):
            held = min(self._held.get(g, 0.0), self._max_share)
            if self._comm_active.get(g, 0) and held > 0:
                change = self._comm_change.get(g)
                if change is None:
                    change = self._comm_change[g] = env.event()
                yield env.timeout(remaining / (1.0 - held)) | change
            else:
                yield env.timeout(remaining)
            remaining = work_s - ((env.now - t0) - (self._lost(g) - l0))

    def _blocks(self, g: int, blocks: tuple[Block, ...], category: str, args: dict, prefix: str):
        env, world = self.env, self.world
        step = args.get("step", 0)
        slow = self._slow(g, step)
        var = self._jitter
        interferes, active, lost_cum = self._interferes, self._comm_active, self._lost_cum
        add_span = world.timeline.spans.append
        for b in blocks:
            if b.comm == "ring@cp" and len(self._group(g, "cp")) > 1:  # context parallelism: ring attention
                yield from self._ring(g, b, category, args, prefix)
                continue
            beside = None  # an overlapped collective: issued with the compute, waited for after it
            jittered: float | None = None
            if b.overlap and b.comm and b.comm_bytes > 0:
                op, kind = b.comm_op_kind
                if self._has_peers(g, kind):
                    wait, finish = 0.0, None
                    if var is not None and kind == "tp":  # the collective starts with the group's last member
                        jittered, wait, finish = var.overlapped_block(g, step, b.dur_s)
                    beside = env.process(self._beside(g, kind, op, b, args, prefix, wait, finish))
            if b.dur_s > 0:
                start = env.now
                # Jitter: a block ending in a blocking TP collective waits for the group's slowest member.
                dur = b.dur_s if var is None else jittered if jittered is not None else var.block_time(
                    g, step, b.dur_s, bool(b.comm and "@" not in b.comm) and self.job.tp > 1)
                work = dur * slow
                if interferes and active.get(g, 0):
                    yield from self._compute(g, work)
                else:  # nothing in flight: _compute's usual case, inline (one generator less per block)
                    l0 = lost_cum.get(g, 0.0)
                    yield env.timeout(work)
                    if interferes and (active.get(g, 0) or lost_cum.get(g, 0.0) != l0):
                        yield from self._compute_after(g, work, start, l0)
                world.compute_events += 1
                lost = env.now - start - work
                if self._interferes and lost > 1e-9 * work:  # slowed by overlapped communication
                    world.timeline.add(Span(g, STREAM_COMPUTE, f"{prefix} {b.name}", b.category or category,
                                            start, work, args))
                    world.span(g, STREAM_COMPUTE, f"{prefix} {b.name} (slowed by comm)", INTERFERENCE,
                               start + work, args)
                else:  # world.span, inline (the hot path: one span per block)
                    add_span(Span(g, STREAM_COMPUTE, f"{prefix} {b.name}", b.category or category, start,
                                  env.now - start, args))
            if beside is not None:
                yield beside
                continue
            if b.overlap or not b.comm or b.comm_bytes <= 0:  # most blocks: no collective (parse nothing)
                continue
            op, kind = b.comm_op_kind
            if self._has_peers(g, kind):
                start = env.now
                yield from self._collective(g, kind, op, b.comm_bytes)
                world.span(g, STREAM_COMM, f"{prefix} {b.name} {op}", _BLOCK_COMM_CATEGORY.get(kind, COMM_TP), start,
                           {"bytes": b.comm_bytes, "op": op, **args})

    def _has_peers(self, g: int, kind: str) -> bool:
        """Whether a block's collective on g's ``kind`` group has anyone to talk to."""
        return self.job.tp > 1 if kind == "tp" else len(self._group(g, kind)) > 1

    def _beside(self, g: int, kind: str, op: str, b: Block, args: dict, prefix: str, wait_s: float = 0.0,
                finish: Callable[[float], None] | None = None):
        """Process: block ``b``'s collective, run beside its compute (Megatron's asynchronous backward
        collectives); while it is in flight its NCCL kernels slow that compute (``_compute``). With
        symmetric jitter it starts ``wait_s`` later, when the slowest member of the group g stands for
        arrives, and ``finish`` learns its duration (``Variability.overlapped_block``)."""
        if wait_s > 0:
            yield self.env.timeout(wait_s)
        start = self.env.now
        share = self._comm_begin(g, kind, op, b.comm_bytes, ctas=b.ctas)
        stretch = self._hbm_stretch(g, kind, op, b)
        yield from self._collective(g, kind, op, b.comm_bytes, stretch)
        self._comm_end(g, share)
        if finish is not None:
            finish(self.env.now - start)
        extra = {"hbm_stretch": stretch} if stretch > 1.0 else {}
        slowed = " (slowed by compute's HBM traffic)" if stretch > 1.0 else ""
        self.world.span(g, STREAM_COMM, f"{prefix} {b.name} {op} (overlapped){slowed}",
                        _BLOCK_COMM_CATEGORY.get(kind, COMM_TP), start,
                        {"bytes": b.comm_bytes, "op": op, **extra, **args})

    def _hbm_stretch(self, g: int, kind: str, op: str, b: Block) -> float:
        """How much slower block ``b``'s overlapped collective moves its bytes because the block's kernels
        use the same HBM. The collective touches HBM ``HBM_TOUCHES[op]`` times per byte it receives, at
        the rate of the link it runs on (the group's NVLink port inside a node, its NIC share across
        nodes); the block's kernels move ``b.hbm_bytes`` over ``b.dur_s``. When the two demands exceed what
        HBM streams (``job.hbm_Bps``), each gets its proportional share, so the collective runs at
        HBM / (compute + collective demand) of its speed: GEMMs beside it (few bytes per second) cost it
        nothing, memory-bound kernels beside an NVLink collective up to about 1.4× on A100."""
        hbm = self.job.hbm_Bps
        if hbm <= 0 or b.dur_s <= 0 or b.hbm_bytes <= 0:
            return 1.0
        key = (kind, op, b.dur_s, b.hbm_bytes, g if not self.symmetric else None)
        stretch = self._stretches.get(key)
        if stretch is None:
            topo = self.world.topology
            group = self._group(g, kind)
            shape = group_shape(topo, group)
            wire = (topo.intra_bw_Bps if shape.nodes == 1
                    else topo.inter_bw_Bps * max(1, shape.nics) / max(1, shape.per_node))
            demand = b.hbm_bytes / b.dur_s + HBM_TOUCHES.get(op, 2.0) * wire
            stretch = self._stretches[key] = max(1.0, demand / hbm)
        return stretch

    def _ring(self, g: int, b: Block, category: str, args: dict, prefix: str):
        """Ring attention over g's CP group: ``b`` (one K/V block's attention) runs once per member; while
        it runs, the block moves one GPU along the ring (i → i+1; both ways for two GPUs) for the next."""
        env, world, var = self.env, self.world, self._jitter
        n = len(self._group(g, "cp"))
        op, size = ("all_to_all", 2 * b.comm_bytes) if n == 2 else ("send_recv", b.comm_bytes)
        step = args.get("step", 0)
        slow = self._slow(g, step)

        def exchange(i: int):
            start = env.now
            yield from self._collective(g, "cp", op, size)
            world.span(g, STREAM_COMM, f"{prefix} K/V ring {i + 1}/{n - 1}", COMM_CP, start,
                       {"bytes": b.comm_bytes, "op": op, **args})

        for i in range(n):
            moving = env.process(exchange(i)) if i < n - 1 else None
            start = env.now
            dur = b.dur_s if var is None else var.block_time(g, step, b.dur_s)
            yield env.timeout(dur * slow)
            world.compute_events += 1
            world.span(g, STREAM_COMPUTE, f"{prefix} {b.name} {i + 1}/{n}", category, start, args)
            if moving is not None:
                yield moving

    def _gpu(self, g: int):
        job = self.job
        _, _, stage = self.layout.coords(g)
        actions = self.schedule[stage]
        V = job.pp * job.virtual_stages
        last_grad_action = self._last_grad_actions(actions)
        first_forward: dict[int, int] = {}  # chunk -> index of its first forward in the step (once-per-step work runs there)
        for idx, a in enumerate(actions):
            if a.kind == "F":
                first_forward.setdefault(a.chunk, idx)

        def bucketed(chunk: int) -> bool:
            return not job.bucket_first_chunk_only or (stage == 0 and chunk == 0)
        static = job.static_bytes[stage] if job.static_bytes else 0.0
        self._memory(g, static)
        rounds = job.exchange_rounds
        if rounds:
            first_recv, after = megatron_interleaved_exchanges(job.pp, job.microbatches, job.virtual_stages, stage,
                                                               actions)
        for step in range(job.steps):
            dp_events: list[simpy.Event] = []
            bucket = shard_bucket = shard_pre_s = expert_bucket = 0.0
            param_gathers = self._param_gathers(g, stage, actions)
            if rounds and first_recv:  # recv_forward before the first forward
                yield from self._exchange(g, stage, step, Exchange(None, None, True, False))
            for idx, a in enumerate(actions):
                vs = a.chunk * job.pp + stage
                chunk = job.chunks[vs]
                args = {"microbatch": a.microbatch, "stage": stage, "chunk": a.chunk, "step": step}
                if a.kind == "F":
                    if vs > 0:
                        self._waiting[g] = f"activation of {a} from stage {(vs - 1) % job.pp} (step {step})"
                        yield self._event(("F", g, step, vs, a.microbatch))
                        if job.p2p_device_sync and not rounds:
                            yield from self._device_sync(g)
                        yield from self._gather(g, "act", args)
                    elif job.data is not None:
                        yield from self._blocks(g, (job.data,), COMPUTE, args, f"F{a.microbatch}")
                    self._memory(g, sum(lw.activation_bytes for lw in chunk.layers))
                    gathers = self._zero3_gathers(g, chunk.layers)
                    for i, lw in enumerate(chunk.layers):
                        if gathers:
                            yield gathers(i)
                        if param_gathers:
                            update = param_gathers(a.chunk, i)
                            if not update.processed:
                                yield update
                        if lw.step_forward and first_forward[a.chunk] == idx:
                            yield from self._blocks(g, lw.step_forward, WEIGHT_CAST, args, f"F{a.microbatch} {lw.name}")
                        yield from self._blocks(g, lw.forward, FORWARD, args, f"F{a.microbatch} {lw.name}")
                    if vs < V - 1 and not rounds:
                        sent = self._pipe_send(g, stage, step, a, forward=True)
                        if job.blocking_p2p:
                            yield sent
                            if job.p2p_device_sync:
                                yield from self._device_sync(g)
                else:
                    if a.kind == "B" and vs < V - 1:
                        self._waiting[g] = f"gradient of {a} from stage {(vs + 1) % job.pp} (step {step})"
                        yield self._event(("B", g, step, vs, a.microbatch))
                        if job.p2p_device_sync and not rounds:
                            yield from self._device_sync(g)
                        if job.backward_gathers > 1:  # DeepSpeed rebuilds the stage's own output first
                            yield from self._gather(g, "output", args)
                        yield from self._gather(g, "grad", args)
                    final = idx in last_grad_action
                    layers = chunk.layers[::-1]
                    gathers = self._zero3_gathers(g, layers)
                    for i, lw in enumerate(layers):
                        if gathers:
                            yield gathers(i)
                        if a.kind == "B":
                            if lw.workspace_bytes:
                                self._memory(g, lw.workspace_bytes)
                            yield from self._blocks(g, lw.recompute, RECOMPUTE, args, f"R{a.microbatch} {lw.name}")
                            cat = BACKWARD_INPUT if job.split_backward else BACKWARD
                            yield from self._blocks(g, lw.backward, cat, args, f"B{a.microbatch} {lw.name}")
                            if not job.split_backward:
                                yield from self._blocks(g, lw.weight, BACKWARD, args, f"B{a.microbatch} {lw.name}")
                            if lw.workspace_bytes:
                                self._memory(g, -lw.workspace_bytes)
                        else:
                            yield from self._blocks(g, lw.weight, BACKWARD_WEIGHT, args, f"W{a.microbatch} {lw.name}")
                        has_grads = a.kind == "W" or not job.split_backward
                        # ZeRO-2/3 keep only their shard of the gradients, so each micro-batch's gradients
                        # are reduce-scattered as its backward produces them (DeepSpeed's stage_1_and_2.py
                        # reduces in every backward when partition_gradients, stage 1 only at the
                        # accumulation boundary; FSDP reduce-scatters per backward outside no_sync()).
                        if has_grads and job.zero >= 2 and job.overlap_grad_sync:
                            dp_events.append(self._dp_sync(g, "reduce_scatter", lw.grad_bytes, step,
                                                           pre_s=lw.pre_reduce_s))
                            if lw.expert_grad_bytes > 0:  # MoE: the experts' shard, over the expert-DP group
                                dp_events.append(self._dp_sync(g, "reduce_scatter", lw.expert_grad_bytes, step,
                                                               kind="edp"))
                        elif has_grads and job.zero >= 2:
                            shard_bucket += lw.grad_bytes
                            shard_pre_s += lw.pre_reduce_s
                            expert_bucket += lw.expert_grad_bytes
                        elif has_grads and final and job.compression_ratio is None:
                            bucket += lw.grad_bytes
                            if bucket >= job.bucket_bytes and job.overlap_grad_sync and bucketed(a.chunk):
                                dp_events.append(self._dp_sync(g, self._grad_op(), bucket, step))
                                bucket = 0.0
                    if final and bucket > 0 and job.overlap_grad_sync and not bucketed(a.chunk):
                        # One bucket per model chunk: reduced once the chunk's last gradients are in.
                        dp_events.append(self._dp_sync(g, self._grad_op(), bucket, step))
                        bucket = 0.0
                    if shard_bucket > 0:  # ZeRO-2/3 without overlap: this action's gradients, reduced now
                        yield self._dp_sync(g, "reduce_scatter", shard_bucket, step, pre_s=shard_pre_s)
                        shard_bucket = shard_pre_s = 0.0
                    if expert_bucket > 0:
                        yield self._dp_sync(g, "reduce_scatter", expert_bucket, step, kind="edp")
                        expert_bucket = 0.0
                    if a.kind == "B":
                        self._memory(g, -sum(lw.activation_bytes for lw in chunk.layers))
                        if vs > 0 and not rounds:
                            sent = self._pipe_send(g, stage, step, a, forward=False)
                            if job.blocking_p2p:
                                yield sent
                                if job.p2p_device_sync:
                                    yield from self._device_sync(g)
                if rounds and (ex := after[idx]) is not None:
                    yield from self._exchange(g, stage, step, ex)
            if bucket > 0:
                dp_events.append(self._dp_sync(g, self._grad_op(), bucket, step))
            expert_grads = sum(lw.expert_grad_bytes for c in range(job.virtual_stages)
                               for lw in job.chunk_of(stage, c).layers)
            if expert_grads > 0 and job.zero < 2:  # MoE: the experts' gradients, over the GPUs holding them
                dp_events.append(self._dp_sync(g, self._grad_op(), expert_grads, step, kind="edp"))
            if job.compression_ratio is not None:
                yield from self._compressed_sync(g, step)
            self._waiting[g] = f"data-parallel gradient sync (step {step})"
            if dp_events:
                yield self.env.all_of(dp_events)
            yield from self._embedding_sync(g, step)
            yield from self._optimizer(g, step)
            self.step_end_s[step] = max(self.step_end_s[step], self.env.now)
        self._finished.add(g)
        self._waiting.pop(g, None)

    def _dp_submit(self, g: int, body) -> simpy.Event:
        """Queue ``body`` on g's data-parallel stream; the stream runs in order, so its last event is done
        only once everything queued on it is (``_device_sync``)."""
        ev = self._stream(g, STREAM_DP).submit(body)
        self._dp_last[g] = ev
        return ev

    def _device_sync(self, g: int):
        """torch.cuda.synchronize() after a waited pipeline exchange (``job.p2p_device_sync``): the host
        launches nothing more until the work in flight on g's data-parallel stream (gradient reductions,
        parameter gathers) is done."""
        last = self._dp_last.get(g)
        if last is not None and not last.processed:
            yield last

    def _ring_only_kinds(self, rings: set[str]) -> set[str]:
        """"tp"/"dp" when every collective of that kind runs as a ring: TP's as the tuner chooses them for
        their real sizes; DP's when they exist only as rings (reduce-scatter, all-gather: ZeRO-1). The 4-byte
        gradient-norm all-reduce runs after the last backward, when no replica has TP traffic: left out."""
        job = self.job
        if self._stages_share_nodes():
            return set()
        # ``rings``: ``_ring_route_kinds``. ZeRO-1: gradients reduce-scattered and parameters all-gathered, both
        # rings only. (ZeRO-2/3's per-micro-batch, per-layer reduce-scatters interleave with the backward's TP
        # collectives in ways the peers' groups still matter for: kept.)
        return rings & {"tp", "dp"} if job.zero == 1 else rings & {"tp"}

    def _ring_route_kinds(self) -> set[str]:
        """"tp"/"dp"/"cp" when every collective of that kind that moves data runs as a ring, so that its
        traffic is that of ring neighbours only (``Symmetry.ring_routes``): TP's as the tuner chooses them for
        their real sizes (latency-bound ones left out), DP's when its ops exist only as rings (reduce-scatter
        and all-gather: ZeRO 1–3 without a whole-gradient all-reduce or compression), CP's when it gathers
        and scatters K/V (Meta's all-gather context parallelism) or passes it around the ring (ring
        attention: each rank to the next), not all-to-all. The 4-byte gradient-norm and loss-scale
        all-reduces move too little to load a link: left out."""
        job = self.job
        group = self.layout.tp_group(self.gpus[0])
        layer_blocks = [b for c in job.chunks for lw in c.layers
                        for b in (*lw.forward, *lw.recompute, *lw.backward, *lw.weight) if b.comm]
        tp = {(b.comm_op_kind[0], b.comm_bytes) for b in layer_blocks
              if b.comm_bytes > 0 and b.comm_op_kind[1] == "tp"}
        cp_rings = all(b.comm == "ring@cp" or COLLECTIVE_ALGORITHMS.get(b.comm_op_kind[0]) == ("ring",)
                       for b in layer_blocks if b.comm_op_kind[1] == "cp")
        choices = [choose(op, "tp", size, self.world.topology, group, self.comm, self._choices) for op, size in tp]
        # A latency-bound collective (NCCL's LL protocol: a few kB, the cross-entropy's per-token sums)
        # moves too little for its ranks to finish apart or to load the links its peers use: it does not
        # need the mirrored groups either.
        tp_rings = len(group) == 1 or all(c.algorithm == "ring" or c.protocol == "LL" for c in choices)
        dp_ops = {"reduce_scatter" if job.zero == 3 else self._grad_op(), "all_gather"}
        dp_rings = job.zero >= 1 and job.compression_ratio is None and all(
            COLLECTIVE_ALGORITHMS[op] == ("ring",) for op in dp_ops)
        return {kind for kind, rings in (("tp", tp_rings), ("dp", dp_rings), ("cp", cp_rings)) if rings}

    def _stages_share_nodes(self) -> bool:
        """Whether a node holds GPUs of several pipeline stages (``parallel.order: tp-pp-dp`` with tensor
        groups narrower than a node). The shortcuts of ``_ring_only_kinds`` and ``_apart_kinds`` reason about a
        node's GPUs of one stage, so they are not taken then: more mirrored traffic is simulated."""
        job = self.job
        return job.rank_order != "tp-dp-pp" and job.pp > 1 and job.tp * job.cp < self.world.topology.gpus_per_node

    def _apart_kinds(self) -> frozenset[frozenset[str]]:
        """{"tp", "dp"} when a stage's data-parallel traffic never runs beside its tensor-parallel traffic,
        else nothing (``Symmetry.apart``). So it is when every DP collective waits for the stage's last
        backward: gradients reduced after the backward pass (no ``overlap_grad_sync``; ZeRO ≤ 1, whose
        gradients are not reduce-scattered per micro-batch and whose parameters are not gathered per layer),
        the update's parameters gathered before the next step (no ``overlap_param_gather``), no compression,
        experts or context parallelism (their groups interleave with both). A GPU's DP collective starts once
        its TP group's last collective of the backward is done (each GPU's actions run in order), and the
        links a node's DP hops share with TP rings are those of the same stage's GPUs. Across steps, a tree
        lets a rank go on while its links still carry the others' data, so with several steps DP must run
        as rings (``_dp_rings``)."""
        job = self.job
        if not self.symmetric or self._stages_share_nodes():  # only a symmetric run reuses collectives
            return frozenset()
        if (job.overlap_grad_sync or job.zero > 1 or job.overlap_param_gather or job.compression_ratio is not None
                or job.ep > 1 or job.cp > 1 or job.tp == 1 or job.dp == 1):
            return frozenset()
        if job.steps > 1 and not self._dp_rings():
            return frozenset()
        return frozenset({frozenset(("tp", "dp"))})

    def _dp_rings(self) -> bool:
        """Whether each stage's data-parallel collectives, when they wait for the backward pass, run as rings
        (or as latency-bound LL collectives) as the tuner picks them for their real sizes: the whole
        gradients' reduction, and under ZeRO 1/2 the updated parameters' gather (rings only)."""
        job, topo = self.job, self.world.topology
        for g in self.gpus:
            stage = self.layout.coords(g)[2]
            layers = [lw for c in range(job.virtual_stages) for lw in job.chunk_of(stage, c).layers]
            grads = sum(lw.grad_bytes for lw in layers)
            if grads <= 0:
                continue
            c = choose(self._grad_op(), "dp", grads, topo, self.layout.dp_group(g), self.comm, self._choices)
            if c.algorithm != "ring" and c.protocol != "LL":
                return False
        return not job.gathers_update or COLLECTIVE_ALGORITHMS["all_gather"] == ("ring",)

    def _grad_op(self) -> str:
        job = self.job
        return "reduce_scatter" if job.zero in (1, 2) and not job.grad_all_reduce else "all_reduce"

    @staticmethod
    def _last_grad_actions(actions: list[Action]) -> set[int]:
        """Indices of the actions that produce each chunk's final weight gradients (DDP syncs then)."""
        split = any(a.kind == "W" for a in actions)
        last: dict[int, int] = {}
        for i, a in enumerate(actions):
            if a.kind == ("W" if split else "B"):
                last[a.chunk] = i
        return set(last.values())

    def _pre_kernel(self, g: int, name: str, dur_s: float):
        """A kernel FSDP runs on its DP stream before a collective (``LayerWork.pre_reduce_s``)."""
        start = self.env.now
        yield self.env.timeout(dur_s)
        self.world.span(g, STREAM_DP, name, FSDP_COPY, start)

    def _dp_sync(self, g: int, op: str, size_bytes: float, step: int, kind: str = "dp",
                 pre_s: float = 0.0) -> simpy.Event:
        env, world = self.env, self.world

        def body():
            if pre_s > 0:
                yield from self._pre_kernel(g, "grad predivide", pre_s)
            start = env.now
            share = self._comm_begin(g, kind, op, size_bytes)
            alg = yield from self._collective(g, kind, op, size_bytes)
            self._comm_end(g, share)
            if env.now > start:
                world.span(g, STREAM_DP, f"{op} grads", COMM_DP, start,
                           {"bytes": size_bytes, "op": op, "step": step, "algorithm": alg})
            return None

        return self._dp_submit(g, body)

    def _zero3_gathers(self, g: int, layers):
        """ZeRO-3 / FSDP: a function giving the event of layer i's parameter all-gather, with layer
        i+1's gather queued on the DP stream when layer i's is asked for (FSDP's one-ahead prefetch).
        None without ZeRO-3."""
        job = self.job
        if job.zero != 3 or job.dp == 1:
            return None
        events: dict[int, simpy.Event] = {}

        def submit(i: int) -> None:
            if i < len(layers) and i not in events:
                events[i] = self._dp_gather(g, layers[i].param_bytes, layers[i].pre_gather_s)

        def get(i: int) -> simpy.Event:
            submit(i)
            submit(i + 1)
            return events[i]

        return get

    def _param_gathers(self, g: int, stage: int, actions):
        """Megatron-Core's overlapped parameter gather (ZeRO 1/2, ``job.overlap_param_gather``): a function
        giving the event of (chunk, layer)'s gather of the updated parameters. As Megatron's schedules
        dispatch them (``param_sync_func``): the first two model chunks' gathers, every layer of each back
        to back on the DP stream, as the step starts (the optimizer step just ended), then the next chunk's
        when a chunk's first forward begins; each layer's forward waits for its own (the forward pre-hook's
        ``finish_param_sync``). Megatron also shifts each stage's dispatch by its pipeline rank in
        micro-batches to line the stages up; dtsim dispatches when the stage starts the chunk. None when
        the update is gathered after the optimizer step instead."""
        job = self.job
        if not (job.gathers_update and job.overlap_param_gather):
            return None
        chunks: list[int] = []  # model chunks in the order the step's forwards first reach them
        for a in actions:
            if a.kind == "F" and a.chunk not in chunks:
                chunks.append(a.chunk)
        events: dict[tuple[int, int], simpy.Event] = {}

        def dispatch(k: int) -> None:
            if k < len(chunks) and (chunks[k], 0) not in events:
                for i, lw in enumerate(job.chunk_of(stage, chunks[k]).layers):
                    events[(chunks[k], i)] = self._dp_gather(g, lw.param_bytes)

        def get(chunk: int, i: int) -> simpy.Event:
            if i == 0:
                dispatch(chunks.index(chunk) + 1)
            return events[(chunk, i)]

        dispatch(0)
        dispatch(1)
        return get

    def _dp_gather(self, g: int, size_bytes: float, pre_s: float = 0.0) -> simpy.Event:
        env, world = self.env, self.world

        def body():
            if pre_s > 0:
                yield from self._pre_kernel(g, "shard cast", pre_s)
            start = env.now
            share = self._comm_begin(g, "dp", "all_gather", size_bytes)
            alg = yield from self._collective(g, "dp", "all_gather", size_bytes)
            self._comm_end(g, share)
            if env.now > start:
                world.span(g, STREAM_DP, "all_gather params", COMM_DP, start,
                           {"bytes": size_bytes, "op": "all_gather", "algorithm": alg})
            return None

        return self._dp_submit(g, body)

    def _compressed_sync(self, g: int, step: int):
        """Top-k sparsified gradients: compress, all-gather values + indices, decompress."""
        job = self.job
        _, _, stage = self.layout.coords(g)
        grads = sum(lw.grad_bytes for c in range(job.virtual_stages) for lw in job.chunk_of(stage, c).layers)
        if job.compress:
            yield from self._blocks(g, (job.compress,), COMPUTE, {"step": step}, "topk")
        ratio = job.compression_ratio
        assert ratio is not None, "only compressed jobs sync through here"
        sent = grads * ratio * (1 + job.index_bytes / job.grad_elem_bytes)
        if job.dp > 1:
            yield self._dp_sync(g, "all_gather", sent * job.dp, step)
        if job.decompress:
            yield from self._blocks(g, (job.decompress,), COMPUTE, {"step": step}, "topk")

    def _optimizer(self, g: int, step: int):
        job = self.job
        env, world = self.env, self.world
        if job.unscale is not None:
            yield from self._blocks(g, (job.unscale,), OPTIMIZER, {"step": step}, "loss-scale")
            if len(self._group(g, "mp")) > 1:
                start = yield from self._cross_stage(g, "mp", 4.0, step, "found_inf")
                world.span(g, STREAM_COMM, "found_inf all_reduce", COMM_TP, start, {"bytes": 4.0, "op": "all_reduce"})
        if step in job.overflow_steps:
            return  # overflow: the update is skipped, the scale backs off
        if job.clip is not None:
            yield from self._blocks(g, (job.clip,), CLIP_GRAD, {"step": step}, "")
            start = env.now
            # The squared norm is summed over the model-parallel group (and over data-parallel ranks
            # when ZeRO shards the gradients or the optimizer: Megatron's distributed optimizer).
            # A 4-byte all-reduce: the tuner picks what NCCL would for so small a message.
            if len(self._group(g, "mp")) > 1:
                start = yield from self._cross_stage(g, "mp", 4.0, step, "clip")
            if job.zero >= 1:
                yield from self._collective(g, "dp", "all_reduce", 4.0)
            if env.now > start:
                world.span(g, STREAM_COMM, "grad norm all_reduce", COMM_CLIP, start, {"bytes": 4.0, "op": "all_reduce"})
        yield from self._blocks(g, (job.optimizer,), OPTIMIZER, {"step": step}, "")
        if job.gathers_update and not job.overlap_param_gather:
            _, _, stage = self.layout.coords(g)
            params = sum(lw.param_bytes for c in range(job.virtual_stages) for lw in job.chunk_of(stage, c).layers)
            yield self._dp_gather(g, params)
