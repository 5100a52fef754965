"""Engine speed: raw SimPy events/s on this machine vs dtsim's simulated events/s, on a 1 GiB ring
all-reduce over 1,024 GPUs (128 nodes × 8, HDR, every rank simulated).

A "simulated event" is one discrete change of the simulated system: a flow starting or finishing on
the network (each ring step of each rank is one flow per channel route). The fluid network batches
simultaneous changes into one SimPy wake-up, so dtsim processes more simulated events than SimPy
events; both counts are printed. Run: python benchmarks/engine_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import simpy

from sim.engine.collective_workload import run_collectives
from sim.engine.world import World
from sim.hardware.links import INTER_PRESETS, INTRA_PRESETS
from sim.hardware.topology import Topology


def raw_simpy_events_per_s(n: int = 400_000, procs: int = 8) -> float:
    env = simpy.Environment()

    def p():
        for _ in range(n // procs):
            yield env.timeout(1)

    for _ in range(procs):
        env.process(p())
    t = time.perf_counter()
    env.run()
    return n / (time.perf_counter() - t)


def ring_1024() -> dict:
    topo = Topology(128, 8, INTRA_PRESETS["nvlink3"], INTER_PRESETS["hdr"], nics_per_node=8)
    w = World(topo)
    t = time.perf_counter()
    (r,) = run_collectives(w, "all_reduce", "ring", list(range(1024)), [1 << 30], record_spans=False)
    wall = time.perf_counter() - t
    simpy_events = next(w.env._eid)  # events SimPy scheduled (ids are consecutive)
    return {"wall_s": wall, "flow_events": w.network.flow_events, "transfers": w.network.transfers,
            "simpy_events": simpy_events, "sim_time_s": r.time_s, "busbw_GBps": r.busbw_GBps}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    raw = [raw_simpy_events_per_s() for _ in range(a.repeat)]
    runs = [ring_1024() for _ in range(a.repeat)]
    raw_med = statistics.median(raw)
    wall_med = statistics.median(r["wall_s"] for r in runs)
    ev = runs[0]["flow_events"]
    print(f"raw SimPy                : {raw_med:,.0f} events/s (median of {a.repeat})")
    print(f"1 GiB ring all-reduce, 1024 GPUs: wall {wall_med:.2f} s median "
          f"(min {min(r['wall_s'] for r in runs):.2f}, max {max(r['wall_s'] for r in runs):.2f})")
    print(f"  transfers {runs[0]['transfers']:,}, simulated flow events {ev:,}, SimPy events {runs[0]['simpy_events']:,}")
    print(f"  simulated events/s {ev / wall_med:,.0f}  → ratio to raw SimPy {ev / wall_med / raw_med:.2f} (target ≥ 0.3)")
    print(f"  SimPy events/s     {runs[0]['simpy_events'] / wall_med:,.0f}")
    print(f"  simulated time {runs[0]['sim_time_s'] * 1e3:.3f} ms, busbw {runs[0]['busbw_GBps']:.1f} GB/s")
    print(f"  wall target ≤ 10 s: {'met' if wall_med <= 10 else 'NOT met'}")


if __name__ == "__main__":
    main()
