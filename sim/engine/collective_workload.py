"""Run one collective (or a size sweep) the way nccl-tests does: every rank arrives together, time from
the start to the last rank's completion, algbw = N / t, busbw = algbw × the collective's factor."""

from __future__ import annotations

from dataclasses import dataclass

from sim.analytic import busbw_factor
from sim.engine import collectives as coll
from sim.engine.timeline import COMM, STREAM_COMM
from sim.engine.world import World


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
    chunks: int = 1,
    record_spans: bool = True,
) -> list[CollectiveResult]:
    """Simulate ``op`` for each size in turn (``iterations`` times each, reporting the mean)."""
    results: list[CollectiveResult] = []
    p = len(gpus)
    rbn = ranks_by_node(world, gpus)

    def driver():
        for size in sizes_bytes:
            t0 = world.env.now
            transfers = 0
            ch = 1
            for it in range(iterations):
                dag = coll.build(op, algorithm, p, float(size), ranks_by_node=rbn, chunks=chunks)
                transfers = dag.n
                run = world.run_collective_alone(dag, gpus, channels)
                ch = run.channels
                start = world.env.now
                yield run.join_all()
                if record_spans and len(gpus) <= 4096:
                    for g in gpus:
                        world.span(g, STREAM_COMM, f"{op} {size}B #{it}", COMM, start,
                                   {"bytes": float(size), "op": op, "algorithm": algorithm})
            t = (world.env.now - t0) / iterations
            algbw = size / t / 1e9 if t > 0 else float("inf")
            results.append(
                CollectiveResult(op, algorithm, p, int(size), t, algbw, algbw * busbw_factor(op, p), ch, transfers)
            )

    world.env.process(driver())
    world.env.run()
    return results
