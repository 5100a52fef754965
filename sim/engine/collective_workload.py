"""Run one collective (or a size sweep) the way nccl-tests does: every rank arrives together, time from
the start to the last rank's completion, algbw = N / t, busbw = algbw × the collective's factor."""

from __future__ import annotations

from dataclasses import dataclass

from sim.analytic import busbw_factor
from sim.engine import algorithms as algs
from sim.engine import collective_algorithms as coll
from sim.engine.timeline import COMM, STREAM_COMM
from sim.engine.world import World
from sim.hardware.nccl import PROTOCOLS, base_latency_s


@dataclass(frozen=True)
class CollectiveResult:
    op: str
    algorithm: str
    ranks: int
    size_bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    channels: int
    transfers: int
    protocol: str = "Simple"


    def as_dict(self) -> dict:
        return {
            "op": self.op,
            "algorithm": self.algorithm,
            "ranks": self.ranks,
            "size_bytes": self.size_bytes,
            "time_s": self.time_s,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
            "channels": self.channels,
            "transfers": self.transfers,
            "protocol": self.protocol,
        }


def ranks_by_node(world: World, gpus: list[int]) -> list[list[int]]:
    """Group indices of ``gpus`` arranged node by node (for hierarchical algorithms)."""
    by: dict[int, list[int]] = {}
    for i, g in enumerate(gpus):
        by.setdefault(world.topology.node_of(g), []).append(i)
    return list(by.values())


def run_collectives(
    world: World,
    op: str,
    algorithm: str,
    gpus: list[int],
    sizes_bytes: list[int],
    channels: int | None = None,
    iterations: int = 1,
    chunks: int | None = None,
    record_spans: bool = True,
    protocol: str = "auto",
) -> list[CollectiveResult]:
    """Simulate ``op`` for each size in turn (``iterations`` times each, reporting the mean).

    ``algorithm`` "auto" and ``protocol`` "auto" choose as NCCL's tuner does (``sim.engine.algorithms``);
    every run pays its algorithm/protocol's launch latency."""
    results: list[CollectiveResult] = []
    p = len(gpus)
    rbn = ranks_by_node(world, gpus)
    cfg = world.comm or algs.CommConfig()
    shape = algs.group_shape(world.topology, gpus)

    def pick(size: float) -> tuple[str, str]:
        if algorithm == "auto":
            c = algs.choose(op, "bench", size, world.topology, gpus, cfg)
            return c.algorithm, (c.protocol if protocol == "auto" else protocol)
        if protocol != "auto":
            return algorithm, protocol
        allowed = algs.PIPELINE_PROTOCOLS.get(algorithm, ("Simple",)) if op != "all_to_all" else ("Simple",)
        best = min(allowed, key=lambda pr: algs.predict_s(op, algorithm, pr, size, shape, world.topology, cfg))
        return algorithm, best

    def driver():
        for size in sizes_bytes:
            t0 = world.env.now
            transfers = 0
            ch = 1
            alg, proto = pick(float(size))
            if proto not in PROTOCOLS:
                raise ValueError(f"protocol {proto!r} is not one of {PROTOCOLS}")
            for it in range(iterations):
                dag = coll.build(op, alg, p, float(size), ranks_by_node=rbn, chunks=chunks,
                                 servers=cfg.parameter_servers, aggregate_Bps=cfg.aggregate_Bps)
                transfers = dag.n
                run = world.run_collective_alone(dag, gpus, channels, proto, base_latency_s(alg, proto))
                ch = run.channels
                start = world.env.now
                yield run.join_all()
                if record_spans and len(gpus) <= 4096:
                    for g in gpus:
                        world.span(g, STREAM_COMM, f"{op} {size}B #{it}", COMM, start,
                                   {"bytes": float(size), "op": op, "algorithm": alg, "protocol": proto})
            t = (world.env.now - t0) / iterations
            algbw = size / t / 1e9 if t > 0 else float("inf")
            results.append(
                CollectiveResult(op, alg, p, int(size), t, algbw, algbw * busbw_factor(op, p), ch, transfers, proto)
            )
            world.count_algorithm(op, alg if proto == "Simple" else f"{alg}/{proto}", iterations)

    world.env.process(driver())
    world.env.run()
    return results
