"""Training-simulation speed: one iteration of GPT-3 175B on 1,024 A100s (TP8 PP8 DP16, 1,536
sequences, micro-batch 1; target ≤ 10 s) and Llama-3 405B on 16,384 H100s (target ≤ 60 s), both with
symmetry (one GPU simulated per pipeline stage). Prints wall time (median), events and key results.
Run: python benchmarks/training_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from sim.api import simulate
from sim.scenario.load import load_scenario

ROOT = Path(__file__).resolve().parent.parent
CASES = [("gpt3-175b-1024xa100-hdr", [], 10.0), ("llama3-405b-16384xh100", [], 60.0)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    for name, sets, target in CASES:
        sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets)
        walls, res = [], None
        for _ in range(a.repeat):
            t = time.perf_counter()
            res = simulate(sc)
            walls.append(time.perf_counter() - t)
        st, s = res.stats, res.summary
        w = statistics.median(walls)
        print(f"{name}: wall {w:.2f} s median (min {min(walls):.2f}, max {max(walls):.2f}); target ≤ {target:.0f} s "
              f"{'met' if w <= target else 'NOT met'}")
        print(f"  events: {st['transfers']:,} transfers, {st['flow_events']:,} flow events, "
              f"{st['compute_events']:,} compute ops, {st['rate_updates']:,} network rate updates, "
              f"{st['spans']:,} spans")
        print(f"  step {s['step_time_s']:.3f} s, MFU {s['mfu']:.1%}, {s['model_tflops_per_gpu']:.1f} TFLOP/s/GPU, "
              f"bubble {s['bubble_fraction']:.1%}, peak memory {s['memory_bytes']['peak'] / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
