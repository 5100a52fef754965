"""The World: one SimPy environment, the topology's links as a fluid network, GPUs with streams."""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy

from sim.engine.collective_algorithms import Spec
from sim.engine.collective_runs import CollectiveRun, make_run
from sim.engine.network import Network
from sim.engine.timeline import Span, Timeline
from sim.hardware.topology import Topology

if TYPE_CHECKING:  # algorithms.py imports this module
    from sim.engine.algorithms import CommConfig


class Stream:
    """A CUDA stream: work submitted to it runs in order, one item at a time.

    ``submit(fn)`` queues a generator function (a SimPy process body) and returns an event that fires
    when it has run; the stream's own process pulls items in FIFO order.
    """

    __slots__ = ("env", "name", "_queue", "_proc")

    def __init__(self, env: simpy.Environment, name: str):
        self.env = env
        self.name = name
        self._queue: simpy.Store = simpy.Store(env)
        self._proc = env.process(self._run())

    def submit(self, body) -> simpy.Event:
        done = self.env.event()
        self._queue.put((body, done))
        return done

    def _run(self):
        while True:
            body, done = yield self._queue.get()
            result = yield from body()
            done.succeed(result)


class World:
    """Shared state of one simulation: clock, network, timeline, collective registry."""

    def __init__(self, topology: Topology, timeline: Timeline | None = None):
        self.env = simpy.Environment()
        self.topology = topology
        self.network = Network(self.env, topology.capacity_Bps)
        self.timeline = timeline if timeline is not None else Timeline()
        self._collectives: dict[tuple, CollectiveRun] = {}
        self._seq: dict[tuple, int] = {}
        self.compute_events = 0
        self.collectives_run = 0
        self.comm: CommConfig | None = None  # how collectives choose their algorithm
        self.algorithm_counts: dict[str, dict[str, int]] = {}  # op → algorithm/protocol → collectives

    # ---- collectives -----------------------------------------------------------------------------
    def collective(self, key: tuple, gpu: int, dag_factory, gpus: list[int], channels: int | None = None,
                   protocol: str = "Simple", launch_s: float = 0.0) -> CollectiveRun:
        """The collective instance that ``gpu`` joins next on group ``key`` (created by the first
        member to arrive; members issue collectives on a group in the same order, as NCCL requires)."""
        seq_key = (key, gpu)
        n = self._seq.get(seq_key, 0)
        self._seq[seq_key] = n + 1
        inst_key = (key, n)
        run = self._collectives.get(inst_key)
        if run is None:
            run = make_run(self, dag_factory(), gpus, channels, protocol, launch_s)
            self._collectives[inst_key] = run
            self.collectives_run += 1
        if all(run.arrived[i] or gpus[i] == gpu for i in range(run.p)):
            self._collectives.pop(inst_key, None)  # last member: forget it
        return run

    def run_collective_alone(self, dag: Spec, gpus: list[int], channels: int | None = None,
                             protocol: str = "Simple", launch_s: float = 0.0,
                             fold: tuple[int, int] | None = None) -> CollectiveRun:
        """A collective all of whose members arrive together (symmetric mirrors, benchmarks); ``fold``: a ring
        folded onto one period of its hops (``sim.engine.collective_runs.make_run``)."""
        run = make_run(self, dag, gpus, channels, protocol, launch_s, fold)
        self.collectives_run += 1
        return run

    def count_algorithm(self, op: str, name: str, n: int = 1) -> None:
        """Tally which algorithm a collective used (summary ``collective_algorithms``)."""
        per = self.algorithm_counts.setdefault(op, {})
        per[name] = per.get(name, 0) + n

    def span(self, gpu: int, stream: str, name: str, category: str, start_s: float, args: dict | None = None) -> None:
        self.timeline.add(Span(gpu, stream, name, category, start_s, self.env.now - start_s, args or {}))
